"""The node's bus ports (`bus/ports.py`) over aiokafka."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    CommitFailedError,
    IllegalOperation,
    IllegalStateError,
    InvalidProducerEpoch,
    InvalidSessionTimeoutError,
    InvalidTimestampError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)
from aiokafka.structs import OffsetAndMetadata

from chronowheel.bus.group_thread import LIVENESS_PING_MS, GroupThreadMember
from chronowheel.bus.kafka import (
    group_consumer,
    group_session_limits,
    open_admin,
    reader,
    session_timeout_refusal,
    transactional_producer,
)
from chronowheel.bus.ports import (
    BusError,
    Claimer,
    Fenced,
    Headers,
    PartitionUnavailable,
    Prepared,
    ProducerBroken,
    RecordsRefused,
    Refusal,
    ShardsChanged,
    SubmitGroup,
)
from chronowheel.core import limits, wire
from chronowheel.errors import ChronowheelError, ConfigError
from chronowheel.retry import with_retries
from chronowheel.settings import Settings
from chronowheel.timeouts import within

log = logging.getLogger(__name__)

_FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)
PARTITIONS_LOOKUP_TIMEOUT_S = 10
LIMIT_LOOKUP_TIMEOUT_S = 10
T = TypeVar("T")

# Errors of a produce request about the records of one batch (never retriable: the
# transactional producer retries retriable ones itself), by the dead-letter reason they give
# and whether they are about the whole topic (every record of the batch earns them) rather
# than one record. Anything else is the node's problem (fencing, or a failed transaction).
REFUSED_BATCH: Mapping[type[KafkaError], tuple[str, bool]] = {
    MessageSizeTooLargeError: ("too_large", False),
    RecordListTooLargeError: ("too_large", False),
    TopicAuthorizationFailedError: ("refused", True),
    UnknownTopicOrPartitionError: ("unknown_topic", True),
    InvalidTimestampError: ("invalid", False),
    # Not here: UnknownError (UNKNOWN_SERVER_ERROR, which is also how aiokafka reports
    # INVALID_RECORD) and CorruptRecordException can be the broker's or the network's trouble,
    # not the record's: dead-lettering on them would condemn good occurrences on a passing
    # fault, so they fail the transaction like any other broker error.
}


def refusal_of(exc: BaseException) -> tuple[str, bool] | None:
    """(reason, whole topic) when `exc`, the failure of one batch, is permanent for its
    records only; None when it is not about the records (see REFUSED_BATCH)."""
    for cls, kind in REFUSED_BATCH.items():
        if type(exc) is cls:
            return kind
    return None


def broken_cause(producer: AIOKafkaProducer) -> BaseException | None:
    """Why `producer` can no longer be used, or None while it can. When aiokafka's sender task
    dies, it puts the producer's transaction state in FATAL_ERROR, and from then on every
    transactional call fails with an AssertionError about an invalid state transition."""
    txn = getattr(producer, "_txn_manager", None)
    if txn is None or not txn.is_fatal_error():
        return None
    sender = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    if task is not None and task.done() and not task.cancelled():
        cause = task.exception()
        if cause is not None:
            return cause
    return KafkaError("the producer's transaction state is FATAL_ERROR")


def _is_fence(exc: BaseException) -> bool:
    return isinstance(exc, _FENCED) or isinstance(exc.__cause__, _FENCED)


@contextlib.contextmanager
def _translated(what: str, producer: AIOKafkaProducer | None = None) -> Iterator[None]:
    """Kafka's errors as the bus port's: Fenced, ProducerBroken (when `producer` is given and
    its client gave up on it), BusError."""
    try:
        yield
    except _FENCED as exc:
        raise Fenced(f"{what}: fenced by a newer owner ({exc})") from exc
    except (KafkaError, AssertionError) as exc:
        cause = broken_cause(producer) if producer is not None else None
        if cause is not None:
            if _is_fence(cause):
                raise Fenced(f"{what}: fenced by a newer owner ({cause!r})") from exc
            raise ProducerBroken(f"{what}: the producer can no longer be used "
                                 f"({_describe(cause)})") from exc
        if isinstance(exc, AssertionError):
            raise
        raise BusError(f"{what}: {exc!r}") from exc


class KafkaPrepared:
    def __init__(self, producer: KafkaTxnProducer) -> None:
        self._owner = producer
        self._producer = producer.aiokafka
        # In the order they filled: topic, partition, batch, indexes of its messages.
        self.batches: list[tuple[str, int, Any, list[int]]] = []
        self._open: dict[tuple[str, int], tuple[str, int, Any, list[int]]] = {}
        self._used: dict[tuple[str, int], int] = {}  # bytes in the open batch
        self._count = 0

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes,
            headers: Headers, *, alone: bool = False) -> None:
        where = (topic, partition)
        index = self._count
        # A broker refuses a batch over the topic's max.message.bytes as a whole: so that a
        # small topic limit refuses only a message too large by itself (alone in its batch,
        # as the first message always fits), a batch never grows past it (counted as
        # `limits.record_bytes` counts, which errs high; aiokafka's batch size is fixed).
        size = limits.record_bytes(key, value, headers)
        try:
            entry = None if alone else self._open.get(where)
            if entry is None or self._used[where] + size > self._owner.known_limit(topic) \
                    or entry[2].append(key=key, value=value, timestamp=None,
                                       headers=headers) is None:
                batch = self._producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    raise BusError(f"message for {topic} too large for one batch")
                entry = (topic, partition, batch, [])
                self.batches.append(entry)
                self._used[where] = 0
                if alone:
                    self._open.pop(where, None)
                else:
                    self._open[where] = entry
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            # Encoding writes the record apart and appends it only when complete: the batch
            # is as it was.
            raise BusError(f"message for {topic} cannot be encoded: {exc!r}") from exc
        self._used[where] += size
        entry[3].append(index)
        self._count += 1

    def __len__(self) -> int:
        return self._count


class KafkaTransaction:
    def __init__(self, producer: AIOKafkaProducer, transactional_id: str, submit_topic: str,
                 group_id: str, own_topics: frozenset[str] = frozenset()) -> None:
        self._producer = producer
        self._id = transactional_id
        self._submit_topic = submit_topic
        self._group_id = group_id
        self._own_topics = own_topics
        """The namespace's topics: the node may not lack the right to write one of them, so
        a refusal by the authorizer there stops the node instead of dead-lettering."""
        self._batches: dict[tuple[str, int], Any] = {}
        # Every batch sent, with where its messages came from (None: `publish`). aiokafka
        # commits a transaction whose batch failed without that batch, so `commit` waits for
        # each and refuses to commit past a failure.
        self._sent: list[tuple[asyncio.Future[Any], KafkaPrepared | None, tuple[int, ...],
                               str]] = []
        self._refusals: list[Refusal] = []
        self.end_ms: float | None = None

    async def _send_batch(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        try:
            return await self._producer.send_batch(batch, topic, partition=partition)
        except IllegalOperation as exc:
            # aiokafka ended the transaction already: a batch sent earlier failed (it moves the
            # transaction to an abortable error at once). What failed it is among the batches
            # sent, and the answer for it (a refusal, our own topic refused, a fence) is the
            # one to give, not this consequence.
            await self._check_sent()
            raise BusError(f"{self._id}: the transaction is no longer open ({exc})") from exc

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
        with _translated(f"{self._id}: publishing to {topic}[{partition}]", self._producer):
            if batch is not None:
                self._sent.append((await self._send_batch(batch, topic, partition),  # full
                                   None, (), topic))
            batch = self._batches[(topic, partition)] = self._producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            raise BusError(f"{self._id}: message for {topic} too large for one batch")

    async def send(self, prepared: Prepared) -> None:
        assert isinstance(prepared, KafkaPrepared)
        with _translated(f"{self._id}: sending prepared batches", self._producer):
            for topic, partition, batch, indexes in prepared.batches:
                try:
                    future = await self._send_batch(batch, topic, partition)
                except (UnknownTopicOrPartitionError, TopicAuthorizationFailedError) as exc:
                    # Raised by the metadata wait, before the batch joined the transaction.
                    self._raise_if_about_the_node(exc, topic)
                    kind, whole = refusal_of(exc) or ("refused", True)
                    self._refusals.append(Refusal(prepared, tuple(indexes), topic,
                                                  _describe(exc), kind, whole))
                    continue
                self._sent.append((future, prepared, tuple(indexes), topic))
        prepared.batches.clear()

    async def commit(self, submit_offsets: Mapping[int, int]) -> None:
        with _translated(f"{self._id}: committing a transaction", self._producer):
            for (topic, part), batch in self._batches.items():
                self._sent.append((await self._send_batch(batch, topic, part), None, (), topic))
            self._batches.clear()
            if submit_offsets:
                await self._producer.send_offsets_to_transaction(
                    {TopicPartition(self._submit_topic, k): off
                     for k, off in submit_offsets.items()}, self._group_id)
            await self._check_sent()
            ending = time.monotonic()
            await self._producer.commit_transaction()
            self.end_ms = (time.monotonic() - ending) * 1000

    async def _check_sent(self) -> None:
        """Wait for every batch sent; raise what one of them failed with (nothing is committed
        yet): Fenced first, then RecordsRefused for refusals of prepared messages (other
        failures beside them are their knock-on effects), then any other failure as the
        transaction's."""
        sent, self._sent = self._sent, []
        results = await asyncio.gather(*(f for f, *_ in sent), return_exceptions=True)
        refusals, self._refusals = self._refusals, []
        other: BaseException | None = None
        for (_f, prepared, indexes, topic), result in zip(sent, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            if isinstance(result, _FENCED):
                raise result
            self._raise_if_about_the_node(result, topic)
            kind = refusal_of(result)
            if kind is None or prepared is None:
                other = other or result
            else:
                refusals.append(Refusal(prepared, indexes, topic, _describe(result), *kind))
        if refusals:
            # A refused batch breaks the idempotent producer's sequence on its partition, so
            # the batches after it there fail too (OutOfOrderSequenceNumber): knock-on errors
            # of the refusal, which is what to act on. The new session that follows starts
            # from a fresh producer state, and everything not refused is published again.
            if other is not None:
                log.info("%s: besides the refused records, a batch failed with %s (taken "
                         "as a consequence of the refusal)", self._id, _describe(other))
            raise RecordsRefused(refusals)
        if other is not None:
            raise other

    def _raise_if_about_the_node(self, exc: BaseException, topic: str) -> None:
        """A refusal by the authorizer to write one of the namespace's own topics concerns
        every job (a revoked or missing ACL): raised as the access error that says who may not
        do what, which stops the node. On a job's own target topic it is that job's problem:
        the caller dead-letters its occurrences."""
        if isinstance(exc, TopicAuthorizationFailedError) and topic in self._own_topics:
            refused = getattr(self._producer, "_refused", None)
            if refused is not None:
                raise refused(exc, topic) from None
            raise BusError(f"{self._id}: may not write topic {topic} ({exc!r})") from None

    async def abort(self) -> None:
        self._batches.clear()
        self._refusals.clear()
        sent, self._sent = self._sent, []
        for future, *_ in sent:  # their failures are known or moot: not "never retrieved"
            if future.done() and not future.cancelled():
                future.exception()
            else:
                future.add_done_callback(_ignore_result)
        read_transaction_outcome(self._producer)  # the abort replaces a failed waiter
        with contextlib.suppress(Exception):
            await self._producer.abort_transaction()


def read_transaction_outcome(producer: AIOKafkaProducer) -> None:
    """Mark as read the failures aiokafka keeps where nobody of ours waits: a transaction's
    failure (a fence, an abortable error) on a future of its own that only a commit or an
    abort reads (an abort replaces it unread; a fenced producer makes neither), and each
    failed batch's on the batch's drain waiter, which aiokafka reads only when another batch
    for the same partition queues behind it. Unread, each is reported as "Future exception
    was never retrieved" with the fence's traceback when collected: noise in the node's log
    (the failure was acted on where the node met it) that reads like a fault of its own."""
    manager = getattr(producer, "_txn_manager", None)
    if manager is not None:
        _read_failure(manager.wait_for_transaction_end())
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is not None:
        queued = [*getattr(accumulator, "_pending_batches", ())]
        for batches in getattr(accumulator, "_batches", {}).values():
            queued.extend(batches)
        for batch in queued:
            _read_failure(getattr(batch, "_drain_waiter", None))


def _read_failure(future: asyncio.Future[Any] | None) -> None:
    if future is not None and future.done():
        _ignore_result(future)


def _ignore_result(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class TopicLimits:
    """The largest record each topic takes (`max.message.bytes`), as last read from the
    brokers, for every producer of one node process: a producer that replaces a fenced or
    failed one finds them known, instead of starting an admin client and asking again on the
    path of the first parts of every shard it takes over again (the node's loop is busiest
    then). Read again after `limits.TOPIC_LIMIT_REFRESH_MS`, or at once after `forget`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # topic -> (largest record, monotonic time it was read)
        self._known: dict[str, tuple[int, float]] = {}
        self._admin: AIOKafkaAdminClient | None = None
        self._admin_lock = asyncio.Lock()
        self._unreadable_logged = False

    def known(self, topic: str) -> int | None:
        known = self._known.get(topic)
        return known[0] if known is not None else None

    async def largest_record(self, topic: str, max_request: int) -> int:
        known = self._known.get(topic)
        now = time.monotonic()
        if known is not None and now - known[1] < limits.TOPIC_LIMIT_REFRESH_MS / 1000:
            return known[0]
        configured = await self._read_max_message_bytes(topic)
        limit = limits.max_record_bytes(configured, max_request)
        self._known[topic] = (limit, now)
        return limit

    def forget(self, topic: str) -> None:
        self._known.pop(topic, None)

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()

    async def _read_max_message_bytes(self, topic: str) -> int | None:
        """The topic's `max.message.bytes` from the brokers; None when it cannot be read."""
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        try:
            async with self._admin_lock:  # shards may ask at once: one admin client
                if self._admin is None:
                    self._admin = await within(open_admin(self._settings),
                                               LIMIT_LOOKUP_TIMEOUT_S)
                admin: AIOKafkaAdminClient = self._admin
            responses = await within(admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})]),
                LIMIT_LOOKUP_TIMEOUT_S)
            for response in responses:
                for error_code, message, _type, _name, entries in response.resources:
                    if error_code:
                        raise BusError(f"error {error_code}: {message}")
                    for entry in entries:
                        if entry[0] == "max.message.bytes":
                            return int(entry[1])
            raise BusError("max.message.bytes not in the answer")
        except (TimeoutError, KafkaError, ChronowheelError, ValueError) as exc:
            if not self._unreadable_logged:
                self._unreadable_logged = True
                log.warning("cannot read max.message.bytes of topic %s (%r); assuming "
                            "Kafka's default, %d", topic, exc, limits.KAFKA_MAX_MESSAGE_BYTES)
            return None


