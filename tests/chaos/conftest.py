"""Fixtures of the fault suite (marker `chaos`, run with `./run chaos`): the local stack's
cluster profile, three Cassandra nodes and three Kafka nodes on replication 3.

The scenarios that need the cluster run only when selected with `-m chaos` (they need the
cluster, several minutes and most of two cores); in any other run they are skipped with that
hint.

`cluster` (session): the cluster profile, started unless it is up and stopped at the session's
end if this session started it. `chaos_settings` (module): one namespace of six shards,
replication 3, on the cluster; dropped at the end. Sizes scale with CHRONOWHEEL_CHAOS_SCALE
(testkit.chaos: 1 is the full size, 0.05 the default); each scenario's result is
printed, and appended as a JSON line to the file named by CHRONOWHEEL_CHAOS_REPORT when that
is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.testing import drop_namespace

from testkit.chaos import RESTART_TIMEOUT_S, ScenarioResult
from testkit.cluster import LocalCluster

REPORT_ENV = "CHRONOWHEEL_CHAOS_REPORT"
SHARDS = 6


# pytest-timeout limits (the default, 300 s, is in pyproject.toml), at the default scale: a
# cluster scenario may restart a server (RESTART_TIMEOUT_S) and its session may start the
# cluster first. Larger sizes get proportionally longer.
NODE_FAULT_TIMEOUT_S = 300.0
CLUSTER_TIMEOUT_S = 2400.0
SIZE = max(1.0, float(os.environ.get("CHRONOWHEEL_CHAOS_SCALE", "0.05")) / 0.05)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here) and not item.get_closest_marker("timeout"):
            limit = CLUSTER_TIMEOUT_S if "cluster" in getattr(item, "fixturenames", ()) \
                else NODE_FAULT_TIMEOUT_S
            item.add_marker(pytest.mark.timeout(limit * SIZE))
    if "chaos" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="needs the cluster profile: `./run chaos` (pytest -m chaos)")
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure's traceback the moment it happens: a later scenario can hang until an
    outer time limit kills the run, and pytest's summary at the end would then never appear."""
    if report.failed:
        print(f"\n[chaos] {report.nodeid} failed ({report.when}):\n{report.longreprtext}",
              file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    members = local.members()
    down = [m.name for m in members.values() if not (m.ready and m.pid)]
    started: list[str] = []
    if down:
        t0 = time.monotonic()
        print(f"\n[chaos] starting the cluster profile ({', '.join(down)})", file=sys.stderr)
        started = local.start_all()
        print(f"[chaos] cluster up in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    try:
        local.require_up()
        yield local
    finally:
        if started:
            local.stop_all(started)


@pytest.fixture(autouse=True)
def whole_cluster(request: pytest.FixtureRequest) -> None:
    """Each scenario that needs the cluster starts on a whole one: a server that an earlier
    scenario failed to restart is started again first, so one failure is reported once
    instead of spoiling every scenario after it."""
    if "cluster" not in request.fixturenames:
        return
    cluster: LocalCluster = request.getfixturevalue("cluster")
    down = [m.name for m in cluster.members().values() if not (m.ready and m.pid)]
    if down:
        t0 = time.monotonic()
        print(f"\n[chaos] {', '.join(down)} down before {request.node.name}: starting",
              file=sys.stderr)
        cluster.start_all(timeout_s=RESTART_TIMEOUT_S)
        print(f"[chaos] cluster whole again after {time.monotonic() - t0:.0f}s", file=sys.stderr)


@pytest.fixture(scope="module")
async def chaos_settings(cluster: LocalCluster) -> AsyncIterator[Settings]:
    cassandra, kafka = cluster.addresses()
    settings = Settings(namespace="chaos" + secrets.token_hex(4), cassandra=cassandra,
                        kafka=kafka, shards=SHARDS, replication="3", http_port=0)
    t0 = time.monotonic()
    await init_namespace(settings)
    print(f"\n[chaos] namespace {settings.namespace} ({SHARDS} shards, replication 3) "
          f"initialised in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    try:
        yield settings
    finally:
        try:
            await asyncio.wait_for(drop_namespace(settings), 180)
        except Exception as exc:  # cleanup must not fail the scenario that just ran
            print(f"dropping {settings.namespace} failed: {exc!r}", file=sys.stderr)


def report(result: ScenarioResult) -> None:
    """Print the result; append it to $CHRONOWHEEL_CHAOS_REPORT as a JSON line."""
    print("\n" + result.summary(), file=sys.stderr)
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({**vars(result), "row": result.row()}) + "\n")
