"""The node's state reads (`KafkaNodeBus.read_last`) against the real broker: a settled read
waits for a transaction still open on the partition and returns what it committed; a reader
kept for the next read is paused meanwhile (an assigned one goes on fetching its partition every
few milliseconds), and serves the next read of another partition; a read looks at the tail first
and finds the last record however far back it is."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from chronowheel.bus.kafka import plain_producer, transactional_producer
from chronowheel.bus.kafka_node import STATE_TAIL_OFFSETS, KafkaNodeBus

from testkit.fleet import until
from tests.conftest import Stack
from tests.integration.harness import make_namespace

pytestmark = pytest.mark.integration


async def test_a_settled_read_waits_for_the_open_transaction_and_idle_readers_are_paused(
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
        await txn.send_and_wait(topic, b"second", key=b"k0", partition=0)
        # Open while the read begins: a read to the last stable offset does not wait for it,
        # a settled read does, and returns what the transaction committed.
        assert await bus.read_last(topic, 0, b"k0", 10_000) == b"first"
        in_use: list[AIOKafkaConsumer] = []
        take = bus._reader

        async def recorded() -> AIOKafkaConsumer:
            in_use.append(await take())
            return in_use[-1]

        bus._reader = recorded  # type: ignore[method-assign]
        settled = asyncio.ensure_future(bus.read_last(topic, 0, b"k0", 10_000, settled=True))
        # Committed only once the read has fetched and seen the high watermark above it (the
        # open transaction's record): a read that ended then would return "first".
        tp = TopicPartition(topic, 0)
        await until(lambda: bool(in_use) and in_use[0].highwater(tp) is not None, 30,
                    "the settled read's first fetch")
        assert not settled.done()
        await txn.commit_transaction()
        assert await settled == b"second"

        idle = list(bus._idle_readers)
        assert idle, "the readers were not kept for the next read"
        for reader in idle:
            assert reader.paused() == reader.assignment(), "an idle reader still fetches"
        # A kept reader serves the next read, of another partition, unpaused.
        assert await bus.read_last(topic, 1, b"k1", 10_000, settled=True) == b"other"
        assert await bus.read_last(topic, 0, b"k0", 10_000) == b"second"
        assert all(r.paused() == r.assignment() for r in bus._idle_readers)
    finally:
        await txn.stop()
        await bus.close()


async def test_a_read_finds_the_last_record_in_the_tail_or_further_back(
        stack: Stack, namespace: str) -> None:
    """`read_last` looks at the partition's tail first (`STATE_TAIL_OFFSETS`) and further back
    only when the key is not there: the last record is found either way, never an older one."""
    settings = await make_namespace(stack, namespace, shards=2)
    topic = settings.state_topic
    plain = plain_producer(settings)
    await plain.start()
    try:
        for i in range(STATE_TAIL_OFFSETS + 100):  # the tail holds only the newest of these
            await plain.send(topic, f"v{i}".encode(), key=b"k0", partition=0)
        await plain.send_and_wait(topic, b"before", key=b"k1", partition=1)
        await plain.send_and_wait(topic, b"target", key=b"k1", partition=1)
        # Then more than a tail of records of other keys after it on the same partition.
        for _ in range(3 * STATE_TAIL_OFFSETS):
            await plain.send(topic, b"noise", key=b"other", partition=1)
        await plain.flush()
    finally:
        await plain.stop()
    bus = KafkaNodeBus(settings)
    seen: list[int] = []  # offsets the reads were handed
    take = bus._reader

    async def recorded() -> AIOKafkaConsumer:
        consumer = await take()
        fetch = consumer.getmany

        async def getmany(*tps: TopicPartition, **kw: Any) -> Any:
            batch = await fetch(*tps, **kw)
            seen.extend(m.offset for msgs in batch.values() for m in msgs)
            return batch

        consumer.getmany = getmany  # type: ignore[method-assign]
        return consumer

    bus._reader = recorded  # type: ignore[method-assign]
    try:
        last = f"v{STATE_TAIL_OFFSETS + 99}".encode()
        assert await bus.read_last(topic, 0, b"k0", 10_000) == last
        end = STATE_TAIL_OFFSETS + 101  # `init`'s record, then ours
        assert seen and min(seen) == end - STATE_TAIL_OFFSETS  # the tail only
        assert await bus.read_last(topic, 0, b"k0", 10_000, settled=True) == last
        assert await bus.read_last(topic, 1, b"k1", 10_000) == b"target"
        assert await bus.read_last(topic, 1, b"k1", 10_000, settled=True) == b"target"
        assert await bus.read_last(topic, 1, b"absent", 10_000) is None
    finally:
        await bus.close()
