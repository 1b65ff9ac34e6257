"""The node's group member on a thread of its own (`KafkaSubmitGroup`), over a fake consumer:
liveness of the node loop on an injected clock, rebalance callbacks run on the node loop and
awaited by the group thread, hand-over of fetched records, failures surfacing to the node, a
clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidSessionTimeoutError,
    KafkaConnectionError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import OffsetAndMetadata
from chronowheel.bus import kafka_node
from chronowheel.bus.group_thread import LoopLiveness
from chronowheel.bus.kafka_node import GROUP_POLL_MS, KafkaSubmitGroup
from chronowheel.bus.ports import BusError, PartitionUnavailable
from chronowheel.core import wire
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings

from testkit.fleet import until

TOPIC = Settings().submit_topic


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000


# --- liveness of the node loop -------------------------------------------------------------


def test_a_loop_that_answers_may_be_polled_for() -> None:
    clock = FakeClock()
    live = LoopLiveness(15_000, clock)
    clock.advance(LoopLiveness.POLL_GRACE_MS)
    assert live.may_poll()
    clock.advance(1)
    assert not live.may_poll()
    live.answered()
    assert live.may_poll() and live.stalled_ms() == 0


def test_a_stall_is_warned_of_at_a_third_of_the_limit_and_at_the_limit(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    live = LoopLiveness(15_000, clock, what="node n1")
    caplog.set_level(logging.WARNING, logger=kafka_node.__name__)
    clock.advance(4_999)
    live.check()
    assert not caplog.records
    clock.advance(1)
    live.check()
    live.check()  # once per stall
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    assert "node n1" in warning.message and "5000 ms" in warning.message
    assert "node_loop_stall_limit_ms (15000)" in warning.message
    clock.advance(10_000 + LoopLiveness.POLL_GRACE_MS)
    live.check()
    assert caplog.records[-1].levelno == logging.ERROR
    assert "not polling" in caplog.records[-1].message
    live.answered()
    assert "answers again after 16000 ms" in caplog.records[-1].message
    clock.advance(5_000)
    live.check()  # a new stall is warned of again
    assert "has not answered for 5000 ms" in caplog.records[-1].message


# --- the group thread over a fake consumer -------------------------------------------------


class FakeConsumer:
    """The parts of AIOKafkaConsumer the group uses; records which thread calls it."""

    def __init__(self) -> None:
        self.listener: ConsumerRebalanceListener | None = None
        self.refuse_offsets: Exception | None = None  # raised by beginning_offsets
        self.threads: set[int] = set()
        self.assigned: set[TopicPartition] = set()
        self.paused_tps: set[TopicPartition] = set()
        self.queued: dict[TopicPartition, list[Any]] = {}
        self.getmany_calls = 0
        self.fail_with: BaseException | None = None
        self.seeks: list[tuple[int, int | None]] = []
        self.log_start: dict[int, int] = {}
        self.log_end: dict[int, int] = {}  # as the last fetch heard it (highwater)
        self.commits: list[tuple[Any, dict[TopicPartition, Any]]] = []
        self.refuse_commits: BaseException | None = None
        self.stopped = False
        # The internals the membership check goes through (the consumer's own commit refuses
        # a partition that is not assigned).
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment="now"))
        self._coordinator = SimpleNamespace(commit_offsets=self._commit_offsets, generation=3,
                                            member_id="n1-abc")

    def _here(self) -> None:
        self.threads.add(threading.get_ident())

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        self.listener = listener

    async def start(self) -> None:
        self._here()

    async def stop(self) -> None:
        self._here()
        self.stopped = True

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1, 2, 3}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_tps)

    def pause(self, *tps: TopicPartition) -> None:
        self._here()
        self.paused_tps.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._here()
        self.paused_tps.difference_update(tps)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        self._here()
        self.getmany_calls += 1
        if self.fail_with is not None:
            raise self.fail_with
        out = {tp: r for tp, r in self.queued.items() if r and tp not in self.paused_tps}
        for tp in out:
            self.queued[tp] = []
        if not out:
            await asyncio.sleep(0.01)  # the fetch's wait, shortened
        return out

    async def committed(self, tp: TopicPartition) -> int | None:
        self._here()
        return 7

    async def _commit_offsets(self, assignment: Any, offsets: dict[TopicPartition, Any]) -> None:
        self._here()
        if self.refuse_commits is not None:
            raise self.refuse_commits
        self.commits.append((assignment, offsets))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._here()
        if tp not in self.assigned:  # as aiokafka
            raise IllegalStateError(f"No current assignment for partition {tp}")
        self.seeks.append((tp.partition, offset))

    def highwater(self, tp: TopicPartition) -> int | None:
        assert tp in self.assigned, "Partition is not assigned"  # as aiokafka
        return self.log_end.get(tp.partition)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self._here()
        if self.refuse_offsets is not None:
            raise self.refuse_offsets
        return {tp: self.log_start.get(tp.partition, 0) for tp in tps}


class Rec:
    def __init__(self, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = TOPIC, partition, offset
        self.key, self.value, self.headers = b"k", b"v", []


class Group(KafkaSubmitGroup):
    def __init__(self, consumer: FakeConsumer, **kw: Any) -> None:
        self.fake = consumer
        self.node_calls: list[tuple[str, list[int], int]] = []
        self.revoke_may_end = asyncio.Event()
        self.revoke_may_end.set()
        super().__init__(Settings(pump_fetch_records=3), group_id="g", client_id="n1",
                         session_timeout_ms=3_000, on_assigned=self._assigned_cb,
                         on_revoked=self._revoked_cb, **kw)

    def _new_consumer(self) -> Any:
        return self.fake

    async def _assigned_cb(self, shards: list[int]) -> None:
        self.node_calls.append(("assigned", shards, threading.get_ident()))

    async def _revoked_cb(self, shards: list[int]) -> None:
        self.node_calls.append(("revoked", shards, threading.get_ident()))
        await self.revoke_may_end.wait()
        self.node_calls.append(("revoked-done", shards, threading.get_ident()))


@pytest.fixture(autouse=True)
def _no_broker_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    async def none(settings: Settings) -> None:
        return None

    monkeypatch.setattr(kafka_node, "group_session_limits", none)


async def _on_group_thread(group: Group, coro: Any) -> Any:
    """Run a coroutine on the group loop (as aiokafka's coordinator would) and wait for it."""
    assert group._loop is not None
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, group._loop))


