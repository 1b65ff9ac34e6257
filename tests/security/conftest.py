"""Fixtures of the security tests (marker `security`): the secured local stack.

`secured` (session): the secured profile of deploy/local/stack.py — Kafka with SASL_SSL, SCRAM
users and the StandardAuthorizer on 127.0.0.1:9094, Cassandra with client TLS and
PasswordAuthenticator on 127.0.0.1:9142, a throwaway CA — started for the session unless it is
already up, and stopped at its end if this session started it. Its state folder is the plain
stack's with `-secured` appended, so both stacks run side by side.

`secured_ns` (function): a namespace initialised by the admin principal, with the ACLs and
grants of `chronowheel acl --apply` for the SCRAM users submitter, worker and node and the
Cassandra roles node, worker and ops; dropped afterwards.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import STACK_SCRIPT
from tests.security.support import Secured, chronowheel_cli, drop_namespace


def _stack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(STACK_SCRIPT), "--profile", "secured", "--json",
                           *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          check=False)


@pytest.fixture(scope="session")
def secured() -> Iterator[Secured]:
    t0 = time.monotonic()
    up = _stack("up")
    if up.returncode != 0:
        pytest.fail(f"the secured local stack did not come up (exit {up.returncode}):\n"
                    f"{up.stderr}", pytrace=False)
    info = json.loads(up.stdout)
    print(f"\n[security] secured stack ready in {time.monotonic() - t0:.0f}s "
          f"(started: {info['started'] or 'none'})", file=sys.stderr)
    started = tuple(info["started"])
    try:
        yield Secured(kafka=info["kafka"], cassandra=info["cassandra"], ca_file=info["ca_file"],
                      password_files=info["password_files"], started=started,
                      kafka_mtls=info["kafka_mtls"], client_cert=info["client_cert"],
                      client_key=info["client_key"],
                      client_key_password_file=info["client_key_password_file"])
    finally:
        if started:
            down = _stack("down", *started)
            if down.returncode != 0:
                print(f"stopping the secured stack failed:\n{down.stderr}", file=sys.stderr)


@pytest.fixture
def secured_ns(secured: Secured) -> Iterator[str]:
    ns = "s" + secrets.token_hex(5)
    init = chronowheel_cli(secured, ["init", "--namespace", ns, "--shards", "2"],
                           "admin", "admin")
    assert init.returncode == 0, init.stderr
    acl = chronowheel_cli(secured, [
        "acl", "--namespace", ns, "--apply",
        "--submitter-principal", "User:submitter", "--worker-principal", "User:worker",
        "--node-principal", "User:node", "--cassandra-node-role", "node",
        "--cassandra-worker-role", "worker", "--cassandra-ops-role", "ops"], "admin", "admin")
    assert acl.returncode == 0, acl.stderr
    # incl. the node transactional ids, <ns>.dead, DESCRIBE_CONFIGS on what the node writes,
    # ALTER_CONFIGS and DESCRIBE_CONFIGS on the node group (its session and heartbeat)
    assert "applied 32 Kafka ACLs" in acl.stdout
    yield ns
    drop_namespace(secured, ns)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.security)
