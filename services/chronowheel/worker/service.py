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
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from chronowheel.bus.ports import (
    BusError,
    TopicPartition,
    WorkerBus,
    WorkerConsumer,
    WorkerProducer,
)
from chronowheel.core.clock import Clock, SystemClock
from chronowheel.errors import ChronowheelError
from chronowheel.history import RunRecorder, recorder_for
from chronowheel.observe.http import HttpEndpoint
from chronowheel.settings import Settings
from chronowheel.store.base import WorkerStores
from chronowheel.supervise import Supervisor, install_stop_signals
from chronowheel.timeouts import within
from chronowheel.worker.autopause import AutoPause
from chronowheel.worker.handling import Handler, Slots, WorkerStats
from chronowheel.worker.intake import Intake
from chronowheel.worker.ledger import Ledger
from chronowheel.worker.metrics import WorkerMetrics, observed
from chronowheel.worker.offsets import OffsetTracker
from chronowheel.worker.options import WorkerSettings, default_group_id
from chronowheel.worker.overlap import Overlap
from chronowheel.worker.timing import RealTimer, Timer

log = logging.getLogger(__name__)

HISTORY_FLUSH_S = 5.0
"""At shutdown, how long the worker writes the run history still queued, at most."""

__all__ = ["Handler", "Worker", "WorkerError", "WorkerSettings", "WorkerStats",
           "default_group_id", "install_signal_handlers"]


class WorkerError(ChronowheelError):
    """The worker stopped because of a failure outside a handler."""