async def _assign(group: Group, *shards: int) -> None:
    group.fake.assigned |= {TopicPartition(TOPIC, k) for k in shards}
    assert group.fake.listener is not None
    await _on_group_thread(group, group.fake.listener.on_partitions_assigned(
        [TopicPartition(TOPIC, k) for k in shards]))

@contextlib.asynccontextmanager
async def _running(fake: FakeConsumer) -> AsyncIterator[Group]:
    """A started group member over `fake`, stopped at the end."""
    group = Group(fake)
    await group.start()
    try:
        yield group
    finally:
        await group.stop()



class SlowJoin(FakeConsumer):
    """A consumer whose start (the group join) takes 20 s of the injected clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    async def start(self) -> None:
        await super().start()
        self.clock.advance(20_000)


async def test_a_long_join_is_not_taken_for_a_stalled_node_loop(
        caplog: pytest.LogCaptureFixture) -> None:
    # Before the pings begin nothing asks the node loop: a join that waited 20 s (a static
    # member's predecessor waited out by the broker) must neither warn nor stop the polls.
    # The node loop's answers are left out, so only the count's start can keep the polls.
    clock = FakeClock()
    caplog.set_level(logging.WARNING, logger=kafka_node.__name__)
    group = Group(SlowJoin(clock), clock=clock)
    group._answer = lambda: None  # type: ignore[method-assign]
    await group.start()
    try:
        calls = group.fake.getmany_calls
        await until(lambda: group.fake.getmany_calls > calls + 2, 5, "the group's polls")
        assert not [r for r in caplog.records if "has not answered" in r.message]
    finally:
        await group.stop()


def test_liveness_counts_from_its_start() -> None:
    clock = FakeClock()
    live = LoopLiveness(15_000, clock)
    clock.advance(20_000)
    live.start()
    assert live.may_poll() and live.stalled_ms() == 0
    clock.advance(LoopLiveness.POLL_GRACE_MS + 1)
    assert not live.may_poll()


async def test_the_consumer_lives_on_its_own_thread_and_the_callbacks_on_the_node_loop() -> None:
    async with _running(FakeConsumer()) as group:
        assert group.partition_count() == 4
        await _assign(group, 0, 1)
        assert group.assigned() == {0, 1}
        here = threading.get_ident()
        assert [(what, k, t == here) for what, k, t in group.node_calls] == [
            ("assigned", [0, 1], True)]
        assert await group.committed(0) == 7
        await group.seek(1, 5)
        group.fake.log_start = {0: 12}
        assert await group.seek(0, None) == 0
        assert await group.check_membership()
        # Through the probe on the state topic, never a submit offset (a process that is no
        # longer a member may still commit those: an older one would move a shard back).
        [(assignment, offsets)] = group.fake.commits
        assert assignment == "now"
        assert offsets == {TopicPartition("chronowheel.state", 0): OffsetAndMetadata(
            wire.MEMBERSHIP_PROBE_OFFSET, wire.MEMBERSHIP_PROBE_METADATA)}
        group.fake.refuse_commits = CommitFailedError("the group has rebalanced")
        assert not await group.check_membership()
        group.fake.refuse_commits = KafkaConnectionError("no coordinator")
        with pytest.raises(BusError):
            await group.check_membership()
        # Reset by a refusal, rejoining: not a member, and nothing sent (an empty group would
        # take a commit without a generation as one from outside the group).
        group.fake.refuse_commits = None
        group.fake._coordinator.generation, group.fake._coordinator.member_id = -1, ""
        assert not await group.check_membership()
        assert len(group.fake.commits) == 1
        assert here not in group.fake.threads and len(group.fake.threads) == 1
        # The beginning is sought as the log start's offset (`_hand_over` knows from where).
        assert group.fake.seeks == [(1, 5), (0, 12)]
    assert group.fake.stopped and group._thread is None


async def test_a_seek_below_the_log_start_reads_from_it_and_says_how_far_below() -> None:
    """aiokafka would reset a position below the log start to it without a word; the group
    seeks there itself and returns how many offsets retention deleted in between."""
    async with _running(FakeConsumer()) as group:
        await _assign(group, 0, 1)
        group.fake.log_start = {0: 40, 1: 3}
        assert await group.seek(0, 25) == 15
        assert await group.seek(1, 3) == 0
        assert await group.seek(1, 9) == 0
        assert group.fake.seeks == [(0, 40), (1, 3), (1, 9)]


async def test_a_log_start_no_leader_answered_for_is_the_partition_s_alone() -> None:
    """aiokafka's look-up of offsets ends in KafkaTimeoutError once its retries (no leader,
    stale metadata) pass its request timeout: PartitionUnavailable, which a takeover takes for
    the one shard's (node/takeover.py). Any other refusal is a BusError."""
    async with _running(FakeConsumer()) as group:
        await _assign(group, 0)
        group.fake.refuse_offsets = KafkaTimeoutError()
        with pytest.raises(PartitionUnavailable, match=r"log start of .*\[0\]"):
            await group.seek(0, 25)
        group.fake.refuse_offsets = TopicAuthorizationFailedError()
        with pytest.raises(BusError) as refused:
            await group.seek(0, 25)
        assert not isinstance(refused.value, PartitionUnavailable)
        assert group.fake.seeks == []