class KafkaTxnProducer:
    def __init__(self, settings: Settings, transactional_id: str, group_id: str,
                 topic_limits: TopicLimits | None = None) -> None:
        self._settings = settings
        self._id = transactional_id
        self._group_id = group_id
        self._submit_topic = settings.submit_topic
        self._producer = transactional_producer(settings, transactional_id)
        self._max_request = int(getattr(self._producer, "_max_request_size", 1 << 20))
        # Shared with the other producers of the node's bus; one of its own when alone (its
        # stop then closes it).
        self._own_limits = topic_limits is None
        self._limits = topic_limits if topic_limits is not None else TopicLimits(settings)

    @property
    def transactional_id(self) -> str:
        return self._id

    @property
    def aiokafka(self) -> AIOKafkaProducer:
        return self._producer

    async def start(self) -> None:
        # init_transactions bumps the epoch of this transactional.id: any other producer with
        # it is fenced from here on, and its open transaction (if any) is aborted.
        with _translated(f"{self._id}: init transactional producer"):
            await with_retries(self._producer.start, f"{self._id}: init transactional producer")

    async def stop(self) -> None:
        try:
            if self._own_limits:
                await self._limits.close()
            await self._producer.stop()
        finally:
            read_transaction_outcome(self._producer)

    async def begin(self) -> KafkaTransaction:
        with _translated(f"{self._id}: begin transaction", self._producer):
            cause = broken_cause(self._producer)
            if cause is not None:  # checked first: aiokafka would fail an assertion
                raise KafkaError(f"begin refused: {cause!r}")
            await self._producer.begin_transaction()
        s = self._settings
        return KafkaTransaction(self._producer, self._id, self._submit_topic, self._group_id,
                                frozenset({s.submit_topic, s.state_topic, s.fired_topic,
                                           s.rejected_topic, s.dead_topic}))

    def prepare(self) -> KafkaPrepared:
        return KafkaPrepared(self)

    def known_limit(self, topic: str) -> int:
        """The topic's largest record as last read (Kafka's default before the first read)."""
        known = self._limits.known(topic)
        return known if known is not None \
            else limits.max_record_bytes(None, self._max_request)

    async def max_record_bytes(self, topic: str) -> int:
        return await self._limits.largest_record(topic, self._max_request)

    def forget_limit(self, topic: str) -> None:
        self._limits.forget(topic)

    async def partition_count(self, topic: str) -> int | None:
        try:
            parts = await within(self._producer.partitions_for(topic),
                                 PARTITIONS_LOOKUP_TIMEOUT_S)
        except (TimeoutError, KafkaError):
            return None
        return len(parts) if parts else None


