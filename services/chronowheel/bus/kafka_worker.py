"""The worker's bus ports (`bus/ports.py`, "the worker's bus") over aiokafka.

The producer tells a refusal of one record (`RecordRefused`: too large, invalid) from a failure
that concerns every record (`BusError`: no acknowledgement within the delivery deadline, no
such topic; `KafkaAccessError`: the authorizer refuses the topic). It is not idempotent: an
idempotent producer whose batch the broker refused is left with a gap in its sequence numbers
on that partition, and every later batch there fails (OUT_OF_ORDER_SEQUENCE_NUMBER) until the
producer is replaced. What idempotence would save, a duplicate retry command or dead letter
after a retried request, the worker already tolerates: a retry is deduplicated by the
per-occurrence ledger, and a dead letter may be produced twice after a crash anyway
(docs/worker.md, "Retries and dead letters").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.errors import (
    BrokerResponseError,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)

from chronowheel.bus.kafka import Producer, group_consumer, is_authorization_error
from chronowheel.bus.ports import (
    BusError,
    Headers,
    PartitionsChanged,
    RecordRefused,
    SubmitRecord,
    TopicPartition,
)
from chronowheel.core.shard import murmur2, to_positive
from chronowheel.settings import Settings
from chronowheel.timeouts import within

POSITION_TIMEOUT_S = 0.1
"""Bound on reading a partition's position for the lag: one being reset must not hold up the
caller (the worker's commit loop)."""


DELIVERY_TIMEOUT_MS = 30_000
"""How long a produce may go unacknowledged (brokers unreachable, no leader for the partition):
past it the send fails as a BusError, which concerns every record, and stops the worker."""
DELIVERY_DEADLINE_S = DELIVERY_TIMEOUT_MS / 1000 + 15
"""The worker's own bound around one send, in case the client's expiry does not fire (a metadata
wait, a connection that never answers)."""


class InvalidRecordError(BrokerResponseError):
    """INVALID_RECORD (87): the broker validated the record and refused it (e.g. no key for a
    compacted topic). aiokafka 0.14 has no class for the code and reports it as UnknownError,
    which cannot be told from a broker's own trouble; registered here so it can."""

    errno = 87
    message = "INVALID_RECORD"
    description = "This record has failed the validation on broker and hence will be rejected."


kafka_errors.kafka_errors.setdefault(InvalidRecordError.errno, InvalidRecordError)

REFUSED_RECORD: dict[type[KafkaError], str] = {
    MessageSizeTooLargeError: "too_large",
    RecordListTooLargeError: "too_large",
    InvalidRecordError: "invalid",
    InvalidTimestampError: "invalid",
    # Not here, as in the node (bus/kafka_node.py): UnknownError and CorruptRecordException may
    # be the broker's or the network's trouble; quarantining on them would condemn good
    # records on a passing fault. TopicAuthorizationFailed and UnknownTopicOrPartition concern
    # the topic, i.e. every retry or every dead letter: the worker stops instead.
}


def refused_kind(exc: BaseException) -> str | None:
    """`too_large` or `invalid` when the broker refused a record for what it is; else None."""
    for cls, kind in REFUSED_RECORD.items():
        if type(exc) is cls:
            return kind
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        self._producer: Producer = Producer(
            settings, "worker producer", enable_idempotence=False, acks="all", linger_ms=5,
            max_batch_size=1 << 20, max_request_size=4 << 20,
            request_timeout_ms=DELIVERY_TIMEOUT_MS)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, topic: str, key: bytes | None, value: bytes,
                   headers: Headers = ()) -> None:
        try:
            await within(self._send(topic, key, value, headers), DELIVERY_DEADLINE_S)
        except TimeoutError:
            raise BusError(f"publishing to {topic}: not acknowledged within "
                           f"{DELIVERY_DEADLINE_S:.0f} s") from None

    async def _send(self, topic: str, key: bytes | None, value: bytes,
                    headers: Headers) -> None:
        hdrs = list(headers) or None
        try:
            future = await self._producer.send(topic, value, key=key, headers=hdrs)
        except KafkaError as exc:
            # Before anything was sent: the client's own check of the record alone (over the
            # largest request), or metadata that never came.
            raise self._translate(exc, topic) from exc
        try:
            await future
            return
        except KafkaError as exc:
            if refused_kind(exc) is None:
                raise self._translate(exc, topic) from exc
        # The broker refused the producer batch the record was in, perhaps for a neighbour's
        # sake (a batch over max.message.bytes is refused as a whole): send it alone to know.
        await self._send_alone(topic, key, value, hdrs)

    async def _send_alone(self, topic: str, key: bytes | None, value: bytes,
                          headers: list[tuple[str, bytes]] | None) -> None:
        partitions = sorted(await self._producer.partitions_for(topic))
        if not partitions:
            raise BusError(f"publishing to {topic}: the topic has no partitions")
        # Kafka's default partitioner for a key; the lowest partition without one.
        partition = partitions[to_positive(murmur2(key)) % len(partitions)] \
            if key is not None else partitions[0]
        batch = self._producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None, headers=headers or []) is None:
            raise RecordRefused(topic, "too_large", "larger than one producer batch")
        try:
            await (await self._producer.send_batch(batch, topic, partition=partition))
        except KafkaError as exc:
            raise self._translate(exc, topic) from exc

    def _translate(self, exc: KafkaError, topic: str) -> Exception:
        kind = refused_kind(exc)
        if kind is not None:
            return RecordRefused(topic, kind, _describe(exc))
        if is_authorization_error(exc):
            return self._producer._refused(exc, topic)
        return BusError(f"publishing to {topic} failed: {exc!r}")


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
