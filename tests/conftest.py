"""Shared fixtures.

`stack` (session): addresses of a real Cassandra and a real Kafka. Taken from
CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA when set; otherwise the local stack
(deploy/local/stack.py) is started for the session, and whatever this session started is
stopped at its end (a stack that was already up is left running).

`namespace` (function): a fresh namespace per test, `t` + 10 hex digits, valid both as a
Cassandra keyspace name and as a Kafka topic prefix. For a test that also uses `stack`, its
keyspace (`keyspace_of(namespace)`, which the test passes on as `cassandra_keyspace`) was
prepared ahead on a thread of its own, and is emptied for another test after it
(tests/namespace_pool.py); the test's `chronowheel init` still records the shard count and
creates the topics. The unit tests run first, while the first keyspaces are prepared.

Only integration tests (tests/integration/, marked `integration`) request `stack`, so unit
tests run without any server. A test that requests `stack` is marked `integration` here too.

pytest-timeout's per-test limit (`timeout` in pyproject.toml) counts fixture setup and
teardown: the first test to use a session fixture that starts servers (`stack`; `secured` in
tests/security) gets the time those servers may take to start on top of its limit, and the
last test of the session the time they may take to stop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling

from tests.namespace_pool import NamespacePool, new_name

REPO = Path(__file__).resolve().parents[1]
STACK_SCRIPT = REPO / "deploy" / "local" / "stack.py"


@dataclass(frozen=True)
class Stack:
    cassandra: str
    """Cassandra contact point, "host:port"."""
    kafka: str
    """Kafka bootstrap servers, "host:port"."""
    started: tuple[str, ...] = ()
    """Servers this test session started (and will stop)."""

    @property
    def cassandra_host(self) -> str:
        return self.cassandra.rsplit(":", 1)[0]

    @property
    def cassandra_port(self) -> int:
        host, _, port = self.cassandra.rpartition(":")
        return int(port) if host else 9042


def _stack_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STACK_SCRIPT), "--json", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    cassandra = os.environ.get("CHRONOWHEEL_CASSANDRA", "").strip()
    kafka = os.environ.get("CHRONOWHEEL_KAFKA", "").strip()
    missing = [name for name, given in (("cassandra", cassandra), ("kafka", kafka)) if not given]
    if not missing:
        _start_pool(cassandra, kafka)
        try:
            yield Stack(cassandra=cassandra, kafka=kafka)
        finally:
            _close_pool()
        return

    up = _stack_script("up", *missing)
    if up.returncode != 0:
        pytest.fail(
            f"the local stack did not come up (exit {up.returncode}):\n{up.stderr}",
            pytrace=False,
        )
    info = json.loads(up.stdout)
    started = tuple(info["started"])
    _start_pool(cassandra or info["cassandra"], kafka or info["kafka"])
    try:
        yield Stack(
            cassandra=cassandra or info["cassandra"],
            kafka=kafka or info["kafka"],
            started=started,
        )
    finally:
        _close_pool()  # its drops need the servers
        if started and os.environ.get("PYTEST_XDIST_WORKER"):
            # Another process of this run may still be using them (`./run test` starts the
            # stack before pytest and stops it after, so this happens only without it).
            print(f"left running (other test processes may use them): {' '.join(started)}; "
                  "stop them with `./run stack down`", file=sys.stderr)
        elif started:
            down = _stack_script("down", *started)
            if down.returncode != 0:
                print(f"stopping the local stack failed:\n{down.stderr}", file=sys.stderr)


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> Iterator[str]:
    if "stack" not in request.fixturenames:
        yield new_name()
        return
    request.getfixturevalue("stack")  # starts the pool when nothing did before
    assert _POOL is not None
    ns = _POOL.take()
    yield ns
    # On the pool's thread: the namespace's topics deleted, its keyspace emptied for another
    # test; or dropped if this one failed (a child process it left behind may still write).
    _POOL.give_back(ns, reuse=not _failed(request))


@pytest.fixture(scope="module")
def shared_namespace(stack: Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    """One prepared namespace for every test of a module: for the storage contract suites
    (tests/contract), whose tests each keep to ids of their own, so that one store may serve
    them all. Preparing a keyspace per test cost 3-6 s of each such test's setup and kept the
    pool's thread (and Cassandra's schema work) busy for the timed tests beside them."""
    assert _POOL is not None
    ns = _POOL.take()
    yield ns
    _POOL.give_back(ns, reuse=not _failed(request))


@pytest.fixture
def bare_namespace(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh name like `namespace`'s with nothing made for it, for a test that creates the
    keyspace or topics itself; whatever it made is dropped after the test."""
    ns = new_name()
    yield ns
    if "stack" in request.fixturenames and _POOL is not None:
        _POOL.give_back(ns)