async def test_the_group_thread_waits_for_the_nodes_revocation_to_end() -> None:
    async with _running(FakeConsumer()) as group:
        await _assign(group, 0, 1)
        group.revoke_may_end.clear()
        assert group.fake.listener is not None
        revoking = asyncio.ensure_future(_on_group_thread(
            group, group.fake.listener.on_partitions_revoked([TopicPartition(TOPIC, 1)])))
        while not any(c[0] == "revoked" for c in group.node_calls):
            await asyncio.sleep(0)
        # The node still stops shard 1: the rebalance (the group thread) must not go on.
        await asyncio.sleep(0.05)
        assert not revoking.done()
        assert group.assigned() == {0}  # not taken again meanwhile (fence recovery)
        group.revoke_may_end.set()
        await revoking
        assert [c[0] for c in group.node_calls] == ["assigned", "revoked", "revoked-done"]


async def test_fetched_records_are_handed_over_in_order_and_a_seek_drops_older_ones() -> None:
    fake = FakeConsumer()
    async with _running(fake) as group:
        await _assign(group, 0, 1)
        tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
        fake.queued[tp0] = [Rec(0, 0), Rec(0, 1)]
        got: dict[int, list[Any]] = {}
        while len(got.get(0, [])) < 2:
            for k, recs in (await group.fetch(1_000, 100)).items():
                got.setdefault(k, []).extend(recs)
        assert [r.offset for r in got[0]] == [0, 1]
        # Not taken by the node yet, then a seek: those records are never handed over.
        fake.queued[tp1] = [Rec(1, 0)]
        while not group._ready:
            await asyncio.sleep(0.005)
        await group.seek(1, 0)
        assert await group.fetch(0, 100) == {}
        # A shard with pump_fetch_records (3) waiting for the node is paused on the consumer.
        fake.queued[tp0] = [Rec(0, 2), Rec(0, 3), Rec(0, 4)]
        while tp0 not in fake.paused_tps:
            await asyncio.sleep(0.005)
        assert [r.offset for r in (await group.fetch(0, 100))[0]] == [2, 3, 4]
        while tp0 in fake.paused_tps:
            await asyncio.sleep(0.005)
        # The node's own backpressure.
        group.pause(1)
        while tp1 not in fake.paused_tps:
            await asyncio.sleep(0.005)
        group.resume(1)
        while tp1 in fake.paused_tps:
            await asyncio.sleep(0.005)


