"""The local stack's pieces that need no server: config templates, CLI wiring, helpers."""

from __future__ import annotations

import argparse
import importlib.util
import re
import string
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from chronowheel.cli import stack as stack_cli
from chronowheel.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "deploy" / "local"


def load_stack_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chronowheel_local_stack", LOCAL / "stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


stack_script = load_stack_script()


def render(template: Path, values: dict[str, str]) -> str:
    return string.Template(template.read_text()).substitute(values)


def test_cassandra_yaml_renders_with_the_mandatory_keys() -> None:
    text = render(
        LOCAL / "cassandra" / "cassandra.yaml",
        {"listen_address": "127.0.0.1", "storage_port": "7000", "native_port": "9042"},
    )
    keys = {line.split(":", 1)[0] for line in text.splitlines() if line and line[0].isalpha()}
    assert {
        "partitioner",
        "commitlog_sync",
        "commitlog_sync_period",
        "seed_provider",
        "endpoint_snitch",
        "listen_address",
        "rpc_address",
        "native_transport_port",
        "num_tokens",
        "auto_snapshot",
    } <= keys
    assert '- seeds: "127.0.0.1:7000"' in text
    assert "native_transport_port: 9042" in text
    assert "auto_snapshot: false" in text


def test_kafka_properties_render_a_single_node_kraft_combined_server(tmp_path: Path) -> None:
    text = render(
        LOCAL / "kafka" / "server.properties",
        {
            "host": "127.0.0.1",
            "broker_port": "9092",
            "controller_port": "9093",
            "data_dir": str(tmp_path),
        },
    )
    props = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["controller.quorum.voters"] == f"{props['node.id']}@127.0.0.1:9093"
    assert props["log.dirs"] == str(tmp_path)
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert props[key] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_poms_pin_the_server_versions() -> None:
    cassandra = (LOCAL / "cassandra" / "pom.xml").read_text()
    kafka = (LOCAL / "kafka" / "pom.xml").read_text()
    assert "<cassandra.version>5.0." in cassandra
    assert "<kafka.version>4." in kafka
    assert "log4j-slf4j2-impl" in kafka


def test_pick_rejects_unknown_servers(tmp_path: Path) -> None:
    paths = stack_script.Paths(state=tmp_path / "state", cache=tmp_path / "cache")
    all_servers = stack_script.servers(paths)
    assert [s.name for s in stack_script.pick(all_servers, [])] == ["cassandra", "kafka"]
    assert [s.name for s in stack_script.pick(all_servers, ["kafka", "kafka"])] == ["kafka"]
    with pytest.raises(stack_script.StackError, match="unknown server 'zookeeper'"):
        stack_script.pick(all_servers, ["zookeeper"])


def test_tail_reads_only_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "system.log"
    log.write_text("old 1\nold 2\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("new 1\nnew 2\nnew 3\n")
    assert stack_script.tail(log, 2) == ["new 2", "new 3"]
    assert stack_script.tail(log, 10, since=offset) == ["new 1", "new 2", "new 3"]
    assert stack_script.tail(tmp_path / "absent.log", 5) == []


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="chronowheel")
    stack_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_passes_the_action_servers_and_state_dir_to_the_script(tmp_path: Path) -> None:
    args = parse(["stack", "up", "kafka", "--timeout", "30", "--state-dir", str(tmp_path)])
    cmd = stack_cli.stack_command(args)
    assert cmd[0] == sys.executable
    assert Path(cmd[1]) == LOCAL / "stack.py"
    assert cmd[2:] == ["--state-dir", str(tmp_path), "up", "kafka", "--timeout", "30.0"]


def test_cli_state_dir_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHRONOWHEEL_STATE_DIR", str(tmp_path / "elsewhere"))
    cmd = stack_cli.stack_command(parse(["stack", "down", "--json"]))
    assert cmd[2:] == ["--state-dir", str(tmp_path / "elsewhere"), "--json", "down"]
    cmd = stack_cli.stack_command(parse(["stack", "logs", "cassandra", "-n", "5", "-f"]))
    assert cmd[4:] == ["logs", "cassandra", "--lines", "5", "--follow"]


