"""Cassandra and Kafka in containers (testcontainers), for machines with a Docker engine:
with `CHRONOWHEEL_SERVERS=containers`, a test session that needs servers (a test uses the
`stack` fixture of tests/conftest.py) starts them after collection and hands their addresses
to that fixture as CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA, and stops them at its end. This
module is a pytest plugin for that (`-p testkit.containers` in pyproject.toml's addopts).

Nothing here is typed in twice: the image tags are the versions deploy/local pins (its
pom.xml files), Cassandra gets every setting of deploy/local/cassandra/cassandra.yaml's "small
footprint" section (and its compatibility mode, cluster name, snitch and token count) as
system properties, Kafka every line of deploy/local/kafka/server.properties that names no
local address or folder as a KAFKA_* variable, and both get the local stack's heap sizes.
deploy/docker-compose.yml runs the same images with the same settings; a unit test
(tests/unit/test_containers.py) checks all three agree.

Cassandra runs in testcontainers' CassandraContainer. Kafka runs the Apache image
(apache/kafka, the one docker-compose.yml uses) in a plain DockerContainer: testcontainers'
KafkaContainer starts Confluent's cp-kafka images through their own scripts, which the Apache
image does not have. The broker advertises the host port its listener is published on, which
is chosen before the start for that reason.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from testkit import REPO, STACK_SCRIPT

SERVERS_ENV = "CHRONOWHEEL_SERVERS"
"""`containers`: the tests' servers are started with testcontainers."""
LOCAL = REPO / "deploy" / "local"
CQL_PORT = 9042
KAFKA_PORT = 9092
KAFKA_CONTROLLER_PORT = 9093
KAFKA_CLUSTER_ID = "sK3JlRXsQcWcbA0H55SKjQ"  # any base64 UUID; the same as docker-compose.yml
KAFKA_READY = r"Kafka Server started"
CASSANDRA_READY = "Startup complete"
START_TIMEOUT_S = 240


