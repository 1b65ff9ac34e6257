"""The node's group member over Kafka 4's consumer group protocol (KIP-848), through librdkafka.

`node_group_protocol=consumer`, the default, selects it (`KafkaNodeBus.submit_group`); `classic`
selects `KafkaSubmitGroup` (aiokafka, the eager protocol). Both implement
`bus/ports.SubmitGroup`, and the node's exactly-once path does not depend on which: fencing
rests on the state record and the claimers (`node/takeover.py`), and the node's transactional
producer (aiokafka) commits its submit offsets into either kind of group (the broker checks a
member epoch in TxnOffsetCommit only when one is given, and the producer gives none).

What changes is what a rebalance costs. With this protocol the brokers compute the assignment
and hand each member only its *changes*, on the member's heartbeats: a member that keeps a
partition is never told anything about it, so a join, a leave or a restart pauses only the
shards that move. A moved shard is revoked at its old owner's next heartbeat, and given to the
new owner once the old one has acknowledged (its next heartbeat after `on_revoked` returned):
about two heartbeat intervals. The session timeout and heartbeat interval are the *group's*
(`consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms`), not the client's; `start`
sets them from node_session_timeout_ms and node_heartbeat_interval_ms, within the brokers'
`group.consumer.min.*` / `group.consumer.max.*` limits (45 s and 5 s minimums by default).

Threads, as in `KafkaSubmitGroup`: the librdkafka consumer is used only on the group thread,
which polls it, hands fetched records to the node under a lock, serves the node's requests
(seek, the membership check) between two polls, and runs the rebalance
callbacks: each calls the node's `on_assigned` / `on_revoked` on the node loop and waits for it
(serving requests meanwhile, since the node's shard actors ask for seeks while it waits). A
revoked shard is removed from the consumer's assignment only after the node stopped it, and
the revocation is acknowledged to the group only after that, so another member is given the
shard only once this node has stopped publishing for it. Heartbeats are librdkafka's own
background thread's: neither the node loop nor the group thread's poll delays them. A second
consumer, never subscribed (the *querier*), reads committed offsets and log starts in threads
of their own (`_ask`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from chronowheel.bus.group_thread import LIVENESS_PING_MS, GroupThreadMember
from chronowheel.bus.kafka import check_kafka_security
from chronowheel.bus.ports import (
    BusError,
    FetchedRecord,
    PartitionUnavailable,
    ShardsChanged,
    SubmitRecord,
)
from chronowheel.core import wire
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# One poll of the group thread waits at most this long for records (librdkafka's batch consume
# returns at its timeout unless the batch fills). It also bounds how long a request of the node
# (a seek on the takeover path) waits for the group thread.
CONSUME_WAIT_MS = 20
# While a rebalance callback waits for the node, the node's requests are served this often.
CALLBACK_SERVE_MS = 10
# A seek of a partition whose fetch has not started yet is tried again this often.
SEEK_RETRY_MS = 5
# Reads of offsets and watermarks are tried again this often, for this long, while Kafka
# fails them (aiokafka's request timeout is of the same order).
QUERY_RETRY_MS = 200
QUERY_DEADLINE_S = 30.0
# One try waits this long at most: the group thread does not poll meanwhile.
QUERY_TIMEOUT_S = 5.0
ADMIN_TIMEOUT_S = 10.0
# Errors of a synchronous commit that say this member is not in the group's current state.
NOT_A_MEMBER = frozenset({"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH", "STALE_MEMBER_EPOCH",
                          "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS",
                          "_ASSIGNMENT_LOST", "_STATE"})
# Blocking librdkafka calls made for the node's loop (the querier's reads, the claimers'
# transactions) run on this pool, not asyncio's default executor: its few threads (CPUs + 4)
# would make the claims of many shards taken over at once wait for each other, and a fence
# that waits for a broker (up to 30 s) would hold one of them.
LIBRDKAFKA_CALLS = concurrent.futures.ThreadPoolExecutor(max_workers=32,
                                                         thread_name_prefix="librdkafka-call")


async def librdkafka_call(call: Callable[[], T]) -> T:
    """Run a blocking librdkafka call on `LIBRDKAFKA_CALLS`; the loop goes on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(LIBRDKAFKA_CALLS, call)


GROUP_SESSION = "consumer.session.timeout.ms"
GROUP_HEARTBEAT = "consumer.heartbeat.interval.ms"


