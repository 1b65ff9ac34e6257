"""Security settings: secrets only from the environment or files and never shown; TLS and SASL
options built for the drivers; replication maps; the HTTP bearer-token check."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import importlib.util
import io
import pickle
import ssl
import sys
from pathlib import Path
from types import ModuleType

import pytest
from chronowheel.bus.kafka import security_options as kafka_options
from chronowheel.cli import build_parser
from chronowheel.errors import ConfigError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.observe.http import HttpEndpoint
from chronowheel.schema import cql_statements
from chronowheel.security import bearer_allowed, tls_failure
from chronowheel.settings import Secret, Settings, env_name, secret_names
from chronowheel.store.cassandra import security_options as cassandra_options

REPO = Path(__file__).resolve().parents[2]
MARK = "pa55-MARKER-do-not-show"
SECRET_ENV = {env_name(name): f"{MARK}-{name}" for name in secret_names()}


def _load_secured() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "chronowheel_local_secured", REPO / "deploy" / "local" / "secured.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """A throwaway CA and server certificate, as the secured local stack makes them."""
    return _load_secured().ensure(tmp_path_factory.mktemp("pki"))


# --- secrets ---------------------------------------------------------------------------------


def test_every_secret_comes_from_its_variable_or_its_file(tmp_path: Path) -> None:
    s = Settings.from_env(SECRET_ENV)
    for name in secret_names():
        value = getattr(s, name)
        assert isinstance(value, Secret)
        assert value.reveal() == f"{MARK}-{name}"
    f = tmp_path / "pw"
    f.write_text("from-a-file\n")
    s = Settings.from_env({"CHRONOWHEEL_CASSANDRA_PASSWORD_FILE": str(f)})
    assert s.cassandra_password is not None
    assert s.cassandra_password.reveal() == "from-a-file"  # one trailing newline stripped
    assert Settings.from_env({}).kafka_sasl_password is None


def test_secret_errors_name_the_variables_and_the_file_never_the_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as both:
        Settings.from_env({"CHRONOWHEEL_KAFKA_SASL_PASSWORD": MARK,
                           "CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "x")})
    assert "CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE" in str(both.value)
    assert MARK not in str(both.value)
    with pytest.raises(ConfigError, match=r"cannot read .*missing"):
        Settings.from_env({"CHRONOWHEEL_HTTP_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        Settings.from_env({"CHRONOWHEEL_CASSANDRA_PASSWORD_FILE": str(tmp_path / "empty")})


def test_no_secret_in_repr_str_format_or_the_safe_view() -> None:
    s = Settings.from_env(SECRET_ENV)
    shown = [repr(s), str(s), f"{s}", repr(s.safe_view()), str(s.kafka_sasl_password),
             f"{s.cassandra_password}", repr(s.http_token)]
    for text in shown:
        assert MARK not in text
    assert s.safe_view()["kafka_sasl_password"] == "(set)"
    assert Settings().safe_view()["kafka_sasl_password"] == "(unset)"
    with pytest.raises(TypeError):
        pickle.dumps(s.kafka_sasl_password)
    copied = copy.deepcopy(s)  # dataclasses.asdict and friends deep-copy: that still works
    assert copied.kafka_sasl_password == s.kafka_sasl_password
    assert MARK not in repr(dataclasses.asdict(s))
    # Passed from Python code as a plain string, a secret is wrapped all the same.
    assert MARK not in repr(Settings(cassandra_password=MARK))
    assert isinstance(Settings(cassandra_password=MARK).cassandra_password, Secret)


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _all_parsers(child)
    return out


def test_no_command_has_a_secret_flag_and_no_help_shows_a_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in SECRET_ENV.items():
        monkeypatch.setenv(var, value)
    parsers = _all_parsers(build_parser())
    flags = [o for p in parsers for a in p._actions for o in a.option_strings]
    assert not [f for f in flags if "password" in f or "token" in f or "secret" in f]
    for p in parsers:
        assert MARK not in p.format_help(), p.prog
    node_help = next(p for p in parsers if p.prog.endswith(" node")).format_help()
    for var in ("CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE", "CHRONOWHEEL_CASSANDRA_PASSWORD_FILE",
                "CHRONOWHEEL_HTTP_TOKEN_FILE"):
        assert var in node_help  # named, so operators know where to put it


def test_every_connecting_command_takes_the_security_flags() -> None:
    parsers = {p.prog.split(" ", 1)[1]: p for p in _all_parsers(build_parser())[1:]
               if " " in p.prog}
    for command in ("node", "worker", "init", "submit", "status", "tail", "job show", "acl"):
        opts = {o for a in parsers[command]._actions for o in a.option_strings}
        assert "--kafka-security-protocol" in opts, command
        assert "--kafka-ssl-cafile" in opts, command
    for command in ("node", "worker", "init", "status"):
        opts = {o for a in parsers[command]._actions for o in a.option_strings}
        assert {"--cassandra-username", "--cassandra-ssl-cafile",
                "--cassandra-local-dc"} <= opts, command
    node = {o for a in parsers["node"]._actions for o in a.option_strings}
    assert "--http-host" in node


def test_booleans_and_protocols_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env({"CHRONOWHEEL_CASSANDRA_SSL": "yes"}).cassandra_ssl is True
    assert Settings.from_env(
        {"CHRONOWHEEL_KAFKA_SSL_CHECK_HOSTNAME": "false"}).kafka_ssl_check_hostname is False
    with pytest.raises(ConfigError, match="CHRONOWHEEL_CASSANDRA_SSL"):
        Settings.from_env({"CHRONOWHEEL_CASSANDRA_SSL": "perhaps"})
    with pytest.raises(ConfigError, match="kafka_security_protocol"):
        Settings(kafka_security_protocol="TLS")
    lower = Settings(kafka_security_protocol="sasl_ssl", kafka_sasl_mechanism="scram-sha-256")
    assert (lower.kafka_security_protocol, lower.kafka_sasl_mechanism) == (
        "SASL_SSL", "SCRAM-SHA-256")
    with pytest.raises(ConfigError, match="kafka_sasl_mechanism"):
        Settings(kafka_sasl_mechanism="GSSAPI")
    args = build_parser().parse_args(["node", "--kafka-ssl-check-hostname", "false"])
    assert args.kafka_ssl_check_hostname is False
    assert Settings().http_host == "127.0.0.1"


# --- replication -----------------------------------------------------------------------------


def test_a_plain_factor_is_simple_strategy_and_dc_pairs_network_topology() -> None:
    assert Settings(replication="3").cassandra_replication() == {"replication_factor": 3}
    assert Settings(replication=3).topic_replication == 3  # an int from Python code
    s = Settings(replication="dc1:3, dc2:2")
    assert s.cassandra_replication() == {"dc1": 3, "dc2": 2}
    assert s.topic_replication == 3
    simple = cql_statements("ks", 3)[0]
    assert "{'class': 'SimpleStrategy', 'replication_factor': 3}" in simple
    nts = cql_statements("ks", s.cassandra_replication())[0]
    assert nts.startswith("CREATE KEYSPACE IF NOT EXISTS ks")
    assert "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}" in nts
    for bad in ("0", "dc1", "dc1:x", "dc1:3,dc1:2", "d'c:3", "dc1:10", ""):
        with pytest.raises(ConfigError, match="replication"):
            Settings(replication=bad)


def test_init_takes_a_replication_map_from_the_command_line() -> None:
    args = build_parser().parse_args(["init", "--replication", "dc1:3,dc2:3"])
    assert args.replication == "dc1:3,dc2:3"


# --- driver options --------------------------------------------------------------------------


def test_plaintext_kafka_gets_no_tls_and_no_sasl() -> None:
    assert kafka_options(Settings()) == {"security_protocol": "PLAINTEXT"}


def test_sasl_ssl_kafka_options(pki: ModuleType) -> None:
    s = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-512",
                 kafka_sasl_username="node", kafka_sasl_password=MARK,
                 kafka_ssl_cafile=str(pki.ca))
    opts = kafka_options(s)
    assert opts["security_protocol"] == "SASL_SSL"
    assert (opts["sasl_mechanism"], opts["sasl_plain_username"],
            opts["sasl_plain_password"]) == ("SCRAM-SHA-512", "node", MARK)
    ctx = opts["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.check_hostname is True and ctx.verify_mode == ssl.CERT_REQUIRED
    assert kafka_options(s.replace(kafka_ssl_check_hostname=False))["ssl_context"] \
        .check_hostname is False


def test_incomplete_kafka_security_is_refused_with_the_setting_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CHRONOWHEEL_KAFKA_SASL_PASSWORD"):
        kafka_options(Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="u"))
    with pytest.raises(ConfigError, match="kafka_ssl_cafile: no such file"):
        kafka_options(Settings(kafka_security_protocol="SSL",
                               kafka_ssl_cafile=str(tmp_path / "nope.pem")))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="kafka_ssl_cafile"):
        kafka_options(Settings(kafka_security_protocol="SSL",
                               kafka_ssl_cafile=str(tmp_path / "junk.pem")))
    with pytest.raises(ConfigError, match="use SSL or SASL_SSL"):
        kafka_options(Settings(kafka_ssl_cafile=str(tmp_path / "junk.pem")))


def test_a_client_key_with_a_wrong_passphrase_is_refused_without_showing_it(
        pki: ModuleType, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = pki.server_pem.read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    encrypted = key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"right"))
    (tmp_path / "client.key").write_bytes(encrypted)
    base = Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=str(pki.ca),
                    kafka_ssl_certfile=str(pki.server_pem),
                    kafka_ssl_keyfile=str(tmp_path / "client.key"))
    assert kafka_options(base.replace(kafka_ssl_key_password="right"))["ssl_context"]
    with pytest.raises(ConfigError) as err:
        kafka_options(base.replace(kafka_ssl_key_password=MARK))
    assert "cannot load the client certificate" in str(err.value)
    assert MARK not in str(err.value)


def test_cassandra_options(pki: ModuleType) -> None:
    assert cassandra_options(Settings()) == {}
    opts = cassandra_options(Settings(cassandra_username="node", cassandra_password=MARK,
                                      cassandra_ssl_cafile=str(pki.ca)))
    assert opts["auth_provider"].username == "node"
    assert opts["auth_provider"].password == MARK
    assert opts["ssl_context"].check_hostname is True
    with pytest.raises(ConfigError, match="CHRONOWHEEL_CASSANDRA_PASSWORD"):
        cassandra_options(Settings(cassandra_username="node"))
    assert "ssl_context" in cassandra_options(Settings(cassandra_ssl=True))  # system CAs


def test_tls_failures_are_explained() -> None:
    err = ssl.SSLCertVerificationError(1, "certificate verify failed")
    err.verify_message = "self-signed certificate in certificate chain"
    assert "not trusted" in (tls_failure(err) or "")
    wrapped = PermissionError(1, "Last error: [SSL: CERTIFICATE_VERIFY_FAILED] certificate "
                                 "verify failed: IP address mismatch (_ssl.c:1006)")
    assert "does not name this host" in (tls_failure(wrapped) or "")
    assert tls_failure(ConnectionRefusedError()) is None


# --- HTTP ------------------------------------------------------------------------------------


def test_bearer_check() -> None:
    token = Secret("s3cret")
    assert bearer_allowed("/metrics", {}, None)
    assert bearer_allowed("/healthz?verbose=1", {}, None)
    assert not bearer_allowed("/admin", {}, None)  # no token configured: nothing else served
    assert not bearer_allowed("/admin", {}, token)
    assert not bearer_allowed("/admin", {"authorization": "Bearer wrong"}, token)
    assert not bearer_allowed("/admin", {"authorization": "Basic s3cret"}, token)
    assert not bearer_allowed("/metricsx", {}, token)
    assert bearer_allowed("/admin", {"authorization": "Bearer s3cret"}, token)
    assert bearer_allowed("/admin", {"authorization": "bearer  s3cret "}, token)


async def _get(port: int, path: str, headers: str = "") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_the_http_endpoint_needs_the_token_beyond_metrics_and_healthz() -> None:
    endpoint = HttpEndpoint(NodeMetrics().registry, lambda: (True, {"ok": True}), 0,
                            token=Secret("tok-123"))
    await endpoint.start()
    try:
        assert (await _get(endpoint.port, "/metrics"))[0] == 200
        assert (await _get(endpoint.port, "/healthz"))[0] == 200
        status, body = await _get(endpoint.port, "/debug/shards")
        assert status == 401 and b"tok-123" not in body
        assert (await _get(endpoint.port, "/debug/shards",
                           "Authorization: Bearer nope\r\n"))[0] == 401
        # Authorized, and then the path does not exist.
        assert (await _get(endpoint.port, "/debug/shards",
                           "Authorization: Bearer tok-123\r\n"))[0] == 404
    finally:
        await endpoint.stop()


def test_the_local_stack_material_is_private(pki: ModuleType) -> None:
    for path in pki.folder.iterdir():
        assert path.stat().st_mode & 0o077 == 0, path
    assert io.BytesIO(pki.ca.read_bytes()).read(27) == b"-----BEGIN CERTIFICATE-----"


def test_the_secrets_note_keeps_the_description_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    parsers = {p.prog: p for p in _all_parsers(build_parser())}
    text = parsers["chronowheel node"].format_help()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "\n  CHRONOWHEEL_HTTP_TOKEN or CHRONOWHEEL_HTTP_TOKEN_FILE\n" in text + "\n"
