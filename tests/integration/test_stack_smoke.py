"""Smoke tests of the real servers: the drivers and features chronowheel relies on work.

- Cassandra: prepared statements write and read back through cassandra-driver.
- Kafka: aiokafka transactions. A committed transaction is visible to a read_committed
  consumer, an aborted one is not; consumed offsets committed inside a transaction
  (send_offsets_to_transaction) take effect only when it commits; a second producer with the
  same transactional.id fences the first (the shard takeover mechanism).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import ProducerFenced
from cassandra.cluster import Cluster, Session

if TYPE_CHECKING:
    from conftest import Stack

pytestmark = pytest.mark.integration

POLL_DEADLINE_S = 30.0


# --- Cassandra -------------------------------------------------------------------------------


@pytest.fixture
def cql(stack: Stack) -> Iterator[Session]:
    cluster = Cluster([stack.cassandra_host], port=stack.cassandra_port)
    session = cluster.connect()
    try:
        yield session
    finally:
        cluster.shutdown()


def test_cassandra_prepared_write_and_read(cql: Session, bare_namespace: str) -> None:
    ks = bare_namespace
    cql.execute(
        f"CREATE KEYSPACE {ks} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    try:
        cql.execute(f"CREATE TABLE {ks}.kv (k text, n int, v blob, PRIMARY KEY (k, n))")
        insert = cql.prepare(f"INSERT INTO {ks}.kv (k, n, v) VALUES (?, ?, ?) USING TTL ?")
        select = cql.prepare(f"SELECT n, v, TTL(v) AS ttl FROM {ks}.kv WHERE k = ?")
        for n in (2, 0, 1):
            cql.execute(insert, ("job-1", n, bytes([n]) * 3, 3600))
        cql.execute(insert, ("job-2", 7, b"other", 3600))

        rows = list(cql.execute(select, ("job-1",)))
        assert [(r.n, r.v) for r in rows] == [(0, b"\0\0\0"), (1, b"\1\1\1"), (2, b"\2\2\2")]
        assert all(0 < r.ttl <= 3600 for r in rows)
        assert list(cql.execute(select, ("missing",))) == []

        version = cql.execute("SELECT release_version FROM system.local").one()
        assert version is not None and version.release_version.startswith("5.0.")
    finally:
        cql.execute(f"DROP KEYSPACE IF EXISTS {ks}")
    assert ks not in cql.cluster.metadata.keyspaces


# --- Kafka -----------------------------------------------------------------------------------


@pytest.fixture
async def topics(stack: Stack, bare_namespace: str) -> AsyncIterator[list[str]]:
    """Two one-partition topics of this test's namespace, deleted afterwards."""
    names = [f"{bare_namespace}.in", f"{bare_namespace}.out"]
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.kafka)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(n, num_partitions=1, replication_factor=1) for n in names]
        )
        yield names
    finally:
        await admin.delete_topics(names)
        await admin.close()


async def read_all(
    bootstrap: str, topic: str, isolation_level: str, until_count: int
) -> list[bytes]:
    """Values on one topic from the beginning, polling until `until_count` arrived
    and the consumer has reached the end of what it may read (bounded by a deadline)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    tp = TopicPartition(topic, 0)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        deadline = time.monotonic() + POLL_DEADLINE_S
        while time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200)
            values.extend(m.value for m in batch.get(tp, []) if m.value is not None)
            if len(values) >= until_count:
                end = (await consumer.end_offsets([tp]))[tp]
                if isolation_level == "read_uncommitted" or await consumer.position(tp) >= end:
                    # With read_committed, end_offsets is the last stable offset: being there
                    # means every committed record before it has been returned.
                    break
        return values
    finally:
        await consumer.stop()


async def test_kafka_transaction_commit_visible_abort_invisible(
    stack: Stack, topics: list[str], bare_namespace: str
) -> None:
    out = topics[1]
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka,
                                transactional_id=f"{bare_namespace}-tx")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send(out, b"committed-1", key=b"job-1")
        await producer.begin_transaction()
        await producer.send(out, b"aborted", key=b"job-2")
        await producer.send(out, b"aborted-too", key=b"job-3")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(out, b"committed-2", key=b"job-4")
    finally:
        await producer.stop()

    committed = await read_all(stack.kafka, out, "read_committed", until_count=2)
    assert committed == [b"committed-1", b"committed-2"]
    # The aborted records were written to the log: a plain reader sees them.
    uncommitted = await read_all(stack.kafka, out, "read_uncommitted", until_count=4)
    assert uncommitted == [b"committed-1", b"aborted", b"aborted-too", b"committed-2"]


async def committed_offset(consumer: AIOKafkaConsumer, tp: TopicPartition, want: int) -> int | None:
    """The group's committed offset, polled until it equals `want` (bounded by a deadline):
    the coordinator applies offsets of a transaction when its commit markers are written,
    which happens just after commit_transaction() returns."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    seen: int | None = await consumer.committed(tp)
    while seen != want and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        seen = await consumer.committed(tp)
    return seen


