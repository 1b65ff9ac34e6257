"""The worker: a consumer group on target topics that runs a handler per fired occurrence.

Records flow: the fetch loop reads batches (read_committed) into the intake (`intake.py`); a
partition's records become ready once its idempotency lease is held and the outcomes already
recorded past its starting offset are known (`partitions.py`); `concurrency` handler slots
(`handling.py`) take ready records in order and run the handler. Each outcome is queued as a
mark; the marks of a partition are written together, and a record's offset is committed only
once it and every record before it on its partition are handled and marked (`offsets.py`): a
crash at any point redelivers, never loses, and the redelivery skips what was already handled.

A failure first produces a `retry` command (or a dead letter) and only then counts as handled.
Retries (`cw-attempt` > 1) are checked against the per-occurrence ledger (`ledger.py`), since a
crash between producing a retry and committing can put the same attempt on the topic twice.

The fetch loop wakes as soon as a handler frees room (the first version waited in a paused
`getmany` for 200 ms, capping a worker at `concurrency` records per 200 ms).

Infrastructure failures outside a handler (Cassandra, Kafka) stop the worker loudly with
nothing past the failed record committed; a supervisor restarts it and redelivery resumes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from chronowheel.bus.kafka import group_consumer, plain_producer
from chronowheel.core.clock import Clock, SystemClock
from chronowheel.errors import ChronowheelError
from chronowheel.observe.http import HttpEndpoint
from chronowheel.settings import Settings
from chronowheel.supervise import Supervisor, install_stop_signals
from chronowheel.timeouts import wait_event, within
from chronowheel.worker.handling import Handler, Slots, WorkerStats
from chronowheel.worker.intake import Intake
from chronowheel.worker.ledger import DEFAULT_KEEP_S, DEFAULT_LEASE_S, ClaimStore, Ledger
from chronowheel.worker.metrics import WorkerMetrics, observed
from chronowheel.worker.offsets import OffsetTracker
from chronowheel.worker.overlap import DEFAULT_POLL_S, DEFAULT_REPLACE_WAIT_S, Overlap, RunStore
from chronowheel.worker.partitions import MarkStore

log = logging.getLogger(__name__)

__all__ = ["Handler", "Worker", "WorkerError", "WorkerStats", "default_group_id",
           "install_signal_handlers"]


class WorkerError(ChronowheelError):
    """The worker stopped because of a failure outside a handler."""


def default_group_id(namespace: str, topics: list[str]) -> str:
    return f"{namespace}-workers-{'+'.join(sorted(topics))}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        handlers: Mapping[str, Handler],
        group_id: str | None = None,
        concurrency: int = 16,
        idempotency: bool = True,
        idempotency_scope: str | None = None,
        clock: Clock | None = None,
        lease_s: int = DEFAULT_LEASE_S,
        keep_s: int = DEFAULT_KEEP_S,
        shutdown_deadline_s: float = 30.0,
        commit_interval_s: float = 0.5,
        session_timeout_ms: int = 10_000,
        prefetch: int | None = None,
        store: ClaimStore | None = None,
        marks: MarkStore | None = None,
        worker_id: str | None = None,
        overlap_poll_s: float = DEFAULT_POLL_S,
        replace_wait_s: float = DEFAULT_REPLACE_WAIT_S,
        http_port: int | None = None,
    ) -> None:
        if not handlers:
            raise ValueError("handlers: give at least one topic -> handler")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if lease_s < 1:
            raise ValueError(f"lease_s must be at least 1, got {lease_s}")
        self.settings = settings
        self.handlers = dict(handlers)
        self.topics = sorted(self.handlers)
        self.group_id = group_id or default_group_id(settings.namespace, self.topics)
        self.concurrency = concurrency
        self.idempotency = idempotency
        self.idempotency_scope = idempotency_scope or self.group_id
        self.clock = clock or SystemClock()
        self.lease_s = lease_s
        self.keep_s = keep_s
        self.shutdown_deadline_s = shutdown_deadline_s
        self.commit_interval_s = commit_interval_s
        self.session_timeout_ms = session_timeout_ms
        self.prefetch = prefetch or max(1000, 8 * concurrency)
        """Most records received and not yet handled, over all partitions. Handled records
        waiting for their marks to be written do not count (up to 8 x prefetch of them), so
        the write latency of the marks does not throttle fetching."""
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.stats = WorkerStats()
        self.overlap_poll_s = overlap_poll_s
        self.replace_wait_s = replace_wait_s
        self._overlap: Overlap | None = None
        self.metrics = WorkerMetrics(self.stats)
        self.http_port = http_port
        """Serve /metrics and /healthz on this port (settings.http_host); None: no endpoint."""
        self.http: HttpEndpoint | None = None
        self._store = store
        self._marks = marks
        self._own_store: Any = None
        self._ledger: Ledger | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._intake: Intake | None = None
        self._slots: Slots | None = None
        self._sup = Supervisor("worker")
        self._commit_lock = asyncio.Lock()
        self._loops: list[asyncio.Task[Any]] = []
        self._started = False
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, join the group and start handling in the background."""
        if self._started:
            raise RuntimeError("a Worker starts once")
        self._started = True
        if self.http_port is not None:
            self.http = HttpEndpoint(self.metrics.registry, self.health, self.http_port,
                                     self.settings.http_host, token=self.settings.http_token)
            await self.http.start()
        if self.idempotency:
            if self._store is None or self._marks is None:
                from chronowheel.store.cassandra import CassandraStore
                from chronowheel.store.cassandra_marks import CassandraMarks

                self._own_store = await asyncio.to_thread(CassandraStore.open, self.settings)
                self._store = self._store or self._own_store
                self._marks = self._marks or await asyncio.to_thread(
                    CassandraMarks, self._own_store.session, self.settings.keyspace)
            assert self._store is not None
            self._ledger = Ledger(self._store, self.idempotency_scope, self.worker_id,
                                  lease_s=self.lease_s, keep_s=self.keep_s)
            if hasattr(self._store, "swap_run"):  # a JobStore, not a bare claim store
                self._overlap = Overlap(cast(RunStore, self._store), self.idempotency_scope,
                                        self.worker_id, lease_s=self.lease_s,
                                        clock=self.clock, poll_s=self.overlap_poll_s,
                                        replace_wait_s=self.replace_wait_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="chronowheel-handler")
        self._producer = plain_producer(self.settings)
        await self._producer.start()
        consumer = group_consumer(self.settings, self.group_id, session_timeout_ms=
                                  self.session_timeout_ms, max_partition_fetch_bytes=4 << 20)
        self._intake = Intake(
            self._tracker, self._marks if self.idempotency else None,
            scope=self.idempotency_scope, worker_id=self.worker_id, lease_s=self.lease_s,
            keep_s=self.keep_s, poll_s=self._ledger.poll_s if self._ledger else 1.0,
            spawn=self._sup.job, end_offset=consumer.highwater)
        handlers = {t: observed(h, t, self.metrics) for t, h in self.handlers.items()}
        self._slots = Slots(self._intake, handlers, concurrency=self.concurrency,
                            settings=self.settings, clock=self.clock, ledger=self._ledger,
                            producer=self._producer, executor=self._executor, stats=self.stats,
                            fail=self._sup.fail, overlap=self._overlap)
        consumer.subscribe(self.topics, listener=_Rebalance(self))
        self._consumer = consumer  # before start(): an assignment can arrive during it
        await consumer.start()
        self._loops = [self._sup.spawn(self._fetch_loop(), "worker-fetch"),
                       self._sup.spawn(self._commit_loop(), "worker-commit")]
        if self._ledger is not None:
            self._loops.append(self._sup.spawn(self._lease_loop(), "worker-leases"))
        self._slots.start()
        log.info("worker %s started: group %s, topics %s, concurrency %d, idempotency %s",
                 self.worker_id, self.group_id, ", ".join(self.topics), self.concurrency,
                 self.idempotency_scope if self.idempotency else "off")

    def request_stop(self) -> None:
        self._sup.request_stop()

    async def run(self) -> None:
        """Start, run until request_stop() (or a failure), shut down gracefully; raises
        WorkerError for a failure outside a handler."""
        await self._sup.run(self.start, self.shutdown, error=WorkerError)

    async def shutdown(self, deadline_s: float | None = None) -> None:
        """Stop fetching; let running handlers finish until the deadline, cancel the rest
        (left uncommitted, so redelivered); write the marks; commit; release the leases;
        leave the group."""
        if self._closed:
            return
        self._closed = True
        self._sup.begin_shutdown()
        deadline = self.shutdown_deadline_s if deadline_s is None else deadline_s
        for task in self._loops:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        intake, slots = self._intake, self._slots
        if intake is not None and slots is not None:
            # Records not begun stay uncommitted: fetched again by whoever owns them next.
            slots.closed = True
            intake.draining = True
            intake.ready.clear()
            intake.work.set()  # idle slots wake up and end
            await slots.drain(deadline)
            parts = list(intake.parts.values())
            for part in parts:
                if part.acquiring is not None:
                    part.acquiring.cancel()
            with contextlib.suppress(Exception):
                await intake.settle_marks(parts)
            if self._consumer is not None:
                with contextlib.suppress(Exception):
                    await self._commit()
            with contextlib.suppress(Exception):
                await intake.release_leases(parts)
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()  # leaves the group: partitions move at once
            self._consumer = None
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None
        if self._executor is not None:
            # A sync handler cannot be interrupted: its thread is left to finish on its own.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._own_store is not None:
            await asyncio.to_thread(self._own_store.close)
            self._own_store = None
        if self.http is not None:
            await self.http.stop()
            self.http = None
        log.info("worker %s stopped: %s", self.worker_id, self.stats)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def failure(self) -> BaseException | None:
        return self._sup.failure

    def committed_points(self) -> dict[TopicPartition, int]:
        """Offsets committed by this worker so far, per partition it tracks (for tests/ops)."""
        out: dict[TopicPartition, int] = {}
        for tp in self._tracker.partitions():
            offset = self._tracker.last_committed(tp)
            if offset is not None:
                out[tp] = offset
        return out

    def health(self) -> tuple[bool, dict[str, object]]:
        """Ready while running: started, not stopping, nothing failed outside a handler."""
        consumer = self._consumer
        assigned = sorted(f"{tp.topic}:{tp.partition}" for tp in consumer.assignment()) \
            if consumer is not None else []
        failure = self._sup.failure
        ok = self._started and not self._closed and consumer is not None and failure is None
        return ok, {"worker": self.worker_id, "group": self.group_id, "partitions": assigned,
                    "holding": self.holding(),
                    "failure": None if failure is None else repr(failure)}

    async def _update_gauges(self) -> None:
        consumer, metrics = self._consumer, self.metrics
        if consumer is None:
            return
        assigned = consumer.assignment()
        metrics.assigned_partitions.set(len(assigned))
        metrics.holding.set(self.holding())
        for tp in assigned:
            end = consumer.last_stable_offset(tp)
            if end is None or end < 0:
                end = consumer.highwater(tp)
            if end is None:
                continue  # nothing fetched from it yet
            try:  # bounded: a position being reset must not hold up the commit loop
                fetched_to = await within(consumer.position(tp), 0.1)
            except Exception:
                continue  # revoked meanwhile, or its position is not known yet
            # Not yet fetched plus fetched and not yet handled. Measured from the position,
            # not the committed offset: the commit markers of the node's transactions take
            # offsets too, so end - committed never reaches 0 on a transactional topic.
            metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(
                max(0, end - fetched_to) + self._tracker.in_flight(tp))

    def holding(self) -> int:
        """Records received and not yet fully handled (waiting, running or being marked)."""
        return 0 if self._intake is None else self._intake.holding

    # --- loops ----------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        consumer, intake = self._consumer, self._intake
        assert consumer is not None and intake is not None
        while not self._sup.stopping:
            room = min(self.prefetch - intake.unhandled(), 8 * self.prefetch - intake.holding)
            if room <= 0:
                # Wake as soon as handlers free room. The short getmany(timeout 0) on a timeout
                # keeps aiokafka counting this consumer as polling (max_poll_interval).
                intake.room.clear()
                if await wait_event(intake.room, 1.0):
                    continue
                room = 1
                batches = await consumer.getmany(timeout_ms=0, max_records=room)
            else:
                batches = await consumer.getmany(timeout_ms=500, max_records=room)
            if self._sup.stopping:
                return  # records not begun are not committed: fetched again next time
            for tp, records in batches.items():
                intake.receive(tp, records)

    async def _lease_loop(self) -> None:
        assert self._ledger is not None and self._intake is not None
        while True:
            await asyncio.sleep(self._ledger.renew_every_s)
            await self._intake.renew_leases()

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval_s)
            await self._commit()
            await self._update_gauges()

    async def _commit(self, partitions: list[TopicPartition] | None = None) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:
            assigned = consumer.assignment()
            wanted = [tp for tp in (partitions or self._tracker.partitions()) if tp in assigned]
            points = self._tracker.commit_points(wanted)
            if not points:
                return
            try:
                await consumer.commit(points)
            except KafkaError as exc:
                # A rebalance raced us: the new owner redelivers, which the marks make harmless.
                log.warning("offset commit failed (will be redelivered): %r", exc)
                return
            self._tracker.committed(points)
            if self._intake is not None:
                for tp, offset in points.items():
                    part = self._intake.parts.get(tp)
                    if part is not None and part.guard is not None:
                        part.guard.prune(offset)

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        """Let the partitions' running handlers finish (bounded), write their marks, commit,
        release the leases, forget the partitions."""
        intake, slots = self._intake, self._slots
        if intake is None or slots is None:
            return
        gone = set(revoked)
        parts = intake.take(gone)
        await slots.finish_partitions(parts, self.shutdown_deadline_s)
        await intake.settle_marks(parts)
        await self._commit(list(gone))
        await intake.release_leases(parts)
        intake.forget(parts)
        for tp in gone:
            self.metrics.forget_partition(tp.topic, tp.partition)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    # aiokafka logs and swallows a listener's exception; a worker that silently stops
    # committing would be worse than one that stops, so failures here stop it loudly.
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        try:
            await self.worker._revoked(list(revoked))
        except Exception as exc:
            self.worker._sup.fail("revoking partitions", exc)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("worker %s assigned %s", self.worker.worker_id,
                 sorted((tp.topic, tp.partition) for tp in assigned))


def install_signal_handlers(worker: Worker) -> None:
    """First SIGTERM/SIGINT: graceful stop. Second: abort at once."""
    install_stop_signals(worker.request_stop, graceful=(
        f"finishing in-flight handlers (up to {worker.shutdown_deadline_s:.0f}s), committing, "
        f"leaving the group"))