async def test_records_read_after_a_seek_wait_for_the_shard_to_take_them() -> None:
    # The seek happens on the group thread; records it reads next, if handed to the node's
    # pump before the shard's actor is ready, were dropped there and never read again (a
    # whole shard's commands went unapplied). Now they wait for deliver().
    fake = FakeConsumer()
    async with _running(fake) as group:
        await _assign(group, 0, 1)
        tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
        await group.seek(1, 7)
        fake.queued[tp1] = [Rec(1, 7), Rec(1, 8)]
        fake.queued[tp0] = [Rec(0, 0)]
        got: dict[int, list[Any]] = {}
        while not got.get(0):
            for k, recs in (await group.fetch(1_000, 100)).items():
                got.setdefault(k, []).extend(recs)
        while 1 not in group._ready:
            await asyncio.sleep(0.005)
        assert 1 not in got and await group.fetch(0, 100) == {}  # read, not handed over
        group.deliver(1)
        assert [r.offset for r in (await group.fetch(0, 100))[1]] == [7, 8]


async def _fetch_offsets(group: Group, shard: int, want: int) -> list[int]:
    """The offsets of `shard` the node's fetch takes, until it has taken `want` of them (or
    more: the test then fails on them); 5 s at most."""
    got: list[int] = []
    async with asyncio.timeout(5):
        while len(got) < want:
            got.extend(r.offset for r in (await group.fetch(1_000, 100)).get(shard, []))
    return got


