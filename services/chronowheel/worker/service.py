"""The worker: a consumer group on target topics that runs a handler per fired occurrence.

Records flow: the fetch loop reads batches (read_committed) into per-partition intake; a
partition's records become ready once its idempotency lease is held and the outcomes already
recorded past its starting offset are known (`partitions.py`); `concurrency` handler slots take
ready records in order and run the handler (an `async def` on the loop, a plain function in a
thread, several records per thread hop when many are waiting). Each outcome is queued as a mark;
the marks of a partition are written together, and a record's offset is committed only once it
and every record before it on its partition are handled and marked: a crash at any point
redelivers, never loses, and the redelivery skips what was already handled.

A failure first produces a `retry` command (or a dead letter) and only then counts as handled.
Retries (`cw-attempt` > 1) are checked against the per-occurrence ledger (`ledger.py`), since a
crash between producing a retry and committing can put the same attempt on the topic twice.

Why slots and not a task per record: a record costs a few tens of microseconds of Python; a task
and a loop iteration per record would double it. The fetch loop wakes as soon as a handler frees
room (the first version waited in a paused `getmany` for 200 ms, capping a worker at
`concurrency` records per 200 ms).

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
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
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
from chronowheel.worker.partitions import (
    MARK_DEAD,
    MARK_DONE,
    MARK_FAILED,
    MARK_SKIPPED,
    LeaseLost,
    MarkStore,
    PartitionGuard,
    window_bounds,
)
from chronowheel.worker.policy import dead_headers, error_text, gives_up, retry_command

log = logging.getLogger(__name__)

Handler = Callable[[Occurrence], Awaitable[None]] | Callable[[Occurrence], None]
"""`async def handler(occ) -> None`, or a plain function (run in a thread)."""

YIELD_EVERY = 64
"""Records a slot handles before it lets the loop run other work (fetch, marks, commits)."""
MAX_CHUNK = 64
"""Most records of a plain-function handler run in one thread hop."""


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


@dataclass(eq=False)
class _Part:
    """One assigned partition: its guard (with idempotency) and the records waiting for it."""

    tp: TopicPartition
    guard: PartitionGuard | None
    held: deque[_Item] = field(default_factory=deque)
    """Received, waiting for the lease (with idempotency) before they may start."""
    deferred: dict[str, list[_Item]] = field(default_factory=dict)
    """Copies of an occurrence whose handling is still running: decided when it ends."""
    running: int = 0
    unmarked: int = 0
    """Handled, with the mark queued or being written (their tickets are not finished yet)."""
    acquiring: asyncio.Task[None] | None = None
    flushing: bool = False
    gone: bool = False

    @property
    def ready(self) -> bool:
        return self.guard is None or self.guard.holds()


_Item = tuple[_Part, Any, Ticket[TopicPartition]]


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
        self._async = {t: _is_async(h) for t, h in self.handlers.items()}
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
        self._store = store
        self._marks = marks
        self._own_store: Any = None
        self._ledger: Ledger | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._parts: dict[TopicPartition, _Part] = {}
        self._ready: deque[_Item] = deque()
        self._work = asyncio.Event()
        self._room = asyncio.Event()
        self._holding = 0  # received, not yet finished (handled and marked) or dropped
        self._slots: dict[asyncio.Task[None], _Item | None] = {}
        self._jobs: set[asyncio.Task[None]] = set()
        self._commit_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._draining = False
        self._loops: list[asyncio.Task[None]] = []
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
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="chronowheel-handler")
        self._producer = plain_producer(self.settings)
        await self._producer.start()
        consumer = group_consumer(self.settings, self.group_id, session_timeout_ms=
                                  self.session_timeout_ms, max_partition_fetch_bytes=4 << 20)
        consumer.subscribe(self.topics, listener=_Rebalance(self))
        self._consumer = consumer  # before start(): an assignment can arrive during it
        await consumer.start()
        self._loops = [self._spawn(self._fetch_loop(), "fetch"),
                       self._spawn(self._commit_loop(), "commit")]
        if self._marks is not None:
            self._loops.append(self._spawn(self._lease_loop(), "leases"))
        for i in range(self.concurrency):
            self._start_slot(i)
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
        """Stop fetching; let running handlers finish until the deadline, cancel the rest
        (left uncommitted, so redelivered); write the marks; commit; release the leases;
        leave the group."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        deadline = self.shutdown_deadline_s if deadline_s is None else deadline_s
        for task in self._loops:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # Records not begun stay uncommitted: fetched again by whoever owns them next.
        self._draining = True
        self._ready.clear()
        self._work.set()  # idle slots wake up and end
        await self._drain(list(self._slots), deadline)
        for part in self._parts.values():
            if part.acquiring is not None:
                part.acquiring.cancel()
        with contextlib.suppress(Exception):
            await self._settle_marks(list(self._parts.values()))
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._commit()
        with contextlib.suppress(Exception):
            await self._release_leases(list(self._parts.values()))
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

    def holding(self) -> int:
        """Records received and not yet fully handled (waiting, running or being marked)."""
        return self._holding

    # --- supervision ----------------------------------------------------------------------
    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        """A loop that runs for the worker's life: its end is a failure."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"worker-{name}")
        task.add_done_callback(self._supervise)
        return task

    def _supervise(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        self._fail(task.get_name(), exc or RuntimeError(f"{task.get_name()} ended"))

    def _job(self, coro: Any, name: str) -> asyncio.Task[None]:
        """A piece of work that ends: only an exception is a failure."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"worker-{name}")
        self._jobs.add(task)
        task.add_done_callback(self._job_done)
        return task

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._closed:
            self._fail(task.get_name(), exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        log.critical("%s failed; stopping the worker: %r", what, exc, exc_info=exc)
        self._stop.set()

    # --- fetching -------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self._stop.is_set():
            unmarked = sum(p.unmarked for p in self._parts.values())
            room = min(self.prefetch - (self._holding - unmarked),
                       8 * self.prefetch - self._holding)
            if room <= 0:
                # Wake as soon as handlers free room. The short getmany(timeout 0) on a timeout
                # keeps aiokafka counting this consumer as polling (max_poll_interval).
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), timeout=1.0)
                    continue
                except TimeoutError:
                    room = 1
                batches = await consumer.getmany(timeout_ms=0, max_records=room)
            else:
                batches = await consumer.getmany(timeout_ms=500, max_records=room)
            if self._stop.is_set():
                return  # records not begun are not committed: fetched again next time
            for tp, records in batches.items():
                self._receive(tp, records)

    def _receive(self, tp: TopicPartition, records: list[Any]) -> None:
        part = self._parts.get(tp)
        if part is None:
            guard = None
            if self._marks is not None:
                guard = PartitionGuard(self._marks, self.idempotency_scope, tp.topic,
                                       tp.partition, self.worker_id, lease_s=self.lease_s,
                                       keep_s=self.keep_s)
            part = self._parts[tp] = _Part(tp, guard)
        if part.guard is not None:
            part.guard.touched = True
        items = [(part, rec, self._tracker.begin(tp, rec.offset)) for rec in records]
        self._holding += len(items)
        if part.ready and not part.held:
            self._ready.extend(items)
            self._work.set()
        else:
            part.held.extend(items)
            self._need_lease(part)

    # --- leases ---------------------------------------------------------------------------
    def _need_lease(self, part: _Part) -> None:
        if part.acquiring is None and not part.gone and not self._draining:
            part.acquiring = self._job(self._acquire(part), f"lease-{part.tp.partition}")

    async def _acquire(self, part: _Part) -> None:
        guard = part.guard
        assert guard is not None and self._ledger is not None
        try:
            if guard.owner is not None:  # held, but not renewed in time: try that first
                with contextlib.suppress(LeaseLost):
                    await guard.renew()
            waited_for: str | None = None
            while not guard.holds():
                holder = await guard.acquire()
                if holder is None:
                    break
                if holder != waited_for:
                    log.info("%s[%d]: waiting for the lease held by %s", part.tp.topic,
                             part.tp.partition, holder or "nobody (it is expiring)")
                    waited_for = holder
                await asyncio.sleep(self._ledger.poll_s)
            if part.gone:
                await guard.release()
                return
            guard.forget_window()
            if part.held:
                assert self._consumer is not None
                low, high = window_bounds((rec.offset for _, rec, _ in part.held),
                                          self._consumer.highwater(part.tp))
                found = await guard.load_window(low, high)
                if found:
                    log.info("%s[%d]: %d record(s) from offset %d on were handled before; "
                             "they will be skipped", part.tp.topic, part.tp.partition, found,
                             low)
        finally:
            part.acquiring = None
        if not part.gone and part.held:
            self._ready.extend(part.held)
            part.held.clear()
            self._work.set()

    async def _lease_loop(self) -> None:
        assert self._ledger is not None
        while True:
            await asyncio.sleep(self._ledger.renew_every_s)
            await asyncio.gather(*(self._renew(part) for part in list(self._parts.values())))

    async def _renew(self, part: _Part) -> None:
        guard = part.guard
        if guard is None or guard.owner is None or part.gone:
            return
        idle = (not guard.touched and not part.held and part.running == 0
                and not guard.pending and not part.flushing)
        guard.touched = False
        try:
            if idle:
                # Another group sharing the scope may be waiting for it.
                await guard.release()
            else:
                await guard.renew()
        except LeaseLost as lost:
            log.warning("%s[%d]: lease lost to %s; this worker starts no handler of it until "
                        "it holds the lease again", part.tp.topic, part.tp.partition,
                        lost.holder)
        except Exception as exc:  # Cassandra unreachable: handlers stop when valid_until passes
            log.warning("%s[%d]: renewing the lease failed: %r", part.tp.topic,
                        part.tp.partition, exc)

    async def _release_leases(self, parts: list[_Part]) -> None:
        await asyncio.gather(*(p.guard.release() for p in parts if p.guard is not None),
                             return_exceptions=True)

    # --- handler slots --------------------------------------------------------------------
    def _start_slot(self, i: int) -> None:
        runner = self._slot_sync if not self._all_async() else self._slot_async
        task: asyncio.Task[None] = asyncio.ensure_future(runner())
        task.set_name(f"worker-slot-{i}")
        self._slots[task] = None
        task.add_done_callback(self._slot_done)

    def _slot_done(self, task: asyncio.Task[None]) -> None:
        self._slots.pop(task, None)
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        self._fail(task.get_name(), exc or RuntimeError(f"{task.get_name()} ended"))

    def _all_async(self) -> bool:
        return all(self._async.values())

    async def _next(self) -> _Item | None:
        """The next ready record, waiting for one; None when the worker is stopping."""
        while not self._ready:
            if self._draining:
                return None
            self._work.clear()
            await self._work.wait()
        return None if self._draining else self._ready.popleft()

    async def _slot_async(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        since_yield = 0
        while True:
            item = await self._next()
            if item is None:
                return
            self._slots[me] = item
            item[0].running += 1
            try:
                await self._one(item)
            finally:
                item[0].running -= 1
                self._slots[me] = None
            since_yield += 1
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)

    async def _slot_sync(self) -> None:
        """Plain-function handlers: records whose checks pass run in one thread hop per chunk,
        the rest (async handlers of other topics, retries, copies) one by one."""
        me = asyncio.current_task()
        assert me is not None
        while True:
            item = await self._next()
            if item is None:
                return
            chunk = [item]
            want = min(MAX_CHUNK, len(self._ready) // self.concurrency)
            while want > 0 and self._ready:
                chunk.append(self._ready.popleft())
                want -= 1
            self._slots[me] = item
            for it in chunk:
                it[0].running += 1
            try:
                await self._chunk(chunk)
            finally:
                for it in chunk:
                    it[0].running -= 1
                self._slots[me] = None

    # --- one record -----------------------------------------------------------------------
    def _admit(self, item: _Item) -> Occurrence | None:
        """Checks before a handler may start; None when the record is settled or set aside.

        Raises MalformedOccurrence for a record that is not an occurrence.
        """
        part, rec, ticket = item
        if part.gone:
            return None
        guard = part.guard
        if guard is not None:
            if not guard.holds():
                part.held.appendleft(item)  # a zombie, or a lease not renewed in time
                self._need_lease(part)
                return None
            if rec.offset in guard.done_offsets:
                self._skip(part, rec.offset, f"{rec.topic}:{rec.partition}@{rec.offset}",
                           ticket)
                return None
        occ = Occurrence.from_record(rec.topic, rec.partition, rec.offset, rec.value,
                                     rec.headers)
        if guard is None:
            return occ
        # A copy of a first delivery is recognised here; a retry's attempt is checked in the
        # per-occurrence ledger (the first attempt's mark carries the same occurrence key).
        if occ.attempt == 1 and occ.occurrence in guard.recent:
            self._skip(part, rec.offset, occ.occurrence, ticket)
            return None
        if occ.occurrence in guard.running:
            part.deferred.setdefault(occ.occurrence, []).append(item)
            return None
        guard.running.add(occ.occurrence)
        return occ

    def _skip(self, part: _Part, offset: int, occurrence: str,
              ticket: Ticket[TopicPartition]) -> None:
        self.stats.skipped += 1
        log.debug("%s (offset %d): already handled, skipped", occurrence, offset)
        self._outcome(part, offset, MARK_SKIPPED, occurrence, ticket)

    async def _one(self, item: _Item) -> None:
        try:
            occ = self._admit(item)
        except MalformedOccurrence as exc:
            await self._malformed(item, exc)
            return
        if occ is not None:
            await self._one_admitted(item, occ)

    async def _chunk(self, chunk: list[_Item]) -> None:
        runnable: list[tuple[_Item, Occurrence]] = []
        for item in chunk:
            try:
                occ = self._admit(item)
            except MalformedOccurrence as exc:
                await self._malformed(item, exc)
                continue
            if occ is None:
                continue
            if (occ.attempt > 1 and self._ledger is not None) or self._async[occ.topic]:
                await self._one_admitted(item, occ)
            else:
                runnable.append((item, occ))
        if not runnable:
            return
        loop = asyncio.get_running_loop()
        guards = [item[0].guard for item, _ in runnable]
        call = loop.run_in_executor(self._executor, functools.partial(
            _run_sync_chunk, [self.handlers[o.topic] for _, o in runnable],
            [o for _, o in runnable], guards))
        try:
            results = await asyncio.shield(call)
        except asyncio.CancelledError:
            for item, occ in runnable:
                self._release_running(item[0], occ.occurrence)
            raise
        for (item, occ), result in zip(runnable, results, strict=True):
            part, rec, ticket = item
            if result is _NOT_STARTED:
                self._release_running(part, occ.occurrence)
                part.held.appendleft(item)
                self._need_lease(part)
                continue
            error = cast(BaseException | None, result)
            if error is not None and not isinstance(error, Exception):
                raise error
            state = await self._settle(occ, error, None)
            self._outcome(part, rec.offset, state, occ.occurrence, ticket)
            self._release_running(part, occ.occurrence)

    async def _one_admitted(self, item: _Item, occ: Occurrence) -> None:
        part, rec, ticket = item
        try:
            if occ.attempt > 1 and self._ledger is not None:
                state = await self._handle_retry(occ)
            else:
                error = await self._call(occ, None)
                state = await self._settle(occ, error, None)
        except BaseException:
            self._release_running(part, occ.occurrence)
            raise
        self._outcome(part, rec.offset, state, occ.occurrence, ticket)
        self._release_running(part, occ.occurrence)

    def _release_running(self, part: _Part, occurrence: str) -> None:
        if part.guard is None:
            return
        part.guard.running.discard(occurrence)
        copies = part.deferred.pop(occurrence, None)
        if copies and not part.gone:
            self._ready.extendleft(reversed(copies))
            self._work.set()

    async def _handle_retry(self, occ: Occurrence) -> str:
        """A retry delivery: claimed in the per-occurrence ledger, which knows every attempt
        handled so far wherever it was delivered."""
        assert self._ledger is not None
        lease = await self._ledger.acquire(occ.occurrence, occ.attempt)
        if lease is None:
            self.stats.skipped += 1
            log.debug("%s attempt %d: already handled, skipped", occ.occurrence, occ.attempt)
            return MARK_SKIPPED
        error = await self._call(occ, lease)
        return await self._settle(occ, error, lease)

    async def _settle(self, occ: Occurrence, error: BaseException | None,
                      lease: Lease | None) -> str:
        """Count the outcome; for a failure, produce the retry or dead letter first."""
        if error is None:
            self.stats.succeeded += 1
            if lease is not None:
                await lease.done()
            return MARK_DONE
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
        return MARK_FAILED

    async def _malformed(self, item: _Item, exc: MalformedOccurrence) -> None:
        part, rec, ticket = item
        log.warning("%s[%d]@%d: dead-lettered: %s", rec.topic, rec.partition, rec.offset, exc)
        await self._dead_letter(rec.key, rec.value or b"", tuple(rec.headers or ()), exc,
                                rec.topic, rec.partition, rec.offset)
        self._outcome(part, rec.offset, MARK_DEAD, f"{rec.topic}:{rec.partition}@{rec.offset}",
                      ticket)

    def _outcome(self, part: _Part, offset: int, state: str, occurrence: str,
                 ticket: Ticket[TopicPartition]) -> None:
        if part.guard is None:
            self._finish(ticket)
            return
        part.guard.mark(offset, state, occurrence, ticket)
        part.unmarked += 1
        if not self._room.is_set():
            self._room.set()
        if not part.flushing:
            part.flushing = True
            self._job(self._flush(part), f"marks-{part.tp.partition}")

    async def _flush(self, part: _Part) -> None:
        """Write the partition's queued marks, one row per round; while a write is under way
        the next outcomes queue up and go together in the next one."""
        guard = part.guard
        assert guard is not None
        try:
            while guard.pending:
                marks, tickets = guard.take_pending()
                await guard.write(marks)
                part.unmarked -= len(tickets)
                for ticket in tickets:
                    self._finish(cast(Ticket[TopicPartition], ticket))
        finally:
            part.flushing = False

    async def _settle_marks(self, parts: list[_Part]) -> None:
        """Wait for the marks of `parts` to be written (before a final commit)."""
        for _ in range(100):
            busy = [p for p in parts if p.guard is not None and (p.flushing or p.guard.pending)]
            if not busy:
                return
            for p in busy:
                if not p.flushing and p.guard is not None and p.guard.pending:
                    p.flushing = True
                    self._job(self._flush(p), f"marks-{p.tp.partition}")
            await asyncio.sleep(0.01)

    def _finish(self, ticket: Ticket[TopicPartition]) -> None:
        if self._tracker.finish(ticket):
            self._holding -= 1
            if not self._room.is_set():
                self._room.set()

    async def _call(self, occ: Occurrence, lease: Lease | None) -> Exception | None:
        """Run the topic's handler, renewing a per-occurrence lease meanwhile; return what it
        raised."""
        handler = self.handlers[occ.topic]
        is_async = self._async[occ.topic]
        if is_async and lease is None:
            try:  # the common path: no task, no extra loop iteration
                await cast(Awaitable[None], handler(occ))
            except Exception as failure:
                return failure
            return None
        if is_async:
            call: asyncio.Future[Any] = asyncio.ensure_future(
                cast(Awaitable[None], handler(occ)))
        else:
            loop = asyncio.get_running_loop()
            call = loop.run_in_executor(self._executor, functools.partial(_run_sync, handler, occ))
        try:
            while True:
                done, _ = await asyncio.wait(
                    {call}, timeout=None if lease is None else lease.ledger.renew_every_s)
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
        outcome = call.exception()
        if outcome is not None and not isinstance(outcome, Exception):
            raise outcome  # KeyboardInterrupt, SystemExit: not a handler failure
        return outcome

    async def _dead_letter(self, key: bytes | None, value: bytes,
                           headers: tuple[tuple[str, bytes], ...], error: BaseException,
                           topic: str, partition: int, offset: int) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(
            self.settings.dead_topic, value, key=key,
            headers=dead_headers(headers, error, self.clock.now_ms(), topic, partition, offset))
        self.stats.dead += 1

    # --- committing and revoking ----------------------------------------------------------
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
                # A rebalance raced us: the new owner redelivers, which the marks make harmless.
                log.warning("offset commit failed (will be redelivered): %r", exc)
                return
            self._tracker.committed(points)
            for tp, offset in points.items():
                part = self._parts.get(tp)
                if part is not None and part.guard is not None:
                    part.guard.prune(offset)

    async def _drain(self, tasks: list[asyncio.Task[None]], deadline_s: float) -> None:
        """Let `tasks` finish for up to `deadline_s`, then cancel what is left."""
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline_s))
        if pending:
            running = [t for t in pending if self._slots.get(t) is not None]
            if running:
                log.warning("cancelling %d handler(s) still running after %.1fs; their "
                            "records are not committed and will be redelivered", len(running),
                            deadline_s)
            for t in pending:
                t.cancel()
            await asyncio.wait(pending)
            self.stats.cancelled += len(running)

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        gone = set(revoked)
        parts = [p for tp, p in self._parts.items() if tp in gone]
        for part in parts:
            part.gone = True
            if part.acquiring is not None:
                part.acquiring.cancel()
            part.held.clear()
            part.deferred.clear()
        self._ready = deque(it for it in self._ready if it[0].tp not in gone)
        busy = [t for t, it in self._slots.items() if it is not None and it[0].tp in gone]
        if busy:
            await self._wait_or_cancel_slots(busy, self.shutdown_deadline_s)
        await self._settle_marks(parts)
        await self._commit(list(gone))
        await self._release_leases(parts)
        for part in parts:
            # Tickets never finished (waiting, cancelled, unmarked) leave with the partition.
            self._holding -= self._tracker.in_flight(part.tp)
            self._parts.pop(part.tp, None)
        self._tracker.drop(gone)
        self._room.set()

    async def _wait_or_cancel_slots(self, slots: list[asyncio.Task[None]],
                                    deadline_s: float) -> None:
        """Wait until these slots are done with the record they hold; past the deadline,
        cancel them (their records stay uncommitted) and start fresh slots instead."""
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, deadline_s)
        watched = {t: self._slots.get(t) for t in slots}
        while loop.time() < end:
            if all(self._slots.get(t) is not watched[t] for t in slots):
                return
            await asyncio.sleep(0.02)
        stuck = [t for t in slots if t in self._slots and self._slots.get(t) is watched[t]]
        if not stuck:
            return
        log.warning("cancelling %d handler(s) of revoked partitions still running after "
                    "%.1fs; their records are not committed and will be redelivered",
                    len(stuck), deadline_s)
        for t in stuck:
            self._slots.pop(t, None)  # not a failure: replaced below
            t.remove_done_callback(self._slot_done)
            t.cancel()
        await asyncio.wait(stuck)
        self.stats.cancelled += len(stuck)
        for i in range(len(stuck)):
            self._start_slot(len(self._slots) + i)


_NOT_STARTED = object()


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


def _run_sync_chunk(handlers: list[Handler], occs: list[Occurrence],
                    guards: list[PartitionGuard | None]) -> list[object]:
    """In a handler thread: each record's outcome (None or the exception), or _NOT_STARTED for
    records whose partition lease stopped being valid before their turn (a pause, say)."""
    out: list[object] = []
    for handler, occ, guard in zip(handlers, occs, guards, strict=True):
        if guard is not None and not guard.holds():
            out.append(_NOT_STARTED)
            continue
        try:
            _run_sync(handler, occ)
            out.append(None)
        except BaseException as exc:  # handed back to the loop, which decides
            out.append(exc)
    return out
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