def librdkafka_config(settings: Settings) -> dict[str, Any]:
    """librdkafka's properties for the configured brokers, TLS and SASL (the same settings
    as aiokafka's `security_options`, checked the same way)."""
    credentials = check_kafka_security(settings)
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka,
                            "security.protocol": settings.kafka_security_protocol}
    if settings.kafka_uses_ssl:
        # Without a CA file, the system's CAs, as Python's default SSL context uses.
        conf["ssl.ca.location"] = settings.kafka_ssl_cafile or "probe"
        if settings.kafka_ssl_certfile:
            conf["ssl.certificate.location"] = settings.kafka_ssl_certfile
        if settings.kafka_ssl_keyfile:
            conf["ssl.key.location"] = settings.kafka_ssl_keyfile
        if settings.kafka_ssl_key_password is not None:
            conf["ssl.key.password"] = settings.kafka_ssl_key_password.reveal()
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if settings.kafka_ssl_check_hostname else "none")
    if credentials is not None:
        conf.update({"sasl.mechanism": settings.kafka_sasl_mechanism,
                     "sasl.username": credentials[0], "sasl.password": credentials[1]})
    return conf


# Errors of a fetch that concern all of the node's work, not one record: with them the member
# would go on polling and read nothing, a shard's ingest stalled with only a warning per poll.
# aiokafka raises the same from its fetch, which stops the classic member.
STOPS_THE_MEMBER = frozenset({"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
                              "CLUSTER_AUTHORIZATION_FAILED", "SASL_AUTHENTICATION_FAILED",
                              "_AUTHENTICATION"})


def stops_the_member(err: Any) -> bool:
    """Whether a fetch error (librdkafka's KafkaError) stops the member: fatal, or a refusal
    of this node's access (its ACLs, its credentials). Others are passing (a broker down, a
    leader moving) and librdkafka tries again by itself."""
    return bool(err.fatal()) or err.name() in STOPS_THE_MEMBER


def admin_config(settings: Settings) -> dict[str, Any]:
    """librdkafka's properties for a short-lived admin client: warnings and errors only
    (at its info level it prints to stderr that it purged its queue when it is destroyed)."""
    return {**librdkafka_config(settings), "log_level": 4}


def _error_name(exc: BaseException) -> str:
    """librdkafka's error name of a KafkaException ("" for anything else)."""
    args = getattr(exc, "args", ())
    err = args[0] if args else None
    name = getattr(err, "name", None)
    return name() if callable(name) else ""


def group_config_refusal(group_id: str, wanted: dict[str, int], exc: BaseException) -> str:
    """What to tell an operator whose brokers refused the group's session or heartbeat."""
    asked = ", ".join(f"{k} {v}" for k, v in wanted.items())
    return (f"Kafka refused to set group {group_id}'s {asked} ({exc}): with "
            f"node_group_protocol=consumer the brokers' group.consumer.min.session.timeout.ms "
            f"must be at most node_session_timeout_ms and group.consumer.min.heartbeat."
            f"interval.ms at most node_heartbeat_interval_ms (Kafka's defaults, 45 s and 5 s, "
            f"refuse the node's), and the node's user needs ALTER_CONFIGS and DESCRIBE_CONFIGS "
            f"on the group (see the operations runbook)")


