"""Against the secured local stack: Kafka SASL_SSL + SCRAM + ACLs, Cassandra TLS + passwords.

- a node, a worker and the Python client, each as its own principal, work end to end: every
  job fires once, never early, read_committed, and the worker handles each once; when the
  node's ACL on `<ns>.fired` is revoked it stops publishing and says why;
- SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN each authenticate, and mutual TLS works with an
  encrypted client key (and without a client certificate fails clearly);
- a wrong password, an untrusted certificate and plaintext against a TLS port each fail fast
  with one clear message naming the endpoint and the cause;
- the submitter principal may write `<ns>.submit` but is refused `<ns>.fired` and
  `<ns>.state`, and the refusal says who, what and where;
- no secret appears in the processes' logs, their command lines (`ps`), `--help`, `/metrics`,
  `/healthz` or `status`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from chronowheel.acl import KafkaAcl, remove_kafka_acls
from chronowheel.bus.kafka import KafkaAccessError, open_admin, plain_producer
from chronowheel.bus.kafka import reader as kafka_reader
from chronowheel.client import SchedulerClient
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraAccessError, connect

from testkit.fleet import until as _wait
from tests.integration.worker_handlers import read_events
from tests.security.support import REPO, Secured, chronowheel_cli, drop_namespace

pytestmark = [pytest.mark.security, pytest.mark.integration]

JOBS = 12


def _ps_lines() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args", "--no-headers", "-ww"], capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


def _assert_no_secret(secured: Secured, where: str, text: str) -> None:
    assert len(secured.all_secrets()) >= 6  # the check itself must look at something
    for value in secured.all_secrets():
        assert value not in text, f"a password appears in {where}"


class Child:
    """A `chronowheel` command run as a child process, its output in a file."""

    def __init__(self, secured: Secured, args: list[str], log: Path, kafka_user: str,
                 cassandra_user: str | None, **extra: str) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chronowheel", *args],
            env=secured.child_env(kafka_user, cassandra_user, **extra), cwd=REPO,
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()


async def _read_fired(secured: Secured, ns: str, want: int, timeout_s: float) -> list[Any]:
    """Everything committed to <ns>.fired, read as the worker principal (read_committed)."""
    settings = secured.settings(ns, "worker")
    consumer = kafka_reader(settings)
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(settings.fired_topic, p) for p in range(2)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend(records)
        # a little longer: a duplicate would arrive now
        batch = await consumer.getmany(timeout_ms=1500)
        for records in batch.values():
            out.extend(records)
    finally:
        await consumer.stop()
    return out


async def test_node_worker_and_client_end_to_end_over_sasl_ssl_and_cassandra_tls(
        secured: Secured, secured_ns: str, tmp_path: Path, children: list[Child]) -> None:
    ns = secured_ns
    calls = tmp_path / "calls.jsonl"
    node = Child(secured, ["node", "--namespace", ns, "--http-port", "0"],
                 tmp_path / "node.log", "node", "node", CHRONOWHEEL_HTTP_TOKEN_FILE=
                 secured.password_files["ops"])
    children.append(node)
    worker = Child(secured, ["worker", "--namespace", ns, "--topic", f"{ns}.fired",
                             "--handler", "tests.integration.worker_handlers:record"],
                   tmp_path / "worker.log", "worker", "worker",
                   CHRONOWHEEL_TEST_LOG=str(calls))
    children.append(worker)
    port_re = re.compile(r"serving /metrics and /healthz on http://127\.0\.0\.1:(\d+)")
    await _wait(lambda: port_re.search(node.text()) or node.proc.poll() is not None, 60,
                "the node's HTTP endpoint")
    assert node.proc.poll() is None, node.text()
    match = port_re.search(node.text())
    assert match is not None
    http_port = int(match.group(1))

    # The client as the submitter principal: it may write <ns>.submit.
    start = int(time.time() * 1000) + 4000
    due = {f"job-{i}": start + 150 * i for i in range(JOBS)}
    async with SchedulerClient(secured.settings(ns, "submitter")) as client:
        for job_id, at in due.items():
            await client.schedule(job_id, at, payload={"n": job_id})

    records = await _read_fired(secured, ns, JOBS, 90)
    assert node.proc.poll() is None, node.text()
    fired: dict[str, list[tuple[int, int]]] = {}
    for rec in records:
        headers = {k: v.decode() for k, v in rec.headers}
        fired.setdefault(headers["cw-job-id"], []).append(
            (int(headers["cw-scheduled-at"]), int(headers["cw-fired-at"])))
    assert sorted(fired) == sorted(due), node.text()[-3000:]
    for job_id, got in fired.items():
        assert len(got) == 1, f"{job_id} fired {len(got)} times"
        scheduled, fired_at = got[0]
        assert scheduled == due[job_id]
        assert fired_at >= scheduled, f"{job_id} fired {scheduled - fired_at} ms early"

    # The worker (its own principal, Cassandra role `worker`) handles each once.
    def handled() -> list[dict[str, Any]]:
        return read_events(calls)

    await _wait(lambda: len(handled()) >= JOBS or worker.proc.poll() is not None, 60,
                "the worker's handlings")
    occurrences = [c["occurrence"] for c in handled()]
    assert sorted(occurrences) == sorted(f"{j}@{at}" for j, at in due.items()), worker.text()
    # Its role may read the namespace's record (the keyspace's owner, checked at its start).
    assert "owner not checked" not in worker.text(), worker.text()

    # /metrics and /healthz are served without a token, and show no secret; anything else
    # needs the bearer token.
    base = f"http://127.0.0.1:{http_port}"
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    health = urllib.request.urlopen(f"{base}/healthz", timeout=10).read().decode()
    assert "chronowheel_" in metrics
    _assert_no_secret(secured, "/metrics", metrics)
    _assert_no_secret(secured, "/healthz", health)
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{base}/debug", timeout=10)
    assert denied.value.code == 401

    # `status` as the administrator shows the shards, and no secret.
    status = chronowheel_cli(secured, ["status", "--namespace", ns], "admin", "admin")
    assert status.returncode == 0, status.stderr
    _assert_no_secret(secured, "status", status.stdout + status.stderr)

    # No secret in the processes' command lines, logs or --help.
    ps = "\n".join(_ps_lines())
    assert str(node.proc.pid) in ps and str(worker.proc.pid) in ps
    _assert_no_secret(secured, "ps output", ps)

    # Revoke the node's right to write <ns>.fired: it stops publishing and says why.
    admin = await open_admin(secured.settings(ns, "admin"))
    try:
        revoked = KafkaAcl("node", "User:node", "TOPIC", f"{ns}.fired", "LITERAL", "WRITE")
        assert await remove_kafka_acls(admin, [revoked]) == 1
    finally:
        await admin.close()
    late_at = int(time.time() * 1000) + 1000
    async with SchedulerClient(secured.settings(ns, "submitter")) as client:
        await client.schedule("after-revoke", late_at)
    await _wait(lambda: node.proc.poll() is not None, 60, "the node to stop")
    assert node.proc.returncode != 0
    last = node.text().strip().splitlines()[-1]
    assert f"user 'node' may not write topic {ns}.fired" in last, last
    assert "chronowheel acl" in last
    after = await _read_fired(secured, ns, JOBS + 1, 3)
    assert "after-revoke" not in {dict(r.headers)["cw-job-id"].decode() for r in after}

    for child in children:
        child.stop()
        _assert_no_secret(secured, f"the log of {child.log.name}", child.text())
    for command in ("node", "worker", "init", "acl", "status"):
        help_out = chronowheel_cli(secured, [command, "--help"], "node", "node")
        assert help_out.returncode == 0
        _assert_no_secret(secured, f"{command} --help", help_out.stdout)


# --- failing fast and clearly ----------------------------------------------------------------


def _other_ca(tmp_path: Path) -> str:
    """A CA that signed nothing the servers present."""
    spec = importlib.util.spec_from_file_location("chronowheel_local_secured_other",
                                                  REPO / "deploy" / "local" / "secured.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return str(module.ensure(tmp_path / "other-pki").ca)


async def _kafka_error(secured: Secured, **overrides: Any) -> tuple[str, float]:
    settings = secured.settings("x", "node", **overrides)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        admin = await open_admin(settings)
        await admin.close()
    return str(err.value), time.monotonic() - t0


async def _cassandra_error(secured: Secured, **overrides: Any) -> tuple[str, float]:
    settings = secured.settings("x", None, "node", **overrides)
    t0 = time.monotonic()
    with pytest.raises(CassandraAccessError) as err:
        cluster, _session = await asyncio.to_thread(connect, settings)
        cluster.shutdown()
    return str(err.value), time.monotonic() - t0


async def test_wrong_password_untrusted_certificate_and_plaintext_fail_fast_and_clearly(
        secured: Secured, tmp_path: Path) -> None:
    other_ca = _other_ca(tmp_path)
    kafka_cases = {
        "wrong password": ({"kafka_sasl_password": "not-the-password"},
                           "authentication of user 'node' was refused"),
        "untrusted certificate": ({"kafka_ssl_cafile": other_ca},
                                  "certificate is not trusted"),
        "plaintext to TLS": ({"kafka_security_protocol": "PLAINTEXT", "kafka_ssl_cafile": ""},
                             "the port speaks TLS"),
    }
    for case, (overrides, cause) in kafka_cases.items():
        message, took = await _kafka_error(secured, **overrides)
        assert f"Kafka at {secured.kafka}" in message, (case, message)
        assert cause in message, (case, message)
        assert "not-the-password" not in message
        assert took < 15, f"{case}: took {took:.1f}s"
    cassandra_cases = {
        "wrong password": ({"cassandra_password": "not-the-password"},
                           "credentials of user 'node' were refused"),
        "untrusted certificate": ({"cassandra_ssl_cafile": other_ca},
                                  "certificate is not trusted"),
        "plaintext to TLS": ({"cassandra_ssl_cafile": "", "cassandra_ssl": False},
                             "the port speaks TLS"),
    }
    for case, (overrides, cause) in cassandra_cases.items():
        message, took = await _cassandra_error(secured, **overrides)
        assert f"Cassandra at {secured.cassandra}" in message, (case, message)
        assert cause in message, (case, message)
        assert "not-the-password" not in message
        assert took < 15, f"{case}: took {took:.1f}s"


def test_a_command_with_a_wrong_password_exits_with_one_clear_line(
        secured: Secured, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("definitely-wrong\n")
    env = secured.child_env("node", "node",
                            CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE=str(wrong))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "chronowheel", "tail", "x.fired",
                          "--namespace", "x", "--max", "1", "--timeout", "5"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL, check=False)
    took = time.monotonic() - t0
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert f"Kafka at {secured.kafka}" in lines[0] and "was refused" in lines[0]
    assert "definitely-wrong" not in out.stderr + out.stdout
    assert took < 30


# --- mechanisms and mutual TLS --------------------------------------------------------------


async def test_scram_256_scram_512_plain_and_mutual_tls_each_connect(
        secured: Secured) -> None:
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        admin = await open_admin(secured.settings("x", "admin", kafka_sasl_mechanism=mechanism))
        try:
            assert isinstance(await admin.list_topics(), list)
        finally:
            await admin.close()
    # SSL with a client certificate whose key is encrypted (passphrase from a _FILE variable).
    settings = Settings.from_env(secured.mtls_env(), namespace="x")
    assert settings.kafka_ssl_key_password is not None
    admin = await open_admin(settings)
    try:
        assert isinstance(await admin.list_topics(), list)
    finally:
        await admin.close()
    # The same listener refuses a client without a certificate, and says so.
    t0 = time.monotonic()
    with pytest.raises(KafkaAccessError) as err:
        await open_admin(Settings.from_env(secured.mtls_env(with_certificate=False),
                                           namespace="x"))
    assert f"Kafka at {secured.kafka_mtls}" in str(err.value)
    assert "requires a client certificate" in str(err.value)
    assert time.monotonic() - t0 < 15


# --- authorization ---------------------------------------------------------------------------


async def test_the_submitter_may_only_write_the_submit_topic(
        secured: Secured, secured_ns: str) -> None:
    ns = secured_ns
    settings = secured.settings(ns, "submitter")
    producer = plain_producer(settings)
    await producer.start()
    try:
        # allowed (a node would reject the bad command into <ns>.rejected)
        await producer.send_and_wait(settings.submit_topic, b"not json", key=b"k")
        for topic in (settings.fired_topic, settings.state_topic):
            with pytest.raises(KafkaAccessError) as err:
                await producer.send_and_wait(topic, b"forged", key=b"k")
            message = str(err.value)
            assert f"user 'submitter' may not write topic {topic}" in message
            assert secured.kafka in message and "chronowheel acl" in message
    finally:
        await producer.stop()


# --- replication per data centre -------------------------------------------------------------


def test_init_with_a_replication_map_makes_a_network_topology_keyspace(
        secured: Secured) -> None:
    """`--replication <dc>:1` on the one-DC local cluster, with its DC as the local one."""
    ns = "r" + secrets.token_hex(5)
    out = chronowheel_cli(secured, ["init", "--namespace", ns, "--shards", "1",
                                    "--replication", "datacenter1:1",
                                    "--cassandra-local-dc", "datacenter1"], "admin", "admin")
    try:
        assert out.returncode == 0, out.stderr
        settings = secured.settings(ns, "admin", "admin", cassandra_local_dc="datacenter1")
        cluster, session = connect(settings)
        try:
            row = session.execute("SELECT replication FROM system_schema.keyspaces WHERE "
                                  "keyspace_name = %s", (settings.keyspace,)).one()
        finally:
            cluster.shutdown()
        assert row is not None
        assert row.replication["class"].endswith("NetworkTopologyStrategy")
        assert row.replication["datacenter1"] == "1"
    finally:
        drop_namespace(secured, ns)
