"""The worker: a consumer group on target topics that runs a handler per fired occurrence.

Per record: parse the occurrence, claim it in the idempotency ledger (or skip it), run the
handler with its lease renewed, then record the outcome. A failure first produces a `retry`
command (or a dead letter) and only then counts as handled, and a record's offset is committed
only once it and every record before it on its partition are handled: a crash at any point
redelivers, never loses.

Infrastructure failures outside a handler (Cassandra, Kafka) stop the worker loudly with
nothing past the failed record committed; a supervisor restarts it and redelivery resumes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from chronowheel.bus.kafka import group_consumer, plain_producer
from chronowheel.core.clock import Clock, SystemClock
from chronowheel.errors import ChronowheelError
from chronowheel.settings import Settings
from chronowheel.worker.ledger import DEFAULT_KEEP_S, DEFAULT_LEASE_S, ClaimStore, Lease, Ledger
from chronowheel.worker.occurrence import MalformedOccurrence, Occurrence
from chronowheel.worker.offsets import OffsetTracker, Ticket
from chronowheel.worker.policy import dead_headers, error_text, gives_up, retry_command

log = logging.getLogger(__name__)

Handler = Callable[[Occurrence], Awaitable[None]] | Callable[[Occurrence], None]
"""`async def handler(occ) -> None`, or a plain function (run in a thread)."""


class WorkerError(ChronowheelError):
    """The worker stopped because of a failure outside a handler."""


@dataclass
class WorkerStats:
    succeeded: int = 0
    """handler calls that returned"""
    failed: int = 0
    """handler calls that raised (each then retried or dead-lettered)"""
    retried: int = 0
    dead: int = 0
    """dead letters published (failed occurrences and malformed records)"""
    skipped: int = 0
    """deliveries the idempotency ledger found already handled"""
    cancelled: int = 0
    """handlings cancelled at shutdown or revocation (left uncommitted: redelivered)"""


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
        store: ClaimStore | None = None,
        worker_id: str | None = None,
    ) -> None:
        if not handlers:
            raise ValueError("handlers: give at least one topic -> handler")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
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
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.stats = WorkerStats()
        self._store = store
        self._own_store: Any = None
        self._ledger: Ledger | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._slots = asyncio.Semaphore(concurrency)
        self._handlings: dict[asyncio.Task[None], Ticket[TopicPartition]] = {}
        self._commit_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._fetching: asyncio.Task[None] | None = None
        self._committing: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._started = False
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, join the group and start handling in the background."""
        if self._started:
            raise RuntimeError("a Worker starts once")
        self._started = True
        if self.idempotency:
            if self._store is None:
                from chronowheel.store.cassandra import CassandraStore

                self._own_store = await asyncio.to_thread(CassandraStore.open, self.settings)
                self._store = self._own_store
            assert self._store is not None
            self._ledger = Ledger(self._store, self.idempotency_scope, self.worker_id,
                                  lease_s=self.lease_s, keep_s=self.keep_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="chronowheel-handler")
        self._producer = plain_producer(self.settings)
        await self._producer.start()
        consumer = group_consumer(self.settings, self.group_id, session_timeout_ms=
                                  self.session_timeout_ms, max_partition_fetch_bytes=4 << 20)
        consumer.subscribe(self.topics, listener=_Rebalance(self))
        self._consumer = consumer  # before start(): an assignment can arrive during it
        await consumer.start()
        self._fetching = self._spawn(self._fetch_loop(), "fetch")
        self._committing = self._spawn(self._commit_loop(), "commit")
        log.info("worker %s started: group %s, topics %s, concurrency %d, idempotency %s",
                 self.worker_id, self.group_id, ", ".join(self.topics), self.concurrency,
                 self.idempotency_scope if self.idempotency else "off")

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Start, run until request_stop() (or a failure), shut down gracefully."""
        await self.start()
        try:
            await self._stop.wait()
        finally:
            await self.shutdown()
        if self._failure is not None:
            raise WorkerError(f"worker stopped: {self._failure!r}") from self._failure

    async def shutdown(self, deadline_s: float | None = None) -> None:
        """Stop fetching; let in-flight handlers finish until the deadline, cancel the rest
        (left uncommitted, so redelivered); commit; leave the group."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        deadline = self.shutdown_deadline_s if deadline_s is None else deadline_s
        for task in (self._fetching, self._committing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._drain(list(self._handlings), deadline)
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._commit()
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
        log.info("worker %s stopped: %s", self.worker_id, self.stats)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def committed_points(self) -> dict[TopicPartition, int]:
        """Offsets committed by this worker so far, per partition it tracks (for tests/ops)."""
        out: dict[TopicPartition, int] = {}
        for tp in self._tracker.partitions():
            offset = self._tracker.last_committed(tp)
            if offset is not None:
                out[tp] = offset
        return out

    # --- supervision ----------------------------------------------------------------------
    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"worker-{name}")
        task.add_done_callback(self._supervise)
        return task

    def _supervise(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        self._fail(task.get_name(), exc or RuntimeError(f"{task.get_name()} ended"))

    def _fail(self, what: str, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        log.critical("%s failed; stopping the worker: %r", what, exc, exc_info=exc)
        self._stop.set()

    # --- fetching and committing ----------------------------------------------------------
    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self._stop.is_set():
            free = self.concurrency - len(self._handlings)
            # Stay in getmany even when full (paused): aiokafka leaves the group after
            # max_poll_interval without a poll.
            if free <= 0:
                consumer.pause(*consumer.assignment())
            elif consumer.paused():
                consumer.resume(*consumer.paused())
            batches = await consumer.getmany(timeout_ms=200, max_records=max(1, free))
            if self._stop.is_set():
                return  # records not begun are not committed: fetched again next time
            for tp, records in batches.items():
                for rec in records:
                    self._dispatch(tp, rec)

    def _dispatch(self, tp: TopicPartition, rec: Any) -> None:
        ticket = self._tracker.begin(tp, rec.offset)
        task: asyncio.Task[None] = asyncio.ensure_future(self._handle(ticket, rec))
        task.set_name(f"handle-{tp.topic}-{tp.partition}-{rec.offset}")
        self._handlings[task] = ticket
        task.add_done_callback(self._handled)

    def _handled(self, task: asyncio.Task[None]) -> None:
        self._handlings.pop(task, None)
        if task.cancelled():
            self.stats.cancelled += 1
        elif task.exception() is not None and not self._closed:
            self._fail(task.get_name(), task.exception())  # type: ignore[arg-type]

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval_s)
            await self._commit()

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
                # A rebalance raced us: the new owner redelivers, which the ledger makes harmless.
                log.warning("offset commit failed (will be redelivered): %r", exc)
                return
            self._tracker.committed(points)

    async def _drain(self, tasks: list[asyncio.Task[None]], deadline_s: float) -> None:
        """Let `tasks` finish for up to `deadline_s`, then cancel what is left."""
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline_s))
        if pending:
            log.warning("cancelling %d handler(s) still running after %.1fs; their records "
                        "are not committed and will be redelivered", len(pending), deadline_s)
            for t in pending:
                t.cancel()
            await asyncio.wait(pending)

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        gone = set(revoked)
        mine = [t for t, ticket in self._handlings.items() if ticket.partition in gone]
        await self._drain(mine, self.shutdown_deadline_s)
        await self._commit(list(gone))
        self._tracker.drop(gone)

    # --- one record -----------------------------------------------------------------------
    async def _handle(self, ticket: Ticket[TopicPartition], rec: Any) -> None:
        async with self._slots:
            await self._process(rec)
        self._tracker.finish(ticket)

    async def _process(self, rec: Any) -> None:
        try:
            occ = Occurrence.from_record(rec.topic, rec.partition, rec.offset, rec.value,
                                         rec.headers)
        except MalformedOccurrence as exc:
            log.warning("%s[%d]@%d: dead-lettered: %s", rec.topic, rec.partition, rec.offset,
                        exc)
            await self._dead_letter(rec.key, rec.value or b"", tuple(rec.headers or ()), exc,
                                    rec.topic, rec.partition, rec.offset)
            return
        lease: Lease | None = None
        if self._ledger is not None:
            lease = await self._ledger.acquire(occ.occurrence, occ.attempt)
            if lease is None:
                self.stats.skipped += 1
                log.debug("%s attempt %d: already handled, skipped", occ.occurrence,
                          occ.attempt)
                return
        handler = self.handlers[occ.topic]
        error = await self._call(handler, occ, lease)
        if error is None:
            self.stats.succeeded += 1
            if lease is not None:
                await lease.done()
            return
        self.stats.failed += 1
        if gives_up(occ, error):
            log.warning("%s attempt %d/%d failed, dead-lettered: %s", occ.occurrence,
                        occ.attempt, occ.max_attempts, error_text(error, 300))
            await self._dead_letter(occ.job_id.encode(), occ.payload, occ.raw_headers, error,
                                    occ.topic, occ.partition, occ.offset)
        else:
            key, value = retry_command(occ, self.clock.now_ms())
            assert self._producer is not None
            await self._producer.send_and_wait(self.settings.submit_topic, value, key=key)
            self.stats.retried += 1
            log.info("%s attempt %d/%d failed, retry submitted: %s", occ.occurrence,
                     occ.attempt, occ.max_attempts, error_text(error, 300))
        if lease is not None:
            await lease.failed()  # only after the retry/dead letter is durable

    async def _call(self, handler: Handler, occ: Occurrence,
                    lease: Lease | None) -> Exception | None:
        """Run the handler, renewing the lease meanwhile; return what it raised."""
        is_async = _is_async(handler)
        if is_async:
            call: asyncio.Future[Any] = asyncio.ensure_future(
                cast(Awaitable[None], handler(occ)))
        else:
            loop = asyncio.get_running_loop()
            call = loop.run_in_executor(self._executor, functools.partial(_run_sync, handler, occ))
        try:
            while True:
                done, _ = await asyncio.wait(
                    {call}, timeout=None if lease is None else self._renew_every(lease))
                if done:
                    break
                assert lease is not None
                try:
                    await lease.renew()
                except Exception as renew_error:  # keep the handler going; the outcome decides
                    log.warning("renewing the lease on %s failed: %r", occ.occurrence,
                                renew_error)
        except asyncio.CancelledError:
            call.cancel()
            if is_async:
                # Bounded: a handler that swallows the cancellation must not hang shutdown.
                stopped, _ = await asyncio.wait({call}, timeout=5)
                if stopped and lease is not None:  # it has stopped: a redelivery may run now
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(lease.release(), 5)
            # Otherwise (a sync handler's thread runs on) the lease expires on its own.
            raise
        if call.cancelled():
            return RuntimeError("handler was cancelled")
        exc = call.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit: not a handler failure
        return exc

    @staticmethod
    def _renew_every(lease: Lease) -> float:
        return lease.ledger.renew_every_s

    async def _dead_letter(self, key: bytes | None, value: bytes,
                           headers: tuple[tuple[str, bytes], ...], error: BaseException,
                           topic: str, partition: int, offset: int) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(
            self.settings.dead_topic, value, key=key,
            headers=dead_headers(headers, error, self.clock.now_ms(), topic, partition, offset))
        self.stats.dead += 1


def _is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None))  # noqa: B004 - an object with an async __call__


def _run_sync(handler: Handler, occ: Occurrence) -> None:
    result = handler(occ)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError("handler returned an awaitable from a plain function; "
                        "declare it `async def` so the worker awaits it")


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    # aiokafka logs and swallows a listener's exception; a worker that silently stops
    # committing would be worse than one that stops, so failures here stop it loudly.
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        try:
            await self.worker._revoked(list(revoked))
        except Exception as exc:
            self.worker._fail("revoking partitions", exc)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("worker %s assigned %s", self.worker.worker_id,
                 sorted((tp.topic, tp.partition) for tp in assigned))


def install_signal_handlers(worker: Worker) -> None:
    """First SIGTERM/SIGINT: graceful stop. Second: abort at once."""
    loop = asyncio.get_running_loop()
    count = 0

    def handler() -> None:
        nonlocal count
        count += 1
        if count == 1:
            log.warning("stop requested: finishing in-flight handlers (up to %.0fs), "
                        "committing, leaving the group", worker.shutdown_deadline_s)
            worker.request_stop()
        else:
            log.error("second stop signal: aborting")
            os._exit(130)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler)