def configure_group(settings: Settings, group_id: str, *, session_timeout_ms: int,
                    heartbeat_interval_ms: int) -> None:
    """Set the group's session timeout and heartbeat interval (blocking; run it on a thread).
    Raises ConfigError when the brokers refuse them."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    wanted = {GROUP_SESSION: session_timeout_ms, GROUP_HEARTBEAT: heartbeat_interval_ms}
    admin = AdminClient(admin_config(settings))
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=[
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in wanted.items()])
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        retriable = getattr(exc.args[0], "retriable", lambda: False)() if exc.args else False
        if retriable:
            raise BusError(f"setting group {group_id}'s session and heartbeat: {exc}") from exc
        raise ConfigError(group_config_refusal(group_id, wanted, exc)) from exc
    except concurrent.futures.TimeoutError as exc:
        raise BusError(f"setting group {group_id}'s session and heartbeat: no answer in "
                       f"{ADMIN_TIMEOUT_S:.0f} s") from exc


class ConsumerProtocolGroup(GroupThreadMember):
    """The node's member of `<ns>-nodes` with `group.protocol=consumer` (see the module)."""

    def __init__(self, settings: Settings, *, group_id: str, client_id: str,
                 session_timeout_ms: int, on_assigned: ShardsChanged,
                 on_revoked: ShardsChanged, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, group_id=group_id, client_id=client_id,
                         session_timeout_ms=session_timeout_ms, on_assigned=on_assigned,
                         on_revoked=on_revoked, clock=clock)
        self._requests: queue.SimpleQueue[tuple[Callable[[Any], Any],
                                                concurrent.futures.Future[Any]]] = \
            queue.SimpleQueue()
        self._stopping = threading.Event()
        self._consumer: Any = None  # a confluent_kafka.Consumer, made and used on the thread
        self._thread: threading.Thread | None = None
        self._paused: set[int] = set()  # group thread only: what the consumer has paused
        self._querier: Any = None
        """A second librdkafka consumer, never subscribed, for the takeover's reads of
        committed offsets and log starts (`_ask`)."""

    def _querier_config(self) -> dict[str, Any]:
        return {**librdkafka_config(self._settings),
                "group.id": self._group_id,  # whose committed offsets it reads
                "client.id": f"{self._client_id}-queries",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # Connected to every broker from the start: its first query does not wait
                # for a connection.
                "enable.sparse.connections": False,
                "logger": logging.getLogger("chronowheel.bus.librdkafka")}

    def _consumer_config(self) -> dict[str, Any]:
        s = self._settings
        conf = librdkafka_config(s)
        conf.update({
            "group.id": self._group_id,
            "group.protocol": "consumer",
            "client.id": self._client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # The group thread polls only while the node loop answers: this is how long a
            # hung node loop keeps its shards.
            "max.poll.interval.ms": s.node_loop_stall_limit_ms,
            # One fetched chunk per partition ahead of ingest, as the classic member.
            "max.partition.fetch.bytes": 1 << 20,
            # The group thread hands records over at once; a fetch waits no longer than the
            # classic member's.
            "fetch.wait.max.ms": 100,
            "logger": logging.getLogger("chronowheel.bus.librdkafka"),
        })
        if s.node_instance_id:
            conf["group.instance.id"] = s.node_instance_id
        return conf

    # --- between the threads ----------------------------------------------------------------
    async def _on_group(self, request: Callable[[Any], T]) -> T:
        """Run `request(consumer)` on the group thread and wait for it here."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            raise BusError(f"group {self._group_id}: the member is not running")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((request, future))
        return await asyncio.wrap_future(future)

    def _serve_requests(self, consumer: Any) -> None:
        while True:
            try:
                request, future = self._requests.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(request(consumer))
            except BaseException as exc:  # handed to the node's caller
                future.set_exception(exc)

    def _call_node(self, consumer: Any, callback: ShardsChanged, shards: list[int]) -> None:
        """Run a node callback on the node loop; wait for it, serving the node's requests."""
        loop = self._node_loop
        if loop is None or loop.is_closed():
            return
        async def call() -> None:  # a coroutine of its own: the callback runs on the node loop
            await callback(shards)

        done: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(call(), loop)
        while True:
            try:
                done.result(timeout=CALLBACK_SERVE_MS / 1000)
                return
            except concurrent.futures.TimeoutError:
                self._serve_requests(consumer)

    # --- rebalance callbacks (group thread, inside a poll) ------------------------------------
    def _assigned_cb(self, consumer: Any, partitions: list[Any]) -> None:
        shards = sorted(tp.partition for tp in partitions if tp.topic == self._topic)
        # Into the consumer's assignment first: the node's actors seek these shards while
        # the callback waits, and a seek moves a partition that is already assigned.
        consumer.incremental_assign(partitions)
        with self._lock:
            self._assigned.update(shards)
            self._paused_by_node.difference_update(shards)
        self._paused.difference_update(shards)  # a partition assigned anew starts unpaused
        self._call_node(consumer, self._on_assigned, shards)

    def _revoked_cb(self, consumer: Any, partitions: list[Any]) -> None:
        shards = sorted(tp.partition for tp in partitions if tp.topic == self._topic)
        with self._lock:
            self._assigned.difference_update(shards)
            self._paused_by_node.difference_update(shards)
            self._withheld.difference_update(shards)
            self._forget(shards)  # fetched for the old assignment: never handed over now
        # The node stops the shards before the revocation is acknowledged (after this
        # returns): nobody else is given them while this node may still publish for them.
        self._call_node(consumer, self._on_revoked, shards)
        consumer.incremental_unassign(partitions)
        self._paused.difference_update(shards)

    # --- the group thread -------------------------------------------------------------------
    def _run_thread(self, started: concurrent.futures.Future[None]) -> None:
        from confluent_kafka import Consumer

        consumer = None
        try:
            consumer = self._consumer = Consumer(self._consumer_config())
            metadata = consumer.list_topics(self._topic, timeout=ADMIN_TIMEOUT_S)
            topic = metadata.topics.get(self._topic)
            if topic is None or topic.error is not None:
                raise BusError(f"topic {self._topic}: not found "
                               f"({topic.error if topic is not None else 'no metadata'})")
            self._partitions = len(topic.partitions)
            consumer.subscribe([self._topic], on_assign=self._assigned_cb,
                               on_revoke=self._revoked_cb, on_lost=self._revoked_cb)
            started.set_result(None)
            self._poll_loop(consumer)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            elif self._failure is None:
                log.error("group %s: the member's thread failed: %r", self._group_id, exc)
                self._failure = exc
                self._notify_node()
        finally:
            if consumer is not None:
                try:
                    consumer.close()  # leaves the group; revocations run the callbacks
                except Exception as exc:
                    log.warning("group %s: closing the member: %r", self._group_id, exc)
            self._fail_requests()

    def _fail_requests(self) -> None:
        while True:
            try:
                _request, future = self._requests.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(BusError(f"group {self._group_id}: the member stopped"))

    def _ping(self) -> None:
        loop = self._node_loop
        if loop is not None and not self._ping_pending:
            self._ping_pending = True
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._answer)
        self._liveness.check()

    def _apply_pauses(self, consumer: Any) -> None:
        from confluent_kafka import TopicPartition

        most = self._settings.pump_fetch_records
        with self._lock:
            want = {k for k in self._assigned
                    if k in self._paused_by_node or len(self._ready.get(k, ())) >= most}
            assigned = set(self._assigned)
        if stop := sorted((want - self._paused) & assigned):
            consumer.pause([TopicPartition(self._topic, k) for k in stop])
            self._paused.update(stop)
        if go := sorted((self._paused - want) & assigned):
            consumer.resume([TopicPartition(self._topic, k) for k in go])
            self._paused.difference_update(go)

    def _poll_loop(self, consumer: Any) -> None:
        most = self._settings.pump_fetch_records
        self._liveness.start()
        next_ping = 0.0
        while not self._stopping.is_set():
            self._serve_requests(consumer)
            now = time.monotonic()
            if now >= next_ping:
                self._ping()
                next_ping = now + LIVENESS_PING_MS / 1000
            if not self._liveness.may_poll():
                # No poll: past max.poll.interval of these the member leaves the group.
                self._stopping.wait(CONSUME_WAIT_MS / 1000)
                continue
            self._apply_pauses(consumer)
            messages = consumer.consume(num_messages=most, timeout=CONSUME_WAIT_MS / 1000)
            if not messages:
                continue
            batches: dict[int, list[SubmitRecord]] = {}
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if stops_the_member(err):
                        raise BusError(f"group {self._group_id}: fetching {self._topic}: "
                                       f"{err}")
                    log.warning("group %s: fetching %s: %s", self._group_id, self._topic, err)
                    continue
                batches.setdefault(msg.partition(), []).append(FetchedRecord(
                    msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                    msg.headers() or ()))
            if batches:
                self._hand_over(batches)

    # --- the node's side --------------------------------------------------------------------
    async def start(self) -> None:
        s = self._settings
        await asyncio.to_thread(configure_group, s, self._group_id,
                                session_timeout_ms=self._session_timeout_ms,
                                heartbeat_interval_ms=s.node_heartbeat_interval_ms)
        self._node_loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        from confluent_kafka import Consumer

        self._querier = await asyncio.to_thread(Consumer, self._querier_config())
        self._thread = threading.Thread(target=self._run_thread, args=(started,), daemon=True,
                                        name=f"group-{self._group_id}-{self._client_id}")
        self._thread.start()
        try:
            await asyncio.wrap_future(started)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.stop()
            raise

    async def stop(self) -> None:
        """Leave the group and end the group thread (the node's shards have stopped)."""
        thread = self._thread
        if thread is not None:
            self._stopping.set()
            await asyncio.to_thread(thread.join)
            self._thread = None
        # After the leave, which the other nodes wait for (a close took up to 0.3 s).
        querier, self._querier = self._querier, None
        if querier is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(querier.close)

    def _raise_failure(self) -> None:
        exc = self._failure
        if exc is not None:
            raise BusError(f"group {self._group_id}: the member's thread failed: "
                           f"{exc!r}") from exc

    def _log_end(self, shard: int) -> int | None:
        consumer = self._consumer
        if consumer is None:
            return None
        _start, end = consumer.get_watermark_offsets(self._tp(shard), cached=True)
        return int(end) if end >= 0 else None

    def _tp(self, shard: int, offset: int | None = None) -> Any:
        from confluent_kafka import TopicPartition

        if offset is None:
            return TopicPartition(self._topic, shard)
        return TopicPartition(self._topic, shard, offset)

    async def check_membership(self) -> bool:
        return await self._on_group(self._check_membership_on_group)

    def _check_membership_on_group(self, consumer: Any) -> bool:
        from confluent_kafka import KafkaException, TopicPartition

        # As the classic member: commit the probe (core/wire.py); the coordinator checks the
        # member's id and epoch.
        probe = TopicPartition(self._settings.state_topic, wire.MEMBERSHIP_PROBE_PARTITION,
                               wire.MEMBERSHIP_PROBE_OFFSET, wire.MEMBERSHIP_PROBE_METADATA)
        try:
            consumer.commit(offsets=[probe], asynchronous=False)
        except KafkaException as exc:
            if _error_name(exc) in NOT_A_MEMBER:
                log.warning("group membership check failed: %s", exc)
                return False
            raise BusError(f"group membership check ({probe.topic}[{probe.partition}]): "
                           f"{exc}") from exc
        return True

    async def _ask(self, what: str, query: Callable[[Any], T],
                   past_deadline: type[BusError] = BusError) -> T:
        """A read of offsets or watermarks through the querier, in a thread of its own, tried
        again while Kafka fails it (a broker killed or restarting: librdkafka fails such a call
        at once, where aiokafka's own retries absorb it) for up to `QUERY_DEADLINE_S`. A
        takeover's two reads (the committed offset, the log start) so no longer queue on the
        group thread, one after the other and between its polls, with the reads of every
        other shard taken over at the same time (the offset and the seek took 0.15-0.55 s at
        the scale-outs of the loaded cluster profile); several shards' reads run at once, and
        only the seek is left to the group thread. The querier is not the member: its calls
        do not meet the group thread's polls, which had made such reads take from 0.5 s to
        forever when made on the member's consumer from another thread."""
        from confluent_kafka import KafkaException

        querier = self._querier
        if querier is None:
            raise BusError(f"group {self._group_id}: the member is not running")
        deadline = time.monotonic() + QUERY_DEADLINE_S
        while True:
            try:
                return await librdkafka_call(lambda: query(querier))
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                fatal = bool(getattr(err, "fatal", lambda: False)())
                if fatal:
                    raise BusError(f"{what}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise past_deadline(f"{what}: {exc}") from exc
                log.warning("%s: %s; trying again", what, exc)
            await asyncio.sleep(QUERY_RETRY_MS / 1000)

    async def committed(self, shard: int) -> int | None:
        (tp,) = await self._ask(
            f"{self._topic}[{shard}]: reading the committed offset",
            lambda querier: querier.committed([self._tp(shard)], timeout=QUERY_TIMEOUT_S))
        return None if tp.offset < 0 else int(tp.offset)

    async def seek(self, shard: int, offset: int | None) -> int:
        with self._lock:
            self._withheld.add(shard)
        # Below the log start librdkafka would reset without a word: the commands in between
        # were deleted unapplied, which the node must report. The beginning is sought as the
        # log start's offset too: a logical seek is one more look-up of it by librdkafka,
        # racing with its own (`_hand_over`), and the records handed over are then known to
        # start there.
        start, _end = await self._ask(
            f"log start of {self._topic}[{shard}]",
            lambda querier: querier.get_watermark_offsets(
                self._tp(shard), timeout=QUERY_TIMEOUT_S, cached=False),
            past_deadline=PartitionUnavailable)
        target = start if offset is None else max(offset, start)
        await self._on_group(lambda consumer: self._seek_on_group(consumer, shard, target))
        return 0 if offset is None else max(0, start - offset)

    def _seek_on_group(self, consumer: Any, shard: int, target: int) -> None:
        from confluent_kafka import KafkaException

        if shard not in self.assigned():
            # Being revoked: its actor, stopped half-way through a takeover, seeks before it
            # releases the shard. Nothing of the shard is handed over any more, so there is
            # nothing to move. (Seeking it anyway met librdkafka's "erroneous state" until the
            # callback ended, while the callback waited for the stop: 30 s, the stop deadline.)
            return
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            try:
                consumer.seek(self._tp(shard, target))
                # Records fetched from the old position are not handed over: those already
                # handed to `_ready` go here (no poll since the seek: this is the group
                # thread), and librdkafka drops its own (a seek purges what it fetched).
                self._moved(shard, target)
                return
            except KafkaException as exc:
                # Just assigned, the partition's fetch is not started yet ("erroneous
                # state") until librdkafka has looked up its first position: a moment.
                if _error_name(exc) != "_STATE" or time.monotonic() > deadline:
                    raise BusError(f"seek of {self._topic}[{shard}] to {target}: "
                                   f"{exc}") from exc
            time.sleep(SEEK_RETRY_MS / 1000)
