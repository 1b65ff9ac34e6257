"""The worker's bus ports (`bus/ports.py`, "the worker's bus") in memory, over a `MemoryBus`
(`bus/memory.py`): workers read the same partition logs a node in memory publishes to.

A group's members share its partitions round-robin; every join, leave or expiry rebalances
the group eagerly, as aiokafka does: each member's `on_revoked` of all it held completes
before any member is given partitions (`on_assigned`), and a newly assigned partition is read
from the group's committed offset (its beginning when none). `expire` stands for a member
paused past its session: the group moves on without telling it; its commits are refused and
its next fetch rejoins (revoking what it held first), as a real member does on waking.

The producer refuses records as a broker does, with the `MemoryBus`'s settings: a record over
its topic's `max.message.bytes` (`topic_limits`) as `RecordRefused` (`too_large`), a topic in
`refused_topics` (the authorizer) as `KafkaAccessError`; `invalid` (a test's predicate) refuses
records as INVALID_RECORD, and `fail_sends` makes the next sends fail as an unreachable
cluster does (BusError).

Fetch waits on the bus clock, so with a manual clock an idle member waits until a message
arrives or a test moves time. One event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from chronowheel.bus.kafka import KafkaAccessError
from chronowheel.bus.memory import MemoryBus
from chronowheel.bus.ports import (
    BusError,
    Headers,
    PartitionsChanged,
    RecordRefused,
    SubmitRecord,
    TopicPartition,
)
from chronowheel.core import limits
from chronowheel.core.clock import sleep_until_or_event
from chronowheel.core.shard import murmur2, to_positive


class MemoryWorkerBus:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.groups: dict[str, list[MemoryWorkerConsumer]] = {}
        """group id -> its live members, in the order they joined."""
        self.commits = 0
        self.sent = 0
        self.refused: list[RecordRefused] = []
        """Every refusal the producers met, in order."""
        self.invalid: Callable[[str, bytes | None, bytes, Headers], bool] | None = None
        """(topic, key, value, headers) -> whether the broker refuses the record as invalid."""
        self.fail_sends = 0
        """Make this many next sends fail with BusError (not acknowledged in time)."""
        self.duplicate_sends = 0
        """Write this many next sends twice, acknowledged once: a request whose acknowledgement
        was lost, sent again by a producer that is not idempotent (the worker's is not)."""
        self._rebalancing = asyncio.Lock()

    # --- WorkerBus -----------------------------------------------------------------------
    def consumer(self, *, group_id: str, topics: Sequence[str], session_timeout_ms: int,
                 on_assigned: PartitionsChanged,
                 on_revoked: PartitionsChanged) -> MemoryWorkerConsumer:
        del session_timeout_ms
        return MemoryWorkerConsumer(self, group_id, topics, on_assigned, on_revoked)

    def producer(self) -> MemoryWorkerProducer:
        return MemoryWorkerProducer(self)

    # --- test helpers --------------------------------------------------------------------
    def committed(self, group_id: str, tp: TopicPartition) -> int | None:
        return self.bus.group_offsets.get((group_id, tp.topic, tp.partition))

    async def expire(self, member: MemoryWorkerConsumer) -> None:
        """The member's session expired (it was paused): the group goes on without it."""
        members = self.groups.get(member.group_id, [])
        if member in members:
            members.remove(member)
        member.stale = True
        await self.rebalance(member.group_id)

    async def rebalance(self, group_id: str) -> None:
        async with self._rebalancing:
            members = list(self.groups.get(group_id, []))
            for m in members:
                await m.revoke_all()
            if not members:
                return
            topics = sorted({t for m in members for t in m.topics})
            parts = [TopicPartition(t, p) for t in topics
                     for p in range(len(self.bus.topics.get(t, [])))]
            share: dict[MemoryWorkerConsumer, list[TopicPartition]] = {m: [] for m in members}
            eligible = {t: [m for m in members if t in m.topics] for t in topics}
            for i, tp in enumerate(parts):
                who = eligible[tp.topic]
                share[who[i % len(who)]].append(tp)
            for m in members:
                await m.assign(share[m])

    def _place(self, topic: str, key: bytes | None) -> int:
        logs = self.bus.topics.get(topic)
        if not logs:
            raise BusError(f"no topic {topic}")
        if key is None or len(logs) == 1:
            return 0
        return to_positive(murmur2(key)) % len(logs)  # Kafka's default partitioner


class MemoryWorkerConsumer:
    def __init__(self, wbus: MemoryWorkerBus, group_id: str, topics: Sequence[str],
                 on_assigned: PartitionsChanged, on_revoked: PartitionsChanged) -> None:
        self.wbus = wbus
        self.group_id = group_id
        self.topics = list(topics)
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._position: dict[TopicPartition, int] = {}
        self._seen_end: dict[TopicPartition, int] = {}
        self.stale = False
        self.joined = False

    async def start(self) -> None:
        await self._join()

    async def _join(self) -> None:
        self.stale = False
        self.joined = True
        self.wbus.groups.setdefault(self.group_id, []).append(self)
        await self.wbus.rebalance(self.group_id)

    async def stop(self) -> None:
        if not self.joined:
            return
        self.joined = False
        members = self.wbus.groups.get(self.group_id, [])
        if self in members:
            members.remove(self)
            await self.revoke_all()
            await self.wbus.rebalance(self.group_id)

    async def revoke_all(self) -> None:
        held = sorted(self._position)
        if held:
            await self._on_revoked(held)
        self._position.clear()
        self._seen_end.clear()

    async def assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self._position[tp] = self.wbus.committed(self.group_id, tp) or 0
        if tps:
            await self._on_assigned(list(tps))

    async def fetch(self, timeout_ms: int, max_records: int,
                    ) -> dict[TopicPartition, list[SubmitRecord]]:
        if self.stale and self.joined:  # woke after its session expired: rejoin first
            await self.revoke_all()
            await self._join()
        out = self._take(max_records)
        if out or timeout_ms <= 0:
            return out
        bus = self.wbus.bus
        bus._arrived.clear()
        await sleep_until_or_event(bus.clock, bus.clock.now_ms() + timeout_ms, bus._arrived)
        return self._take(max_records)

    def _take(self, max_records: int) -> dict[TopicPartition, list[SubmitRecord]]:
        out: dict[TopicPartition, list[SubmitRecord]] = {}
        if self.stale:
            return out
        for tp in sorted(self._position):
            if max_records <= 0:
                break
            log = self.wbus.bus.topics[tp.topic][tp.partition]
            self._seen_end[tp] = len(log)
            start = self._position[tp]
            records = log[start:start + max_records]
            if records:
                out[tp] = list(records)
                self._position[tp] = start + len(records)
                max_records -= len(records)
        return out

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        await asyncio.sleep(0)
        if self.stale or not self.joined:
            raise BusError(f"offset commit failed: {self.group_id} rebalanced without this "
                           f"member")
        for tp, offset in offsets.items():
            self.wbus.bus.group_offsets[(self.group_id, tp.topic, tp.partition)] = offset
        self.wbus.commits += 1

    def assignment(self) -> set[TopicPartition]:
        return set(self._position)

    def end_offset(self, tp: TopicPartition) -> int | None:
        return self._seen_end.get(tp)

    async def unfetched(self, tp: TopicPartition) -> int | None:
        position = self._position.get(tp)
        if position is None:
            return None
        return max(0, len(self.wbus.bus.topics[tp.topic][tp.partition]) - position)


class MemoryWorkerProducer:
    def __init__(self, wbus: MemoryWorkerBus) -> None:
        self.wbus = wbus
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def send(self, topic: str, key: bytes | None, value: bytes,
                   headers: Headers = ()) -> None:
        await asyncio.sleep(0)
        if not self.started:
            raise BusError("the producer is not started")
        wbus = self.wbus
        if wbus.fail_sends > 0:
            wbus.fail_sends -= 1
            raise BusError(f"publishing to {topic} failed: KafkaTimeoutError()")
        if topic in wbus.bus.refused_topics:
            raise KafkaAccessError(f"worker producer: this client may not write topic {topic} "
                                   f"(TopicAuthorizationFailedError)")
        size = limits.record_bytes(key, value, headers)
        limit = limits.max_record_bytes(wbus.bus.topic_limits.get(topic),
                                        wbus.bus.max_request_bytes)
        refusal = None
        if size > limit:
            refusal = RecordRefused(topic, "too_large",
                                    f"MessageSizeTooLargeError: a record of {size} bytes, over "
                                    f"the {limit} bytes the topic takes")
        elif wbus.invalid is not None and wbus.invalid(topic, key, value, headers):
            refusal = RecordRefused(topic, "invalid",
                                    "InvalidRecordError: [Error 87] INVALID_RECORD")
        if refusal is not None:
            wbus.refused.append(refusal)
            raise refusal
        partition = wbus._place(topic, key)
        wbus.bus.produce(topic, partition, key, value, headers)
        if wbus.duplicate_sends > 0:
            wbus.duplicate_sends -= 1
            wbus.bus.produce(topic, partition, key, value, headers)
        wbus.sent += 1