class Worker:
    """Runs `handlers` (topic -> handler) for the occurrences fired to their topics.

    `options` (a `WorkerSettings`) says how; its fields may also be given as keywords
    (`Worker(settings, handlers=h, concurrency=32)`), which override those of `options`.
    Without `bus` the worker uses Kafka (`settings.kafka`); without `stores` and with
    idempotency it opens Cassandra (`settings.cassandra`). `timer` measures durations (leases,
    polls, deadlines), the real monotonic time unless a test injects its clock's.
    """

    def __init__(self, settings: Settings, *, handlers: Mapping[str, Handler],
                 options: WorkerSettings | None = None, clock: Clock | None = None,
                 bus: WorkerBus | None = None, stores: WorkerStores | None = None,
                 timer: Timer | None = None, **overrides: Any) -> None:
        if not handlers:
            raise ValueError("handlers: give at least one topic -> handler")
        self.settings = settings
        self.handlers = dict(handlers)
        self.topics = sorted(self.handlers)
        self.options = replace(options or WorkerSettings(), **overrides).resolved(
            settings.namespace, self.topics)
        self.clock = clock or SystemClock()
        self.timer = timer or RealTimer()
        self.stats = WorkerStats()
        self.metrics = WorkerMetrics(self.stats)
        self.http: HttpEndpoint | None = None
        self._bus = bus
        self._stores = stores
        self._own_stores: Any = None
        self._ledger: Ledger | None = None
        self._overlap: Overlap | None = None
        self.history: RunRecorder | None = None
        self._history_task: asyncio.Task[None] | None = None
        """The run history writer (None: runs are not recorded; see docs/worker.md)."""
        self._consumer: WorkerConsumer | None = None
        self._producer: WorkerProducer | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._intake: Intake | None = None
        self._slots: Slots | None = None
        self._sup = Supervisor("worker")
        self._commit_lock = asyncio.Lock()
        self._loops: list[asyncio.Task[Any]] = []
        self._started = False
        self._closed = False

    # --- what it was told, resolved -------------------------------------------------------
    @property
    def group_id(self) -> str:
        assert self.options.group_id is not None
        return self.options.group_id

    @property
    def idempotency_scope(self) -> str:
        assert self.options.idempotency_scope is not None
        return self.options.idempotency_scope

    @property
    def worker_id(self) -> str:
        assert self.options.worker_id is not None
        return self.options.worker_id

    @property
    def prefetch(self) -> int:
        assert self.options.prefetch is not None
        return self.options.prefetch

    @property
    def shutdown_deadline_s(self) -> float:
        return self.options.shutdown_deadline_s

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, join the group and start handling in the background."""
        if self._started:
            raise RuntimeError("a Worker starts once")
        self._started = True
        o = self.options
        if o.http_port is not None:
            self.http = HttpEndpoint(self.metrics.registry, self.health, o.http_port,
                                     self.settings.http_host, token=self.settings.http_token)
            await self.http.start()
        if o.idempotency:
            stores = self._stores
            if stores is None:
                from chronowheel.store.cassandra_marks import CassandraWorkerStores

                self._own_stores = await asyncio.to_thread(CassandraWorkerStores, self.settings)
                stores = self._own_stores.stores
            assert stores is not None
            self._ledger = Ledger(stores.claims, self.idempotency_scope, self.worker_id,
                                  lease_s=o.lease_s, keep_s=o.keep_s, sleep=self.timer.sleep)
            if stores.runs is not None:
                self._overlap = Overlap(stores.runs, self.idempotency_scope, self.worker_id,
                                        lease_s=o.lease_s, clock=self.clock,
                                        poll_s=o.overlap_poll_s,
                                        replace_wait_s=o.replace_wait_s)
            if stores.history is not None and self.settings.run_history:
                self.history = recorder_for(stores.history, self.settings,
                                            self.metrics.registry)
        if self._bus is None:
            from chronowheel.bus.kafka_worker import KafkaWorkerBus

            self._bus = KafkaWorkerBus(self.settings)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=o.concurrency, thread_name_prefix="chronowheel-handler")
        self._producer = self._bus.producer()
        await self._producer.start()
        consumer = self._bus.consumer(group_id=self.group_id, topics=self.topics,
                                      session_timeout_ms=o.session_timeout_ms,
                                      on_assigned=self.partitions_assigned,
                                      on_revoked=self.partitions_revoked)
        self._intake = Intake(
            self._tracker, stores.marks if o.idempotency and stores is not None else None,
            scope=self.idempotency_scope, worker_id=self.worker_id, lease_s=o.lease_s,
            keep_s=o.keep_s, poll_s=self._ledger.poll_s if self._ledger else 1.0,
            spawn=self._sup.job, end_offset=consumer.end_offset, timer=self.timer,
            marks_wait_s=self.settings.marks_wait_ms / 1000, hurry_marks=o.concurrency)
        self.metrics.count_marks(self._intake)
        handlers = {t: observed(h, t, self.metrics) for t, h in self.handlers.items()}
        autopause = None
        if self.history is not None:
            autopause = AutoPause(recorder=self.history, producer=self._producer,
                                  submit_topic=self.settings.submit_topic, clock=self.clock,
                                  worker_id=self.worker_id)
        self._slots = Slots(self._intake, handlers, concurrency=o.concurrency,
                            settings=self.settings, clock=self.clock, timer=self.timer,
                            ledger=self._ledger, producer=self._producer,
                            executor=self._executor, stats=self.stats, fail=self._sup.fail,
                            overlap=self._overlap, history=self.history,
                            worker_id=self.worker_id, autopause=autopause)
        self._consumer = consumer  # before start(): an assignment can arrive during it
        await consumer.start()
        self._loops = [self._sup.spawn(self._fetch_loop(), "worker-fetch"),
                       self._sup.spawn(self._commit_loop(), "worker-commit")]
        if self._ledger is not None:
            self._loops.append(self._sup.spawn(self._lease_loop(), "worker-leases"))
        if self.history is not None:
            # Not among `_loops`: it writes what the last handlings recorded at the stop.
            self._history_task = self._sup.spawn(self.history.run(), "worker-history")
        self._slots.start()
        log.info("worker %s started: group %s, topics %s, concurrency %d, idempotency %s",
                 self.worker_id, self.group_id, ", ".join(self.topics), o.concurrency,
                 self.idempotency_scope if o.idempotency else "off")

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
        deadline = self.options.shutdown_deadline_s if deadline_s is None else deadline_s
        for task in self._loops:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        intake, slots = self._intake, self._slots
        if intake is not None and slots is not None:
            slots.close()
            intake.stop()
            await slots.drain(deadline)
            parts = intake.stop_acquiring()
            with contextlib.suppress(Exception):
                await intake.settle_marks(parts)
            if self._consumer is not None:
                with contextlib.suppress(Exception):
                    await self._commit()
            with contextlib.suppress(Exception):
                await intake.release_leases(parts)
        if self.history is not None and self._history_task is not None:
            # What the last handlings recorded, within a bound: history never holds a stop.
            # By the writer task, which keeps its batch in hand (cancelling it lost that).
            with contextlib.suppress(Exception):
                await within(self.history.drain(), HISTORY_FLUSH_S)
            self._history_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._history_task
            self._history_task = None
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
        if self._own_stores is not None:
            await asyncio.to_thread(self._own_stores.close)
            self._own_stores = None
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

    def assignment(self) -> set[TopicPartition]:
        """Partitions the group assigned to this worker now."""
        return set() if self._consumer is None else self._consumer.assignment()

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
            unfetched = await consumer.unfetched(tp)
            if unfetched is None:
                continue
            # Not yet fetched plus fetched and not yet handled. Measured from the position,
            # not the committed offset: the commit markers of the node's transactions take
            # offsets too, so end - committed never reaches 0 on a transactional topic.
            metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(
                unfetched + self._tracker.in_flight(tp))

    def holding(self) -> int:
        """Records received and not yet fully handled (waiting, running or being marked)."""
        return 0 if self._intake is None else self._intake.holding

    # --- loops ----------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        consumer, intake = self._consumer, self._intake
        assert consumer is not None and intake is not None
        prefetch = self.prefetch
        while not self._sup.stopping:
            room = min(prefetch - intake.unhandled(), 8 * prefetch - intake.holding)
            if room <= 0:
                # Wake as soon as handlers free room. The short fetch (timeout 0) on a timeout
                # keeps the consumer counted as polling (Kafka's max_poll_interval).
                intake.room.clear()
                if await self.timer.wait_event(intake.room, 1.0):
                    continue
                room = 1
                batches = await consumer.fetch(timeout_ms=0, max_records=room)
            else:
                batches = await consumer.fetch(timeout_ms=500, max_records=room)
            if self._sup.stopping:
                return  # records not begun are not committed: fetched again next time
            for tp, records in batches.items():
                intake.receive(tp, records)

    async def _lease_loop(self) -> None:
        assert self._ledger is not None and self._intake is not None
        while True:
            await self.timer.sleep(self._ledger.renew_every_s)
            await self._intake.renew_leases()

    async def _commit_loop(self) -> None:
        while True:
            await self.timer.sleep(self.options.commit_interval_s)
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
            except BusError as exc:
                # A rebalance raced us: the new owner redelivers, which the marks make harmless.
                log.warning("offset commit failed (will be redelivered): %r", exc)
                return
            self._tracker.committed(points)
            if self._intake is not None:
                self._intake.committed(points)

    # --- the group's rebalances (the bus calls these) -----------------------------------------
    async def partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("worker %s assigned %s", self.worker_id,
                 sorted((tp.topic, tp.partition) for tp in assigned))

    async def partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Let the partitions' running handlers finish (bounded), write their marks, commit,
        release the leases, forget the partitions; then log it, as an assignment is logged. A
        failure here stops the worker loudly (a worker that silently stopped committing would
        be worse)."""
        try:
            await self._revoke(revoked)
        except Exception as exc:
            self._sup.fail("revoking partitions", exc)
            return
        if revoked:
            log.info("worker %s revoked %s", self.worker_id,
                     sorted((tp.topic, tp.partition) for tp in revoked))

    async def _revoke(self, revoked: list[TopicPartition]) -> None:
        intake, slots = self._intake, self._slots
        if intake is None or slots is None:
            return
        gone = set(revoked)
        parts = intake.take(gone)
        await slots.finish_partitions(parts, self.options.shutdown_deadline_s)
        await intake.settle_marks(parts)
        await self._commit(list(gone))
        await intake.release_leases(parts)
        intake.forget(parts)
        for tp in gone:
            self.metrics.forget_partition(tp.topic, tp.partition)


def install_signal_handlers(worker: Worker) -> None:
    """First SIGTERM/SIGINT: graceful stop. Second: abort at once."""
    install_stop_signals(worker.request_stop, graceful=(
        f"finishing in-flight handlers (up to {worker.shutdown_deadline_s:.0f}s), committing, "
        f"leaving the group"))
