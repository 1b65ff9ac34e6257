"""The worker's bus contract (`chronowheel.bus.ports.WorkerBus`), once for every implementation.

A test module subclasses `WorkerBusContract` and provides a `env` fixture (a `BusEnv`): the
unit tests run it in memory, the integration tests against Kafka. Every test makes its own
topics and groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from chronowheel.bus.ports import SubmitRecord, TopicPartition, WorkerBus, WorkerConsumer
from chronowheel.core.shard import murmur2, to_positive

Stored = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]
"""(partition, key, value, headers) of a message as stored on a topic."""


class BusEnv(Protocol):
    bus: WorkerBus

    async def new_topic(self, partitions: int) -> str: ...

    async def put(self, topic: str, partition: int, key: bytes | None, value: bytes,
                  headers: list[tuple[str, bytes]]) -> None: ...

    async def read(self, topic: str) -> list[Stored]: ...

    async def committed(self, group: str, topic: str) -> dict[int, int]: ...


async def until(what: str, predicate: Callable[[], bool], timeout_s: float = 60) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


class Member:
    """A consumer of the port plus what a test needs to watch it: a fetch loop collecting
    records, and the assignment events in order (shared between members)."""

    def __init__(self, env: BusEnv, name: str, group: str, topics: list[str],
                 events: list[tuple[str, str, list[TopicPartition]]]) -> None:
        self.name = name
        self.records: list[SubmitRecord] = []
        self.events = events
        self.consumer: WorkerConsumer = env.bus.consumer(
            group_id=group, topics=topics, session_timeout_ms=6000,
            on_assigned=self._assigned, on_revoked=self._revoked)
        self._loop: asyncio.Task[None] | None = None

    async def _assigned(self, tps: list[TopicPartition]) -> None:
        self.events.append((self.name, "assigned", sorted(tps)))

    async def _revoked(self, tps: list[TopicPartition]) -> None:
        self.events.append((self.name, "revoked", sorted(tps)))

    async def start(self) -> None:
        await self.consumer.start()
        self._loop = asyncio.ensure_future(self._fetching())

    async def _fetching(self) -> None:
        while True:
            for records in (await self.consumer.fetch(200, 100)).values():
                self.records.extend(records)

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        await self.consumer.stop()


@contextlib.asynccontextmanager
async def members(*started: Member) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for m in started:
            await m.stop()


def offsets(records: list[SubmitRecord], partition: int) -> list[int]:
    return [r.offset for r in records if r.partition == partition]


class WorkerBusContract:
    async def test_a_lone_member_gets_every_partition_and_reads_each_in_order(
            self, env: BusEnv) -> None:
        topic = await env.new_topic(2)
        for i in range(3):
            await env.put(topic, 0, f"k{i}".encode(), f"v{i}".encode(), [("h", str(i).encode())])
        await env.put(topic, 1, None, b"w0", [])
        events: list[tuple[str, str, list[TopicPartition]]] = []
        a = Member(env, "a", "g-" + secrets.token_hex(4), [topic], events)
        await a.start()
        async with members(a):
            await until("every record", lambda: len(a.records) == 4)
            tps = {TopicPartition(topic, 0), TopicPartition(topic, 1)}
            assert a.consumer.assignment() == tps
            assert ("a", "assigned", sorted(tps)) in events
            assert offsets(a.records, 0) == [0, 1, 2] and offsets(a.records, 1) == [0]
            first = next(r for r in a.records if r.partition == 0 and r.offset == 0)
            assert (first.topic, first.key, first.value) == (topic, b"k0", b"v0")
            assert list(first.headers) == [("h", b"0")]
            assert a.consumer.end_offset(TopicPartition(topic, 0)) == 3
            assert await a.consumer.unfetched(TopicPartition(topic, 0)) == 0

    async def test_the_next_member_of_a_group_starts_at_its_committed_offsets(
            self, env: BusEnv) -> None:
        topic = await env.new_topic(2)
        for i in range(4):
            await env.put(topic, 0, b"k", f"v{i}".encode(), [])
        await env.put(topic, 1, b"k", b"w", [])
        group = "g-" + secrets.token_hex(4)
        events: list[tuple[str, str, list[TopicPartition]]] = []
        a = Member(env, "a", group, [topic], events)
        await a.start()
        async with members(a):
            await until("every record", lambda: len(a.records) == 5)
            await a.consumer.commit({TopicPartition(topic, 0): 2})
        assert await env.committed(group, topic) == {0: 2}
        b = Member(env, "b", group, [topic], events)
        await b.start()
        async with members(b):
            await until("the uncommitted records", lambda: len(b.records) == 3)
            assert offsets(b.records, 0) == [2, 3] and offsets(b.records, 1) == [0]

    async def test_partitions_move_between_members_revoked_before_they_are_given(
            self, env: BusEnv) -> None:
        topic = await env.new_topic(2)
        group = "g-" + secrets.token_hex(4)
        events: list[tuple[str, str, list[TopicPartition]]] = []
        a = Member(env, "a", group, [topic], events)
        b = Member(env, "b", group, [topic], events)
        everything = {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        await a.start()
        async with members(a):
            await until("A to hold every partition", lambda: a.consumer.assignment() == everything)
            await b.start()
            async with members(b):
                # A consumer's assignment() may still show what it held until its new
                # assignment arrives: wait for the rebalance to settle (shared, each partition
                # once); what the contract promises is told by the callbacks, checked below.
                await until("the partitions to be shared, each held once", lambda: bool(
                    a.consumer.assignment() and b.consumer.assignment()
                    and a.consumer.assignment() | b.consumer.assignment() == everything
                    and not a.consumer.assignment() & b.consumer.assignment()))

                def last_given(member: str) -> set[TopicPartition]:
                    given = [set(e[2]) for e in list(events) if e[:2] == (member, "assigned")]
                    return given[-1] if given else set()

                # The callbacks may be told on the client's own thread a moment later: wait for
                # the last partitions each was given to be the settled, disjoint split.
                await until("the callbacks to tell the split", lambda: bool(
                    not last_given("a") & last_given("b")
                    and last_given("a") | last_given("b") == everything))
                given_to_b = next(i for i, e in enumerate(events) if e[:2] == ("b", "assigned"))
                revoked_from_a = next(i for i, e in enumerate(events)
                                      if e[:2] == ("a", "revoked"))
                assert revoked_from_a < given_to_b, events
            await until("A to hold every partition again",
                        lambda: a.consumer.assignment() == everything)

    async def test_a_sent_message_lands_on_its_keys_partition_acknowledged(
            self, env: BusEnv) -> None:
        topic, single = await env.new_topic(3), await env.new_topic(1)
        producer = env.bus.producer()
        await producer.start()
        try:
            await producer.send(topic, b"job-7", b"value", [("cw-error", b"E: x")])
            await producer.send(single, None, b"plain")
        finally:
            await producer.stop()
        expected = to_positive(murmur2(b"job-7")) % 3
        assert await env.read(topic) == [(expected, b"job-7", b"value", [("cw-error", b"E: x")])]
        assert await env.read(single) == [(0, None, b"plain", [])]
