"""The handler slots: take ready records in order, decide (skip, wait for a running copy, run),
run the handler, produce the retry or dead letter of a failure, and leave the outcome.

Why slots and not a task per record: a record costs a few tens of microseconds of Python; a
task and an extra loop iteration per record would double it. An `async def` handler is awaited
in the slot itself; plain functions run in a thread pool, several waiting records per thread
hop when many are waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from chronowheel.bus.ports import RecordRefused, WorkerProducer
from chronowheel.core import runs, wire
from chronowheel.core.clock import Clock
from chronowheel.history import ROW_BYTES, RunRecorder
from chronowheel.settings import Settings
from chronowheel.timeouts import within
from chronowheel.worker.autopause import AutoPause
from chronowheel.worker.intake import Intake, Item, Part
from chronowheel.worker.ledger import Lease, Ledger
from chronowheel.worker.occurrence import MalformedOccurrence, Occurrence
from chronowheel.worker.overlap import Overlap, Run, Skip
from chronowheel.worker.partitions import (
    MARK_DEAD,
    MARK_DONE,
    MARK_FAILED,
    MARK_SKIPPED,
    PartitionGuard,
)
from chronowheel.worker.policy import (
    dead_headers,
    error_text,
    gives_up,
    minimal_dead_letter,
    refusal_reason,
    retry_command,
)
from chronowheel.worker.timing import Timer

log = logging.getLogger(__name__)

Handler = Callable[[Occurrence], Awaitable[None]] | Callable[[Occurrence], None]
"""`async def handler(occ) -> None`, or a plain function (run in a thread)."""

YIELD_EVERY = 64
"""Records a slot handles before it lets the loop run other work (fetch, marks, commits)."""
MAX_CHUNK = 64
"""Most records of a plain-function handler run in one thread hop."""


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
    """deliveries found already handled"""
    cancelled: int = 0
    """handlings cancelled at shutdown or revocation (left uncommitted: redelivered)"""
    overlap_skipped: int = 0
    """occurrences not run because another of the same job was running (concurrency=forbid)"""
    replaced: int = 0
    """handlings asked to stop for a newer occurrence of the job (concurrency=replace)"""
    quarantined: int = 0
    """records whose retry or dead letter the broker refused (too large, invalid): each then
    dead-lettered without its payload, or, refused too, only logged (`unlettered`)"""
    unlettered: int = 0
    """of those, the ones whose payload-less dead letter was refused as well: logged at ERROR
    with where the record is, and committed"""


class Slots:
    def __init__(self, intake: Intake, handlers: Mapping[str, Handler], *, concurrency: int,
                 settings: Settings, clock: Clock, timer: Timer, ledger: Ledger | None,
                 producer: WorkerProducer, executor: concurrent.futures.Executor,
                 stats: WorkerStats, fail: Callable[[str, BaseException], None],
                 overlap: Overlap | None = None, history: RunRecorder | None = None,
                 worker_id: str = "", autopause: AutoPause | None = None) -> None:
        self.intake = intake
        self.handlers = dict(handlers)
        self.is_async = {t: is_async_handler(h) for t, h in self.handlers.items()}
        self.concurrency = concurrency
        self.settings = settings
        self.clock = clock
        self.timer = timer
        self.ledger = ledger
        self.producer = producer
        self.executor = executor
        self.stats = stats
        self._fail = fail
        self.overlap = overlap
        self.history = history
        """Where each handler's run is recorded (None: nowhere); see `_ran`."""
        self.worker_id = worker_id
        self.autopause = autopause
        """Records the final runs of jobs with `pause_after_failures` and pauses them after
        that many failed in a row (None: they are not auto-paused; logged once)."""
        self._no_autopause_logged = False
        self._to_run = functools.partial(_run_record, worker_id)
        self.closed = False
        self.current: dict[asyncio.Task[None], list[Item]] = {}
        """Each slot and the records it works on (none between records)."""

    # --- the slots ----------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self.concurrency):
            self._start_one(i)

    def _start_one(self, i: int) -> None:
        runner = self._run_async if all(self.is_async.values()) else self._run_sync
        task: asyncio.Task[None] = asyncio.ensure_future(runner())
        task.set_name(f"worker-slot-{i}")
        self.current[task] = []
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.current.pop(task, None)
        if task.cancelled() or self.closed:
            return
        exc = task.exception()
        self._fail(task.get_name(), exc or RuntimeError(f"{task.get_name()} ended"))

    async def _run_async(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        since_yield = 0
        while True:
            item = await self.intake.next()
            if item is None:
                return
            self.current[me] = [item]
            item.part.running += 1
            try:
                await self._one(item)
            finally:
                item.part.running -= 1
                self.current[me] = []
            since_yield += 1
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)

    async def _run_sync(self) -> None:
        """Plain-function handlers: records whose checks pass run in one thread hop per chunk,
        the rest (async handlers of other topics, retries) one by one."""
        me = asyncio.current_task()
        assert me is not None
        ready = self.intake
        while True:
            item = await ready.next()
            if item is None:
                return
            chunk = [item, *ready.take_more(self.concurrency, MAX_CHUNK)]
            self.current[me] = chunk
            for it in chunk:
                it.part.running += 1
            try:
                await self._chunk(chunk)
            finally:
                for it in chunk:
                    it.part.running -= 1
                self.current[me] = []

    def close(self) -> None:
        """Shutdown: a slot ending from now on is no failure."""
        self.closed = True

    async def drain(self, deadline_s: float) -> None:
        """Shutdown: let the slots finish their records for up to `deadline_s`, then cancel."""
        tasks = list(self.current)
        if not tasks:
            return
        _, pending = await self.timer.wait(tasks, deadline_s)
        if pending:
            running = [t for t in pending if self.current.get(t)]
            if running:
                log.warning("cancelling %d handler(s) still running after %.1fs; their "
                            "records are not committed and will be redelivered", len(running),
                            deadline_s)
            for t in pending:
                t.cancel()
            await asyncio.wait(pending)
            self.stats.cancelled += len(running)

    async def finish_partitions(self, parts: list[Part], deadline_s: float) -> None:
        """Revoke: wait until no slot works on a record of `parts`; past the deadline cancel
        those slots (their records stay uncommitted) and start fresh ones instead."""
        gone = {id(p) for p in parts}
        busy = {t: items for t, items in self.current.items()
                if any(id(it.part) in gone for it in items)}
        if not busy:
            return
        timer = self.timer
        end = timer.monotonic() + max(0.0, deadline_s)
        while timer.monotonic() < end:
            if all(self.current.get(t) is not items for t, items in busy.items()):
                return
            await timer.sleep(0.02)
        stuck = [t for t, items in busy.items() if self.current.get(t) is items]
        if not stuck:
            return
        log.warning("cancelling %d handler(s) of revoked partitions still running after "
                    "%.1fs; their records are not committed and will be redelivered",
                    len(stuck), deadline_s)
        for t in stuck:
            self.current.pop(t, None)  # not a failure: replaced below
            t.remove_done_callback(self._ended)
            t.cancel()
        await asyncio.wait(stuck)
        self.stats.cancelled += len(stuck)
        for i in range(len(stuck)):
            self._start_one(len(self.current) + i)

    # --- one record ---------------------------------------------------------------------------
    def _admit(self, item: Item) -> Occurrence | None:
        """Checks before a handler may start; None when the record is settled or set aside.

        Raises MalformedOccurrence for a record that is not an occurrence.
        """
        part, rec, ticket = item
        if part.gone:
            return None
        guard = part.guard
        if guard is not None:
            if not guard.holds():
                self.intake.hold_again(item)  # a zombie, or a lease not renewed in time
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
            self.intake.defer(item, occ.occurrence)
            return None
        guard.running.add(occ.occurrence)
        return occ

    def _skip(self, part: Part, offset: int, occurrence: str, ticket: Any) -> None:
        self.stats.skipped += 1
        log.debug("%s (offset %d): already handled, skipped", occurrence, offset)
        self.intake.outcome(part, offset, MARK_SKIPPED, occurrence, ticket)

    async def _one(self, item: Item) -> None:
        try:
            occ = self._admit(item)
        except MalformedOccurrence as exc:
            await self._malformed(item, exc)
            return
        if occ is not None:
            await self._admitted(item, occ)

    async def _admitted(self, item: Item, occ: Occurrence) -> None:
        part, rec, ticket = item
        started = None if self.history is None else self.clock.now_ms()
        try:
            if occ.attempt > 1 and self.ledger is not None:
                state = await self._retry_delivery(occ, started)
            elif self._governed(occ):
                state = await self._with_overlap_policy(occ, started)
            else:
                state = await self._settle(occ, await self._call(occ, None), None, started)
        finally:
            self.intake.release_running(part, occ.occurrence)
        self.intake.outcome(part, rec.offset, state, occ.occurrence, ticket)

    async def _chunk(self, chunk: list[Item]) -> None:
        runnable: list[tuple[Item, Occurrence]] = []
        for item in chunk:
            try:
                occ = self._admit(item)
            except MalformedOccurrence as exc:
                await self._malformed(item, exc)
                continue
            if occ is None:
                continue
            if (occ.attempt > 1 and self.ledger is not None) or self.is_async[occ.topic] \
                    or self._governed(occ):
                await self._admitted(item, occ)
            else:
                runnable.append((item, occ))
        if not runnable:
            return
        loop = asyncio.get_running_loop()
        # Each record's handler start, read in the thread (only when runs are recorded).
        starts: list[int] | None = None if self.history is None else []
        call = loop.run_in_executor(self.executor, functools.partial(
            _run_sync_chunk, [self.handlers[o.topic] for _, o in runnable],
            [o for _, o in runnable], [item.part.guard for item, _ in runnable],
            starts, self.clock.now_ms))
        try:
            results = await asyncio.shield(call)
        except asyncio.CancelledError:
            for item, occ in runnable:
                self.intake.release_running(item.part, occ.occurrence)
            raise
        for i, ((item, occ), result) in enumerate(zip(runnable, results, strict=True)):
            part, rec, ticket = item
            if result is _NOT_STARTED:
                self.intake.release_running(part, occ.occurrence)
                self.intake.hold_again(item)
                continue
            error = cast(BaseException | None, result)
            try:
                if error is not None and not isinstance(error, Exception):
                    raise error  # KeyboardInterrupt, SystemExit: not a handler failure
                state = await self._settle(occ, error, None,
                                           None if starts is None else starts[i])
            finally:
                self.intake.release_running(part, occ.occurrence)
            self.intake.outcome(part, rec.offset, state, occ.occurrence, ticket)

    def _governed(self, occ: Occurrence) -> bool:
        """Whether the job's overlap policy applies (docs/worker.md, "Overlap policy"): to a
        first delivery only (a retry goes through the per-occurrence ledger; it carries the
        policy only so that its own retries and dead letter keep it)."""
        if occ.concurrency == wire.CONCURRENCY_ALLOW or occ.attempt > 1:
            return False
        if self.overlap is None:
            log.warning("%s: concurrency=%s is not enforced: the worker has no store (it "
                        "runs with idempotency off)", occ.occurrence, occ.concurrency)
            return False
        return True

    async def _with_overlap_policy(self, occ: Occurrence, started: int | None) -> str:
        assert self.overlap is not None
        run = await self.overlap.begin(occ)
        if isinstance(run, Skip):
            self.stats.overlap_skipped += 1
            log.info("%s: skipped: %s", occ.occurrence, run.reason)
            self._ran(occ, runs.SKIPPED, None, None)
            return MARK_SKIPPED
        try:
            error = await self._call(occ, None, run)
            if run.stop_requested:
                # Replaced: whatever the handler made of the request, it is not retried.
                self.stats.replaced += 1
                log.info("%s: skipped: concurrency=replace: a newer occurrence replaced it",
                         occ.occurrence)
                self._ran(occ, runs.CANCELLED, started, None)
                return MARK_SKIPPED
            return await self._settle(occ, error, None, started)
        finally:
            await run.release()

    async def _retry_delivery(self, occ: Occurrence, started: int | None) -> str:
        """A retry: claimed in the per-occurrence ledger, which knows every attempt handled so
        far wherever it was delivered."""
        assert self.ledger is not None
        lease = await self.ledger.acquire(occ.occurrence, occ.attempt)
        if lease is None:
            self.stats.skipped += 1
            log.debug("%s attempt %d: already handled, skipped", occ.occurrence, occ.attempt)
            return MARK_SKIPPED
        return await self._settle(occ, await self._call(occ, lease), lease, started)

    def _ran(self, occ: Occurrence, outcome: str, started: int | None,
             error: BaseException | None) -> None:
        """Record the run's outcome in the run history (a queue append: never waits)."""
        history = self.history
        if history is None:
            return
        # A plain tuple: the record is built by the history writer, off this path. The error
        # goes as its text (a failure's path only), never the exception: its traceback holds
        # the handler's frames and through them the occurrence and its payload.
        text = None if error is None else error_text(error, 300)
        history.add_item((occ.job_id, occ.scheduled_ms, occ.attempt, occ.occurrence, outcome,
                          started, self.clock.now_ms(), text), self._to_run,
                         # Its size for the queue's byte bound (the key holds the job id).
                         ROW_BYTES + 2 * len(occ.occurrence) + (len(text) if text else 0))

    async def _settle(self, occ: Occurrence, error: BaseException | None,
                      lease: Lease | None, started: int | None = None) -> str:
        """Count the outcome; for a failure, produce the retry or dead letter first."""
        if error is None:
            self.stats.succeeded += 1
            if lease is not None:
                await lease.done()
            if occ.pause_after_failures is None:
                self._ran(occ, runs.SUCCEEDED, started, None)
            else:
                await self._ran_final(occ, runs.SUCCEEDED, started, None)
            return MARK_DONE
        self.stats.failed += 1
        outcome = runs.DEAD_LETTERED
        if gives_up(occ, error):
            log.warning("%s attempt %d/%d failed, dead-lettered: %s", occ.occurrence,
                        occ.attempt, occ.max_attempts, error_text(error, 300))
            if not await self.dead_letter(occ.job_id.encode(), occ.payload, occ.raw_headers,
                                          error, occ.topic, occ.partition, occ.offset):
                outcome = runs.FAILED
        else:
            key, value = retry_command(occ, self.clock.now_ms())
            try:
                await self.producer.send(self.settings.submit_topic, key, value)
            except RecordRefused as refused:
                # The retry can never be scheduled: the occurrence is dead-lettered now, with
                # the handler's error and why its retry could not be.
                log.error("%s attempt %d/%d failed and its retry was refused by the broker "
                          "(%s: %s); dead-lettered instead", occ.occurrence, occ.attempt,
                          occ.max_attempts, refused.kind, refused.reason)
                if not await self.dead_letter(
                        occ.job_id.encode(), occ.payload, occ.raw_headers, error, occ.topic,
                        occ.partition, occ.offset,
                        reason=refusal_reason("retry refused", refused.kind, refused.reason)):
                    outcome = runs.FAILED
            else:
                outcome = runs.RETRIED
                self.stats.retried += 1
                log.info("%s attempt %d/%d failed, retry submitted: %s", occ.occurrence,
                         occ.attempt, occ.max_attempts, error_text(error, 300))
        if lease is not None:
            await lease.failed()  # only after the retry/dead letter is durable
        # FAILED: neither a retry nor a dead letter of this occurrence could be produced (the
        # failure is only logged). Told by this occurrence's own sends, never by the shared
        # stats, which other slots change meanwhile.
        if occ.pause_after_failures is None or outcome == runs.RETRIED:
            self._ran(occ, outcome, started, error)
        else:
            await self._ran_final(occ, outcome, started, error)
        return MARK_FAILED

    async def _ran_final(self, occ: Occurrence, outcome: str, started: int | None,
                         error: BaseException | None) -> None:
        """The final outcome of a run of a job with `pause_after_failures`: recorded by the
        auto-pause (awaited, before the record's outcome is marked), which pauses the job
        after that many failed runs in a row (`worker/autopause.py`)."""
        if self.autopause is None:
            if not self._no_autopause_logged:
                self._no_autopause_logged = True
                log.warning("job %s has pause_after_failures %d, but this worker records no "
                            "run history (run_history off, idempotency off, or a namespace "
                            "without the history tables): it auto-pauses no job",
                            occ.job_id, occ.pause_after_failures)
            self._ran(occ, outcome, started, error)
            return
        await self.autopause.ran(occ, runs.RunRecord(
            occ.job_id, occ.scheduled_ms, occ.attempt, occ.occurrence, started_ms=started,
            ended_ms=self.clock.now_ms(), outcome=outcome, worker_id=self.worker_id,
            error=None if error is None else error_text(error, 300)))

    async def _malformed(self, item: Item, exc: MalformedOccurrence) -> None:
        part, rec, ticket = item
        log.warning("%s[%d]@%d: dead-lettered: %s", rec.topic, rec.partition, rec.offset, exc)
        await self.dead_letter(rec.key, rec.value or b"", tuple(rec.headers or ()), exc,
                               rec.topic, rec.partition, rec.offset)
        self.intake.outcome(part, rec.offset, MARK_DEAD,
                            f"{rec.topic}:{rec.partition}@{rec.offset}", ticket)

    async def dead_letter(self, key: bytes | None, value: bytes,
                          headers: tuple[tuple[str, bytes], ...], error: BaseException,
                          topic: str, partition: int, offset: int, *,
                          reason: bytes | None = None) -> bool:
        """Publish the record to `<ns>.dead` with why, when and where it failed (`reason`:
        a `cw-reason` to add). A refusal by the broker of this one record never stops the
        worker: the record is quarantined (`_quarantine`). Anything else raises. Returns
        whether a dead letter (in full or without its payload) was published: False when
        the record was only logged."""
        letter = dead_headers(headers, error, self.clock.now_ms(), topic, partition, offset)
        if reason is not None:
            letter.append((wire.REASON, reason))
        try:
            await self.producer.send(self.settings.dead_topic, key, value, letter)
        except RecordRefused as refused:
            return await self._quarantine(key, value, letter, refused, topic, partition,
                                          offset)
        self.stats.dead += 1
        return True

    async def _quarantine(self, key: bytes | None, value: bytes,
                          letter: list[tuple[str, bytes]], refused: RecordRefused,
                          topic: str, partition: int, offset: int) -> bool:
        """The broker refused the dead letter itself: send one without the payload and the
        job's headers, saying why; if that is refused too, say it loudly in the log. Either
        way the record counts as handled (its offset is committed: one record never blocks
        its partition) and stays readable where it was, at `topic[partition]@offset`, for as
        long as the topic keeps it. Returns whether the payload-less letter was published."""
        self.stats.quarantined += 1
        where = f"{topic}[{partition}]@{offset}"
        reason = refusal_reason("dead letter refused", refused.kind, refused.reason)
        m_key, m_value, m_headers = minimal_dead_letter(key, value, letter, reason)
        try:
            await self.producer.send(self.settings.dead_topic, m_key, m_value, m_headers)
        except RecordRefused as again:
            self.stats.unlettered += 1
            log.error("%s: NOT dead-lettered: the broker refused its dead letter (%s: %s) and "
                      "the dead letter without its payload (%s: %s); the record stays at %s "
                      "and is committed; its failure: %s", where, refused.kind, refused.reason,
                      again.kind, again.reason, where,
                      dict(letter).get(wire.ERROR, b"").decode("utf-8", "replace"),
                      extra={"source": where})
            return False
        self.stats.dead += 1
        log.error("%s: dead-lettered without its payload (%d bytes, still at the source): "
                  "the broker refused the full dead letter (%s: %s)", where, len(value),
                  refused.kind, refused.reason, extra={"source": where})
        return True

    async def _call(self, occ: Occurrence, lease: Lease | None,
                    run: Run | None = None) -> Exception | None:
        """Run the topic's handler, renewing a per-occurrence lease meanwhile (and the job's
        run lease, which may ask the handler to stop); return what it raised."""
        handler = self.handlers[occ.topic]
        is_async = self.is_async[occ.topic]
        if is_async and lease is None and run is None:
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
            call = loop.run_in_executor(self.executor, functools.partial(_run_sync, handler, occ))
        if run is not None:
            # A task can be cancelled; a thread cannot, so a plain function is only told.
            stop: Callable[[], object] = call.cancel if is_async else occ._stop.set
            run.start(stop)
        try:
            while True:
                if lease is None:
                    await asyncio.wait({call})
                    break
                done, _ = await self.timer.wait({call}, lease.ledger.renew_every_s)
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
                        await within(lease.release(), 5)
            # Otherwise (a sync handler's thread runs on) the lease expires on its own.
            raise
        if call.cancelled():
            return RuntimeError("handler was cancelled")
        outcome = call.exception()
        if outcome is not None and not isinstance(outcome, Exception):
            raise outcome  # KeyboardInterrupt, SystemExit: not a handler failure
        return outcome


