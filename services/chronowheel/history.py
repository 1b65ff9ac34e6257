"""The run-history writer of a node or a worker: records queued by the hot path, written in
batches by a background task.

Firing and handling never wait on history. `add` and `add_lazy` are plain appends to a bounded
queue (`history_queue_rows` rows and `history_queue_bytes` bytes, whichever is reached first:
each append says about how many bytes its items hold, `ROW_BYTES` a row plus its strings and,
for the node's occurrences, their payloads); when it is full, what does not fit is dropped and
counted (`chronowheel_history_rows_total{outcome="dropped"}`), never waited for. The writer task
(`run`, supervised by the service) takes up to `history_batch_rows` rows at a time, groups
them by job, and writes the runs of up to `RUN_WRITE_JOBS` (10) jobs as one write (an
unlogged batch over their partitions, a request per group of them with the same replicas) and
their counter deltas as another (counter batches likewise), at most
`history_writes_in_flight` requests in flight (a permit each, held by the store for each
request a write splits into) and `history_writes_per_s` requests a second as the store counts
them (a request per job and kind cost the process about five times the CPU a row: what history
costs is mostly the driver's work per request).
A write that fails after the store's own retries is counted (`outcome="failed"`) and logged
at most once a minute; the writer goes on with the next batch. So if Cassandra is slow,
history is late; if it stays slow, history is dropped, and the jobs are neither.

The node hands over a whole committed part at once (`add_lazy`: one append per commit, the
records built by the writer task), so its cost on the publish path does not grow with the
number of occurrences beyond a length check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from chronowheel.core.runs import RunRecord, add_counts
from chronowheel.settings import Settings
from chronowheel.store.base import RUN_WRITE_BYTES, RUN_WRITE_JOBS, RunHistoryStore

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
"""At most one log line per this interval about failed history writes."""

Convert = Callable[[Any], RunRecord]

ROW_BYTES = 256
"""What one queued row is counted beside its strings and payload, for the byte bound: about a
row's objects in CPython (a tuple or a record and its integers), an estimate."""
DEFAULT_QUEUE_BYTES = 32 << 20
RUN_ROW_BYTES = 160
"""A run row in a write beside its strings (for `RUN_WRITE_BYTES`): its integers and outcome,
and what Cassandra adds when it sizes a batch for `batch_size_warn_threshold` (about 16 bytes
a cell, a row's liveness and clustering key), so a request stays under the warning."""


def record_bytes(record: RunRecord) -> int:
    """About what a queued `RunRecord` holds."""
    return ROW_BYTES + len(record.job_id) + len(record.occurrence) + len(record.error or "") \
        + len(record.node_id or "") + len(record.worker_id or "")