def test_cli_finds_the_script_of_the_checkout_it_runs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(stack_cli.SCRIPT_ENV, raising=False)
    assert stack_cli.stack_script(REPO / "services" / "chronowheel") == LOCAL / "stack.py"
    # Outside a checkout (an installed wheel): a clear refusal, not a guess.
    with pytest.raises(ConfigError, match=r"not inside one.*`./run stack`"):
        stack_cli.stack_script(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="installed package does not include the local stack"):
        stack_cli.stack_command(parse(["stack", "status"]))
    monkeypatch.setenv(stack_cli.SCRIPT_ENV, str(LOCAL / "stack.py"))
    assert Path(stack_cli.stack_command(parse(["stack", "status"]))[1]) == LOCAL / "stack.py"
    monkeypatch.setenv(stack_cli.SCRIPT_ENV, str(tmp_path / "none.py"))
    with pytest.raises(ConfigError, match="no file at"):
        stack_cli.stack_script()


def pom_property(pom: Path, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    assert match, f"{pom} has no <{name}>"
    return match.group(1)


def test_docker_compose_runs_the_same_versions_and_settings() -> None:
    compose = (REPO / "deploy" / "docker-compose.yml").read_text()
    cassandra = pom_property(LOCAL / "cassandra" / "pom.xml", "cassandra.version")
    kafka = pom_property(LOCAL / "kafka" / "pom.xml", "kafka.version")
    assert f"image: cassandra:{cassandra}\n" in compose
    assert f"image: apache/kafka:{kafka}\n" in compose

    # Every Cassandra setting of the local yaml below its "small footprint" heading (and the
    # compatibility mode) is passed to the container as a system property with the same value.
    yaml_text = (LOCAL / "cassandra" / "cassandra.yaml").read_text()
    tuned = yaml_text.split("# --- small footprint", 1)[1].split("# ---", 1)[0]
    settings = dict(
        line.split(": ", 1) for line in tuned.splitlines() if line and line[0].isalpha()
    )
    settings["storage_compatibility_mode"] = "NONE"
    for key, value in settings.items():
        assert f"-Dcassandra.settings.{key}={value}\n" in compose, key

    # Every Kafka property is set in the container's environment with the same value, except
    # those naming local addresses and folders.
    props = (LOCAL / "kafka" / "server.properties").read_text()
    for line in props.splitlines():
        if not line or line.startswith("#") or "${" in line:
            continue
        key, value = line.split("=", 1)
        env = "KAFKA_" + key.upper().replace(".", "_")
        assert re.search(rf"^\s+{env}: \"?{re.escape(value)}\"?$", compose, re.M), key


def test_the_secured_profile_uses_other_ports_and_its_own_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = stack_script.servers(stack_script.Paths(state=tmp_path, cache=tmp_path))
    secured_paths = stack_script.Paths(state=tmp_path / "s", cache=tmp_path,
                                       profile=stack_script.SECURED)
    secured = stack_script.servers(secured_paths)
    plain_ports = {p for s in plain.values() for p in (s.port, *s.extra_ports)}
    secured_ports = {p for s in secured.values() for p in (s.port, *s.extra_ports)}
    assert plain_ports == {9042, 7000, 9092, 9093}
    assert secured_ports == {9142, 7100, 9094, 9095, 9096}
    monkeypatch.setenv("CHRONOWHEEL_STATE_DIR", str(tmp_path / "st"))
    assert stack_script.default_state_dir(stack_script.SECURED) == tmp_path / "st-secured"
    assert stack_script.default_state_dir(stack_script.PLAIN) == tmp_path / "st"

    cmd = stack_cli.stack_command(parse(["stack", "up", "--profile", "secured"]))
    assert cmd[2:6] == ["--profile", "secured", "--state-dir", str(tmp_path / "st-secured")]
    monkeypatch.setenv("CHRONOWHEEL_STACK_PROFILE", "secured")
    assert stack_cli.stack_command(parse(["stack", "down"]))[2:4] == ["--profile", "secured"]


def test_the_secured_kafka_properties_replace_the_listeners_and_authorize(tmp_path: Path) -> None:
    values = {"host": "127.0.0.1", "broker_port": "9094", "controller_port": "9095",
              "data_dir": str(tmp_path), "admin_password": "pw", "keystore": "/k.pem",
              "truststore": "/t.pem", "mtls_port": "9096", "plain_users": 'user_admin="pw"'}
    text = render(LOCAL / "kafka" / "server.properties", values) + "\n" + render(
        LOCAL / "kafka" / "secured.properties", values)
    props: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            props[key] = value  # the last one wins, as in java.util.Properties
    assert props["listeners"] == (
        "SASL_SSL://127.0.0.1:9094,SSL://127.0.0.1:9096,CONTROLLER://127.0.0.1:9095")
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:9094,SSL://127.0.0.1:9096"
    assert props["listener.name.ssl.ssl.client.auth"] == "required"
    assert "PLAINTEXT://127.0.0.1:9094" not in props["listeners"]
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert "SCRAM-SHA-512" in props["sasl.enabled.mechanisms"]


def test_the_cluster_profile_runs_three_of_each_beside_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = stack_script.Paths(state=tmp_path / "c", cache=tmp_path,
                               profile=stack_script.CLUSTER)
    cluster = stack_script.servers(paths)
    assert list(cluster) == ["cassandra-1", "cassandra-2", "cassandra-3",
                             "kafka-1", "kafka-2", "kafka-3"]
    assert [s.address for s in cluster.values()] == [
        "127.0.0.2:9042", "127.0.0.3:9042", "127.0.0.4:9042",
        "127.0.0.1:9192", "127.0.0.1:9193", "127.0.0.1:9194"]
    endpoints = {(s.host, p) for s in cluster.values() for p in (s.port, *s.extra_ports)}
    assert len(endpoints) == 12
    for other in (stack_script.PLAIN, stack_script.SECURED):
        taken = {(s.host, p) for s in stack_script.servers(
            stack_script.Paths(state=tmp_path, cache=tmp_path, profile=other)).values()
            for p in (s.port, *s.extra_ports)}
        assert not endpoints & taken, other.name
    # A kind names all its nodes; one node can be named alone.
    assert [s.name for s in stack_script.pick(cluster, ["cassandra"])] == [
        "cassandra-1", "cassandra-2", "cassandra-3"]
    assert [s.name for s in stack_script.pick(cluster, ["kafka-2", "kafka"])] == [
        "kafka-2", "kafka-1", "kafka-3"]
    assert {s.kind for s in cluster.values()} == {"cassandra", "kafka"}
    assert stack_script.CLUSTER.cassandra_address() == (
        "127.0.0.2:9042,127.0.0.3:9042,127.0.0.4:9042")
    monkeypatch.setenv("CHRONOWHEEL_STATE_DIR", str(tmp_path / "st"))
    assert stack_script.default_state_dir(stack_script.CLUSTER) == tmp_path / "st-cluster"
    cmd = stack_cli.stack_command(parse(["stack", "up", "--profile", "cluster", "kafka-1"]))
    assert cmd[2:] == ["--profile", "cluster", "--state-dir", str(tmp_path / "st-cluster"),
                       "up", "kafka-1"]


def test_the_cluster_cassandra_yaml_makes_one_ring_of_fixed_tokens(tmp_path: Path) -> None:
    paths = stack_script.Paths(state=tmp_path, cache=tmp_path, profile=stack_script.CLUSTER)
    tokens = []
    for srv in stack_script.pick(stack_script.servers(paths), ["cassandra"]):
        yaml = tmp_path / f"{srv.name}.yaml"
        srv.render(LOCAL / "cassandra" / "cassandra.yaml", yaml,
                   {"listen_address": srv.host, "storage_port": "7000", "native_port": "9042"})
        srv.cluster_yaml(yaml)
        text = yaml.read_text()
        assert f"listen_address: {srv.host}" in text
        assert '- seeds: "127.0.0.2:7000,127.0.0.3:7000,127.0.0.4:7000"' in text
        assert "cluster_name: chronowheel-cluster" in text
        assert re.search(r"^auto_bootstrap: false$", text, re.M)
        tokens.append(int(re.search(r"^initial_token: (-?\d+)$", text, re.M).group(1)))
    assert len(set(tokens)) == 3
    assert all(-(2**63) <= t < 2**63 for t in tokens)


def test_a_cluster_cassandra_node_pulls_a_missed_schema_change_after_a_second(
        tmp_path: Path) -> None:
    cluster = stack_script.Paths(state=tmp_path / "c", cache=tmp_path, profile=stack_script.CLUSTER)
    plain = stack_script.Paths(state=tmp_path / "p", cache=tmp_path, profile=stack_script.PLAIN)
    for srv in stack_script.pick(stack_script.servers(cluster), ["cassandra"]):
        srv.conf.mkdir(parents=True)
        assert "-Dcassandra.migration_delay_ms=1000" in srv.prepare("/jdk/bin/java", "cp")
    single = stack_script.servers(plain)["cassandra"]
    single.conf.mkdir(parents=True)
    assert not [f for f in single.prepare("/jdk/bin/java", "cp") if "migration_delay" in f]


def test_the_cluster_kafka_properties_replicate_everything_three_times(tmp_path: Path) -> None:
    values = {"host": "127.0.0.1", "broker_port": "9193", "controller_port": "9293",
              "data_dir": str(tmp_path), "node_id": "2",
              "voters": "1@127.0.0.1:9292,2@127.0.0.1:9293,3@127.0.0.1:9294"}
    text = render(LOCAL / "kafka" / "server.properties", values) + "\n" + render(
        LOCAL / "kafka" / "cluster.properties", values)
    props: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            props[key] = value  # the last one wins, as in java.util.Properties
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"].count("@") == 3
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9193,CONTROLLER://127.0.0.1:9293"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    for key in ("min.insync.replicas", "transaction.state.log.min.isr"):
        assert props[key] == "2", key
    assert props["unclean.leader.election.enable"] == "false"


@pytest.mark.skipif(not Path("/proc/self/timerslack_ns").exists(),
                    reason="needs Linux's /proc/<pid>/timerslack_ns")
def test_the_timer_slack_wrapper_sets_the_slack_and_becomes_the_program() -> None:
    import subprocess
    out = subprocess.run(
        [sys.executable, "-c", stack_script.EXEC_WITH_TIMER_SLACK, "700000",
         "/bin/sh", "-c", 'echo "$$ $(cat /proc/self/timerslack_ns)"'],
        capture_output=True, text=True, check=True, timeout=30)
    # The shell ran with the slack, and so did the child it started (inherited).
    assert out.stdout.split()[1] == "700000"


def test_cassandra_starts_under_the_timer_slack_wrapper_unless_told_not_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = stack_script.Paths(state=tmp_path, cache=tmp_path, profile=stack_script.PLAIN)
    servers = stack_script.servers(paths)
    cassandra, kafka = servers["cassandra"], servers["kafka"]
    monkeypatch.delenv(stack_script.CASSANDRA_TIMER_SLACK_ENV, raising=False)
    assert kafka.launcher("/jdk/bin/java") == ["/jdk/bin/java"]
    if sys.platform.startswith("linux"):
        assert cassandra.launcher("/jdk/bin/java") == [
            sys.executable, "-c", stack_script.EXEC_WITH_TIMER_SLACK, "1000000", "/jdk/bin/java"]
    monkeypatch.setenv(stack_script.CASSANDRA_TIMER_SLACK_ENV, "0")
    assert cassandra.launcher("/jdk/bin/java") == ["/jdk/bin/java"]
    for bad in ("1ms", "-5", "2000000"):
        monkeypatch.setenv(stack_script.CASSANDRA_TIMER_SLACK_ENV, bad)
        with pytest.raises(stack_script.StackError,
                           match=r"CHRONOWHEEL_CASSANDRA_TIMER_SLACK_US=.*0 .*1000000"):
            cassandra.launcher("/jdk/bin/java")


def test_up_refuses_a_bad_timer_slack_before_starting_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = stack_script.Paths(state=tmp_path, cache=tmp_path, profile=stack_script.PLAIN)
    monkeypatch.setenv(stack_script.CASSANDRA_TIMER_SLACK_ENV, "fast")
    with pytest.raises(stack_script.StackError, match="CHRONOWHEEL_CASSANDRA_TIMER_SLACK_US"):
        stack_script.cmd_up(paths, [], timeout=1)
    assert not any(tmp_path.iterdir())  # no server folder, pid file or lock was made


def test_a_server_kinds_class_archive_is_named_after_the_jdk_and_each_jar(tmp_path: Path) -> None:
    java, jar = tmp_path / "bin" / "java", tmp_path / "a.jar"
    java.parent.mkdir()
    java.write_text("jvm")
    jar.write_text("classes")
    classpath = f"{jar}{':'}{tmp_path / 'b.jar'}"
    first = stack_script.class_archive_path(tmp_path, "kafka", str(java), classpath)
    assert first == stack_script.class_archive_path(tmp_path, "kafka", str(java), classpath)
    assert first.parent == tmp_path / "cds" and first.name.startswith("kafka-")
    assert first != stack_script.class_archive_path(tmp_path, "cassandra", str(java), classpath)
    jar.write_text("other classes")  # a jar the JVM would no longer accept the archive for
    second = stack_script.class_archive_path(tmp_path, "kafka", str(java), classpath)
    assert second != first
    (tmp_path / "lib" / "server").mkdir(parents=True)  # <jdk>/lib/server beside <jdk>/bin
    (tmp_path / "lib" / "server" / "libjvm.so").write_text("another build of the JVM")
    assert stack_script.class_archive_path(tmp_path, "kafka", str(java), classpath) != second


def _server(tmp_path: Path, name: str = "kafka",
            profile: str = "PLAIN") -> tuple[Any, str, str]:
    paths = stack_script.Paths(state=tmp_path / "state", cache=tmp_path / "cache",
                               profile=getattr(stack_script, profile))
    server = stack_script.servers(paths)[name]
    server.home.mkdir(parents=True)
    jar = tmp_path / "k.jar"
    jar.write_text("classes")
    return server, "/jdk/bin/java", str(jar)


def _pending(flags: list[str]) -> Path:
    flag, quiet = flags
    assert flag.startswith("-XX:ArchiveClassesAtExit=") and quiet == "-Xlog:cds=error"
    return Path(flag.split("=", 1)[1])


@pytest.fixture
def jvm_checks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, Path]]:
    """Stands in for the JVM that checks an archive before it is kept: takes every one whose
    content does not say `refused`."""
    checked: list[tuple[str, str, Path]] = []

    def refusal(java: str, classpath: str, archive: Path) -> str | None:
        checked.append((java, classpath, archive))
        return "exit 1: refused" if b"refused" in archive.read_bytes() else None

    monkeypatch.setattr(stack_script, "archive_refusal", refusal)
    monkeypatch.delenv(stack_script.CLASS_SHARING_ENV, raising=False)
    return checked


