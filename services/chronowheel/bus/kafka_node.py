"""The node's bus ports (`bus/ports.py`) over aiokafka."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidProducerEpoch,
    InvalidSessionTimeoutError,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from chronowheel.bus.kafka import (
    group_consumer,
    group_session_limits,
    reader,
    session_timeout_refusal,
    transactional_producer,
)
from chronowheel.bus.ports import (
    BusError,
    Fenced,
    Headers,
    Prepared,
    ShardsChanged,
    SubmitRecord,
)
from chronowheel.errors import ConfigError
from chronowheel.retry import with_retries
from chronowheel.settings import Settings

log = logging.getLogger(__name__)

_FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)
PARTITIONS_LOOKUP_TIMEOUT_S = 10


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except _FENCED as exc:
        raise Fenced(f"{what}: fenced by a newer owner ({exc})") from exc
    except KafkaError as exc:
        raise BusError(f"{what}: {exc!r}") from exc


class KafkaPrepared:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self.batches: list[tuple[str, int, Any]] = []  # in the order they filled
        self._open: dict[tuple[str, int], Any] = {}
        self._count = 0

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes,
            headers: Headers) -> None:
        batch = self._open.get((topic, partition))
        if batch is None or batch.append(key=key, value=value, timestamp=None,
                                         headers=headers) is None:
            batch = self._producer.create_batch()
            self._open[(topic, partition)] = batch
            self.batches.append((topic, partition, batch))
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                raise BusError(f"message for {topic} too large for one batch")
        self._count += 1

    def __len__(self) -> int:
        return self._count


class KafkaTransaction:
    def __init__(self, producer: AIOKafkaProducer, transactional_id: str, submit_topic: str,
                 group_id: str) -> None:
        self._producer = producer
        self._id = transactional_id
        self._submit_topic = submit_topic
        self._group_id = group_id
        self._batches: dict[tuple[str, int], Any] = {}

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes,
               headers: Headers) -> bool:
        batch = self._batches.get((topic, partition))
        return batch is not None and batch.append(key=key, value=value, timestamp=None,
                                                  headers=headers) is not None

    async def publish(self, topic: str, partition: int, key: bytes | None, value: bytes,
                      headers: Headers) -> None:
        batch = self._batches.get((topic, partition))
        if batch is not None and batch.append(key=key, value=value, timestamp=None,
                                              headers=headers) is not None:
            return
        with _translated(f"{self._id}: publishing to {topic}[{partition}]"):
            if batch is not None:
                await self._producer.send_batch(batch, topic, partition=partition)  # full
            batch = self._batches[(topic, partition)] = self._producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            raise BusError(f"{self._id}: message for {topic} too large for one batch")

    async def send(self, prepared: Prepared) -> None:
        assert isinstance(prepared, KafkaPrepared)
        with _translated(f"{self._id}: sending prepared batches"):
            for topic, partition, batch in prepared.batches:
                await self._producer.send_batch(batch, topic, partition=partition)
        prepared.batches.clear()

    async def commit(self, submit_offsets: Mapping[int, int]) -> None:
        with _translated(f"{self._id}: committing a transaction"):
            for (topic, part), batch in self._batches.items():
                await self._producer.send_batch(batch, topic, partition=part)
            self._batches.clear()
            if submit_offsets:
                await self._producer.send_offsets_to_transaction(
                    {TopicPartition(self._submit_topic, k): off
                     for k, off in submit_offsets.items()}, self._group_id)
            await self._producer.commit_transaction()

    async def abort(self) -> None:
        self._batches.clear()
        with contextlib.suppress(Exception):
            await self._producer.abort_transaction()


class KafkaTxnProducer:
    def __init__(self, settings: Settings, transactional_id: str, group_id: str) -> None:
        self._id = transactional_id
        self._group_id = group_id
        self._submit_topic = settings.submit_topic
        self._producer = transactional_producer(settings, transactional_id)

    @property
    def transactional_id(self) -> str:
        return self._id

    async def start(self) -> None:
        # init_transactions bumps the epoch of this transactional.id: any other producer with
        # it is fenced from here on, and its open transaction (if any) is aborted.
        with _translated(f"{self._id}: init transactional producer"):
            await with_retries(self._producer.start, f"{self._id}: init transactional producer")

    async def stop(self) -> None:
        await self._producer.stop()

    async def begin(self) -> KafkaTransaction:
        with _translated(f"{self._id}: begin transaction"):
            await self._producer.begin_transaction()
        return KafkaTransaction(self._producer, self._id, self._submit_topic, self._group_id)

    def prepare(self) -> KafkaPrepared:
        return KafkaPrepared(self._producer)

    async def partition_count(self, topic: str) -> int | None:
        try:
            parts = await asyncio.wait_for(self._producer.partitions_for(topic),
                                           PARTITIONS_LOOKUP_TIMEOUT_S)
        except (TimeoutError, KafkaError):
            return None
        return len(parts) if parts else None


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, on_assigned: ShardsChanged, on_revoked: ShardsChanged) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._on_revoked([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._on_assigned([tp.partition for tp in assigned])


class KafkaSubmitGroup:
    def __init__(self, settings: Settings, *, group_id: str, client_id: str,
                 session_timeout_ms: int, on_assigned: ShardsChanged,
                 on_revoked: ShardsChanged) -> None:
        self._topic = settings.submit_topic
        self._settings = settings
        self._session_timeout_ms = session_timeout_ms
        self._consumer: AIOKafkaConsumer = group_consumer(
            settings, group_id, session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=settings.node_heartbeat_interval_ms,
            group_instance_id=settings.node_instance_id or None,
            # One fetched chunk per partition is buffered until consumed: 1 MiB (a few
            # thousand commands) per shard is ahead of ingest, not 4.
            max_partition_fetch_bytes=1 << 20, client_id=client_id)
        self._consumer.subscribe([self._topic], listener=_Rebalance(on_assigned, on_revoked))

    def _tp(self, shard: int) -> TopicPartition:
        return TopicPartition(self._topic, shard)

    async def start(self) -> None:
        # A broker refuses a session timeout outside its limits only when the member joins,
        # in the background, as an opaque coordination error: check the limits first.
        limits = await group_session_limits(self._settings)
        refusal = limits and session_timeout_refusal(self._session_timeout_ms, limits)
        if refusal:
            raise ConfigError(refusal)
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    def partition_count(self) -> int | None:
        parts = self._consumer.partitions_for_topic(self._topic)
        return None if parts is None else len(parts)

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[int, list[SubmitRecord]]:
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms,
                                                   max_records=max_records)
        except KafkaError as exc:
            # Limits we could not read beforehand: the join's refusal surfaces here.
            if isinstance(exc, InvalidSessionTimeoutError) or isinstance(
                    exc.__cause__, InvalidSessionTimeoutError):
                raise ConfigError(
                    f"Kafka refused node_session_timeout_ms {self._session_timeout_ms} "
                    f"(INVALID_SESSION_TIMEOUT): the brokers' group.min.session.timeout.ms "
                    f"must be at most it (see the operations runbook)") from exc
            raise
        return {tp.partition: records for tp, records in batches.items()}

    def pause(self, shard: int) -> None:
        self._consumer.pause(self._tp(shard))

    def resume(self, shard: int) -> None:
        self._consumer.resume(self._tp(shard))

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self._consumer.assignment()}

    async def check_membership(self) -> bool:
        # aiokafka has no call that only validates the member, so commit an assigned
        # partition's committed offset again (a no-op for the group): the coordinator checks
        # the generation and member id of every OffsetCommit. Nothing else commits these
        # offsets meanwhile: this is called while the node's producer is fenced.
        for tp in sorted(self._consumer.assignment()):
            with _translated(f"{tp.topic}[{tp.partition}]: reading the committed offset"):
                offset = await self._consumer.committed(tp)
            if offset is None:
                continue
            try:
                await self._consumer.commit({tp: offset})
            except (CommitFailedError, IllegalStateError) as exc:
                log.warning("group membership check failed: %s", exc)
                return False
            except KafkaError as exc:
                raise BusError(f"group membership check on {tp.topic}[{tp.partition}]: "
                               f"{exc!r}") from exc
            return True
        # Nothing committed yet on any assigned partition (or nothing assigned): only a
        # rejoin can tell; the caller re-takes nothing it does not hold.
        return bool(self._consumer.assignment())

    async def committed(self, shard: int) -> int | None:
        offset: int | None = await self._consumer.committed(self._tp(shard))
        return offset

    async def seek(self, shard: int, offset: int | None) -> None:
        if offset is None:
            await self._consumer.seek_to_beginning(self._tp(shard))
        else:
            self._consumer.seek(self._tp(shard), offset)


class KafkaNodeBus:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # Started readers kept for the next state read: starting one (bootstrap, metadata)
        # costs a few hundred ms, twice per claimed shard, on the path of every failover.
        self._idle_readers: list[AIOKafkaConsumer] = []

    async def _reader(self) -> AIOKafkaConsumer:
        if self._idle_readers:
            return self._idle_readers.pop()
        consumer = reader(self._settings)
        await consumer.start()
        return consumer

    async def close(self) -> None:
        idle, self._idle_readers = self._idle_readers, []
        for consumer in idle:
            with contextlib.suppress(Exception):
                await consumer.stop()

    def submit_group(self, *, group_id: str, client_id: str, session_timeout_ms: int,
                     on_assigned: ShardsChanged, on_revoked: ShardsChanged) -> KafkaSubmitGroup:
        return KafkaSubmitGroup(self._settings, group_id=group_id, client_id=client_id,
                                session_timeout_ms=session_timeout_ms,
                                on_assigned=on_assigned, on_revoked=on_revoked)

    def producer(self, transactional_id: str, group_id: str) -> KafkaTxnProducer:
        return KafkaTxnProducer(self._settings, transactional_id, group_id)

    async def read_last(self, topic: str, partition: int, key: bytes, timeout_ms: int, *,
                        settled: bool = False) -> bytes | None:
        tp = TopicPartition(topic, partition)
        consumer = await self._reader()
        reusable = False
        try:
            consumer.assign([tp])
            # read_committed: end_offsets is the last stable offset (before the first open
            # transaction). Settled: the high watermark, which a read_committed position
            # reaches only once every transaction that wrote below it is resolved.
            end = (await consumer.end_offsets([tp]))[tp]
            await consumer.seek_to_beginning(tp)
            found: bytes | None = None
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                position = await consumer.position(tp)
                if settled:
                    high = consumer.highwater(tp)
                    end = max(end, high if high is not None else end)
                    done = high is not None and position >= end
                else:
                    done = position >= end
                if done:
                    break
                if time.monotonic() > deadline:
                    raise BusError(f"timed out reading {topic}[{partition}] to its "
                                   f"{'high watermark' if settled else 'end'} {end} "
                                   f"({timeout_ms} ms, at {position})")
                batch = await consumer.getmany(tp, timeout_ms=500)
                for msg in batch.get(tp, []):
                    if msg.key == key and msg.value:
                        found = msg.value
            reusable = True
        finally:
            if reusable:
                self._idle_readers.append(consumer)
            else:  # a failed or cancelled read may leave it in any state
                await consumer.stop()
        return found