async def test_a_fetch_that_goes_back_behind_a_seek_or_what_was_handed_over_is_dropped(
        caplog: pytest.LogCaptureFixture) -> None:
    # librdkafka can fetch a partition from its start again after a seek (a late answer to
    # its own look-up of the start), in the batch of the sought records or later; records
    # before where the node asked to read, or that it has read already, are never handed
    # over twice.
    fake = FakeConsumer()
    caplog.set_level(logging.WARNING, logger="chronowheel.bus.group_thread")
    async with _running(fake) as group:
        await _assign(group, 0, 1)
        tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
        fake.log_end = {1: 100}  # longer than anything fetched here
        await group.seek(1, 7)
        group.deliver(1)
        fake.queued[tp1] = [Rec(1, k) for k in range(3, 10)]  # from 3: behind the seek
        assert await _fetch_offsets(group, 1, 3) == [7, 8, 9]
        [warning] = caplog.records
        assert f"{TOPIC}[1] was fetched from offset 3 again, behind offset 7" in warning.message
        fake.queued[tp1] = [Rec(1, 8), Rec(1, 9)]  # all of them handed over already
        fake.queued[tp0] = [Rec(0, 0)]
        assert await _fetch_offsets(group, 0, 1) == [0]
        fake.queued[tp1] = [Rec(1, 9), Rec(1, 10), Rec(1, 12)]  # back there, then on
        assert await _fetch_offsets(group, 1, 2) == [10, 12]
        # In one batch: on, back to the start, and on again.
        fake.queued[tp1] = [Rec(1, 13), Rec(1, 14), Rec(1, 0), Rec(1, 1), Rec(1, 14),
                            Rec(1, 15)]
        assert await _fetch_offsets(group, 1, 3) == [13, 14, 15]
        # Warned of once per going back, not per record or batch of it.
        assert [r.message.split(": ", 1)[1].split(",")[0] for r in caplog.records] == [
            f"{TOPIC}[1] was fetched from offset 3 again",
            f"{TOPIC}[1] was fetched from offset 8 again",
            f"{TOPIC}[1] was fetched from offset 0 again"]
        # A seek backwards is the node's own: what it asks for is handed over again.
        await group.seek(1, 8)
        group.deliver(1)
        fake.queued[tp1] = [Rec(1, 8), Rec(1, 9)]
        assert await _fetch_offsets(group, 1, 2) == [8, 9]
        # So is a shard that was revoked and assigned again: it starts from wherever the
        # consumer puts it, until the node seeks it.
        assert fake.listener is not None
        await _on_group_thread(group, fake.listener.on_partitions_revoked([tp1]))
        await _assign(group, 1)
        fake.queued[tp1] = [Rec(1, 2)]
        assert await _fetch_offsets(group, 1, 1) == [2]
        assert len(caplog.records) == 3


async def test_a_log_cut_short_below_the_next_offset_is_read_on_from_its_new_end(
        caplog: pytest.LogCaptureFixture) -> None:
    # A log that ends below the offset the node reads next was cut short (an unclean leader
    # election): the consumer resets to its start; what lies below the new end was read
    # before the cut, what comes after it is new.
    fake = FakeConsumer()
    caplog.set_level(logging.WARNING, logger="chronowheel.bus.group_thread")
    async with _running(fake) as group:
        await _assign(group, 0)
        tp0 = TopicPartition(TOPIC, 0)
        await group.seek(0, 20)
        group.deliver(0)
        fake.log_end = {0: 3}
        fake.queued[tp0] = [Rec(0, 0), Rec(0, 1), Rec(0, 2)]
        await until(lambda: len(caplog.records) == 2, 5, "the hand-over's error")
        error, again = caplog.records
        assert error.levelno == logging.ERROR
        assert f"{TOPIC}[0] ends at offset 3, below offset 20" in error.message
        assert "from offset 3 on are new" in error.message
        assert "fetched from offset 0 again, behind offset 3" in again.message
        fake.log_end = {0: 5}
        fake.queued[tp0] = [Rec(0, 3), Rec(0, 4)]
        assert await _fetch_offsets(group, 0, 2) == [3, 4]
        assert len(caplog.records) == 2


async def test_a_seek_is_noted_once_done_and_only_for_a_shard_still_assigned() -> None:
    # The hand-over's position follows the consumer's: a seek the consumer refused, or one of
    # a shard revoked meanwhile, leaves none (the next records are taken as they come).
    fake = FakeConsumer()
    async with _running(fake) as group:
        await _assign(group, 0)
        with pytest.raises(IllegalStateError):
            await group.seek(1, 9)  # not assigned: the consumer refuses it
        await _on_group_thread(group, _noted_late(group, 2, 9))
        await _assign(group, 1, 2)
        fake.log_end = {1: 100, 2: 100}
        fake.queued[TopicPartition(TOPIC, 1)] = [Rec(1, 4)]
        fake.queued[TopicPartition(TOPIC, 2)] = [Rec(2, 4)]
        group.deliver(1)
        group.deliver(2)
        got: dict[int, list[int]] = {}
        async with asyncio.timeout(5):
            while len(got) < 2:
                for k, recs in (await group.fetch(1_000, 100)).items():
                    got.setdefault(k, []).extend(r.offset for r in recs)
        assert got == {1: [4], 2: [4]}
        # The log's end of a shard aiokafka no longer has is not asked for (highwater
        # asserts the assignment; on the group thread that would stop the member).
        assert group._log_end(3) is None