class RunRecorder:
    def __init__(self, store: RunHistoryStore, *, ttl_s: int, queue_rows: int,
                 batch_rows: int, in_flight: int, writes_per_s: int = 0,
                 round_s: float = 0.0, queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 registry: CollectorRegistry | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if queue_rows < 1 or batch_rows < 1 or in_flight < 1 or ttl_s < 1 \
                or queue_bytes < ROW_BYTES or round_s < 0:
            raise ValueError(f"run recorder: queue_rows ({queue_rows}), batch_rows "
                             f"({batch_rows}), in_flight ({in_flight}) and ttl_s ({ttl_s}) "
                             f"must be at least 1, queue_bytes ({queue_bytes}) at least "
                             f"{ROW_BYTES}, round_s ({round_s}) at least 0")
        self.store = store
        self.ttl_s = ttl_s
        self.queue_rows = queue_rows
        self.queue_bytes = queue_bytes
        self.batch_rows = batch_rows
        self.in_flight = in_flight
        """Most requests in flight at once: a write of several jobs is one or more (by
        replica set), each holding one of `_permits`, so the bound holds however the writes
        split."""
        self._permits = asyncio.Semaphore(in_flight)
        self.writes_per_s = writes_per_s
        """Most requests a second the writer sends (0: no cap). What the writer costs the
        process is about its requests: the cap bounds it, and past it the queue fills and
        drops (counted) rather than the writer taking the process's time. Counted as the
        store makes them: a write of several jobs is a request per group of jobs with the
        same replicas (`store.base.same_replicas`), not one."""
        self.round_s = round_s
        """Batches start at least this far apart (0: as soon as the previous one ends): at an
        ordinary rate the rows then go as a few bursts of requests a second, not one request
        whenever a row comes. Cassandra's request threads spin for a while after each request
        before they park, so an even trickle keeps them spinning: at 100 runs a second the
        trickle cost Cassandra about 0.1 of a core (`loadtest/RESULTS.md`, "Requests in
        rounds")."""
        self._requests_per_row = 2 / RUN_WRITE_JOBS
        """Requests a row took in the last batch (runs and counters): what a paced batch is
        sized by. At first two per `RUN_WRITE_JOBS` rows of distinct jobs (one node)."""
        self._sleep = sleep
        self._queue: deque[list[Any]] = deque()
        """[items, how each becomes a record (None: it is one), the bytes they hold]. Items
        in a list take `add_item`'s next items of the same conversion: one allocation a row
        on the hot path, not three (an entry per row made the collector's young generation
        run three times as often, about 1.6 of the 2.2 µs an append cost)."""
        self._counts: dict[str, dict[str, int]] = {}
        """Counter deltas without a run row (`count`), added with the next batch."""
        self._queued = 0
        self._queued_bytes = 0
        self._taken = 0
        """Rows taken off the queue by batches, ever (`caught_up` counts by it)."""
        self._through = 0
        """Rows of batches that have ended (written, failed or lost), ever."""
        self._batch_ended = asyncio.Event()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = asyncio.Event()
        self._monotonic = monotonic
        self._logged_at: float | None = None
        self.written = 0
        """Rows written."""
        self.dropped = 0
        """Rows dropped because the queue was full."""
        self.failed = 0
        """Rows whose write failed (after the store's retries)."""
        if registry is not None:
            registry.register(_Collector(self))

    @property
    def queued(self) -> int:
        """Rows waiting to be written."""
        return self._queued

    @property
    def queued_bytes(self) -> int:
        """About the bytes the rows waiting to be written hold."""
        return self._queued_bytes

    # --- the hot path's side: never waits ---------------------------------------------------
    def add(self, record: RunRecord) -> None:
        """Queue one record, or drop and count it when the queue is full."""
        self.add_item(record, None, record_bytes(record))

    def add_item(self, item: Any, convert: Convert | None, nbytes: int = ROW_BYTES) -> None:
        """Queue `convert(item)`, converted by the writer task (what is cheapest for the
        caller: a tuple now, the record later; None: `item` is a record), or drop and count it
        when the queue is full. `nbytes`: about what `item` holds."""
        if self._queued >= self.queue_rows or self._queued_bytes + nbytes > self.queue_bytes:
            self.dropped += 1
            return
        queue = self._queue
        if queue:
            last = queue[-1]
            # At most a batch a list: the writer takes whole lists, never copies a long rest.
            if last[1] is convert and type(last[0]) is list \
                    and len(last[0]) < self.batch_rows:
                last[0].append(item)
                last[2] += nbytes
                self._queued += 1
                self._queued_bytes += nbytes
                self._wake.set()
                return
        queue.append([[item], convert, nbytes])
        self._queued += 1
        self._queued_bytes += nbytes
        self._wake.set()

    def add_lazy(self, items: Sequence[Any], convert: Convert, extra_bytes: int = 0) -> None:
        """Queue `convert(item)` of each of `items`, converted by the writer task; what does
        not fit in the queue is dropped and counted. `extra_bytes`: about what the items hold
        beyond `ROW_BYTES` each (their payloads), all together."""
        n = total = len(items)
        if not n:
            return
        per_row = ROW_BYTES + extra_bytes / n
        room = min(self.queue_rows - self._queued,
                   int((self.queue_bytes - self._queued_bytes) // per_row))
        if room < n:
            self.dropped += n - max(0, room)
            if room <= 0:
                return
            n = room
        nbytes = round(per_row * n)
        # A copy: the caller may reuse its list once this returns.
        self._queue.append([tuple(items[:n]) if n < total else tuple(items), convert, nbytes])
        self._queued += n
        self._queued_bytes += nbytes
        self._wake.set()

    def count(self, job_id: str, name: str, n: int) -> None:
        """Add `n` to a counter of the job with the next batch, without a run row (the
        occurrences a catch-up left out). Dropped and counted when `queue_rows` jobs already
        wait for such deltas."""
        mine = self._counts.get(job_id)
        if mine is None:
            if len(self._counts) >= self.queue_rows:
                self.dropped += 1
                return
            mine = self._counts[job_id] = {}
        mine[name] = mine.get(name, 0) + n
        self._wake.set()

    # --- the writer task ----------------------------------------------------------------------
    async def run(self) -> None:
        """Write what is queued, batch after batch, for as long as the service runs."""
        while True:
            if not self._queue and not self._counts:
                self._idle.set()
                await self._wake.wait()
            self._wake.clear()
            self._idle.clear()
            started = self._monotonic()
            requests = await self.write_batch(self._paced_rows())
            if requests:
                pace = requests / self.writes_per_s if self.writes_per_s > 0 else 0.0
                pause = max(pace, self.round_s) - (self._monotonic() - started)
                if pause > 0:
                    await self._pause(pause)

    async def _pause(self, seconds: float) -> None:
        """Sleep between batches; a drain (a stop) ends the pause at once."""
        if self._draining.is_set():
            return
        sleeping = asyncio.ensure_future(self._sleep(seconds))
        draining = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait((sleeping, draining), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            draining.cancel()

    async def flush(self) -> None:
        """Write everything queued now (at shutdown; tests)."""
        while self._queue or self._counts:
            await self.write_batch()

    def hurry(self) -> None:
        """From now on write without a pace or rounds, and end the pause the writer is in: a
        stop calls it first, so what is queued goes out while the rest of the stop runs."""
        self.writes_per_s = 0
        self.round_s = 0.0
        self._draining.set()
        self._wake.set()

    async def drain(self) -> None:
        """At a stop, with the writer task still running: have it write everything queued
        without its pace or rounds, its batch in hand included (cancelling it would lose that
        batch); return once it has."""
        self.hurry()
        await self.settled()

    async def caught_up(self) -> None:
        """Return once every row queued at the call has been through a batch (written, or
        failed and counted), however many are queued after it: a node that goes on firing
        while its history goes out (a static member's stop) waits for what it had, not for
        a queue it keeps filling. Needs the writer task running."""
        target = self._taken + self._queued
        while self._through < target:
            self._batch_ended.clear()
            self._wake.set()
            await self._batch_ended.wait()

    async def settled(self) -> None:
        """Return once the writer task has written everything queued (tests)."""
        while self._queue or self._counts or not self._idle.is_set():
            self._wake.set()
            await self._idle.wait()
            if self._queue or self._counts:
                await asyncio.sleep(0)

    def _paced_rows(self) -> int:
        """Rows a paced batch takes: about a second of requests at `writes_per_s`, at the
        requests a row took in the last batch (runs of distinct jobs take two requests per
        `RUN_WRITE_JOBS` on one node, up to two a job where each has replicas of its own), so
        the requests go out a second's worth at a time rather than a whole `batch_rows` in a
        burst and then a long pause (2,000 rows were 400 requests at once with the cap at
        50)."""
        if self.writes_per_s <= 0:
            return self.batch_rows
        return min(self.batch_rows,
                   max(RUN_WRITE_JOBS, int(self.writes_per_s / self._requests_per_row)))

    def _take(self, limit: int | None = None) -> list[RunRecord]:
        out: list[RunRecord] = []
        room = self.batch_rows if limit is None else min(limit, self.batch_rows)
        queue = self._queue
        while queue and room > 0:
            items, convert, nbytes = queue[0]
            if len(items) <= room:
                queue.popleft()
                chunk = items
                taken = nbytes
            else:
                chunk, rest = items[:room], items[room:]
                taken = nbytes * room // len(items)
                queue[0] = [rest, convert, nbytes - taken]
            room -= len(chunk)
            self._taken += len(chunk)
            self._queued -= len(chunk)
            self._queued_bytes -= taken
            out.extend(chunk if convert is None else map(convert, chunk))
        return out

    async def write_batch(self, rows: int | None = None) -> int:
        """Take up to `batch_rows` (or `rows`) queued rows and write them: the runs of up to
        `RUN_WRITE_JOBS` jobs (and `RUN_WRITE_BYTES`) a write, their counters in another,
        at most `in_flight` requests at a time; return the requests made (as the store counts
        them: a write is one or more, by replica set; a failed write counts one). Failures are
        counted, not raised (an error of history never stops the node or the worker)."""
        taken_before = self._taken
        try:
            records = self._take(rows)
        except Exception as exc:  # a conversion bug: those rows are lost, the writer goes on
            self._failed(0, exc)
            self._batch_through(self._taken - taken_before)
            return 0
        # Counted here, before any await: another batch may take rows while this one writes.
        taken = self._taken - taken_before
        try:
            return await self._write(records)
        finally:
            self._batch_through(taken)

    def _batch_through(self, rows: int) -> None:
        self._through += rows
        self._batch_ended.set()

    async def _write(self, records: list[RunRecord]) -> int:
        counts, self._counts = self._counts, {}
        if not records and not counts:
            return 0
        by_job: dict[str, list[RunRecord]] = {}
        for r in records:
            by_job.setdefault(r.job_id, []).append(r)
        add_counts(counts, records)
        store, ttl_s, permits = self.store, self.ttl_s, self._permits
        writes: list[tuple[int, Any]] = [
            (sum(map(len, group.values())), store.write_runs_of_jobs(group, ttl_s, permits))
            for group in run_groups(by_job)]
        jobs = list(counts.items())
        writes += [(0, store.add_run_counts_of_jobs(dict(jobs[i:i + RUN_WRITE_JOBS]), permits))
                   for i in range(0, len(jobs), RUN_WRITE_JOBS)]
        requests = await self._bounded(writes)
        if records and requests:
            self._requests_per_row = requests / len(records)
        return requests

    async def _bounded(self, writes: list[tuple[int, Any]]) -> int:
        """Run `writes` ((rows, the store's write), `in_flight` at a time, and their
        requests at most `in_flight` at a time by the permits the store holds for each); the
        requests they made."""
        todo = iter(writes)
        requests = 0

        async def lane() -> None:
            nonlocal requests
            for rows, write in todo:
                try:
                    made = await write
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    requests += 1
                    self._failed(rows, exc)
                else:
                    requests += made if isinstance(made, int) else 1  # unsaid: one
                    self.written += rows

        lanes = [lane() for _ in range(min(self.in_flight, len(writes)))]
        try:
            await asyncio.gather(*lanes)
        finally:
            for _rows, write in todo:  # cancelled part-way: never started, closed quietly
                write.close()
        return requests

    def _failed(self, rows: int, exc: BaseException) -> None:
        self.failed += rows
        now = self._monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("run history: a write failed (%s: %s); %d rows failed and %d dropped "
                        "so far. Firing and handling go on; history is incomplete meanwhile",
                        type(exc).__name__, exc, self.failed, self.dropped)


def run_groups(by_job: dict[str, list[RunRecord]]) -> list[dict[str, list[RunRecord]]]:
    """The runs of a batch (job id -> its runs) in requests of at most `RUN_WRITE_JOBS` jobs
    and about `RUN_WRITE_BYTES` (a job's runs over that go in several)."""
    groups: list[dict[str, list[RunRecord]]] = []
    group: dict[str, list[RunRecord]] = {}
    size = 0
    for job_id, job_runs in by_job.items():
        for r in job_runs:
            n = RUN_ROW_BYTES + len(r.job_id) + len(r.occurrence) + len(r.error or "") \
                + len(r.node_id or "") + len(r.worker_id or "")
            if group and (size + n > RUN_WRITE_BYTES
                          or (job_id not in group and len(group) >= RUN_WRITE_JOBS)):
                groups.append(group)
                group, size = {}, 0
            group.setdefault(job_id, []).append(r)
            size += n
    if group:
        groups.append(group)
    return groups


def recorder_for(store: RunHistoryStore, settings: Settings,
                 registry: CollectorRegistry | None) -> RunRecorder:
    """The recorder of a node or worker configured by `settings` (the `history_*` ones)."""
    return RunRecorder(store, ttl_s=max(1, settings.history_ttl_ms // 1000),
                       queue_rows=settings.history_queue_rows,
                       queue_bytes=settings.history_queue_bytes,
                       batch_rows=settings.history_batch_rows,
                       in_flight=settings.history_writes_in_flight,
                       writes_per_s=settings.history_writes_per_s,
                       round_s=settings.history_round_ms / 1000, registry=registry)


class _Collector(Collector):
    def __init__(self, recorder: RunRecorder) -> None:
        self._r = recorder

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        r = self._r
        rows = CounterMetricFamily(
            "chronowheel_history_rows", "run history rows by outcome: written; dropped (the "
            "queue was full: Cassandra slower than the runs); failed (the write failed)",
            labels=["outcome"])
        rows.add_metric(["written"], r.written)
        rows.add_metric(["dropped"], r.dropped)
        rows.add_metric(["failed"], r.failed)
        yield rows
        yield GaugeMetricFamily("chronowheel_history_queue_rows",
                                "run history rows waiting to be written", value=r.queued)
        yield GaugeMetricFamily("chronowheel_history_queue_bytes",
                                "about the bytes the run history rows waiting hold",
                                value=r.queued_bytes)