@pytest.fixture
def quiet_namespace_pool(namespace: str) -> Iterator[None]:
    """The pool's thread does nothing during the test (after `namespace` is prepared): for a
    test that measures what its own process does, such as the garbage its requests leave."""
    if _POOL is None:
        yield
        return
    with _POOL.paused():
        yield


_OUTCOMES = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[
        pytest.TestReport]:
    """Each phase's report kept on its test, for fixtures to see whether it failed."""
    report = yield
    item.stash.setdefault(_OUTCOMES, {})[report.when] = report
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    """Whether a test (or, for a module's fixture, any test of the module) has failed."""
    items = [request.node] if request.scope == "function" else [
        i for i in request.session.items if i.nodeid.startswith(request.node.nodeid + "::")]
    return any(r.failed for i in items for r in i.stash.get(_OUTCOMES, {}).values())


# The session's namespace pool, and how many tests will ask it for a namespace.
_POOL: NamespacePool | None = None
_POOL_DEMAND = 0


def _start_pool(cassandra: str, kafka: str) -> None:
    global _POOL
    if _POOL is None:
        # CHRONOWHEEL_TEST_NAMESPACE_POOL=0: no work ahead; each namespace is prepared when
        # its test asks (to compare, or to rule the pool out).
        ahead = os.environ.get("CHRONOWHEEL_TEST_NAMESPACE_POOL", "1").strip() != "0"
        # On two processes (xdist) each has a pool of its own, and every one counts the whole
        # run's demand: none prepares before its first test asks, or the process that runs no
        # server test would prepare a dozen namespaces for nothing while the other one's
        # server tests need the servers (seen: 12 prepared in 102 s, none used).
        warm = 12 if ahead and not os.environ.get("PYTEST_XDIST_WORKER") else 0
        _POOL = NamespacePool(cassandra, kafka, demand=_POOL_DEMAND,
                              ahead=3 if ahead else 0, warm_ahead=warm)


def _close_pool() -> None:
    global _POOL
    if _POOL is not None:
        pool, _POOL = _POOL, None
        pool.close()


def _servers_already_up() -> tuple[str, str] | None:
    """The servers' addresses when they answer now (given, or the local stack already up)."""
    cassandra = os.environ.get("CHRONOWHEEL_CASSANDRA", "").strip()
    kafka = os.environ.get("CHRONOWHEEL_KAFKA", "").strip()
    if cassandra and kafka:
        return cassandra, kafka
    status = _stack_script("status")
    if status.returncode != 0:
        return None
    try:
        info = json.loads(status.stdout)
        return (cassandra or info["cassandra"]["address"], kafka or info["kafka"]["address"])
    except (ValueError, KeyError, TypeError):
        return None


# Session fixtures that may start servers: seconds their start (stack.py's readiness timeout
# of 180 s, with margin) and their stop (45 s grace per server, two servers) may take.
SERVER_FIXTURES = {"stack": (240, 120), "secured": (300, 120)}