async def test_kafka_offsets_commit_with_the_transaction(
    stack: Stack, topics: list[str], bare_namespace: str
) -> None:
    """Consume-transform-produce: consumed offsets are committed by the transaction, and an
    aborted transaction commits neither its output nor its offsets."""
    src, out = topics
    group = f"{bare_namespace}-group"
    tp_in = TopicPartition(src, 0)

    seed = AIOKafkaProducer(bootstrap_servers=stack.kafka)
    await seed.start()
    try:
        for i in range(4):
            await seed.send_and_wait(src, f"in-{i}".encode(), partition=0)
    finally:
        await seed.stop()

    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=stack.kafka,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka,
                                transactional_id=f"{bare_namespace}-ctp")
    await consumer.start()
    await producer.start()
    try:
        consumed: list[int] = []
        deadline = time.monotonic() + POLL_DEADLINE_S
        while len(consumed) < 4 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            consumed.extend(m.offset for m in batch.get(tp_in, []))
        assert consumed == [0, 1, 2, 3]
        assert await consumer.committed(tp_in) is None

        async with producer.transaction():
            await producer.send(out, b"from-0-1")
            await producer.send_offsets_to_transaction({tp_in: 2}, group)
        assert await committed_offset(consumer, tp_in, 2) == 2

        await producer.begin_transaction()
        await producer.send(out, b"aborted-from-2-3")
        await producer.send_offsets_to_transaction({tp_in: 4}, group)
        await producer.abort_transaction()

        # The coordinator lets the next transaction start only once the abort is complete.
        async with producer.transaction():
            await producer.send(out, b"unrelated")
        assert await consumer.committed(tp_in) == 2
    finally:
        await producer.stop()
        await consumer.stop()

    assert await read_all(stack.kafka, out, "read_committed", until_count=2) == [
        b"from-0-1",
        b"unrelated",
    ]


async def test_kafka_new_producer_fences_the_old_one(
    stack: Stack, topics: list[str], bare_namespace: str
) -> None:
    """Starting a producer with the same transactional.id fences the previous owner."""
    out = topics[1]
    tid = f"{bare_namespace}-shard-0"
    old = AIOKafkaProducer(bootstrap_servers=stack.kafka, transactional_id=tid)
    new = AIOKafkaProducer(bootstrap_servers=stack.kafka, transactional_id=tid)
    await old.start()
    try:
        await old.begin_transaction()
        await old.send_and_wait(out, b"from-old-owner")
        await new.start()  # takeover: InitProducerId bumps the epoch and aborts old's txn
        with pytest.raises(ProducerFenced):
            await old.send_and_wait(out, b"from-old-owner-after-takeover")
            await old.commit_transaction()
        async with new.transaction():
            await new.send(out, b"from-new-owner")
    finally:
        await new.stop()
        await old.stop()

    assert await read_all(stack.kafka, out, "read_committed", until_count=1) == [b"from-new-owner"]