class _Rebalance(ConsumerRebalanceListener):
    """Runs on the group thread; the node's callbacks run on the node loop and are awaited, so
    a revocation completes (the node stopped the shards) before the member rejoins and another
    member can be given them."""

    def __init__(self, group: KafkaSubmitGroup) -> None:
        self._group = group

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._group._revoked_on_group([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._group._assigned_on_group([tp.partition for tp in assigned])


# The group thread's fetches wait at most this long: aiokafka counts the time between them
# against max.poll.interval, and pause changes of the node are applied between two of them.
GROUP_POLL_MS = 200


class KafkaSubmitGroup(GroupThreadMember):
    """The node's group member, run on an event loop of its own in a dedicated thread.

    Its heartbeats then depend only on that thread, not on the node's loop, which a herd or a
    large Cassandra page keeps busy for seconds: a short session timeout (fast takeover of a
    dead node's shards) no longer revokes a busy node. A hung node loop is caught by the
    liveness pings instead (`LoopLiveness`, node_loop_stall_limit_ms).

    Threads: the aiokafka consumer is used only on the group loop. The node's calls are
    marshalled to it (`_on_group`); the group's rebalance callbacks are marshalled to the node
    loop and awaited. Fetched records are handed over under a lock; a shard whose handed-over
    records the node has not taken yet is paused past `pump_fetch_records` of them.
    """

    def __init__(self, settings: Settings, *, group_id: str, client_id: str,
                 session_timeout_ms: int, on_assigned: ShardsChanged,
                 on_revoked: ShardsChanged, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, group_id=group_id, client_id=client_id,
                         session_timeout_ms=session_timeout_ms, on_assigned=on_assigned,
                         on_revoked=on_revoked, clock=clock)
        self._consumer: AIOKafkaConsumer | None = None  # made and used on the group loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task[None]] = []  # group loop: pump and pings

    def _new_consumer(self) -> AIOKafkaConsumer:
        """The group consumer (on the running loop, the group loop outside tests)."""
        s = self._settings
        return group_consumer(
            s, self._group_id, session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=s.node_heartbeat_interval_ms,
            # Time between two polls of the group thread; it polls only while the node loop
            # answers, so this is how long a hung node loop keeps its shards.
            max_poll_interval_ms=s.node_loop_stall_limit_ms,
            group_instance_id=s.node_instance_id or None,
            # One fetched chunk per partition is buffered until consumed: 1 MiB (a few
            # thousand commands) per shard is ahead of ingest, not 4.
            max_partition_fetch_bytes=1 << 20, client_id=self._client_id)

    def _tp(self, shard: int) -> TopicPartition:
        return TopicPartition(self._topic, shard)

    def _log_end(self, shard: int) -> int | None:
        consumer = self._consumer
        tp = self._tp(shard)
        if consumer is None or tp not in consumer.assignment():  # highwater asserts it is
            return None
        end: int | None = consumer.highwater(tp)
        return end

    # --- between the threads ----------------------------------------------------------------
    async def _on_group(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the group loop and wait for it here (cancelling it if cancelled)."""
        if self._loop is None or self._loop.is_closed():
            coro.close()
            raise BusError(f"group {self._group_id}: the member is not running")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _on_node(self, callback: ShardsChanged, shards: list[int]) -> None:
        """Run a node callback on the node loop and wait (on the group loop) until it ends."""
        assert self._node_loop is not None

        async def call() -> None:  # called there, not here: all of it runs on the node loop
            await callback(shards)

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self._node_loop))

    async def _revoked_on_group(self, shards: list[int]) -> None:
        with self._lock:
            self._assigned.difference_update(shards)
            # As in aiokafka, a shard assigned again starts unpaused: the node forgets its
            # pauses of shards it no longer owns and would never resume this one.
            self._paused_by_node.difference_update(shards)
            self._withheld.difference_update(shards)  # an actor taking it over seeks again
            self._forget(shards)  # fetched for the old assignment: never handed over now
        await self._on_node(self._on_revoked, shards)

    async def _assigned_on_group(self, shards: list[int]) -> None:
        with self._lock:
            self._assigned.update(shards)
            # Again here: the node's pump may have paused a shard while its revocation was
            # on the way to the node loop.
            self._paused_by_node.difference_update(shards)
        await self._on_node(self._on_assigned, shards)

    # --- the group thread -------------------------------------------------------------------
    def _run_thread(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _start_on_group(self) -> None:
        consumer = self._consumer = self._new_consumer()
        consumer.subscribe([self._topic], listener=_Rebalance(self))
        await consumer.start()
        parts = consumer.partitions_for_topic(self._topic)
        self._partitions = None if parts is None else len(parts)
        self._tasks = [asyncio.create_task(self._pings(), name="node-loop-pings"),
                       asyncio.create_task(self._pump(), name="group-pump")]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            log.error("group %s: %s failed: %r", self._group_id, task.get_name(), exc)
            self._failure = exc
            self._notify_node()

    async def _pings(self) -> None:
        node_loop = self._node_loop
        assert node_loop is not None
        self._liveness.start()
        while True:
            if not self._ping_pending:
                self._ping_pending = True
                node_loop.call_soon_threadsafe(self._answer)
            self._liveness.check()
            await asyncio.sleep(LIVENESS_PING_MS / 1000)

    async def _pump(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        most = self._settings.pump_fetch_records
        while True:
            if not self._liveness.may_poll():
                # No poll: past max.poll.interval of these the member leaves the group.
                await asyncio.sleep(GROUP_POLL_MS / 1000)
                continue
            with self._lock:
                want = {k for k in self._assigned
                        if k in self._paused_by_node or len(self._ready.get(k, ())) >= most}
            assignment = consumer.assignment()
            paused = {tp.partition for tp in consumer.paused()}
            if stop := [self._tp(k) for k in want - paused if self._tp(k) in assignment]:
                consumer.pause(*stop)
            if go := [self._tp(k) for k in paused - want if self._tp(k) in assignment]:
                consumer.resume(*go)
            # Also with every partition paused: the fetch (its wait) is what keeps the member
            # within max.poll.interval. Never cancelled midway: aiokafka would then count the
            # member as polling forever.
            batches = await consumer.getmany(timeout_ms=GROUP_POLL_MS, max_records=most)
            if batches:
                self._hand_over({tp.partition: list(records)
                                 for tp, records in batches.items()})

    async def _stop_on_group(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        # Whatever aiokafka left running on this loop ends with it.
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    # --- the node's side --------------------------------------------------------------------
    async def start(self) -> None:
        # A broker refuses a session timeout outside its limits only when the member joins,
        # in the background, as an opaque coordination error: check the limits first.
        limits = await group_session_limits(self._settings)
        refusal = limits and session_timeout_refusal(self._session_timeout_ms, limits)
        if refusal:
            raise ConfigError(refusal)
        self._node_loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_thread, daemon=True,
                                        name=f"group-{self._group_id}-{self._client_id}")
        self._thread.start()
        try:
            # The first assignment may arrive (and run on this loop) before this returns.
            await self._on_group(self._start_on_group())
        except BaseException:
            with contextlib.suppress(Exception):  # the failure to start is what matters
                await self.stop()
            raise

    async def stop(self) -> None:
        """Leave the group and end the group thread. The node calls it once its shards have
        stopped; the pump is cancelled first."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if not loop.is_closed():
                await self._on_group(self._stop_on_group())
        finally:
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)
            if not loop.is_closed():
                loop.close()
            self._loop = self._thread = None

    def _raise_failure(self) -> None:
        exc = self._failure
        if exc is None:
            return
        # Limits we could not read beforehand: the join's refusal surfaces here.
        if isinstance(exc, InvalidSessionTimeoutError) or isinstance(
                exc.__cause__, InvalidSessionTimeoutError):
            raise ConfigError(
                f"Kafka refused node_session_timeout_ms {self._session_timeout_ms} "
                f"(INVALID_SESSION_TIMEOUT): the brokers' group.min.session.timeout.ms "
                f"must be at most it (see the operations runbook)") from exc
        raise BusError(f"group {self._group_id}: the member's thread failed: {exc!r}") from exc

    async def check_membership(self) -> bool:
        return await self._on_group(self._check_membership_on_group())

    async def _check_membership_on_group(self) -> bool:
        # aiokafka has no call that only validates the member, and its consumer's commit
        # refuses a partition not assigned, so the probe (core/wire.py) goes through the
        # consumer's coordinator, which sends the generation and member id with it: the group
        # coordinator checks both on every OffsetCommit.
        consumer = self._consumer
        assert consumer is not None
        coordinator = consumer._coordinator
        if coordinator.generation < 0 or not coordinator.member_id:
            # Reset by a refusal (it is rejoining): a commit now would be taken as one from
            # outside the group, which an empty group accepts.
            log.warning("group membership check: the member is rejoining its group")
            return False
        probe = TopicPartition(self._settings.state_topic, wire.MEMBERSHIP_PROBE_PARTITION)
        subscription = consumer._subscription.subscription
        assignment = None if subscription is None else subscription.assignment
        try:
            await coordinator.commit_offsets(assignment, {probe: OffsetAndMetadata(
                wire.MEMBERSHIP_PROBE_OFFSET, wire.MEMBERSHIP_PROBE_METADATA)})
        except (CommitFailedError, IllegalStateError) as exc:
            log.warning("group membership check failed: %s", exc)
            return False
        except KafkaError as exc:
            raise BusError(f"group membership check ({probe.topic}[{probe.partition}]): "
                           f"{exc!r}") from exc
        return True

    async def committed(self, shard: int) -> int | None:
        return await self._on_group(self._committed_on_group(shard))

    async def _committed_on_group(self, shard: int) -> int | None:
        assert self._consumer is not None
        offset: int | None = await self._consumer.committed(self._tp(shard))
        return offset

    async def seek(self, shard: int, offset: int | None) -> int:
        # Withheld from now: records read after the group thread's seek, but taken by the
        # node's pump before the actor is ready, were dropped and never read again.
        with self._lock:
            self._withheld.add(shard)
        skipped: int = await self._on_group(self._seek_on_group(shard, offset))
        return skipped

    async def _seek_on_group(self, shard: int, offset: int | None) -> int:
        assert self._consumer is not None
        # Records fetched before the seek are not handed over: the next come from the target
        # (aiokafka drops its own buffer of the partition on a seek too).
        tp = self._tp(shard)
        # Below the log start, aiokafka would reset to it (auto_offset_reset) without a
        # word: the commands in between were deleted unapplied, which the node must report.
        # (With nothing committed the group cannot tell deleted commands from applied ones
        # whose committed offsets Kafka expired, so a seek to the beginning reports none.)
        # The beginning is sought as the log start's offset, like any other: the records
        # handed over are then known to start there (`_hand_over`).
        try:
            start = (await self._consumer.beginning_offsets([tp]))[tp]
        except KafkaTimeoutError as exc:  # aiokafka's retries spent: no leader answered
            raise PartitionUnavailable(f"log start of {tp.topic}[{tp.partition}]: "
                                       f"{exc!r}") from exc
        except KafkaError as exc:
            raise BusError(f"log start of {tp.topic}[{tp.partition}]: {exc!r}") from exc
        target = start if offset is None else max(offset, start)
        # No await from the seek to `_moved`: a fetch in between would hand over records
        # from the old position. (A shard revoked meanwhile is not assigned: the seek fails.)
        self._consumer.seek(tp, target)
        self._moved(shard, target)
        return 0 if offset is None else max(0, start - offset)


STATE_READ_POLL_MS = 20
STATE_TAIL_OFFSETS = 256
"""A state read looks at this many offsets before the end first (`read_last`): a node
transaction puts one record and one marker on each state partition it writes to."""
"""How long a state read's fetch and poll wait for records before it looks at its position
again. It was 500 ms (aiokafka's defaults): a settled read that met an open transaction then
took 500 ms however soon the transaction ended, on the path of every full takeover."""


class KafkaNodeBus:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # Started readers kept for the next state read: starting one (bootstrap, metadata)
        # costs a few hundred ms, twice per claimed shard, on the path of every failover.
        self._idle_readers: list[AIOKafkaConsumer] = []
        self._topic_limits = TopicLimits(settings)

    async def _reader(self) -> AIOKafkaConsumer:
        if self._idle_readers:
            return self._idle_readers.pop()
        # A short long-poll: a settled read waits for the transactions still open on the state
        # partition, and each wait ends at the broker's fetch wait or the poll below.
        consumer = reader(self._settings, fetch_max_wait_ms=STATE_READ_POLL_MS)
        await consumer.start()
        return consumer

    async def close(self) -> None:
        idle, self._idle_readers = self._idle_readers, []
        for consumer in idle:
            with contextlib.suppress(Exception):
                await consumer.stop()
        await self._topic_limits.close()

    def submit_group(self, *, group_id: str, client_id: str, session_timeout_ms: int,
                     on_assigned: ShardsChanged, on_revoked: ShardsChanged) -> SubmitGroup:
        if self._settings.node_group_protocol == "consumer":
            # librdkafka, imported only when asked for (aiokafka speaks only the classic one).
            from chronowheel.bus.kafka_consumer_group import ConsumerProtocolGroup

            return ConsumerProtocolGroup(self._settings, group_id=group_id,
                                         client_id=client_id,
                                         session_timeout_ms=session_timeout_ms,
                                         on_assigned=on_assigned, on_revoked=on_revoked)
        return KafkaSubmitGroup(self._settings, group_id=group_id, client_id=client_id,
                                session_timeout_ms=session_timeout_ms,
                                on_assigned=on_assigned, on_revoked=on_revoked)

    def producer(self, transactional_id: str, group_id: str) -> KafkaTxnProducer:
        # Every producer of the node shares what it read of the topics' limits: one made
        # after a fence or a failed transaction needs them for the first part of every shard.
        return KafkaTxnProducer(self._settings, transactional_id, group_id,
                                self._topic_limits)

    def claimer(self, transactional_id: str, group_id: str) -> Claimer:
        del group_id  # a claim commits no submit offsets
        # librdkafka, imported only here (as the consumer protocol's member): its requests run
        # on its own threads, not on the node's loop, which is busiest during takeovers.
        from chronowheel.bus.kafka_claimer import RdKafkaClaimer

        return RdKafkaClaimer(self._settings, transactional_id)

    async def read_last(self, topic: str, partition: int, key: bytes, timeout_ms: int, *,
                        settled: bool = False) -> bytes | None:
        tp = TopicPartition(topic, partition)
        consumer = await self._reader()
        reusable = False
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            consumer.assign([tp])
            # read_committed: end_offsets is the last stable offset (before the first open
            # transaction). Settled: the high watermark, which a read_committed position
            # reaches only once every transaction that wrote below it is resolved.
            end = (await consumer.end_offsets([tp]))[tp]
            # The tail first: a state partition's active segment holds every record of the
            # last `segment.ms` (compaction leaves it alone), thousands to a hundred thousand
            # at high rates, and a read from the beginning parsed them all, twice per takeover.
            # The last record is in the tail unless aborted transactions and markers filled it:
            # then further back, until the log start.
            back = STATE_TAIL_OFFSETS
            start = max(0, end - back)
            while True:
                found = await self._scan(consumer, tp, key, start, end, settled, deadline,
                                         timeout_ms)
                if found is not None or start == 0:
                    break
                begin = (await consumer.beginning_offsets([tp]))[tp]
                if start <= begin:
                    break
                back *= 16
                start = max(begin, end - back)
            reusable = True
        finally:
            if reusable:
                # Paused while idle: its fetcher would go on fetching the partition every
                # STATE_READ_POLL_MS, read or not (the next assign starts unpaused).
                consumer.pause(tp)
                self._idle_readers.append(consumer)
            else:  # a failed or cancelled read may leave it in any state
                await consumer.stop()
        return found

    @staticmethod
    async def _scan(consumer: AIOKafkaConsumer, tp: TopicPartition, key: bytes, start: int,
                    end: int, settled: bool, deadline: float, timeout_ms: int) -> bytes | None:
        """The last record with `key` from offset `start` to `end` (settled: to the high
        watermark, once every transaction below it is resolved); None if there is none."""
        consumer.seek(tp, start)  # below the log start: reset to it (auto_offset_reset)
        found: bytes | None = None
        while True:
            position = await consumer.position(tp)
            if settled:
                high = consumer.highwater(tp)
                end = max(end, high if high is not None else end)
                done = high is not None and position >= end
            else:
                done = position >= end
            if done:
                return found
            if time.monotonic() > deadline:
                raise BusError(f"timed out reading {tp.topic}[{tp.partition}] to its "
                               f"{'high watermark' if settled else 'end'} {end} "
                               f"({timeout_ms} ms, at {position})")
            # Not longer: once the open transactions end, the fetch brings their markers
            # and no record, and only the next turn of this loop sees the position moved.
            batch = await consumer.getmany(tp, timeout_ms=STATE_READ_POLL_MS)
            for msg in batch.get(tp, []):
                if msg.key == key and msg.value:
                    found = msg.value
