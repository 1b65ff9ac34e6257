"""The worker's bus ports (`bus/ports.py`, "the worker's bus") over aiokafka."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaError

from chronowheel.bus.kafka import group_consumer, plain_producer
from chronowheel.bus.ports import (
    BusError,
    Headers,
    PartitionsChanged,
    SubmitRecord,
    TopicPartition,
)
from chronowheel.settings import Settings
from chronowheel.timeouts import within

POSITION_TIMEOUT_S = 0.1
"""Bound on reading a partition's position for the lag: one being reset must not hold up the
caller (the worker's commit loop)."""


class _Listener(ConsumerRebalanceListener):
    def __init__(self, on_assigned: PartitionsChanged, on_revoked: PartitionsChanged) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._on_revoked([TopicPartition(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._on_assigned([TopicPartition(tp.topic, tp.partition) for tp in assigned])


class KafkaWorkerConsumer:
    def __init__(self, settings: Settings, *, group_id: str, topics: Sequence[str],
                 session_timeout_ms: int, on_assigned: PartitionsChanged,
                 on_revoked: PartitionsChanged) -> None:
        self._consumer: AIOKafkaConsumer = group_consumer(
            settings, group_id, session_timeout_ms=session_timeout_ms,
            max_partition_fetch_bytes=4 << 20)
        self._consumer.subscribe(list(topics), listener=_Listener(on_assigned, on_revoked))

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def fetch(self, timeout_ms: int, max_records: int,
                    ) -> dict[TopicPartition, list[SubmitRecord]]:
        batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        return {TopicPartition(tp.topic, tp.partition): records
                for tp, records in batches.items()}

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        try:
            await self._consumer.commit({KafkaTopicPartition(tp.topic, tp.partition): offset
                                         for tp, offset in offsets.items()})
        except KafkaError as exc:
            raise BusError(f"offset commit failed: {exc!r}") from exc

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def end_offset(self, tp: TopicPartition) -> int | None:
        return self._consumer.highwater(KafkaTopicPartition(tp.topic, tp.partition))

    async def unfetched(self, tp: TopicPartition) -> int | None:
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        consumer = self._consumer
        end = consumer.last_stable_offset(ktp)
        if end is None or end < 0:
            end = consumer.highwater(ktp)
        if end is None:
            return None  # nothing fetched from it yet
        try:
            fetched_to = await within(consumer.position(ktp), POSITION_TIMEOUT_S)
        except Exception:
            return None  # revoked meanwhile, or its position is not known yet
        return max(0, end - fetched_to)


class KafkaWorkerProducer:
    def __init__(self, settings: Settings) -> None:
        self._producer: AIOKafkaProducer = plain_producer(settings)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, topic: str, key: bytes | None, value: bytes,
                   headers: Headers = ()) -> None:
        try:
            await self._producer.send_and_wait(topic, value, key=key,
                                               headers=list(headers) or None)
        except KafkaError as exc:
            raise BusError(f"publishing to {topic} failed: {exc!r}") from exc


class KafkaWorkerBus:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def consumer(self, *, group_id: str, topics: Sequence[str], session_timeout_ms: int,
                 on_assigned: PartitionsChanged,
                 on_revoked: PartitionsChanged) -> KafkaWorkerConsumer:
        return KafkaWorkerConsumer(self.settings, group_id=group_id, topics=topics,
                                   session_timeout_ms=session_timeout_ms,
                                   on_assigned=on_assigned, on_revoked=on_revoked)

    def producer(self) -> KafkaWorkerProducer:
        return KafkaWorkerProducer(self.settings)