_NOT_STARTED = object()

RunItem = tuple[str, int, int, str, str, int | None, int, str | None]
"""What a handling hands the run history: job id, scheduled instant, attempt, occurrence key,
outcome, handler start and end (ms), the error's text."""


def _run_record(worker_id: str, item: RunItem) -> runs.RunRecord:
    job_id, scheduled_ms, attempt, occurrence, outcome, started, ended, error = item
    return runs.RunRecord(job_id, scheduled_ms, attempt, occurrence, started_ms=started,
                          ended_ms=ended, outcome=outcome, worker_id=worker_id, error=error)


def is_async_handler(handler: Handler) -> bool:
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
                    guards: list[PartitionGuard | None], starts: list[int] | None = None,
                    now_ms: Callable[[], int] | None = None) -> list[object]:
    """In a handler thread: each record's outcome (None or the exception), or _NOT_STARTED for
    records whose partition lease stopped being valid before their turn (a pause, say). With
    `starts`, each record's start (`now_ms()`) is appended to it, in order."""
    out: list[object] = []
    for handler, occ, guard in zip(handlers, occs, guards, strict=True):
        if starts is not None and now_ms is not None:
            starts.append(now_ms())
        if guard is not None and not guard.holds():
            out.append(_NOT_STARTED)
            continue
        try:
            _run_sync(handler, occ)
            out.append(None)
        except BaseException as exc:  # handed back to the loop, which decides
            out.append(exc)
    return out