def test_the_first_start_writes_the_archive_and_a_graceful_stop_puts_it_in_place(
        tmp_path: Path, jvm_checks: list[tuple[str, str, Path]]) -> None:
    kafka, java, classpath = _server(tmp_path)
    archive = kafka.class_archive(java, classpath)
    pending = _pending(kafka.class_sharing_flags(java, classpath))
    assert pending.parent == archive.parent and pending != archive
    pending.write_bytes(b"archived classes")  # what the JVM writes at its exit
    kafka.settle_class_archive(graceful=True)
    assert jvm_checks == [(java, classpath, pending)]  # checked on the server's own classpath
    assert archive.read_bytes() == b"archived classes" and not pending.exists()
    assert kafka.class_sharing_flags(java, classpath) == [f"-XX:SharedArchiveFile={archive}"]
    assert kafka.existing_class_archive_flags(java, classpath) == [
        f"-XX:SharedArchiveFile={archive}"]


def test_an_archive_a_jvm_refuses_cut_short_or_second_is_removed_and_the_first_kept(
        tmp_path: Path, jvm_checks: list[tuple[str, str, Path]]) -> None:
    kafka, java, classpath = _server(tmp_path)
    archive = kafka.class_archive(java, classpath)
    refused = _pending(kafka.class_sharing_flags(java, classpath))
    refused.write_bytes(b"refused: cut short by a crash in the dump")
    kafka.settle_class_archive(graceful=True)
    assert not refused.exists() and not archive.exists()
    killed = _pending(kafka.class_sharing_flags(java, classpath))
    killed.write_bytes(b"half an arch")
    kafka.settle_class_archive(graceful=False)
    assert not killed.exists() and not archive.exists()
    # A process gone without a stop (kill -9): the next start removes what it left.
    left = _pending(kafka.class_sharing_flags(java, classpath))
    left.write_bytes(b"half an arch")
    again = _pending(kafka.class_sharing_flags(java, classpath))
    assert not left.exists() and again != left
    # Two servers of a kind wrote one each: the first to stop gives the kind its archive.
    archive.write_bytes(b"the first")
    again.write_bytes(b"the second")
    kafka.settle_class_archive(graceful=True)
    assert archive.read_bytes() == b"the first" and not again.exists()
    assert not (kafka.home / stack_script.PENDING_ARCHIVE_FILE).exists()
    assert [checked for _, _, checked in jvm_checks] == [refused]


