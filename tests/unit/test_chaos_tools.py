"""The fault suite's tools that need no server: sizes, the bad-input generator, the verdict
and the recovery measure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chronowheel.core import wire
from chronowheel.core.model import ValidationPolicy, parse_command
from chronowheel.errors import ValidationError
from chronowheel.settings import Settings
from chronowheel.testing import Fired

from testkit.chaos import (
    Checker,
    Load,
    ScenarioResult,
    bad_commands,
    chaos_scale,
    new_controller,
)
from testkit.cluster import ClusterError, LocalCluster, Member
from testkit.faults import Outcome, judge
from testkit.fleet import Fleet, until
from testkit.verdict import Verdict, assert_clean


def test_the_scale_defaults_to_a_twentieth_and_rejects_nonsense() -> None:
    assert chaos_scale({}) == 0.05
    assert chaos_scale({"CHRONOWHEEL_CHAOS_SCALE": "1"}) == 1.0
    for bad in ("0", "-1", "lots", "11"):
        with pytest.raises(ValueError, match="CHRONOWHEEL_CHAOS_SCALE"):
            chaos_scale({"CHRONOWHEEL_CHAOS_SCALE": bad})
    assert Load.at_scale(1.0).herd == 20_000 and Load.at_scale(1.0).rate == 400
    small = Load.at_scale(0.01)
    assert (small.rate, small.herd) == (40, 1_000)  # floors keep a scenario meaningful


def test_every_generated_bad_command_is_refused_and_they_vary() -> None:
    policy = ValidationPolicy(namespace="acme")
    made = list(bad_commands(2_000, policy, prefix="f-", at_ms=1_800_000_000_000))
    assert len(made) == 2_000
    assert made == list(bad_commands(2_000, policy, prefix="f-", at_ms=1_800_000_000_000))
    reasons = set()
    for key, value in made:
        with pytest.raises(ValidationError) as caught:
            parse_command(value, key=key, policy=policy, now_ms=1_799_999_000_000)
        reasons.add(caught.value.path)
    # Broken bytes, missing and mistyped fields, bad keys, unknown fields, limits, ...
    assert {"$", "v", "op", "key", "job.at", "job.id"} <= reasons
    assert len(reasons) >= 10


def fired(job_id: str, scheduled: int, received: float) -> Fired:
    return Fired("acme.fired", 0, 0, job_id.encode(), b"{}", {
        wire.JOB_ID: job_id, wire.SCHEDULED_AT: str(scheduled), wire.FIRED_AT: str(scheduled),
        wire.ATTEMPT: "1", wire.OCCURRENCE: wire.occurrence_id(job_id, scheduled)}, received)


def test_recovery_is_the_last_steady_arrival_over_the_late_bar_after_the_fault() -> None:
    checker = Checker(Settings(namespace="acme"), herd_prefix="x-h")
    for i in range(100):  # before the fault at 10,000: 100 ms late
        checker.observe(fired(f"x-s{i}", 1_000 + i, 1_100 + i))
    checker.observe(fired("x-s-slow", 10_500, 14_500))  # 4 s late, arrived at 14,500
    checker.observe(fired("x-s-ok", 11_000, 11_300))  # under the 1 s bar
    checker.observe(fired("x-h1", 10_200, 30_000))  # the herd does not count for recovery
    checker.observe(fired("x-s-ok", 11_000, 11_400))  # a duplicate
    before, after, bar, recovery = checker.recovery(fault_ms=10_000, late_ms=1_000)
    assert before == 100 and bar == 1_000
    assert after == 4_000
    assert recovery == pytest.approx(4.5)
    assert checker.tally.duplicates == 1 and checker.tally.early == 0
    # A slow machine's usual lateness raises the bar: 2 x the p99 before the fault.
    assert checker.recovery(fault_ms=10_000, late_ms=50)[2] == 200


def test_the_verdict_names_every_problem() -> None:
    clean = ScenarioResult("s", "load", accepted=10)
    assert clean.problems() == []
    assert "| s | load | 10 | 0 | 0 | 0 |" in clean.row()
    bad = ScenarioResult("s", "load", accepted=10, lost=2, early=1, duplicates=3,
                         lost_examples=["a@1", "b@2"])
    problems = " ".join(bad.problems())
    assert "2 accepted occurrences never arrived" in problems and "a@1" in problems
    assert "1 deliveries before" in problems and "3 duplicate" in problems
    assert ScenarioResult("s", "load").problems() == [
        "no job was accepted: the scenario measured nothing"]


class QuorumFiles(LocalCluster):
    """Three Kafka members whose quorum-state files live under `root`; `dead` ones have no
    pid, as `stack status` reports a killed server."""

    def __init__(self, root: Path) -> None:
        super().__init__(state_dir=root, script=root / "no-stack-script")
        self.root = root
        self.dead: set[int] = set()

    def write(self, node: int, leader: int, epoch: int) -> None:
        folder = self.root / f"kafka-{node}" / "data" / "__cluster_metadata-0"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "quorum-state").write_text(json.dumps(
            {"leaderId": leader, "leaderEpoch": epoch, "votedId": -1, "data_version": 1}))

    def members(self) -> dict[str, Member]:
        return {f"kafka-{n}": Member(f"kafka-{n}", "kafka", n, f"127.0.0.1:{9191 + n}", True,
                                     None if n in self.dead else 1000 + n,
                                     self.root / f"kafka-{n}", self.root / f"kafka-{n}.log")
                for n in (1, 2, 3)}


def test_the_quorum_leader_is_the_newest_epoch_among_live_nodes(tmp_path: Path) -> None:
    cluster = QuorumFiles(tmp_path)
    for node in (1, 2, 3):
        cluster.write(node, leader=1, epoch=4)
    assert cluster.quorum_leader() == "kafka-1"
    # kafka-1 killed: kafka-3 still shows the old leader, kafka-2 already knows the new one.
    cluster.dead.add(1)
    cluster.write(2, leader=2, epoch=5)
    assert cluster.quorum_leader() == "kafka-2"


def test_no_leader_while_the_survivors_stand_as_candidates(tmp_path: Path) -> None:
    # The moment CI once met: the old leader killed, both survivors candidates (leaderId -1).
    # The killed node's file still names itself; only live nodes count.
    cluster = QuorumFiles(tmp_path)
    cluster.write(1, leader=1, epoch=4)
    cluster.dead.add(1)
    cluster.write(2, leader=-1, epoch=5)
    cluster.write(3, leader=-1, epoch=5)
    assert cluster.quorum_leader() is None
    with pytest.raises(ClusterError, match="no live Kafka node knew a quorum leader"):
        cluster.active_controller(timeout_s=0, poll_s=0)


class Election(QuorumFiles):
    """The quorum as seen at each look: the old leader, then no leader for a while, then
    another one."""

    def __init__(self, root: Path, seen: list[str | None]) -> None:
        super().__init__(root)
        self.seen = seen
        self.looks = 0

    def quorum_leader(self) -> str | None:
        leader = self.seen[min(self.looks, len(self.seen) - 1)]
        self.looks += 1
        return leader


async def test_a_new_controller_is_waited_for_through_an_election_without_a_leader(
        tmp_path: Path) -> None:
    cluster = Election(tmp_path, ["kafka-1", None, None, "kafka-1", None, "kafka-2"])
    name, _seconds = await new_controller(cluster, "kafka-1", timeout_s=60, poll_s=0)
    assert name == "kafka-2"
    assert cluster.looks == 6


async def test_no_new_controller_in_time_names_the_old_one_and_the_last_seen(
        tmp_path: Path) -> None:
    cluster = Election(tmp_path, [None])
    with pytest.raises(AssertionError, match="after kafka-1 died \\(last known: none\\)"):
        await new_controller(cluster, "kafka-1", timeout_s=0, poll_s=0)


# --- the shared fleet, poller and verdict ----------------------------------------------------


def test_one_assert_clean_judges_a_run_of_jobs_and_a_scenario_alike() -> None:
    ran = judge([], {"a": 1, "b": 2})
    assert isinstance(ran, Verdict) and ran.problems() == ["2 accepted occurrences never arrived"]
    with pytest.raises(AssertionError, match=r"2 accepted occurrences never arrived\n2 expected"):
        assert_clean(ran)
    assert_clean(Outcome(expected=2))
    with pytest.raises(AssertionError, match="3 occurrences of no job of the run"):
        assert_clean(Outcome(expected=2, unexpected=3))
    assert_clean(ScenarioResult("s", "load", accepted=10))
    exited = ScenarioResult("s", "load", accepted=10, exited=["node-2"])
    with pytest.raises(AssertionError, match=r"nodes exited: \['node-2'\].*\n\[chaos\]"):
        assert_clean(exited, Fleet(Settings(namespace="x", shards=2), Path("logs")))


class FakeNode:
    def __init__(self, name: str, shards: list[int] | None, alive: bool = True) -> None:
        self.name, self.shards, self._alive = name, shards, alive

    def alive(self) -> bool:
        return self._alive

    def health(self) -> dict[str, Any] | None:
        return None if self.shards is None else {"ok": True, "shards": self.shards}

    def log_tail(self, chars: int = 3000) -> str:
        return f"{self.name} says hello"


def fleet_of(*nodes: FakeNode, shards: int = 4) -> Fleet:
    fleet = Fleet(Settings(namespace="x", shards=shards), Path("logs"))
    fleet.nodes = list(nodes)  # type: ignore[arg-type]
    return fleet


def test_a_fleet_shares_the_shards_when_each_is_owned_once() -> None:
    a, b = FakeNode("a", [0, 1]), FakeNode("b", [2, 3])
    assert fleet_of(a, b).sharing()
    assert not fleet_of(a, FakeNode("b", [1, 2, 3])).sharing()  # shard 1 twice
    assert not fleet_of(a, FakeNode("b", [2])).sharing()  # shard 3 nobody's
    assert not fleet_of(a, b, FakeNode("c", [])).sharing()  # c owns nothing
    assert not fleet_of(a, FakeNode("b", [2, 3], alive=False)).sharing()
    assert fleet_of(a, b, FakeNode("c", None, alive=False)).dead() == ["c"]


async def test_the_poller_returns_when_true_and_fails_with_the_nodes_logs() -> None:
    seen = iter([False, False, True])
    assert await until(lambda: next(seen), 5, "three looks", poll_s=0) >= 0
    fleet = fleet_of(FakeNode("a", None))
    with pytest.raises(AssertionError, match=r"waiting for never(.|\n)*a says hello"):
        await until(lambda: False, 0, "never", fleet, poll_s=0)
    with pytest.raises(AssertionError, match="waiting for never"):
        await fleet.until(lambda: False, 0, "never")  # the condition runs in a thread


async def test_waiting_for_the_fleet_to_share_fails_at_once_when_a_node_exited() -> None:
    fleet = fleet_of(FakeNode("a", [0, 1]), FakeNode("b", None, alive=False))
    with pytest.raises(AssertionError, match=r"nodes exited while waiting.*\['b'\]"):
        await fleet.wait_sharing(timeout_s=60)
