"""Transitions: one command applied to one job's stored state, the job's lock held.

What ingest (`node/ingest.py`) does not write in groups (`node/ingest_batch.py`) goes here one
command at a time: an edit of a scheduled or paused job, a cancel, the schedule controls
(pause, resume, trigger, backfill) and a worker's retry. Each reads the job's row (or gets it
read with the batch), decides from its `status` what the command means, and writes the new
state durably before the wheel learns of it.
"""

# mypy: strict-equality
# (a job status compared with a string no JobStatus can be is an error)
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Set
from dataclasses import replace

import orjson

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
    routing_key,
)
from chronowheel.core.recurrence import next_after
from chronowheel.core.runs import failure_streak
from chronowheel.node.calendars import Calendars
from chronowheel.node.dispatch import stored_policy
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, pending_from_row
from chronowheel.node.rejections import Rejections
from chronowheel.node.state import ShardState
from chronowheel.node.writes import RowWriter, schedule_of
from chronowheel.observe import tracing
from chronowheel.store.base import (
    CLEAR_NOTE,
    DueRow,
    JobRow,
    JobStore,
    RequestRow,
    RetiredDue,
    RunHistoryStore,
)

log = logging.getLogger(__name__)

PAUSE_REQUEST = "pause"
"""`RequestRow.kind` of a pause applied with a request id (kept for the retention period: the
same request id again changes nothing)."""

RETRY_REQUEST = "retry"
"""`RequestRow.kind` of a retry applied with a `redrive_id` (kept for the retention period: a
retry with the same redrive id again changes nothing). Its request id is
`redrive_request_key(redrive_id)`."""


def redrive_request_key(redrive_id: str) -> str:
    """The request id of the row recording a retry of `redrive_id` applied: `retry/<id>`. A
    `/` is in no request id, so the row never meets a trigger's, backfill's or pause's, nor
    the `redrive:<partition>@<offset>` row a redriving client writes (client/dead.py)."""
    return f"{RETRY_REQUEST}/{redrive_id}"


STORED = "stored"
"""`outcome` label of chronowheel_ingested_total: the command changed what is stored."""
UNCHANGED = "unchanged"
"""`outcome` label: nothing to change (an identical re-submit, a command re-delivered after a
takeover that was applied before, a cancel of an unknown or finished job)."""


class Read:
    """Marker: the command reads the job's row itself."""


READ = Read()


def unchanged(row: JobRow | None, job: JobSpec) -> bool:
    """Whether an upsert of `job` is an identical re-submit of what `row` stores: a no-op."""
    return row is not None and row.status != "cancelled" and row.spec == job.canonical