def test_only_the_first_cluster_server_of_a_kind_writes_an_archive_and_stale_ones_go(
        tmp_path: Path, jvm_checks: list[tuple[str, str, Path]]) -> None:
    import os

    first, java, classpath = _server(tmp_path, "kafka-1", "CLUSTER")
    second, _, _ = _server(tmp_path / "b", "kafka-2", "CLUSTER")
    second.paths.cache = first.paths.cache
    archive = first.class_archive(java, classpath)
    archive.parent.mkdir(parents=True)
    stale = archive.with_name("kafka-old.1.pending")
    recent = archive.with_name("kafka-now.2.pending")
    for left in (stale, recent):
        left.write_bytes(b"left by an aborted run")
    old = stale.stat().st_mtime - stack_script.STALE_PENDING_ARCHIVE_S - 60
    os.utime(stale, (old, old))
    assert second.class_sharing_flags(java, classpath) == []
    assert _pending(first.class_sharing_flags(java, classpath)).parent == archive.parent
    assert not stale.exists() and recent.exists()  # one may be another JVM's, being written
    archive.write_bytes(b"archived")
    assert second.class_sharing_flags(java, classpath) == [f"-XX:SharedArchiveFile={archive}"]


def test_a_jvm_refuses_an_archive_that_is_not_one(tmp_path: Path) -> None:
    try:
        java = stack_script.check_java()
    except stack_script.StackError as exc:
        pytest.skip(f"no Java 17 here: {exc}")
    garbage = tmp_path / "kafka-x.jsa"
    garbage.write_bytes(b"\0" * 4096)
    refusal = stack_script.archive_refusal(java, str(tmp_path / "k.jar"), garbage)
    assert refusal is not None and refusal.startswith("exit ")


