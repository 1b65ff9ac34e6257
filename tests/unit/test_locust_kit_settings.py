"""The locust kit's cluster plumbing (loadtest/locust_support.py, loadtest/kafka_bridge.py):
the same settings as every command, handed to the bridge unchanged, described without
secrets, a cluster off this machine refused unless asked for; and the sum of the processes'
figures. No server: the refusal happens before anything connects."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chronowheel.settings import Settings, settings_from_args

from tests.unit.loadtest_modules import LOADTEST, load


@pytest.fixture(scope="module")
def kit() -> Any:
    return argparse.Namespace(support=load("locust_support"), bridge=load("kafka_bridge"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CHRONOWHEEL_"):
            monkeypatch.delenv(name)


def _options(kit: Any, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kit.support.add_cluster_arguments(parser)
    return parser.parse_args(list(argv))


SECURED_ENV = {
    "CHRONOWHEEL_KAFKA": "kafka-1.staging:9093,kafka-2.staging:9093",
    "CHRONOWHEEL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "CHRONOWHEEL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "CHRONOWHEEL_KAFKA_SASL_USERNAME": "loadtester",
    "CHRONOWHEEL_KAFKA_SSL_CAFILE": "/etc/ca.pem",
    "CHRONOWHEEL_KAFKA_SSL_CERTFILE": "/etc/client.pem",
    "CHRONOWHEEL_KAFKA_SSL_KEYFILE": "/etc/client.key",
    "CHRONOWHEEL_CASSANDRA": "10.0.0.7,10.0.0.8:9142",
    "CHRONOWHEEL_CASSANDRA_USERNAME": "ops",
    "CHRONOWHEEL_CASSANDRA_SSL_CAFILE": "/etc/ca.pem",
    "CHRONOWHEEL_CASSANDRA_SSL_CHECK_HOSTNAME": "false",
}


def test_flags_override_the_environment_and_secrets_come_from_files(
        kit: Any, clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sasl").write_text("kafka-s3cret\n")
    (tmp_path / "cass").write_text("cass-s3cret")
    env = {**SECURED_ENV, "CHRONOWHEEL_NAMESPACE": "staging-load",
           "CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "sasl"),
           "CHRONOWHEEL_CASSANDRA_PASSWORD_FILE": str(tmp_path / "cass")}
    options = _options(kit, "--kafka", "kafka-3.staging:9093", "--consistency", "QUORUM")
    s = kit.support.resolve(options, env)
    assert (s.namespace, s.kafka, s.consistency) == ("staging-load", "kafka-3.staging:9093",
                                                     "QUORUM")
    assert (s.kafka_security_protocol, s.kafka_sasl_mechanism, s.kafka_sasl_username) == \
        ("SASL_SSL", "SCRAM-SHA-512", "loadtester")
    assert s.kafka_ssl_certfile == "/etc/client.pem" and s.cassandra_uses_ssl
    assert s.cassandra_ssl_check_hostname is False
    assert s.kafka_sasl_password is not None and s.cassandra_password is not None
    assert s.kafka_sasl_password.reveal() == "kafka-s3cret"
    assert s.cassandra_password.reveal() == "cass-s3cret"

    # The bridge gets the resolved settings as flags and the secrets from the environment it
    # inherits: it ends up with the same settings, and no secret is on its command line.
    argv = kit.support.bridge_arguments(s)
    assert not any("s3cret" in a for a in argv)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CHRONOWHEEL_KAFKA", "somewhere-else:9092")  # flags win
    bridge = settings_from_args(kit.bridge.parser().parse_args(
        ["--fd", "3", "--prefix", "lc1.", *argv]))
    assert bridge == s
    assert bridge.kafka_sasl_password == s.kafka_sasl_password
    assert bridge.cassandra_password == s.cassandra_password


def test_the_namespace_is_loadtest_unless_named(kit: Any, clean_env: None) -> None:
    assert kit.support.resolve(_options(kit), {}).namespace == "loadtest"
    env = {"CHRONOWHEEL_NAMESPACE": "from-env"}
    assert kit.support.resolve(_options(kit), env).namespace == "from-env"
    assert kit.support.resolve(_options(kit, "--namespace", "flag"), env).namespace == "flag"


def test_the_description_says_how_the_cluster_is_reached_and_no_secret(kit: Any) -> None:
    s = Settings.from_env({**SECURED_ENV, "CHRONOWHEEL_KAFKA_SASL_PASSWORD": "kafka-s3cret",
                           "CHRONOWHEEL_CASSANDRA_PASSWORD": "cass-s3cret"},
                          namespace="staging-load")
    text = kit.support.describe(s)
    assert "s3cret" not in text
    for part in ("namespace staging-load", "Kafka kafka-1.staging:9093,kafka-2.staging:9093",
                 "SASL_SSL", "SASL SCRAM-SHA-512 as loadtester", "CA /etc/ca.pem",
                 "mutual TLS with /etc/client.pem", "Cassandra 10.0.0.7,10.0.0.8:9142",
                 "TLS", "host names not checked", "user ops"):
        assert part in text, (part, text)
    plain = kit.support.describe(Settings(namespace="loadtest"))
    assert plain == ("namespace loadtest; Kafka 127.0.0.1:9092 (PLAINTEXT); Cassandra "
                     "127.0.0.1:9042 (plaintext, no authentication, consistency LOCAL_QUORUM)")


@pytest.mark.parametrize(("kafka", "cassandra", "remote"), [
    ("127.0.0.1:9092", "127.0.0.1:9042", {}),
    ("localhost:9092,[::1]:9093", "127.0.0.2", {}),
    ("10.1.2.3:9092", "127.0.0.1", {"Kafka": ["10.1.2.3"]}),
    ("127.0.0.1:9092", "127.0.0.1,cassandra.staging:9042", {"Cassandra": ["cassandra.staging"]}),
])
def test_servers_off_this_machine_are_found(kit: Any, kafka: str, cassandra: str,
                                            remote: dict[str, list[str]]) -> None:
    assert kit.support.remote_hosts(Settings(kafka=kafka, cassandra=cassandra)) == remote


def test_a_remote_cluster_is_refused_unless_asked_for(kit: Any, clean_env: None) -> None:
    s = Settings(kafka="kafka.staging:9092", cassandra="10.0.0.7", namespace="ns1")
    why = kit.support.refusal(s, allowed=False)
    assert why is not None
    for part in ("not on this machine", "Kafka kafka.staging", "Cassandra 10.0.0.7",
                 "namespace ns1", "--cw-allow-remote-cluster",
                 "CHRONOWHEEL_LOADTEST_ALLOW_REMOTE=1"):
        assert part in why, (part, why)
    assert kit.support.refusal(s, allowed=True) is None
    assert kit.support.refusal(Settings(), allowed=False) is None

    allowed = kit.support.remote_allowed
    assert allowed(_options(kit), {}) is False
    assert allowed(_options(kit, "--cw-allow-remote-cluster"), {}) is True
    assert allowed(_options(kit), {"CHRONOWHEEL_LOADTEST_ALLOW_REMOTE": "1"}) is True
    assert allowed(_options(kit), {"CHRONOWHEEL_LOADTEST_ALLOW_REMOTE": "0"}) is False
    with pytest.raises(SystemExit, match="CHRONOWHEEL_LOADTEST_ALLOW_REMOTE"):
        allowed(_options(kit), {"CHRONOWHEEL_LOADTEST_ALLOW_REMOTE": "sure"})


def test_locust_refuses_a_remote_cluster_before_it_connects(tmp_path: Path) -> None:
    """The locustfile itself: exit status 2, what and how on stderr, no secret, nothing sent
    (the addresses do not exist; a connection attempt would hang or fail differently)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOWHEEL_")}
    env.update(SECURED_ENV, CHRONOWHEEL_KAFKA_SASL_PASSWORD="kafka-s3cret",
               CHRONOWHEEL_CASSANDRA="127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(LOADTEST / "locustfile.py"), "--headless",
         "-t", "5s", "--namespace", "staging-load", "SteadyUser"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "the cluster: namespace staging-load; Kafka kafka-1.staging:9093" in out
    assert "refusing to load a cluster that is not on this machine (Kafka kafka-1.staging, " \
           "kafka-2.staging)" in out
    assert "--cw-allow-remote-cluster" in out
    assert "s3cret" not in out
    assert "about to load" not in out


def _part(prefix: str, late: list[float], fired: list[float], **counts: Any) -> dict[str, Any]:
    base = {"prefix": prefix, "submitted": 10, "submit_failed": 0, "expected_fires": 4,
            "received": len(late), "missing": 0, "not_yet_due": 0, "duplicates": 0,
            "early_fired": 0, "early_received": 0, "lateness_ms": late,
            "fired_lateness_ms": fired}
    return {**base, **counts}


def test_the_processes_figures_add_up(kit: Any) -> None:
    a = _part("a.", [10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0],
              first_submit_ms=1_000, last_submit_ms=3_000, offsets=[[5, 2], [3, 1]])
    b = _part("b.", [50.0, 60.0], [5.0, 6.0], missing=2, duplicates=1,
              first_submit_ms=2_000, last_submit_ms=6_000, offsets=[[-4, 3]],
              handler={"started": 2, "missing": 0, "not_yet_due": 0, "duplicates": 0,
                       "early": 0, "lateness_ms": [70.0, 80.0]})
    out = kit.support.summarize([a, b])
    assert (out["processes"], out["submitted"], out["expected_fires"], out["received"],
            out["missing"], out["duplicates"]) == (2, 20, 8, 6, 2, 1)
    assert out["submit_seconds"] == 5.0 and out["submitted_per_s"] == 4
    assert out["lateness_ms"]["received"] == {"n": 6, "p50": 30.0, "p95": 60.0, "p99": 60.0,
                                              "max": 60.0}
    assert out["lateness_ms"]["cw_fired_at"]["n"] == 6
    assert out["clock_offset_ms"] == {"last": [3, -4], "min": -4, "max": 5,
                                      "uncertainty_max": 3, "measurements": 3}
    assert out["handler_start"]["started"] == 2
    assert out["handler_start"]["lateness_ms"]["max"] == 80.0
    assert kit.support.summarize([])["submitted_per_s"] is None