class Transitions:
    def __init__(self, *, state: ShardState, store: JobStore, writer: RowWriter, clock: Clock,
                 metrics: NodeMetrics, policy: ValidationPolicy, calendars: Calendars,
                 rejections: Rejections, counted: Set[int], namespace: str,
                 history: Callable[[], RunHistoryStore | None] = lambda: None) -> None:
        self.state = state
        self.shard = state.shard
        self.store = store
        self.writer = writer
        self.clock = clock
        self.metrics = metrics
        self.stored_policy = stored_policy(policy)
        self.calendars = calendars
        self.rejections = rejections
        self.counted = counted
        """Minutes whose bucket counts the current batch already raised (ingest's precount)."""
        self.auto_paused = metrics.auto_paused.labels(namespace)
        """Jobs this shard paused after their `pause_after_failures` failed runs."""
        self.history = history
        """The node's run history store, None when it records none (a conditional pause,
        `after_failures`, reads the job's streak in it)."""

    async def apply(self, cmd: Command, now: int, existing: JobRow | Read | None) -> None:
        """One command; `existing` is the job's row read under its lock, or READ to read it
        here (a later command of the same job in one step)."""
        if isinstance(cmd, Retry):
            changed = await self._retry(cmd, now)
        elif isinstance(cmd, PutCalendar | DeleteCalendar):
            raise AssertionError("calendar commands are applied by Ingest._apply_calendars")
        else:
            job_id = routing_key(cmd)
            row = await self.store.get_job(job_id) if isinstance(existing, Read) else existing
            # A row read here (a later command of the job in this step) may name a slot that
            # an earlier command of the step wrote, which ingest's hold does not cover: held as
            # ingest holds the rows it read, with no await between the read and the hold.
            pending = [(row.slot_ms, None if row.scheduled_ms is None
                        else (row.job_id, row.scheduled_ms, 1))] \
                if isinstance(existing, Read) and row is not None \
                and row.status == "scheduled" and row.slot_ms is not None else []
            with self.state.holding(pending):
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
        if unchanged(existing, job):
            return False  # identical re-submit: a no-op, also after the job fired
        version = existing.version + 1 if existing is not None else 1
        first = (next_after(self.calendars.schedule(job), now, inclusive=True)
                 if job.recurring else job.at_ms)
        if first is None:  # a recurring job whose end has passed
            old_key = await self._remove_pending(existing)
            await self.store.put_job(replace(
                self.writer.finished(job.id, job.canonical, version, job.tenant),
                note=_cleared(existing)))
            self.state.apply_job_change(job.id, old_key, None)
            return True
        if existing is not None and existing.status == "paused":
            # The new spec is stored, the job stays paused: a resume starts from `first`.
            await self.store.put_job(JobRow(job.id, self.shard, job.canonical, version,
                                            "paused", first, None, 0, job.tenant))
            self.state.apply_job_change(job.id, None, None)
            return True
        await self._schedule(job, first, version, now, replacing=existing, precounted=True)
        return True

    async def _schedule(self, job: JobSpec, first: int, version: int, now: int, *,
                        replacing: JobRow | None, precounted: bool,
                        clear_note: bool = False) -> None:
        """Store version `version` of the job as scheduled at `first` and put it in the wheel:
        an upsert's new version (`replacing` the stored row, whose unpublished due row goes in
        the same logged batch, so an edit the store refuses leaves it as it was), or a paused
        job resumed. `precounted`: the batch's precount may have counted its row already."""
        state = self.state
        # A first occurrence long overdue gets a slot of now; dispatch measures its lateness
        # from its own slot and applies the job's catch-up policy (`Dispatcher`).
        slot = state.claim_slot(slot_for(job.id, first, job.window_ms), self.clock.now_ms())
        try:
            due, job_row = self.writer.scheduled(job, slot=slot, first=first, version=version,
                                                 now=now)
            if clear_note:
                job_row = replace(job_row, note=CLEAR_NOTE)
            old_key, replaces = self._pending_of(replacing)
            # write_due checks the limits before anything is written: an edit over a limit
            # leaves the old version as it is.
            await self.writer.write_due(due, now, job_row,
                                        counted=precounted and due.minute in self.counted,
                                        replaces=replaces)
            state.apply_job_change(job.id, old_key, pending_from_row(due))
        finally:
            state.release_slot(slot)

    def _pending_of(self, existing: JobRow | None) -> tuple[OccurrenceKey | None,
                                                            RetiredDue | None]:
        """The wheel key of the job's scheduled occurrence, and its due row to retire when
        that row is not published yet (a new version must take it back)."""
        if existing is None or existing.status != "scheduled" or existing.slot_ms is None \
                or existing.scheduled_ms is None:
            return None, None
        retired = None
        key = (existing.job_id, existing.scheduled_ms, 1)
        # Not published yet: beyond the watermark, or waiting in the catch-up queue.
        if self.state.unpublished(existing.slot_ms, key):
            retired = RetiredDue((minute_of(existing.slot_ms), self.shard, existing.slot_ms,
                                  existing.job_id, 1), existing.version,
                                 self.writer.retired_ttl_s(existing.slot_ms,
                                                           self.clock.now_ms()))
        return key, retired

    async def _remove_pending(self, existing: JobRow | None) -> OccurrenceKey | None:
        old_key, retired = self._pending_of(existing)
        if retired is not None:
            await self.store.retire_due(retired)
        return old_key

    async def _cancel(self, job_id: str, existing: JobRow | None) -> bool:
        if existing is None or existing.status not in ("scheduled", "paused"):
            return False
        old_key = await self._remove_pending(existing)
        await self.store.put_job(JobRow(job_id, self.shard, existing.spec, existing.version + 1,
                                        "cancelled", None, None, self.writer.retention_s,
                                        existing.tenant, _cleared(existing)))
        self.state.apply_job_change(job_id, old_key, None)
        return True

    # --- schedule controls ------------------------------------------------------------------
    def _stored(self, row: JobRow) -> JobSpec:
        return decode_stored_job(row.spec, policy=self.stored_policy, now_ms=self.clock.now_ms())

    def _accepted(self, cmd: Pause | Resume | Trigger | Backfill, row: JobRow | None,
                  verb: str) -> JobRow | None:
        """The job's row when `cmd` can apply to it; otherwise None, `cmd` rejected."""
        if row is None:
            self.rejections.reject(cmd, f"id: no job {cmd.id!r} to {verb}")
            return None
        if row.status in ("finished", "cancelled"):
            self.rejections.reject(cmd, f"id: job {cmd.id!r} is {row.status}; there is nothing "
                                        f"to {verb}")
            return None
        if isinstance(cmd, Trigger | Backfill):
            reason = None
            if row.status == "paused":
                reason = f"id: job {cmd.id!r} is paused; resume it before it can be {verb}ed"
            elif not row.spec or orjson.loads(row.spec).get("at") is not None:
                reason = f"id: job {cmd.id!r} is a one-shot; only a recurring job can be {verb}ed"
            if reason is not None:
                self.rejections.reject(cmd, reason)
                return None
        return row

    async def _pause(self, cmd: Pause, row: JobRow | None) -> bool:
        if cmd.after_failures is not None and (row is None
                                               or row.status in ("finished", "cancelled")):
            # A worker's report of a failed run of a job that has ended (its last occurrence
            # still ran): nothing to pause, and no one's mistake to reject.
            return False
        row = self._accepted(cmd, row, "pause")
        if row is None:
            return False
        if row.status == "paused":
            return False
        if cmd.request_id is not None and await self.store.get_request(
                self.shard, cmd.id, cmd.request_id) is not None:
            # Applied before (and perhaps resumed since): an auto-pause sent twice, or late,
            # by workers that counted the same streak pauses once.
            return False
        job = self._stored(row)
        if cmd.after_failures is not None and not await self._failed_enough(cmd, row, job):
            return False
        held = row.scheduled_ms  # the first occurrence the pause withholds
        if held is not None and row.slot_ms is not None \
                and not self.state.unpublished(row.slot_ms, (row.job_id, held, 1)):
            # That one is being published (or is out, for a one-shot): it goes; the pause
            # withholds the next. (One waiting in the catch-up queue is withheld.)
            held = next_after(schedule_of(job), held) if job.recurring else None
        if held is None:
            self.rejections.reject(cmd, f"id: job {cmd.id!r} has no occurrence left to pause"
                                        + ("" if job.recurring else " (a one-shot that has fired)"))
            return False
        old_key = await self._remove_pending(row)
        await self.store.put_job(JobRow(row.job_id, self.shard, row.spec, row.version + 1,
                                        "paused", held, None, 0, row.tenant,
                                        cmd.note if cmd.note is not None else _cleared(row)))
        self.state.apply_job_change(row.job_id, old_key, None)
        if cmd.request_id is not None:
            # After the jobs row: a crash in between re-applies the command, which finds the
            # job paused; never a request row without its pause.
            now = self.clock.now_ms()
            await self.store.put_request(RequestRow(
                self.shard, cmd.id, cmd.request_id, PAUSE_REQUEST, now, now, None, 0, 0,
                row.spec, self.writer.retention_s))
        if cmd.after_failures is not None:
            self.auto_paused.inc()
            log.warning("shard %d: job %s paused after %d consecutive failed runs: %s",
                        self.shard, cmd.id, cmd.after_failures, cmd.note or "",
                        extra={"shard": self.shard, "job_id": cmd.id})
        return True

    async def _failed_enough(self, cmd: Pause, row: JobRow, job: JobSpec) -> bool:
        """Whether the job's last `cmd.after_failures` runs failed, counted from the job's
        `since_ms` (so a resume, or an edit, starts a new streak) in its run history. Read
        here, under the job's lock, by the only writer of the job's state: two workers that
        each report a failed run, a report sent twice, or one that arrives after a resume,
        pause the job at most once for one streak. Without run history the command is
        rejected: the streak cannot be read."""
        assert cmd.after_failures is not None
        store = self.history()
        if store is None:
            self.rejections.reject(
                cmd, "after_failures: this node records no run history (setting run_history "
                     "off, or the namespace has no history tables): a job cannot be paused "
                     "after failed runs")
            return False
        n = cmd.after_failures
        recent = await store.job_runs(
            cmd.id, min(limits.AUTO_PAUSE_RUNS, 2 * n * max(1, job.max_attempts) + 10))
        streak = failure_streak(recent, job_id=cmd.id, since_ms=row.since_ms or 0)
        return streak.count >= n

    async def _resume(self, cmd: Resume, row: JobRow | None, now: int) -> bool:
        row = self._accepted(cmd, row, "resume")
        if row is None:
            return False
        if row.status != "paused" or row.scheduled_ms is None:
            return False  # not paused: nothing to do
        # A paused job has no pending occurrence to replace; resumes are not precounted.
        # The withheld occurrence starts the job's schedule again (`since_ms`): a streak of
        # failed runs counts from it, and the pause's note goes.
        await self._schedule(self._stored(row), row.scheduled_ms, row.version + 1, now,
                             replacing=None, precounted=False, clear_note=row.note is not None)
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
                self.rejections.reject(cmd, f"to: the range holds more than "
                                            f"{wire.MAX_BACKFILL_OCCURRENCES} occurrences (at "
                                            f"least {total} in [{cmd.from_ms}, {cmd.to_ms}))")
                return False
            at = next_after(schedule, at)
        if first is None or total == 0:
            self.rejections.reject(cmd, f"from: job {cmd.id!r} has no occurrence in "
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
        key = redrive_request_key(cmd.redrive_id) if cmd.redrive_id else None
        if key is not None and await self.store.get_request(self.shard, cmd.id, key) \
                is not None:
            # A dead letter's redrive applied before: a second copy (two redrives of the letter
            # at once, or one re-sent after a crash) delivers nothing more.
            log.info("shard %d: retry of job %s with redrive_id %s applied before; ignored",
                     self.shard, cmd.id, cmd.redrive_id,
                     extra={"shard": self.shard, "job_id": cmd.id})
            return False
        state = self.state
        slot = state.claim_slot(cmd.at_ms, self.clock.now_ms())
        try:
            row = DueRow.for_retry(cmd, shard=self.shard, slot_ms=slot)
            # A redrive's request row goes in one logged batch with the due row (both or
            # neither, so a retry re-applied after a takeover is recognised, never delivered
            # twice), and lives as long as it (the writer sets its TTL).
            request = None if key is None else RequestRow(
                self.shard, cmd.id, key, RETRY_REQUEST, now, now, None, 1, 1, b"", 0)
            await self.writer.write_due(row, now, counted=row.minute in self.counted,
                                        request=request)
            p = pending_from_row(row)
            if state.insert_bound(slot):
                state.wheel.insert(p, slot, p)
        finally:
            state.release_slot(slot)
        return True


def _cleared(row: JobRow | None) -> str | None:
    """The note of a row written over `row` that leaves the paused state: removed if there
    is one (else left unset: nothing to remove, no tombstone)."""
    return CLEAR_NOTE if row is not None and row.note is not None else None