def test_class_sharing_can_be_turned_off_and_a_bad_setting_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kafka, java, classpath = _server(tmp_path)
    monkeypatch.setenv(stack_script.CLASS_SHARING_ENV, "0")
    assert kafka.class_sharing_flags(java, classpath) == []
    assert kafka.existing_class_archive_flags(java, classpath) == []
    monkeypatch.setenv(stack_script.CLASS_SHARING_ENV, "maybe")
    paths = stack_script.Paths(state=tmp_path / "up", cache=tmp_path / "up",
                               profile=stack_script.PLAIN)
    with pytest.raises(stack_script.StackError, match=r"CHRONOWHEEL_STACK_CDS='maybe'"):
        stack_script.cmd_up(paths, [], timeout=1)
    assert not (tmp_path / "up").exists()


def test_a_stop_keeps_the_archive_of_a_server_that_exits_on_sigterm_and_not_of_one_killed(
        tmp_path: Path, jvm_checks: list[tuple[str, str, Path]]) -> None:
    import subprocess
    kafka, java, classpath = _server(tmp_path)
    archive = kafka.class_archive(java, classpath)
    server = ("import signal, sys, time\n"
              "if sys.argv[1] == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "print('up', flush=True)\n"
              "time.sleep(30)\n")
    for on_sigterm, kept in (("ignore", False), ("exit", True)):
        pending = _pending(kafka.class_sharing_flags(java, classpath))
        pending.write_bytes(b"archived classes")
        proc = subprocess.Popen([sys.executable, "-c", server, on_sigterm], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        kafka.proc = proc
        assert stack_script.stop_server(kafka, grace=0.5)
        proc.stdout.close()
        assert archive.exists() is kept and not pending.exists()
