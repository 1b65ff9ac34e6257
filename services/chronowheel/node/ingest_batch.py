"""Ingest's fast path: new jobs written in groups.

The common case, an upsert of a job with no pending due row to replace, needs no read of its
own and no delete: several jobs' due and jobs rows go in one logged batch. When the store
refuses a batch, the group is written again in halves, so one bad job among n costs O(log n)
extra writes and only it is quarantined.
"""

# mypy: strict-equality
# (a job status compared with a string no JobStatus can be is an error)
from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Set
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from chronowheel.core import limits
from chronowheel.core.buckets import slot_for
from chronowheel.core.clock import Clock
from chronowheel.core.model import Upsert
from chronowheel.core.recurrence import next_after
from chronowheel.node import failures
from chronowheel.node.calendars import Calendars
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, pending_from_row
from chronowheel.node.rejections import Rejections
from chronowheel.node.state import ShardState
from chronowheel.node.transitions import STORED
from chronowheel.node.writes import RowWriter
from chronowheel.observe import tracing
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow, JobStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class NewJob:
    cmd: Upsert
    version: int
    first: int
    old_key: OccurrenceKey | None


Rows = tuple[DueRow, int, JobRow]
"""A new version's due row, its TTL and its jobs row."""


class NewJobs:
    def __init__(self, *, state: ShardState, settings: Settings, store: JobStore,
                 writer: RowWriter, clock: Clock, metrics: NodeMetrics, calendars: Calendars,
                 rejections: Rejections, counted: Set[int]) -> None:
        self.state = state
        self.shard = state.shard
        self.settings = settings
        self.store = store
        self.writer = writer
        self.clock = clock
        self.metrics = metrics
        self.calendars = calendars
        self.rejections = rejections
        self.counted = counted
        """Minutes whose bucket counts the current batch already raised (ingest's precount)."""

    async def write(self, jobs: list[tuple[Upsert, JobRow | None]],
                    sem: AbstractAsyncContextManager[object]) -> None:
        """Upserts of jobs whose previous row (if any) has no unpublished due row: each job's
        due row and jobs row go in the same logged batch, a few jobs per batch."""
        settings = self.settings
        group: list[NewJob] = []
        size = 0
        writes = []
        for cmd, row in jobs:
            job = cmd.job
            version = row.version + 1 if row is not None else 1
            try:
                first = (next_after(self.calendars.schedule(job), self.clock.now_ms(),
                                    inclusive=True) if job.recurring else job.at_ms)
            except Exception as exc:
                self.rejections.quarantine(cmd, exc)
                continue
            # Published already (slot <= watermark) or none: only the wheel entry may remain.
            old_key = None if row is None or row.status != "scheduled" \
                or row.scheduled_ms is None or row.slot_ms is None \
                else (row.job_id, row.scheduled_ms, 1)
            if first is None:  # a recurring job whose end has passed
                writes.append(self._finish(cmd, version, old_key, sem))
                continue
            cost = limits.job_rows_bytes(job_id=job.id, topic=job.topic,
                                         payload_len=len(job.payload),
                                         spec_len=len(job.canonical), recurring=job.recurring,
                                         headers=job.headers)
            if group and (size + cost > settings.ingest_group_bytes
                          or len(group) >= settings.ingest_group_jobs):
                writes.append(self._write_group(group, sem))
                group, size = [], 0
            group.append(NewJob(cmd, version, first, old_key))
            size += cost
        if group:
            writes.append(self._write_group(group, sem))
        await asyncio.gather(*writes)

    async def _write_group(self, group: list[NewJob],
                           sem: AbstractAsyncContextManager[object]) -> None:
        """Write a group's rows in one logged batch. A job over a limit is rejected before
        the write; when the store still refuses the batch, the group is split in halves and
        each written again, so one bad job among n costs O(log n) extra writes and only it
        is quarantined. Only the checks and the store's answer are about single commands:
        what follows a write that succeeded (the wheel, the counters) is not, and an error
        there stops the shard rather than reject a command that was applied."""
        state = self.state
        written: list[tuple[NewJob, Rows]] = []
        refused: Exception | None = None
        async with sem:
            # Slots are claimed only now, right before the write, and released once the rows
            # are in the wheel: meanwhile dispatch stays below them (ingest-slot invariant).
            now = self.clock.now_ms()
            claimed: list[int] = []
            try:
                for new in group:
                    try:
                        rows = self._rows(new, now)  # claims a slot, or raises having none
                    except Exception as exc:
                        self.rejections.quarantine(new.cmd, exc)
                        continue
                    claimed.append(rows[0].slot_ms)
                    try:
                        self.writer.check(rows[0], now, rows[2])
                    except Exception as exc:
                        self.rejections.quarantine(new.cmd, exc)
                        continue
                    written.append((new, rows))
                if written:
                    try:
                        await self._put_rows([r for _new, r in written])
                    except Exception as exc:
                        if failures.concerns_the_node(exc):
                            raise
                        refused = exc  # a refused batch is atomic: nothing of it was written
                    else:
                        self._applied(written)
            finally:
                for slot in claimed:
                    state.release_slot(slot)
        if refused is None:
            return
        if len(written) == 1:
            self.rejections.quarantine(written[0][0].cmd, refused)
            return
        log.info("shard %d: the store refused a group of %d new jobs (%s); writing it in "
                 "halves to find the job it refuses", self.shard, len(written), refused)
        news = [new for new, _rows in written]
        half = len(news) // 2
        await self._write_group(news[:half], sem)
        await self._write_group(news[half:], sem)

    async def _put_rows(self, rows: list[Rows]) -> None:
        # Bucket counts first or together (see RowWriter.write_due): a row must never exist
        # uncounted when its wheel decision is made.
        uncounted: dict[int, int] = defaultdict(int)
        for due, _ttl, _job in rows:
            if due.minute not in self.counted:
                uncounted[due.minute] += 1
        await asyncio.gather(self.store.put_dues_and_jobs(rows),
                             *([self.store.add_bucket_counts(
                                 self.shard, uncounted, self.settings.ingest_counts_in_flight)]
                               if uncounted else []))

    def _applied(self, written: list[tuple[NewJob, Rows]]) -> None:
        """The wheel and the counters after a group's rows were written."""
        state = self.state
        stored = self.metrics.ingested.labels("upsert", STORED)
        for new, (due, _ttl, _job) in written:
            # Only an occurrence the wheel takes now is encoded; the loader encodes the others
            # when their minute comes (most are days ahead).
            pending = pending_from_row(due) if state.insert_bound(due.slot_ms) else None
            state.apply_job_change(due.job_id, new.old_key, pending)
            stored.inc()
            job = new.cmd.job
            if job.headers:
                tracing.record_ingest(job.id, "upsert", self.shard, job.headers)

    def _rows(self, new: NewJob, now: int) -> Rows:
        """The due row (with its TTL) and the jobs row of a new version, its slot claimed."""
        job = new.cmd.job
        slot = self.state.claim_slot(slot_for(job.id, new.first, job.window_ms), now)
        try:
            due, job_row = self.writer.scheduled(job, slot=slot, first=new.first,
                                                 version=new.version, now=now)
            return due, self.writer.ttl_s(slot, now), job_row
        except BaseException:
            self.state.release_slot(slot)
            raise

    async def _finish(self, cmd: Upsert, version: int, old_key: OccurrenceKey | None,
                      sem: AbstractAsyncContextManager[object]) -> None:
        job = cmd.job
        try:
            async with sem:
                await self.store.put_job(self.writer.finished(job.id, job.canonical, version,
                                                              job.tenant))
        except Exception as exc:
            if failures.concerns_the_node(exc):
                raise
            self.rejections.quarantine(cmd, exc)
            return
        self.state.apply_job_change(job.id, old_key, None)
        self.metrics.ingested.labels("upsert", STORED).inc()
