"""CHRONOWHEEL_SERVERS=containers (testkit/containers.py) runs the servers the local stack
runs: the same versions and settings as deploy/local, and as deploy/docker-compose.yml. No
container is started here; this checks the configuration only."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from testkit import containers

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "deploy" / "local"


def compose_service(name: str) -> dict[str, str]:
    doc = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    service = doc["services"][name]
    return {"image": service["image"],
            **{k: str(v) for k, v in service["environment"].items()}}


def test_the_images_are_the_versions_the_local_stack_pins() -> None:
    cassandra = containers.pom_property(LOCAL / "cassandra" / "pom.xml", "cassandra.version")
    kafka = containers.pom_property(LOCAL / "kafka" / "pom.xml", "kafka.version")
    assert containers.cassandra_image() == f"cassandra:{cassandra}"
    assert containers.kafka_image() == f"apache/kafka:{kafka}"
    assert compose_service("cassandra")["image"] == containers.cassandra_image()
    assert compose_service("kafka")["image"] == containers.kafka_image()


def test_cassandra_gets_every_setting_of_the_local_yaml_as_compose_does() -> None:
    env = containers.cassandra_env()
    options = env.pop("JVM_EXTRA_OPTS").split()
    # Every key of the local yaml's small-footprint section, with its value.
    text = (LOCAL / "cassandra" / "cassandra.yaml").read_text()
    section = text.split("# --- small footprint", 1)[1].split("# ---", 1)[0]
    tuned = [line.split(": ", 1) for line in section.splitlines() if line and line[0].isalpha()]
    assert len(tuned) >= 10
    for key, value in [*tuned, ["storage_compatibility_mode", "NONE"]]:
        assert f"-Dcassandra.settings.{key}={value}" in options, key
    assert {"cluster_name: chronowheel-local", "endpoint_snitch: SimpleSnitch",
            "num_tokens: 1"} <= set(text.splitlines())
    assert env["MAX_HEAP_SIZE"] == containers.local_stack().CASSANDRA_HEAP.upper() == "2G"
    # The same environment as the compose file's service.
    compose = compose_service("cassandra")
    assert sorted(compose.pop("JVM_EXTRA_OPTS").split()) == sorted(options)
    compose.pop("image")
    assert env == compose


def test_kafka_gets_every_setting_of_the_local_properties_as_compose_does() -> None:
    env = containers.kafka_env(host_port=9092)
    props = (LOCAL / "kafka" / "server.properties").read_text().splitlines()
    plain = [line.split("=", 1) for line in props
             if line and not line.startswith("#") and "${" not in line]
    assert len(plain) >= 20
    for key, value in plain:
        assert env["KAFKA_" + key.upper().replace(".", "_")] == value, key
    heap = containers.local_stack().HEAP
    assert env["KAFKA_HEAP_OPTS"] == f"-Xms{heap} -Xmx{heap}"
    compose = compose_service("kafka")
    compose.pop("image")
    assert env == compose
    # The broker advertises the host port its listener is published on.
    assert containers.kafka_env(host_port=40123)["KAFKA_ADVERTISED_LISTENERS"] == \
        "PLAINTEXT://127.0.0.1:40123"


def test_the_switch_and_the_dev_extra() -> None:
    assert not containers.wanted({})
    assert not containers.wanted({"CHRONOWHEEL_SERVERS": "local"})
    assert containers.wanted({"CHRONOWHEEL_SERVERS": "containers"})
    with pytest.raises(pytest.UsageError, match="CHRONOWHEEL_SERVERS"):
        containers.wanted({"CHRONOWHEEL_SERVERS": "docker"})
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(d.startswith("testcontainers") for d in
               project["project"]["optional-dependencies"]["dev"])
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"]
    assert addopts[addopts.index("-p") + 1] == "testkit.containers"


def test_the_testcontainers_api_the_module_uses_is_there() -> None:
    pytest.importorskip("testcontainers")
    from testcontainers.community.cassandra import CassandraContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    assert CassandraContainer.CQL_PORT == containers.CQL_PORT
    for method in ("with_env", "with_bind_ports", "waiting_for", "get_container_host_ip"):
        assert callable(getattr(DockerContainer, method)), method
    assert callable(CassandraContainer.get_contact_points)
    assert callable(LogMessageWaitStrategy(containers.KAFKA_READY).with_startup_timeout)
