"""The node's state reads (`KafkaNodeBus.read_last`, on librdkafka in a thread) against the real
broker: a settled read waits for a transaction still open on the partition and returns what it
committed; a consumer kept for the next read is unassigned meanwhile (it fetches nothing), and
serves the next read of another partition; a read looks at the tail first and finds the last
record however far back it is; a read that cannot reach its end in time says so."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from chronowheel.bus.kafka import plain_producer, transactional_producer
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.bus.kafka_state_reads import TAIL_OFFSETS, RdKafkaStateReads
from chronowheel.bus.ports import BusError

from testkit.fleet import until
from tests.conftest import Stack
from tests.integration.harness import make_namespace

pytestmark = pytest.mark.integration


class Recorded:
    """A reader's consumer that records what its polls handed over: records' offsets and
    the partition-EOF events' offsets (where its fetches reached the end)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.offsets: list[int] = []
        self.eofs: list[int] = []
        self._lock = threading.Lock()

    def _seen(self, msg: Any) -> None:
        with self._lock:
            (self.eofs if msg.error() is not None else self.offsets).append(msg.offset())

    def poll(self, timeout: float) -> Any:
        msg = self.consumer.poll(timeout)
        if msg is not None:
            self._seen(msg)
        return msg

    def consume(self, n: int, timeout: float) -> list[Any]:
        msgs = self.consumer.consume(n, timeout)
        for msg in msgs:
            self._seen(msg)
        return list(msgs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


def recording(bus: KafkaNodeBus) -> list[Recorded]:
    """Every consumer the bus's reads take from now on, recorded."""
    reads: RdKafkaStateReads = bus._state_reads
    taken: list[Recorded] = []
    take = reads._take

    def recorded() -> Any:
        consumer = take()
        wrapped = consumer if isinstance(consumer, Recorded) else Recorded(consumer)
        taken.append(wrapped)
        return wrapped

    reads._take = recorded  # type: ignore[method-assign]
    return taken


async def test_a_settled_read_waits_for_the_open_transaction_and_idle_readers_fetch_nothing(
        stack: Stack, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    topic = settings.state_topic
    plain = plain_producer(settings)
    await plain.start()
    try:
        await plain.send_and_wait(topic, b"first", key=b"k0", partition=0)
        await plain.send_and_wait(topic, b"other", key=b"k1", partition=1)
    finally:
        await plain.stop()

    bus = KafkaNodeBus(settings)
    txn = transactional_producer(settings, f"{namespace}-test-reads")
    await txn.start()
    try:
        await txn.begin_transaction()
        opened = await txn.send_and_wait(topic, b"second", key=b"k0", partition=0)
        # Open while the read begins: a read to the last stable offset does not wait for it,
        # a settled read does, and returns what the transaction committed.
        assert await bus.read_last(topic, 0, b"k0", 10_000) == b"first"
        taken = recording(bus)
        settled = asyncio.ensure_future(bus.read_last(topic, 0, b"k0", 10_000, settled=True))
        # Committed only once the read's fetches have reached the last stable offset, the
        # open transaction's first record (an EOF there): a read that ended then would
        # return "first".
        await until(lambda: bool(taken) and opened.offset in taken[0].eofs, 30,
                    "the settled read reaching the last stable offset")
        assert not settled.done()
        await txn.commit_transaction()
        assert await settled == b"second"
        assert opened.offset in taken[0].offsets  # read once its transaction committed

        reads: RdKafkaStateReads = bus._state_reads
        idle = list(reads._idle)
        assert idle, "the consumers were not kept for the next read"
        for consumer in idle:
            assert consumer.assignment() == [], "an idle consumer still fetches"
        # A kept consumer serves the next read, of another partition.
        kept = len(idle)
        assert await bus.read_last(topic, 1, b"k1", 10_000, settled=True) == b"other"
        assert await bus.read_last(topic, 0, b"k0", 10_000) == b"second"
        assert reads.idle == kept
        assert all(consumer.assignment() == [] for consumer in reads._idle)
    finally:
        await txn.stop()
        await bus.close()


async def test_a_read_that_cannot_reach_its_end_in_time_says_so(
        stack: Stack, namespace: str) -> None:
    """A settled read behind a transaction that stays open fails at its deadline with the
    partition and the offset it reached, and its consumer is not kept (it may be in any
    state)."""
    settings = await make_namespace(stack, namespace, shards=1)
    topic = settings.state_topic
    bus = KafkaNodeBus(settings)
    txn = transactional_producer(settings, f"{namespace}-test-open")
    await txn.start()
    try:
        await txn.begin_transaction()
        await txn.send_and_wait(topic, b"open", key=b"k0", partition=0)
        with pytest.raises(BusError, match=rf"timed out reading {topic}\[0\] to its high "
                                           r"watermark \d+ \(1000 ms, at \d+\)"):
            await bus.read_last(topic, 0, b"k0", 1_000, settled=True)
        assert bus._state_reads.idle == 0
        await txn.abort_transaction()
        assert await bus.read_last(topic, 0, b"k0", 10_000, settled=True) is None
    finally:
        await txn.stop()
        await bus.close()


async def test_a_read_finds_the_last_record_in_the_tail_or_further_back(
        stack: Stack, namespace: str) -> None:
    """`read_last` looks at the partition's tail first (`TAIL_OFFSETS`) and further back
    only when the key is not there: the last record is found either way, never an older one."""
    settings = await make_namespace(stack, namespace, shards=2)
    topic = settings.state_topic
    plain = plain_producer(settings)
    await plain.start()
    try:
        for i in range(TAIL_OFFSETS + 100):  # the tail holds only the newest of these
            await plain.send(topic, f"v{i}".encode(), key=b"k0", partition=0)
        await plain.send_and_wait(topic, b"before", key=b"k1", partition=1)
        await plain.send_and_wait(topic, b"target", key=b"k1", partition=1)
        # Then more than a tail of records of other keys after it on the same partition.
        for _ in range(3 * TAIL_OFFSETS):
            await plain.send(topic, b"noise", key=b"other", partition=1)
        await plain.flush()
    finally:
        await plain.stop()
    bus = KafkaNodeBus(settings)
    taken = recording(bus)
    try:
        last = f"v{TAIL_OFFSETS + 99}".encode()
        assert await bus.read_last(topic, 0, b"k0", 10_000) == last
        end = TAIL_OFFSETS + 101  # `init`'s record, then ours
        seen = taken[-1].offsets
        assert seen and min(seen) == end - TAIL_OFFSETS  # the tail only
        assert await bus.read_last(topic, 0, b"k0", 10_000, settled=True) == last
        assert await bus.read_last(topic, 1, b"k1", 10_000) == b"target"
        assert await bus.read_last(topic, 1, b"k1", 10_000, settled=True) == b"target"
        assert await bus.read_last(topic, 1, b"absent", 10_000) is None
    finally:
        await bus.close()
