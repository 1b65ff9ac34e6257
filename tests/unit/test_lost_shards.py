"""Lost shards (in-memory bus, manual clock): a takeover whose claim another claimer fenced
gives the shard up; if the group still assigns it to the node after `lost_shard_retry_ms` and
the node is still a current member, the node takes it over again, so a stray claimer (one that
no member the group gave the shard to owns) cannot leave the shard unserved until the next
rebalance. A shard the group moved meanwhile is not taken again, nor one while the coordinator
does not confirm the node as a member (it is looked at again later: that answer can pass)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from chronowheel.bus.memory import MemorySubmitGroup, MemoryTxnProducer
from chronowheel.bus.ports import BusError, PartitionUnavailable
from chronowheel.core.wire import claimer_transactional_id
from chronowheel.node.lost_shards import MAX_RETRY_MS, QUIET_MS, LostShards
from chronowheel.node.service import Node
from chronowheel.node.transactions import ShardUnavailable

from tests.unit.node_rig import T0, NodeRig
from tests.unit.test_node_fencing import assert_claim_before_publish, node_id, state_records
from tests.unit.test_node_warm import assert_each_once_never_early, group, job_on, registry


@pytest.fixture
async def rig() -> Any:
    async with NodeRig(lost_shard_retry_ms=1_000) as rig:
        yield rig


def stray_claim_on_first_takeover(rig: NodeRig, shard: int, times: int = 1) -> list[str]:
    """The first `times` claimers the node starts for `shard` are fenced right after their
    start by another claimer of the shard, started and left (as a stopped takeover whose init
    landed late); returns the transactional ids of every claimer started from here on."""
    real = rig.bus.claimer
    stray_id = claimer_transactional_id(rig.settings.namespace, shard)
    started: list[str] = []
    strays = iter([True] * times)

    def claimer(transactional_id: str, group_id: str) -> MemoryTxnProducer:
        ours = real(transactional_id, group_id)
        started.append(transactional_id)
        if transactional_id == stray_id and next(strays, False):
            start = ours.start

            async def start_then_stray() -> None:
                await start()
                await real(stray_id, group_id).start()

            ours.start = start_then_stray  # type: ignore[method-assign]
        return ours

    rig.bus.claimer = claimer  # type: ignore[method-assign]
    return started


async def started_without(rig: NodeRig, shard: int, times: int = 1) -> tuple[Node, list[str]]:
    """A node whose first takeover of `shard` lost its claim to a stray claimer (and so the
    next `times - 1` too)."""
    started = stray_claim_on_first_takeover(rig, shard, times)
    node = rig.new_node("me")
    await node.start()
    await rig.settle()
    assert shard not in node.owned and node.failure is None
    assert shard in group(node).assigned()
    return node, started


async def test_a_shard_lost_to_a_stray_claimer_is_taken_again_while_the_group_assigns_it(
        rig: NodeRig) -> None:
    rig.upsert(job_on(0, "a"), at=T0 + 500)  # due while nobody serves the shard
    rig.upsert(job_on(0, "b"), at=T0 + 3_000)
    rig.upsert(job_on(1, "c"), at=T0 + 500)
    node, _ = await started_without(rig, 0)
    await rig.advance(900)
    assert 0 not in node.owned, "taken again before lost_shard_retry_ms"
    assert [m.key for m in rig.fired()] == [job_on(1, "c").encode()]  # the other shard goes on
    await rig.advance(200)
    assert 0 in node.owned and node.owned[0].actor.ready
    assert state_records(rig, 0)[-1]["owner"] == node_id("me")
    assert node.metrics.claims_lost._value.get() == 1
    assert group(node).membership_checks == 1  # asked of the coordinator before the claim
    await rig.advance(3_000)
    assert_each_once_never_early(rig, Counter(
        {job_on(0, "a"): 1, job_on(0, "b"): 1, job_on(1, "c"): 1}))
    assert_claim_before_publish(rig)
    assert node.failure is None


async def test_each_loss_in_a_row_waits_twice_as_long_in_the_node(rig: NodeRig) -> None:
    node, started = await started_without(rig, 0, times=2)
    await rig.advance(1_100)  # taken again after 1 s, and lost again
    assert 0 not in node.owned and node.metrics.claims_lost._value.get() == 2
    await rig.advance(1_800)
    assert 0 not in node.owned, "the second loss waited no longer than the first"
    await rig.advance(300)
    assert 0 in node.owned and node.owned[0].actor.ready
    assert started.count(claimer_transactional_id(rig.settings.namespace, 0)) == 3


async def test_a_lost_shard_the_group_moved_meanwhile_is_not_taken_again(rig: NodeRig) -> None:
    node, started = await started_without(rig, 0)
    claims = len(started)
    await group(node).revoke([0])
    assert registry(node).lost.pending() == []  # forgotten: the group decided
    await rig.advance(5_000)
    assert 0 not in node.owned and started[claims:] == []
    assert node.failure is None
    # Assigned again, it is taken over as any assignment is.
    await group(node).assign([0])
    await rig.settle()
    assert 0 in node.owned


async def test_no_shard_is_taken_again_while_the_membership_is_not_confirmed(
        rig: NodeRig) -> None:
    node, started = await started_without(rig, 0)
    claims = len(started)
    group(node).stale = True  # the coordinator does not confirm it (an expired session, or
    await rig.advance(5_000)  # a new assignment's epoch not seen yet)
    assert 0 not in node.owned and started[claims:] == []
    assert node.failure is None
    asked = group(node).membership_checks
    assert asked >= 2, "looked at once and never again"
    # Confirmed again (the answer was a passing one): taken at the next look.
    group(node).stale = False
    await rig.advance(8_000)
    assert 0 in node.owned and node.owned[0].actor.ready
    assert group(node).membership_checks == asked + 1
    assert node.metrics.claims_lost._value.get() == 1


async def test_a_coordinator_that_cannot_be_asked_stops_nothing_and_is_asked_again(
        rig: NodeRig) -> None:
    node, started = await started_without(rig, 0)
    claims = len(started)
    rig.upsert(job_on(1, "meanwhile"), at=T0 + 5_000)
    group(node).coordinator_unreachable = True
    await rig.advance(12_000)  # the look at 1 s asks five times, 1+2+3+4 s apart
    assert group(node).membership_checks == 5
    assert node.failure is None and 0 not in node.owned and started[claims:] == []
    assert_each_once_never_early(rig, Counter({job_on(1, "meanwhile"): 1}))  # shard 1 goes on
    group(node).coordinator_unreachable = False
    await rig.advance(3_000)  # looked at again 2 s after the failed look
    assert 0 in node.owned and node.owned[0].actor.ready
    assert group(node).membership_checks == 6


async def test_a_fence_is_not_a_lost_claim_and_its_recovery_takes_the_lost_shard_too(
        rig: NodeRig) -> None:
    node, started = await started_without(rig, 0)
    rig.upsert(job_on(1, "x"), at=T0 + 400)
    # Another node's takeover fences the node's producer before the lost shard's time: the
    # recovery takes every shard the group still gives the node, the lost one included, and
    # the lost shard's look finds it served.
    fencer = rig.bus.producer(node_id("me"), "unit-nodes")
    await fencer.start()
    await rig.advance(500)
    assert node.transactions is not None and node.transactions.session == 1
    assert sorted(node.owned) == [0, 1] and node.failure is None
    assert node.metrics.claims_lost._value.get() == 1  # the stray claim only, not the fence
    await rig.advance(2_000)
    assert started.count(claimer_transactional_id(rig.settings.namespace, 0)) == 2
    assert group(node).membership_checks == 1  # the recovery's
    assert_each_once_never_early(rig, Counter({job_on(1, "x"): 1}))


async def test_zero_leaves_a_lost_shard_to_the_next_rebalance() -> None:
    async with NodeRig(lost_shard_retry_ms=0) as rig:
        node, started = await started_without(rig, 0)
        claims = len(started)
        await rig.advance(MAX_RETRY_MS + 1_000, step_ms=1_000)
        assert 0 not in node.owned and started[claims:] == []


# --- the bookkeeping ------------------------------------------------------------------------
def waits(lost: LostShards, shard: int, at: Iterator[int]) -> list[int | None]:
    return [lost.lost(shard, now) for now in at]


def test_each_loss_in_a_row_waits_twice_as_long_up_to_the_bound() -> None:
    lost = LostShards(retry_ms=1_000)
    assert waits(lost, 3, iter(range(0, 7_000, 1_000))) == [
        1_000, 2_000, 4_000, 8_000, 16_000, MAX_RETRY_MS, MAX_RETRY_MS]
    # A quiet spell starts again from the first wait; other shards count their own.
    assert lost.lost(3, 6_000 + QUIET_MS + 1) == 1_000
    assert lost.lost(4, 6_000 + QUIET_MS + 1) == 1_000


def test_shards_come_due_in_time_order_and_the_group_can_forget_them() -> None:
    lost = LostShards(retry_ms=1_000)
    lost.lost(1, 0)
    lost.lost(2, 500)
    lost.lost(1, 600)  # lost again: 2 s from now
    assert lost.next_due_ms() == 1_500 and lost.take_due(1_499) == []
    assert lost.take_due(1_500) == [2] and lost.pending() == [1]
    assert lost.take_due(2_600) == [1] and lost.next_due_ms() is None
    lost.lost(1, 3_000)
    assert lost.next_due_ms() == 7_000  # its third loss in a row
    lost.forget([1])  # the group revoked or assigned it
    assert lost.pending() == [] and lost.lost(1, 3_100) == 1_000


def test_a_first_wait_over_the_bound_is_kept() -> None:
    lost = LostShards(retry_ms=60_000)
    assert waits(lost, 0, iter([0, 1])) == [60_000, 60_000]
    assert LostShards(retry_ms=0).lost(0, 0) is None


def seek_failing(monkeypatch: pytest.MonkeyPatch, shard: int, times: int = 1) -> None:
    """The next `times` seeks of `shard` fail as when a killed broker led its submit partition
    and no other replica was in sync: the look-up of the log start finds no leader within the
    bus's deadline."""
    failures = iter([True] * times)
    real_seek = MemorySubmitGroup.seek

    async def seek(self: MemorySubmitGroup, k: int, offset: int | None) -> int:
        if k == shard and next(failures, False):
            raise PartitionUnavailable(f"log start of {self.topic}[{k}]: timed out")
        return await real_seek(self, k, offset)

    monkeypatch.setattr(MemorySubmitGroup, "seek", seek)


