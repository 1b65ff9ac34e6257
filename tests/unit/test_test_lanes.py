"""The test scheduler of tests/conftest.py (`--dist loadgroup` on two processes), driven by a
simulation of pytest-xdist's workers: a worker runs a test only once it holds the next one or
has been told to shut down, and reports each test's end to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest

from tests.conftest import LaneScheduling, lane_of

IDS = [
    "tests/unit/test_wheel.py::test_a",
    "tests/unit/test_wheel.py::test_b",
    "tests/unit/test_model.py::test_c",
    "tests/deploy/test_image.py::test_d",
    "tests/integration/test_store_contract.py::TestCassandra::test_e",
    "tests/integration/test_node_oneshot.py::test_f",
    "tests/integration/test_worker.py::test_g",
    "tests/integration/test_overlap.py::test_forbid_and_replace_across_two_worker_processes",
    "tests/integration/test_console_browser.py::test_h",
    "tests/chaos/test_node_faults.py::test_kill_9_of_one_of_three_nodes_during_a_herd",
    "tests/chaos/test_node_faults.py::test_a_node_whose_loop_is_busy_past_its_session_keeps",
    "tests/chaos/test_node_faults.py::test_a_rolling_restart_of_all_three_nodes",
    "tests/security/test_secured_stack.py::test_i",
    "tests/security/test_secured_stack.py::test_j",
    "tests/fuzz/test_e2e.py::test_k",
    "tests/fuzz/test_commands.py::test_l",
]
# Seconds each test "takes" in the simulation: the solo lane is the long pole, as here.
DURATION = {"solo": 30.0, "timed": 10.0, "untimed": 3.0, "free": 1.0}


@dataclass(eq=False)  # hashable by identity, like xdist's WorkerController
class Worker:
    name: str
    shutting_down: bool = False
    held: list[int] = field(default_factory=list)
    gateway: Any = None

    def send_runtest_some(self, indices: list[int]) -> None:
        self.held.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


@dataclass
class Ran:
    worker: str
    nodeid: str
    start: float
    end: float


@dataclass
class Config:
    """What pytest-xdist's scheduler reads of pytest's config (`-n N` arrives as --tx N*popen)."""

    workers: int

    def getoption(self, name: str, default: Any = None) -> Any:
        return {"dist": "loadgroup", "maxschedchunk": None}.get(name, default)

    def getvalue(self, name: str) -> Any:
        assert name == "tx"
        return [f"{self.workers}*popen"]


def simulate(ids: list[str], workers: int = 2) -> list[Ran]:
    sched = LaneScheduling(Config(workers))  # type: ignore[arg-type]
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        node.gateway = type("Gateway", (), {"id": node.name})()
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, ids)  # type: ignore[arg-type]
    sched.schedule()
    now = 0.0
    running: dict[str, tuple[float, int]] = {}
    ran: list[Ran] = []

    def start(node: Worker) -> None:
        if node.name not in running and (len(node.held) >= 2 or
                                         (node.shutting_down and node.held)):
            index = node.held.pop(0)
            running[node.name] = (now + DURATION[lane_of(ids[index])], index)

    for node in nodes:
        start(node)
    while running:
        name, (end, index) = min(running.items(), key=lambda kv: kv[1][0])
        del running[name]
        now = end
        node = next(n for n in nodes if n.name == name)
        ran.append(Ran(name, ids[index], end - DURATION[lane_of(ids[index])], end))
        sched.mark_test_complete(node, index)  # type: ignore[arg-type]
        for each in nodes:
            start(each)
    assert sched.tests_finished
    return ran


def test_each_test_gets_its_lane() -> None:
    assert [lane_of(i) for i in IDS] == [
        "free", "free", "free", "free", "untimed", "timed", "timed", "timed", "solo",
        "solo", "solo", "solo", "solo", "solo", "solo", "free"]


def test_every_test_runs_once_and_the_solo_lane_never_overlaps_itself() -> None:
    ran = simulate(IDS)
    assert sorted(r.nodeid for r in ran) == sorted(IDS)
    solo = [r for r in ran if lane_of(r.nodeid) == "solo"]
    assert len({r.worker for r in solo}) == 1
    for a, b in pairwise(solo):
        assert b.start >= a.end


def test_the_solo_lane_runs_in_its_order_security_first() -> None:
    solo = [r.nodeid for r in simulate(IDS) if lane_of(r.nodeid) == "solo"]
    assert solo[0].startswith("tests/security/")
    assert solo.index(IDS[10]) < solo.index(IDS[9])  # the busy loop before kill -9
    assert solo[-1] == "tests/fuzz/test_e2e.py::test_k"


def test_beside_the_solo_lane_the_other_process_runs_untimed_work_first() -> None:
    ran = simulate(IDS)
    solo_worker = next(r.worker for r in ran if lane_of(r.nodeid) == "solo")
    other = [r for r in ran if r.worker != solo_worker]
    lanes = [lane_of(r.nodeid) for r in other]
    # free and untimed tests before any timed one
    first_timed = lanes.index("timed")
    assert set(lanes[:first_timed]) <= {"free", "untimed"}
    assert "free" not in lanes[first_timed:] and "untimed" not in lanes[first_timed:]
    # and the longest timed test (SLOW_FIRST) comes first among them
    assert other[first_timed].nodeid == IDS[7]


def test_both_processes_take_timed_tests_once_the_solo_lane_is_done() -> None:
    ids = IDS + [f"tests/integration/test_worker.py::test_more_{i}" for i in range(30)]
    ran = simulate(ids)
    solo_worker = next(r.worker for r in ran if lane_of(r.nodeid) == "solo")
    solo_end = max(r.end for r in ran if lane_of(r.nodeid) == "solo")
    after = {r.worker for r in ran if r.start >= solo_end and lane_of(r.nodeid) == "timed"}
    assert after == {"gw0", "gw1"}
    # and the two end within one timed test of each other
    ends = {w: max(r.end for r in ran if r.worker == w) for w in ("gw0", "gw1")}
    assert abs(ends["gw0"] - ends["gw1"]) <= DURATION["timed"], (solo_worker, ends)


@pytest.mark.parametrize("workers", [1, 3])
def test_one_or_three_processes_run_everything(workers: int) -> None:
    ran = simulate(IDS, workers)
    assert sorted(r.nodeid for r in ran) == sorted(IDS)
    assert len({r.worker for r in ran if lane_of(r.nodeid) == "solo"}) == 1


def test_the_unit_tiers_longest_tests_start_first() -> None:
    """`./run unit` schedules with these lanes too: its longest tests (SLOW_FIRST) start
    first, so that neither process is left with one of them at the end."""
    ids = [f"tests/unit/test_a.py::test_{i}" for i in range(6)] + [
        "tests/unit/test_wheel.py::TestWheelMachine::runTest",
        "tests/unit/test_b.py::test_z",
        "tests/unit/test_shard_invariants.py::TestShardInvariants::runTest",
    ]
    ran = simulate(ids)
    assert sorted(r.nodeid for r in ran) == sorted(ids)
    assert {r.nodeid for r in ran if r.start == 0} >= {ids[8]}
    long_ones = {ids[6], ids[8]}
    for worker in {r.worker for r in ran}:
        order = [r.nodeid in long_ones for r in sorted(ran, key=lambda r: r.start)
                 if r.worker == worker]
        assert order == sorted(order, reverse=True), (worker, order)  # long ones before