def timeout_of(item: pytest.Item) -> float:
    """The pytest-timeout limit of a test: its `timeout` marker, else --timeout or the ini's."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        given = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if given is not None:
            return float(given)
    value = item.config.getoption("timeout", None)
    if value is None:
        try:
            value = item.config.getini("timeout")
        except ValueError:  # pytest-timeout not installed
            return 0.0
    return float(value or 0)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Room in the time limit of the tests that start or stop the session's servers (the
    items here are those left after deselection); the namespace pool's demand, and its start
    when the servers already answer."""
    global _POOL_DEMAND
    _POOL_DEMAND = sum(1 for item in session.items
                       if {"stack", "namespace"} <= set(getattr(item, "fixturenames", ())))
    # `shared_namespace`: one per module of tests that asks for it
    _POOL_DEMAND += len({item.nodeid.split("::", 1)[0] for item in session.items
                         if "shared_namespace" in getattr(item, "fixturenames", ())})
    if _POOL_DEMAND and not session.config.option.collectonly:
        up = _servers_already_up()
        if up is not None:
            _start_pool(*up)
    extra: dict[int, float] = {}
    used: set[str] = set()
    for i, item in enumerate(session.items):
        for name, (start_s, _stop_s) in SERVER_FIXTURES.items():
            if name in getattr(item, "fixturenames", ()) and name not in used:
                used.add(name)
                extra[i] = extra.get(i, 0) + start_s
    if used and session.items:
        last = len(session.items) - 1
        extra[last] = extra.get(last, 0) + sum(SERVER_FIXTURES[n][1] for n in used)
    for i, more in extra.items():
        item = session.items[i]
        base = timeout_of(item)
        if base > 0:  # 0: no limit at all
            item.add_marker(pytest.mark.timeout(base + more), append=False)


# Run on two processes (`./run test` and CI use pytest-xdist with `--dist loadgroup`), the
# scheduler below gives each test a lane:
#
# - "solo": the tests that must not overlap one another, run one after another on one process
#   (the solo lane), in SOLO_ORDER: the node fault tests (kill -9, SIGSTOP past a session, a
#   busy or hung event loop, clock steps, cut-offs: timing-sensitive on purpose), the security
#   tests (they start and stop a secured stack of their own from one session fixture, so they
#   must share one process), the end-to-end fuzz run (commands at and past every server limit)
#   and the console's browser test (a headless Chromium, most of a core while it starts);
# - "timed": the other server tests (tests/integration, each in a namespace of its own), which
#   check bounds of a few seconds; they run on both processes;
# - "untimed": server tests that check no bound in seconds (contracts and smoke checks of the
#   servers: conditions with 60 s limits), and "free": the tests that need no server.
#
# While the solo lane has work, the other process takes free tests first, then untimed ones,
# and timed tests only when nothing else is left: the node fault tests load the machine on
# purpose, and a timed test beside them is the pairing most likely to miss its bound (seen
# when only the fault-driving files were grouped: test_node_oneshot's 2 s bound and a 3 s lead
# of test_node_behaviour, each missed twice beside them). Once the solo lane is done, it takes
# timed tests too: the longest first (SLOW_FIRST, from the durations CI lists), so that the two
# processes end together.
# A process is shut down once nothing is left it may run. (Grouping by path in a scheduler,
# not by `xdist_group` markers: pytest-xdist 3.8 marks a grouped test by rewriting
# `item._nodeid`, which pytest 9 no longer reads, so its groups fall apart silently.)
SOLO_ORDER = (
    "tests/security/",  # first: its secured stack boots beside the unit tier
    "tests/chaos/test_node_faults.py::test_a_node_whose_loop_is_busy",
    "tests/chaos/test_node_faults.py::test_a_node_whose_loop_hangs",
    "tests/chaos/test_node_faults.py::test_kill_9",
    "tests/chaos/test_node_faults.py::test_a_rolling_restart",
    "tests/chaos/",
    "tests/integration/test_console_browser.py",
    "tests/fuzz/test_e2e.py",
)
SERVER_PATHS = ("tests/integration/",)
UNTIMED_SERVER_PATHS = (
    "tests/integration/test_run_history_contract.py",
    "tests/integration/test_stack_smoke.py",
    "tests/integration/test_store_contract.py",
    "tests/integration/test_worker_bus_contract.py",
    "tests/integration/test_worker_store_contract.py",
)
# Timed tests of 20 s or more in the last CI run, longest first (a hint for the end of the run;
# a test not listed runs after these, in collection order), then the unit tier's longest.
SLOW_FIRST = (
    "tests/integration/test_failover.py::test_a_node_paused_past_its_session",
    "tests/integration/test_overlap.py::test_forbid_and_replace",
    "tests/integration/test_catch_up.py",
    "tests/integration/test_failover.py::test_a_hot_bucket",
    "tests/integration/test_failover.py::test_sigterm",
    "tests/integration/test_scale_out.py",
    "tests/integration/test_controls.py::test_a_backfill_survives",
    "tests/integration/test_failover.py::test_kill_9",
    "tests/integration/test_locust_capacity.py",
    "tests/integration/test_locust_kit.py",
    "tests/integration/test_worker.py::test_a_killed_worker",
    # The unit tier's longest (free lane; `./run unit` schedules with these lanes too): first,
    # so that neither process is left with one of them at the end.
    "tests/unit/test_shard_invariants.py",
    "tests/unit/test_wheel.py::TestWheelMachine",
    "tests/unit/test_wheel.py::TestBareWheelMachine",
    "tests/unit/test_entry_memory.py",
    "tests/unit/test_recurrence.py::test_day_fields_match_brute_force",
    "tests/unit/test_recurrence.py::test_exclusions_drop_exactly_the_excluded_local_dates",
    "tests/unit/test_wheel.py::test_bulk_random_schedule",
    "tests/unit/test_recurrence.py::test_dst_matches_brute_force",
    "tests/unit/test_recurrence.py::test_time_fields_match_brute_force",
    "tests/unit/test_layers.py",
)
LANES = ("solo", "timed", "untimed", "free")