def pom_property(pom: Path, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if match is None:
        raise ValueError(f"{pom} has no <{name}>")
    return match.group(1)


@cache
def local_stack() -> ModuleType:
    """deploy/local/stack.py as a module (its heap sizes)."""
    spec = importlib.util.spec_from_file_location("chronowheel_local_stack", STACK_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def cassandra_image() -> str:
    return f"cassandra:{pom_property(LOCAL / 'cassandra' / 'pom.xml', 'cassandra.version')}"


def kafka_image() -> str:
    return f"apache/kafka:{pom_property(LOCAL / 'kafka' / 'pom.xml', 'kafka.version')}"


def _yaml_scalars(text: str) -> dict[str, str]:
    """Top-level `key: value` lines of a yaml text (no nesting, no templates)."""
    out = {}
    for line in text.splitlines():
        if line and line[0].isalpha() and ": " in line:
            key, value = line.split(": ", 1)
            if "${" not in value:
                out[key] = value.strip()
    return out


def cassandra_settings() -> dict[str, str]:
    """The local cassandra.yaml's small-footprint settings and its compatibility mode."""
    text = (LOCAL / "cassandra" / "cassandra.yaml").read_text()
    tuned = _yaml_scalars(text.split("# --- small footprint", 1)[1].split("# ---", 1)[0])
    return {"storage_compatibility_mode": _yaml_scalars(text)["storage_compatibility_mode"],
            **tuned}


def cassandra_env() -> dict[str, str]:
    """The container's environment: what the image's entrypoint writes into its yaml, and the
    rest of the local yaml's settings as system properties."""
    yaml = _yaml_scalars((LOCAL / "cassandra" / "cassandra.yaml").read_text())
    options = ["-Dcassandra.skip_wait_for_gossip_to_settle=0",
               "-Dcassandra.config.allow_system_properties=true",
               *(f"-Dcassandra.settings.{k}={v}" for k, v in cassandra_settings().items())]
    return {
        "CASSANDRA_CLUSTER_NAME": yaml["cluster_name"],
        "CASSANDRA_NUM_TOKENS": yaml["num_tokens"],
        "CASSANDRA_ENDPOINT_SNITCH": yaml["endpoint_snitch"],
        "MAX_HEAP_SIZE": str(local_stack().CASSANDRA_HEAP).upper(),
        "HEAP_NEWSIZE": "200M",
        "JVM_EXTRA_OPTS": " ".join(options),
    }


def kafka_properties() -> dict[str, str]:
    """server.properties of the local stack without the lines naming addresses or folders."""
    out = {}
    for line in (LOCAL / "kafka" / "server.properties").read_text().splitlines():
        if line and not line.startswith("#") and "${" not in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


def kafka_env(host_port: int) -> dict[str, str]:
    """The container's environment; clients reach the broker on 127.0.0.1:`host_port`."""
    heap = str(local_stack().HEAP)
    return {
        "CLUSTER_ID": KAFKA_CLUSTER_ID,
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@localhost:{KAFKA_CONTROLLER_PORT}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENERS": f"PLAINTEXT://:{KAFKA_PORT},CONTROLLER://:{KAFKA_CONTROLLER_PORT}",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port}",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        **{"KAFKA_" + k.upper().replace(".", "_"): v for k, v in kafka_properties().items()
           if k not in ("process.roles", "node.id", "controller.listener.names",
                        "inter.broker.listener.name", "listener.security.protocol.map")},
        "KAFKA_HEAP_OPTS": f"-Xms{heap} -Xmx{heap}",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- starting them (needs the testcontainers package and a Docker engine) --------------------


def cassandra_container() -> Any:
    from testcontainers.community.cassandra import CassandraContainer

    container = CassandraContainer(cassandra_image(), wait_strategy_check_string=CASSANDRA_READY)
    for key, value in cassandra_env().items():
        container.with_env(key, value)
    return container


def kafka_container(host_port: int) -> Any:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    container = DockerContainer(kafka_image()).with_bind_ports(KAFKA_PORT, host_port)
    for key, value in kafka_env(host_port).items():
        container.with_env(key, value)
    return container.waiting_for(
        LogMessageWaitStrategy(KAFKA_READY).with_startup_timeout(START_TIMEOUT_S))


@dataclass(frozen=True)
class Servers:
    cassandra: str
    kafka: str


@contextmanager
def containers() -> Iterator[Servers]:
    """Cassandra and Kafka in containers for as long as the block runs; their addresses."""
    with ExitStack() as stack:
        cassandra = stack.enter_context(cassandra_container())
        host, port = cassandra.get_contact_points()[0]
        kafka_port = free_port()
        stack.enter_context(kafka_container(kafka_port))
        yield Servers(cassandra=f"{host}:{port}", kafka=f"127.0.0.1:{kafka_port}")


# --- the pytest plugin ------------------------------------------------------------------------

_running: ExitStack | None = None


def wanted(env: dict[str, str] | None = None) -> bool:
    """Whether CHRONOWHEEL_SERVERS asks for containers ("local" or unset: the local stack)."""
    value = (env if env is not None else os.environ).get(SERVERS_ENV, "").strip().lower()
    if value not in ("", "local", "containers"):
        raise pytest.UsageError(f"{SERVERS_ENV}: expected containers or local, got {value!r}")
    return value == "containers"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    global _running
    if not wanted() or session.config.option.collectonly or _running is not None:
        return
    if not any("stack" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    for name in ("CHRONOWHEEL_CASSANDRA", "CHRONOWHEEL_KAFKA"):
        if os.environ.get(name, "").strip():
            raise pytest.UsageError(f"{SERVERS_ENV}=containers and {name} both name servers")
    running = ExitStack()
    servers = running.enter_context(containers())
    _running = running
    os.environ["CHRONOWHEEL_CASSANDRA"] = servers.cassandra
    os.environ["CHRONOWHEEL_KAFKA"] = servers.kafka
    print(f"\n[containers] Cassandra {cassandra_image()} on {servers.cassandra}, Kafka "
          f"{kafka_image()} on {servers.kafka}", file=sys.stderr)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _running
    if _running is not None:
        running, _running = _running, None
        running.close()
