"""Ingest: apply a shard's submit commands, durable Cassandra writes first.

Records arrive from the node's pump (`enqueue`) in offset order. A batch is parsed, commands of
another shard are forwarded, the rest are applied per job in order (jobs concurrently), and
only then are the batch's outbox and next offset handed to the publisher: the offsets go in
the transaction that follows the writes.
"""

# mypy: strict-equality
# (a job status compared with a string no JobStatus can be is an error)
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from chronowheel.bus.ports import SubmitRecord
from chronowheel.core import limits, wire
from chronowheel.core.buckets import minute_of, slot_for
from chronowheel.core.clock import Clock
from chronowheel.core.model import (
    Backfill,
    Cancel,
    Command,
    DeleteCalendar,
    JobSpec,
    Pause,
    PutCalendar,
    Resume,
    Retry,
    Trigger,
    Upsert,
    ValidationPolicy,
    decode_stored_job,
    parse_command,
    routing_key,
)
from chronowheel.core.recurrence import next_after
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.node import failures
from chronowheel.node.calendars import Calendars
from chronowheel.node.dispatch import stored_policy
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, pending_from_row
from chronowheel.node.state import Outgoing, ShardState
from chronowheel.node.writes import RowWriter, schedule_of
from chronowheel.observe import tracing
from chronowheel.settings import Settings
from chronowheel.store.base import DueKey, DueRow, JobRow, JobStore, RequestRow

log = logging.getLogger(__name__)