def _first_match(nodeid: str, prefixes: tuple[str, ...]) -> int | None:
    for i, prefix in enumerate(prefixes):
        if nodeid.startswith(prefix):
            return i
    return None


def lane_of(nodeid: str) -> str:
    """The lane of a test, by its node id (relative to the repository)."""
    if _first_match(nodeid, SOLO_ORDER) is not None:
        return "solo"
    if _first_match(nodeid, UNTIMED_SERVER_PATHS) is not None:
        return "untimed"
    if _first_match(nodeid, SERVER_PATHS) is not None:
        return "timed"
    return "free"


def run_order(nodeid: str) -> int:
    """Rank within a lane (lower first; ties keep collection order)."""
    hint = _first_match(nodeid, SOLO_ORDER if lane_of(nodeid) == "solo" else SLOW_FIRST)
    return len(SOLO_ORDER) + len(SLOW_FIRST) if hint is None else hint


class LaneScheduling(LoadScheduling):
    """LoadScheduling's bookkeeping (node2pending, pending, crash handling), with its own
    choice of what a process runs next. A worker runs a test only once it knows the next
    one (or is told to shut down), so each process is kept two tests ahead."""

    collection: list[str] | None
    lanes: list[str]

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            ids = next(iter(self.node2collection.values()))
            self.collection = ids
            self.lanes = [lane_of(nodeid) for nodeid in ids]
            self.pending[:] = sorted(range(len(ids)), key=lambda i: (run_order(ids[i]), i))
        for node in self.nodes:
            self.check_schedule(node)

    def _solo_node(self) -> Any:
        """The process of the solo lane: the first one still running."""
        for node in self.nodes:
            if not node.shutting_down:
                return node
        return None

    def _pick(self, node: Any) -> int | None:
        solo = self._solo_node()
        if node is solo:
            order: tuple[str, ...] = LANES
        else:
            assert solo is not None
            solo_busy = any(self.lanes[i] == "solo"
                            for i in (*self.pending, *self.node2pending[solo]))
            order = ("free", "untimed", "timed") if solo_busy else ("timed", "untimed", "free")
        for lane in order:
            for i in self.pending:
                if self.lanes[i] == lane:
                    return i
        return None

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node.shutting_down or self.collection is None:
            return
        queue = self.node2pending[node]
        while len(queue) < 2:
            index = self._pick(node)
            if index is None:
                # Nothing left this process may run (what remains is the solo lane's):
                # it runs the test it holds and ends.
                node.shutdown()
                return
            self.pending.remove(index)
            queue.append(index)
            node.send_runtest_some([index])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LaneScheduling | None:
    """`--dist loadgroup`: the lanes above."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests that need no server first: the namespace pool prepares keyspaces meanwhile.
    items.sort(key=lambda item: any(name in getattr(item, "fixturenames", ())
                                    for name in SERVER_FIXTURES))
    for item in items:
        if "stack" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "integration"
        ):
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _close_pool()  # when the `stack` fixture never ran its teardown