async def test_a_shard_whose_partition_cannot_be_sought_is_released_and_taken_again(
        rig: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    # About the one shard: its claim is released, the node's other shards go on, and it is
    # taken over again while the group still assigns it. (A seek refused otherwise still stops
    # the node: tests/unit/test_node_fencing.py.)
    seek_failing(monkeypatch, 0)
    rig.upsert(job_on(0, "a"), at=T0 + 500)  # due while nobody serves the shard
    rig.upsert(job_on(1, "c"), at=T0 + 500)
    node = rig.new_node("me")
    await node.start()
    await rig.settle()
    assert node.failure is None and 0 not in node.owned and 1 in node.owned
    released = state_records(rig, 0)[-1]
    assert released["owner"] is None, "the half-way claim is released, not left to be fenced"
    assert node.metrics.shards_unavailable._value.get() == 1
    await rig.advance(900)
    assert [m.key for m in rig.fired()] == [job_on(1, "c").encode()]  # the other shard goes on
    assert 0 not in node.owned, "taken again before lost_shard_retry_ms"
    await rig.advance(200)
    assert 0 in node.owned and node.owned[0].actor.ready
    assert state_records(rig, 0)[-1]["owner"] == node_id("me")
    await rig.advance(1_000)
    assert_each_once_never_early(rig, Counter({job_on(0, "a"): 1, job_on(1, "c"): 1}))
    assert_claim_before_publish(rig)
    assert node.failure is None
    assert node.metrics.claims_lost._value.get() == 0  # not a claim another node took


async def test_a_warm_shard_whose_partition_cannot_be_sought_is_released_and_taken_again(
        rig: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    node = await rig.start("me")
    rig.upsert(job_on(0, "a"), at=T0 + 3_000)
    rig.upsert(job_on(1, "c"), at=T0 + 3_000)
    await rig.advance(1_000)
    await group(node).revoke([0, 1])
    await rig.settle()
    assert sorted(registry(node).warm) == [0, 1]
    seek_failing(monkeypatch, 0)
    await group(node).assign([0, 1])
    await rig.settle()
    assert node.failure is None and 0 not in node.owned and node.owned[1].actor.resumed_warm
    assert state_records(rig, 0)[-1]["owner"] is None
    await rig.advance(1_100)
    assert 0 in node.owned and node.owned[0].actor.ready  # taken over in full
    await rig.advance(2_000)
    assert_each_once_never_early(rig, Counter({job_on(0, "a"): 1, job_on(1, "c"): 1}))
    assert_claim_before_publish(rig)
    assert node.failure is None


async def test_a_claim_that_could_not_be_released_or_another_seek_failure_stops_the_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Not released, the claim names this node: its next owner will fence it, so the node
    # stops rather than go on. And a warm resumption's seek refused otherwise is not the
    # partition's alone: it stops the node too.
    from chronowheel.node import takeover

    async def not_released(**kw: Any) -> bool:
        return False

    seek_failing(monkeypatch, 0)
    with monkeypatch.context() as patched:
        patched.setattr(takeover, "release_half_way", not_released)
        async with NodeRig(lost_shard_retry_ms=1_000) as rig:
            node = rig.new_node("me")
            await node.start()
            await rig.settle()
            assert isinstance(node.failure, PartitionUnavailable), node.failure

    async with NodeRig(lost_shard_retry_ms=1_000) as rig:
        node = await rig.start("me")
        await group(node).revoke([0, 1])
        await rig.settle()
        assert sorted(registry(node).warm) == [0, 1]
        real_seek = MemorySubmitGroup.seek

        async def refused(self: MemorySubmitGroup, k: int, offset: int | None) -> int:
            if k == 0:
                raise BusError("seek refused")
            return await real_seek(self, k, offset)

        monkeypatch.setattr(MemorySubmitGroup, "seek", refused)
        await group(node).assign([0, 1])
        await rig.settle()
        assert node.failure is not None and "seek refused" in repr(node.failure)


async def test_with_no_retry_a_shard_whose_partition_cannot_be_sought_stops_the_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # lost_shard_retry_ms 0 leaves a lost shard to the next rebalance, which a consumer-
    # protocol group may never make for it: the node stops, and its shards move.
    seek_failing(monkeypatch, 0)
    async with NodeRig(lost_shard_retry_ms=0) as rig:
        node = rig.new_node("me")
        await node.start()
        await rig.settle()
        assert isinstance(node.failure, ShardUnavailable), node.failure
        assert state_records(rig, 0)[-1]["owner"] is None  # released all the same