async def _noted_late(group: Group, shard: int, target: int) -> None:
    """A seek noted for a shard revoked while it waited for the log start."""
    group._moved(shard, target)


async def test_a_revoked_shards_unread_records_are_dropped() -> None:
    fake = FakeConsumer()
    async with _running(fake) as group:
        await _assign(group, 0)
        fake.queued[TopicPartition(TOPIC, 0)] = [Rec(0, 0)]
        while not group._ready:
            await asyncio.sleep(0.005)
        assert fake.listener is not None
        await _on_group_thread(group, fake.listener.on_partitions_revoked(
            [TopicPartition(TOPIC, 0)]))
        assert await group.fetch(0, 100) == {}


@pytest.mark.parametrize(("error", "raised"), [
    (KafkaConnectionError("broker gone"), BusError),
    (InvalidSessionTimeoutError(), ConfigError),
])
async def test_a_failure_on_the_group_thread_surfaces_in_the_nodes_fetch(
        error: BaseException, raised: type[Exception]) -> None:
    fake = FakeConsumer()
    async with _running(fake) as group:
        fake.fail_with = error
        with pytest.raises(raised) as caught:
            await group.fetch(10_000, 100)  # woken by the failure, not by the timeout
        assert caught.value.__cause__ is error
        with pytest.raises(raised):
            await group.fetch(0, 100)


class CountingLiveness(LoopLiveness):
    """A node loop that stopped answering: counts the pump's questions."""

    def __init__(self) -> None:
        super().__init__(15_000)
        self.asked = 0
        self.asked_enough = threading.Event()

    def may_poll(self) -> bool:
        self.asked += 1
        if self.asked >= 3:
            self.asked_enough.set()
        return False


async def test_the_pump_does_not_poll_for_a_loop_that_does_not_answer() -> None:
    fake = FakeConsumer()
    group = Group(fake)
    live = group._liveness = CountingLiveness()
    await group.start()
    try:
        await asyncio.to_thread(live.asked_enough.wait, 10 * GROUP_POLL_MS / 1000)
        assert live.asked >= 3
        assert fake.getmany_calls == 0
    finally:
        await group.stop()


async def _nothing(shards: list[int]) -> None:
    del shards


async def test_the_group_consumer_polls_no_longer_apart_than_the_stall_limit() -> None:
    s = Settings(node_session_timeout_ms=4_000, node_heartbeat_interval_ms=400,
                 node_loop_stall_limit_ms=9_000)
    group = KafkaSubmitGroup(s, group_id="g", client_id="c", session_timeout_ms=4_000,
                             on_assigned=_nothing, on_revoked=_nothing)
    consumer = group._new_consumer()
    assert consumer._max_poll_interval_ms == 9_000
    # The rebalance timeout stays aiokafka's default, the session timeout.
    assert consumer._rebalance_timeout_ms == 4_000


async def test_a_revocation_ends_the_nodes_pause_of_a_shard_as_aiokafka_does() -> None:
    # The node forgets its pauses of revoked shards (a new assignment starts unpaused in
    # aiokafka): a pause kept here past the revocation would stop the shard's ingest for good
    # once the shard came back.
    fake = FakeConsumer()
    async with _running(fake) as group:
        await _assign(group, 1)
        tp1 = TopicPartition(TOPIC, 1)
        group.pause(1)
        while tp1 not in fake.paused_tps:
            await asyncio.sleep(0.005)
        assert fake.listener is not None
        await _on_group_thread(group, fake.listener.on_partitions_revoked([tp1]))
        fake.assigned.discard(tp1)
        fake.paused_tps.discard(tp1)  # what aiokafka does with a revoked partition's state
        await _assign(group, 1)
        fake.queued[tp1] = [Rec(1, 0)]
        got: dict[int, list[Any]] = {}
        for _ in range(5):  # each returns as soon as records come (a paused shard: none)
            if got := await group.fetch(1_000, 100):
                break
        assert tp1 not in fake.paused_tps
        assert [r.offset for r in got.get(1, [])] == [0]