class Ingest:
    def __init__(self, *, state: ShardState, shards: int, settings: Settings, store: JobStore,
                 writer: RowWriter, clock: Clock, metrics: NodeMetrics,
                 policy: ValidationPolicy, calendars: Calendars) -> None:
        self.state = state
        self.shard = state.shard
        self.shards = shards
        self.settings = settings
        self.store = store
        self.writer = writer
        self.clock = clock
        self.metrics = metrics
        self.policy = policy
        self.stored_policy = stored_policy(policy)
        self.calendars = calendars
        self.queue: deque[SubmitRecord] = deque()
        """Records fetched for this shard, not yet applied (the pump pauses on its length)."""
        self.next_offset: int | None = None
        """The offset expected next; records below it are re-deliveries after a seek."""
        self.counted: set[int] = set()
        """Minutes whose bucket counts the current batch already raised (`precount`), so its
        rows there do not count themselves again."""
        self.sources: dict[int, SubmitRecord] = {}
        """id() of each command of the current batch -> its record (for late rejections)."""
        self.late_rejections: list[Outgoing] = []
        """Commands of the current batch refused for the state of their job (an unknown job,
        a one-shot asked to backfill); published with the batch like parse rejections."""

    def enqueue(self, records: Iterable[SubmitRecord]) -> None:
        self.queue.extend(records)
        self.state.ingest_wake.set()

    def reset(self, next_offset: int | None) -> None:
        """After a takeover: forget what was queued; the partition is read from next_offset."""
        self.queue.clear()
        self.next_offset = next_offset

    async def run(self) -> None:
        state = self.state
        while not state.stopping:
            if not self.queue:
                state.ingest_wake.clear()
                await state.ingest_wake.wait()
                continue
            await self.step()

    async def step(self) -> None:
        """Apply up to one batch of queued records."""
        records: list[SubmitRecord] = []
        while self.queue and len(records) < self.settings.ingest_batch:
            rec = self.queue.popleft()
            if self.next_offset is not None and rec.offset < self.next_offset:
                continue  # already seen (re-delivery after a seek)
            # A gap above next_offset is normal: read_committed skips aborted records and
            # control markers, and the pump never drops records of a ready shard.
            records.append(rec)
            self.next_offset = rec.offset + 1
        if not records:
            return
        now = self.clock.now_ms()
        chains: dict[str, list[Command]] = defaultdict(list)
        calendar_ops: list[PutCalendar | DeleteCalendar] = []
        outbox: list[Outgoing] = []  # published with this batch's offsets, not before
        for i, rec in enumerate(records):
            if i and i % PARSE_YIELD_EVERY == 0:
                # Parsing is CPU only: let dispatch and the group's heartbeat run between
                # slices of a large batch, however slow its commands are to validate.
                await asyncio.sleep(0)
            cmd = self._parse(rec, now, outbox)
            if cmd is None:
                continue
            job_id = routing_key(cmd)
            target = shard_of(job_id, self.shards)
            if target != self.shard:
                outbox.append(Outgoing(self.settings.submit_topic, target, rec.key,
                                       rec.value or b"", list(rec.headers or ())))
                self.metrics.forwarded.inc()
                continue
            self.sources[id(cmd)] = rec
            if isinstance(cmd, PutCalendar | DeleteCalendar):
                calendar_ops.append(cmd)
            else:
                chains[job_id].append(cmd)
        try:
            # Calendars first, so jobs of the same batch that use them compute with them.
            await self._apply_calendars(calendar_ops)
            await self.calendars.refresh(cmds[0].job.calendar for cmds in chains.values()
                                         if isinstance(cmds[0], Upsert))
            await self._precount(chains, now)
            await self._apply_chains(chains)
        finally:
            self.sources.clear()
        outbox.extend(self.late_rejections)
        self.late_rejections.clear()
        # Handed to the next transaction after every step: a step is at most `ingest_batch`
        # records, so a takeover re-applies at most that many.
        self.state.outbox.extend(outbox)
        self.state.offset_to_commit = records[-1].offset + 1
        self.state.wake.set()

    async def _apply_calendars(self, ops: list[PutCalendar | DeleteCalendar]) -> None:
        """Write calendar puts and deletes in offset order (each replaces the whole calendar,
        so re-applying them after a takeover leaves the same result)."""
        for op in ops:
            try:
                if isinstance(op, PutCalendar):
                    await self.store.put_calendar(op.name, op.dates)
                    self.calendars.applied(op.name, op.dates)
                else:
                    await self.store.delete_calendar(op.name)
                    self.calendars.applied(op.name, None)
            except Exception as exc:
                self._quarantine(op, exc)
                continue
            self.metrics.ingested.labels(op.op, STORED).inc()

    async def _apply_chains(self, chains: dict[str, list[Command]]) -> None:
        """Apply every job's commands, each job's in order, all jobs' locks held throughout.

        The common case, an upsert of a job with no pending due row to replace, goes in groups:
        the jobs rows are read together (`get_jobs`) and several jobs' due and jobs rows are
        written per logged batch (`_write_new`). Everything else (cancels, retries, edits of
        a scheduled job, several commands for one job) goes one command at a time as before,
        its first command using the row read with the group.
        """
        state = self.state
        async with state.job_locks(chains):
            # The locks make these reads current until the step ends: every writer of a jobs
            # row (ingest, a recurring fire) holds the job's lock.
            wanted = [j for j, cmds in chains.items() if not isinstance(cmds[0], Retry)]
            existing = await self.store.get_jobs(wanted) if wanted else {}
            fresh: list[tuple[Upsert, JobRow | None]] = []
            one_by_one: list[tuple[str, list[Command]]] = []
            for job_id, cmds in chains.items():
                cmd = cmds[0]
                if len(cmds) == 1 and isinstance(cmd, Upsert):
                    row = existing.get(job_id)
                    if _unchanged(row, cmd.job):
                        self.metrics.ingested.labels(cmd.op, UNCHANGED).inc()
                        continue
                    # A paused job stays paused through an edit (`_upsert`).
                    if not self._has_pending_row(row) \
                            and (row is None or row.status != "paused"):
                        fresh.append((cmd, row))
                        continue
                one_by_one.append((job_id, cmds))
            sem = asyncio.Semaphore(self.settings.ingest_concurrency)

            async def run_chain(job_id: str, cmds: list[Command]) -> None:
                async with sem:
                    for i, cmd in enumerate(cmds):
                        try:
                            await self._apply(cmd, self.clock.now_ms(),
                                              existing.get(job_id) if i == 0 else _READ)
                        except Exception as exc:
                            # Only this command is set aside; the job's later ones read
                            # what is stored (_READ) and apply to that.
                            self._quarantine(cmd, exc)

            await asyncio.gather(self._write_new(fresh, sem),
                                 *(run_chain(j, c) for j, c in one_by_one))

    def _has_pending_row(self, row: JobRow | None) -> bool:
        """Whether a new version of the job must first delete its unpublished due row."""
        return row is not None and row.status == "scheduled" and row.slot_ms is not None \
            and row.scheduled_ms is not None and row.slot_ms > self.state.watermark

    async def _write_new(self, jobs: list[tuple[Upsert, JobRow | None]],
                         sem: asyncio.Semaphore) -> None:
        """Upserts of jobs whose previous row (if any) has no unpublished due row: each job's
        due row and jobs row go in the same logged batch, a few jobs per batch."""
        settings = self.settings
        group: list[_NewJob] = []
        size = 0
        writes = []
        for cmd, row in jobs:
            job = cmd.job
            version = row.version + 1 if row is not None else 1
            try:
                first = (next_after(self.calendars.schedule(job), self.clock.now_ms(),
                                    inclusive=True) if job.recurring else job.at_ms)
            except Exception as exc:
                self._quarantine(cmd, exc)
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
            group.append(_NewJob(cmd, version, first, old_key))
            size += cost
        if group:
            writes.append(self._write_group(group, sem))
        await asyncio.gather(*writes)

    async def _write_group(self, group: list[_NewJob], sem: asyncio.Semaphore) -> None:
        """Write a group's rows in one logged batch. A job over a limit is rejected before
        the write; when the store still refuses the batch, the group is split in halves and
        each written again, so one bad job among n costs O(log n) extra writes and only it
        is quarantined. Only the checks and the store's answer are about single commands:
        what follows a write that succeeded (the wheel, the counters) is not, and an error
        there stops the shard rather than reject a command that was applied."""
        state = self.state
        written: list[tuple[_NewJob, tuple[DueRow, int, JobRow]]] = []
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
                        self._quarantine(new.cmd, exc)
                        continue
                    claimed.append(rows[0].slot_ms)
                    try:
                        self.writer.check(rows[0], now, rows[2])
                    except Exception as exc:
                        self._quarantine(new.cmd, exc)
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
            self._quarantine(written[0][0].cmd, refused)
            return
        log.info("shard %d: the store refused a group of %d new jobs (%s); writing it in "
                 "halves to find the job it refuses", self.shard, len(written), refused)
        news = [new for new, _rows in written]
        half = len(news) // 2
        await self._write_group(news[:half], sem)
        await self._write_group(news[half:], sem)

    async def _put_rows(self, rows: list[tuple[DueRow, int, JobRow]]) -> None:
        # Bucket counts first or together (see RowWriter.write_due): a row must never exist
        # uncounted when its wheel decision is made.
        uncounted: dict[int, int] = defaultdict(int)
        for due, _ttl, _job in rows:
            if due.minute not in self.counted:
                uncounted[due.minute] += 1
        await asyncio.gather(self.store.put_dues_and_jobs(rows),
                             *([self.store.add_bucket_counts(self.shard, uncounted)]
                               if uncounted else []))

    def _applied(self, written: list[tuple[_NewJob, tuple[DueRow, int, JobRow]]]) -> None:
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

    def _rows(self, new: _NewJob, now: int) -> tuple[DueRow, int, JobRow]:
        """The due row (with its TTL) and the jobs row of a new version, its slot claimed."""
        job = new.cmd.job
        slot = self.state.claim_slot(slot_for(job.id, new.first, job.window_ms), now)
        try:
            return self._rows_at(new, slot, now)
        except BaseException:
            self.state.release_slot(slot)
            raise

    def _rows_at(self, new: _NewJob, slot: int, now: int) -> tuple[DueRow, int, JobRow]:
        job = new.cmd.job
        due = DueRow.for_job(job, shard=self.shard, slot_ms=slot, scheduled_ms=new.first,
                             version=new.version)
        # A one-shot's jobs row outlives its occurrence by the retention period (so an
        # identical re-submit stays a no-op that long); a recurring one lives until changed.
        ttl = 0 if job.recurring else self.writer.ttl_s(slot, now)
        return due, self.writer.ttl_s(slot, now), JobRow(
            job.id, self.shard, job.canonical, new.version, "scheduled", new.first, slot, ttl,
            job.tenant)

    async def _finish(self, cmd: Upsert, version: int, old_key: OccurrenceKey | None,
                      sem: asyncio.Semaphore) -> None:
        job = cmd.job
        try:
            async with sem:
                await self.store.put_job(self.writer.finished(job.id, job.canonical, version,
                                                              job.tenant))
        except Exception as exc:
            if failures.concerns_the_node(exc):
                raise
            self._quarantine(cmd, exc)
            return
        self.state.apply_job_change(job.id, old_key, None)
        self.metrics.ingested.labels("upsert", STORED).inc()

    async def _precount(self, chains: dict[str, list[Command]], now: int) -> None:
        """Count the batch's rows per minute before writing any of them: one counter update
        per minute instead of one per row. A row whose slot lands elsewhere when it is
        written (time moved on) counts itself (`RowWriter.write_due`); over-counting is
        harmless."""
        counts: dict[int, int] = defaultdict(int)
        floor = max(self.state.watermark + 1, now + self.settings.ingest_slack_ms)
        for cmds in chains.values():
            for cmd in cmds:
                if isinstance(cmd, Upsert):
                    job = cmd.job
                    first = (next_after(schedule_of(job), now, inclusive=True)
                             if job.recurring else job.at_ms)
                    if first is not None:
                        counts[minute_of(max(slot_for(job.id, first, job.window_ms),
                                             floor))] += 1
                elif isinstance(cmd, Retry):
                    counts[minute_of(max(cmd.at_ms, floor))] += 1
        if counts:
            await self.store.add_bucket_counts(self.shard, counts)
        self.counted = set(counts)

    def _parse(self, rec: SubmitRecord, now: int, outbox: list[Outgoing]) -> Command | None:
        try:
            return parse_command(rec.value or b"", key=rec.key, policy=self.policy, now_ms=now)
        except ValidationError as exc:
            reason = str(exc)
        except Exception as exc:  # a parser bug must not stop the pipeline either
            log.exception("shard %d: parser failed on offset %d", self.shard, rec.offset)
            reason = f"internal error while validating: {type(exc).__name__}: {exc}"
        self._rejection(rec, reason, outbox)
        return None

    def _quarantine(self, cmd: Command, exc: Exception) -> None:
        """Set aside a command that failed for a reason about it alone: to `<ns>.rejected`
        with the reason, counted by kind, and the node goes on. An error about all the
        node's work (`failures.concerns_the_node`) is raised again instead."""
        if failures.concerns_the_node(exc):
            raise exc
        label = failures.reason_label(exc)
        self.metrics.quarantined.labels("ingest", label).inc()
        rec = self.sources[id(cmd)]
        if label == failures.INTERNAL:
            log.warning("shard %d: a bug while applying offset %d; the command is quarantined",
                        self.shard, rec.offset, exc_info=exc,
                        extra={"shard": self.shard, "offset": rec.offset})
        self._reject(cmd, failures.describe(exc))

    def _reject(self, cmd: Command, reason: str) -> None:
        """Refuse a parsed command for the state of its job: to `<ns>.rejected` with the
        batch, like a parse rejection."""
        self._rejection(self.sources[id(cmd)], reason, self.late_rejections)

    def _rejection(self, rec: SubmitRecord, reason: str, outbox: list[Outgoing]) -> None:
        headers = [(wire.REASON, limits.cut_reason(reason).encode()),
                   (wire.SOURCE_TOPIC, rec.topic.encode()),
                   (wire.SOURCE_PARTITION, str(rec.partition).encode()),
                   (wire.SOURCE_OFFSET, str(rec.offset).encode())]
        value = rec.value or b""
        if limits.record_bytes(rec.key, value, headers) > limits.KAFKA_MAX_MESSAGE_BYTES:
            # The original would not fit beside our headers: its size and digest stand in
            # for it, so the rejection itself can never be refused by the broker.
            headers.append((wire.ORIGINAL_BYTES, str(len(value)).encode()))
            value = orjson.dumps({"original_bytes": len(value),
                                  "original_sha256": hashlib.sha256(value).hexdigest()})
        outbox.append(Outgoing(self.settings.rejected_topic, None, rec.key, value, headers))
        self.metrics.rejected.inc()
        log.info("shard %d: rejected offset %d: %s", self.shard, rec.offset,
                 limits.cut_reason(reason, 300),
                 extra={"shard": self.shard, "offset": rec.offset, "partition": rec.partition})

    async def _apply(self, cmd: Command, now: int, existing: JobRow | _Read | None) -> None:
        """One command; `existing` is the job's row read under its lock, or _READ to read it
        here (a later command of the same job in one step)."""
        if isinstance(cmd, Retry):
            changed = await self._retry(cmd, now)
        elif isinstance(cmd, PutCalendar | DeleteCalendar):
            raise AssertionError("calendar commands are applied by _apply_calendars")
        else:
            job_id = routing_key(cmd)
            row = await self.store.get_job(job_id) if isinstance(existing, _Read) else existing
            if isinstance(cmd, Upsert):
                changed = await self._upsert(cmd.job, now, row)
                if cmd.job.headers:
                    tracing.record_ingest(job_id, "upsert", self.shard, cmd.job.headers)
            elif isinstance(cmd, Cancel):
                changed = await self._cancel(cmd.id, row)
            elif isinstance(cmd, Pause):
                changed = await self._pause(cmd, row)
            elif isinstance(cmd, Resume):
                changed = await self._resume(cmd, row, now)
            elif isinstance(cmd, Trigger):
                changed = await self._trigger(cmd, row, now)
            else:
                changed = await self._backfill(cmd, row)
        self.metrics.ingested.labels(cmd.op, STORED if changed else UNCHANGED).inc()

    async def _upsert(self, job: JobSpec, now: int, existing: JobRow | None) -> bool:
        if _unchanged(existing, job):
            return False  # identical re-submit: a no-op, also after the job fired
        version = existing.version + 1 if existing is not None else 1
        first = (next_after(self.calendars.schedule(job), now, inclusive=True)
                 if job.recurring else job.at_ms)
        if first is None:  # a recurring job whose end has passed
            old_key = await self._remove_pending(existing)
            await self.store.put_job(self.writer.finished(job.id, job.canonical, version,
                                                          job.tenant))
            self.state.apply_job_change(job.id, old_key, None)
            return True
        if existing is not None and existing.status == "paused":
            # The new spec is stored, the job stays paused: a resume starts from `first`.
            await self.store.put_job(JobRow(job.id, self.shard, job.canonical, version,
                                            "paused", first, None, 0, job.tenant))
            self.state.apply_job_change(job.id, None, None)
            return True
        state = self.state
        slot = state.claim_slot(slot_for(job.id, first, job.window_ms), self.clock.now_ms())
        try:
            row = DueRow.for_job(job, shard=self.shard, slot_ms=slot, scheduled_ms=first,
                                 version=version)
            # A one-shot's jobs row outlives its occurrence by the retention period (so an
            # identical re-submit stays a no-op that long); a recurring one lives until changed.
            ttl = 0 if job.recurring else self.writer.ttl_s(slot, now)
            job_row = JobRow(job.id, self.shard, job.canonical, version, "scheduled", first,
                             slot, ttl, job.tenant)
            # Before anything is written: an edit over a limit leaves the old version as it is;
            # and the old due row is deleted in the batch that writes the new one, so an edit
            # the store refuses leaves it as it was too.
            self.writer.check(row, now, job_row)
            old_key, replaces = self._pending_of(existing)
            await self.writer.write_due(row, now, job_row, counted=row.minute in self.counted,
                                        replaces=replaces)
            state.apply_job_change(job.id, old_key, pending_from_row(row))
        finally:
            state.release_slot(slot)
        return True

    def _pending_of(self, existing: JobRow | None) -> tuple[OccurrenceKey | None,
                                                            DueKey | None]:
        """The wheel key of the job's scheduled occurrence, and the key of its due row when
        that row is not published yet (a new version must delete it)."""
        if existing is None or existing.status != "scheduled" or existing.slot_ms is None \
                or existing.scheduled_ms is None:
            return None, None
        row_key = None
        if existing.slot_ms > self.state.watermark:  # not published yet
            row_key = (minute_of(existing.slot_ms), self.shard, existing.slot_ms,
                       existing.job_id, 1)
        return (existing.job_id, existing.scheduled_ms, 1), row_key

    async def _remove_pending(self, existing: JobRow | None) -> OccurrenceKey | None:
        old_key, row_key = self._pending_of(existing)
        if row_key is not None:
            await self.store.delete_due(*row_key)
        return old_key

    async def _cancel(self, job_id: str, existing: JobRow | None) -> bool:
        if existing is None or existing.status not in ("scheduled", "paused"):
            return False
        old_key = await self._remove_pending(existing)
        await self.store.put_job(JobRow(job_id, self.shard, existing.spec, existing.version + 1,
                                        "cancelled", None, None, self.writer.retention_s,
                                        existing.tenant))
        self.state.apply_job_change(job_id, old_key, None)
        return True

    # --- schedule controls ------------------------------------------------------------------
    def _stored(self, row: JobRow) -> JobSpec:
        return decode_stored_job(row.spec, policy=self.stored_policy, now_ms=self.clock.now_ms())

    def _accepted(self, cmd: Pause | Resume | Trigger | Backfill, row: JobRow | None,
                  verb: str) -> JobRow | None:
        """The job's row when `cmd` can apply to it; otherwise None, `cmd` rejected."""
        if row is None:
            self._reject(cmd, f"id: no job {cmd.id!r} to {verb}")
            return None
        if row.status in ("finished", "cancelled"):
            self._reject(cmd, f"id: job {cmd.id!r} is {row.status}; there is nothing to {verb}")
            return None
        if isinstance(cmd, Trigger | Backfill):
            reason = None
            if row.status == "paused":
                reason = f"id: job {cmd.id!r} is paused; resume it before it can be {verb}ed"
            elif not row.spec or orjson.loads(row.spec).get("at") is not None:
                reason = f"id: job {cmd.id!r} is a one-shot; only a recurring job can be {verb}ed"
            if reason is not None:
                self._reject(cmd, reason)
                return None
        return row

    async def _pause(self, cmd: Pause, row: JobRow | None) -> bool:
        row = self._accepted(cmd, row, "pause")
        if row is None:
            return False
        if row.status == "paused":
            return False
        job = self._stored(row)
        held = row.scheduled_ms  # the first occurrence the pause withholds
        if held is not None and row.slot_ms is not None and row.slot_ms <= self.state.watermark:
            # That one is being published (or is out, for a one-shot): it goes; the pause
            # withholds the next.
            held = next_after(schedule_of(job), held) if job.recurring else None
        if held is None:
            self._reject(cmd, f"id: job {cmd.id!r} has no occurrence left to pause"
                              + ("" if job.recurring else " (a one-shot that has fired)"))
            return False
        old_key = await self._remove_pending(row)
        await self.store.put_job(JobRow(row.job_id, self.shard, row.spec, row.version + 1,
                                        "paused", held, None, 0, row.tenant))
        self.state.apply_job_change(row.job_id, old_key, None)
        return True

    async def _resume(self, cmd: Resume, row: JobRow | None, now: int) -> bool:
        row = self._accepted(cmd, row, "resume")
        if row is None:
            return False
        if row.status != "paused" or row.scheduled_ms is None:
            return False  # not paused: nothing to do
        job = self._stored(row)
        first, version, state = row.scheduled_ms, row.version + 1, self.state
        # A first occurrence long overdue gets a slot of now; dispatch measures its lateness
        # from its own slot and applies the job's catch-up policy (`Dispatcher`).
        slot = state.claim_slot(slot_for(job.id, first, job.window_ms), self.clock.now_ms())
        try:
            due = DueRow.for_job(job, shard=self.shard, slot_ms=slot, scheduled_ms=first,
                                 version=version)
            ttl = 0 if job.recurring else self.writer.ttl_s(slot, now)
            await self.writer.write_due(due, now, JobRow(job.id, self.shard, job.canonical,
                                                         version, "scheduled", first, slot, ttl,
                                                         job.tenant))
            state.apply_job_change(job.id, None, pending_from_row(due))
        finally:
            state.release_slot(slot)
        return True

    async def _trigger(self, cmd: Trigger, row: JobRow | None, now: int) -> bool:
        row = self._accepted(cmd, row, "trigger")
        if row is None:
            return False
        if await self.store.get_request(self.shard, cmd.id, cmd.request_id) is not None:
            return False  # the same request again: it was applied before
        job = self._stored(row)
        state = self.state
        slot = state.claim_slot(now, self.clock.now_ms())
        try:
            due = DueRow.for_request(job, shard=self.shard, slot_ms=slot, scheduled_ms=now,
                                     version=row.version, origin=wire.TRIGGER_ORIGIN,
                                     request_id=cmd.request_id)
            request = RequestRow(self.shard, job.id, cmd.request_id, wire.TRIGGER_ORIGIN, now,
                                 now, None, 1, 1, row.spec, self.writer.retention_s)
            self.writer.check(due, now)
            # The count first or together: the loader skips minutes counted zero.
            await asyncio.gather(
                self.store.put_request(request, [(due, self.writer.ttl_s(slot, now))]),
                self.store.add_bucket_count(self.shard, due.minute, 1))
            if state.insert_bound(slot):
                p = pending_from_row(due)
                state.wheel.insert(p, slot, p)
        finally:
            state.release_slot(slot)
        return True

    async def _backfill(self, cmd: Backfill, row: JobRow | None) -> bool:
        row = self._accepted(cmd, row, "backfill")
        if row is None:
            return False
        if await self.store.get_request(self.shard, cmd.id, cmd.request_id) is not None:
            return False  # the same request again: it was applied (or is being applied)
        schedule = schedule_of(self._stored(row))
        first = next_after(schedule, cmd.from_ms, inclusive=True)
        total, at = 0, first
        while at is not None and at < cmd.to_ms:
            total += 1
            if total > wire.MAX_BACKFILL_OCCURRENCES:
                self._reject(cmd, f"to: the range holds more than "
                                  f"{wire.MAX_BACKFILL_OCCURRENCES} occurrences (at least "
                                  f"{total} in [{cmd.from_ms}, {cmd.to_ms}))")
                return False
            at = next_after(schedule, at)
        if first is None or total == 0:
            self._reject(cmd, f"from: job {cmd.id!r} has no occurrence in "
                              f"[{cmd.from_ms}, {cmd.to_ms})")
            return False
        request = RequestRow(self.shard, cmd.id, cmd.request_id, wire.BACKFILL_ORIGIN,
                             cmd.from_ms, cmd.to_ms, first, total, 0, row.spec,
                             self.writer.retention_s)
        await self.store.put_request(request)
        self.state.backfills[(cmd.id, cmd.request_id)] = request
        self.state.backfill_wake.set()
        return True

    async def _retry(self, cmd: Retry, now: int) -> bool:
        state = self.state
        slot = state.claim_slot(cmd.at_ms, self.clock.now_ms())
        try:
            row = DueRow.for_retry(cmd, shard=self.shard, slot_ms=slot)
            await self.writer.write_due(row, now, counted=row.minute in self.counted)
            p = pending_from_row(row)
            if state.insert_bound(slot):
                state.wheel.insert(p, slot, p)
        finally:
            state.release_slot(slot)
        return True


class _Read:
    """Marker: the command reads the job's row itself."""


_READ = _Read()
PARSE_YIELD_EVERY = 50
"""Commands an ingest step parses between two yields to the event loop."""
STORED = "stored"
"""`outcome` label of chronowheel_ingested_total: the command changed what is stored."""
UNCHANGED = "unchanged"
"""`outcome` label: nothing to change (an identical re-submit, a command re-delivered after a
takeover that was applied before, a cancel of an unknown or finished job)."""


@dataclass(slots=True)
class _NewJob:
    cmd: Upsert
    version: int
    first: int
    old_key: OccurrenceKey | None


def _unchanged(row: JobRow | None, job: JobSpec) -> bool:
    return row is not None and row.status != "cancelled" and row.spec == job.canonical
