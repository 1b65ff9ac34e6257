"""Durable writes of due rows, shared by ingest (new jobs) and dispatch (a recurring job's next
occurrence)."""

from __future__ import annotations

import asyncio

from chronowheel.core.model import JobSpec
from chronowheel.core.recurrence import Schedule, compile_schedule
from chronowheel.store.base import DueRow, JobRow, JobStore


def schedule_of(job: JobSpec) -> Schedule:
    """The job's own recurrence, its `exclude_dates` included; a named calendar's dates are
    added by `node.calendars.Calendars`."""
    return compile_schedule(cron=job.cron, every_ms=job.every_ms, tz=job.tz,
                            start_ms=job.start_ms, end_ms=job.end_ms, dst=job.dst,
                            exclude_dates=job.exclude_dates)


class RowWriter:
    def __init__(self, store: JobStore, shard: int, retention_ms: int) -> None:
        self.store = store
        self.shard = shard
        self.retention_ms = retention_ms

    @property
    def retention_s(self) -> int:
        return max(1, self.retention_ms // 1000)

    def ttl_s(self, slot: int, now: int) -> int:
        """A due row lives until its slot, then the retention period."""
        return max(1, (max(0, slot - now) + self.retention_ms) // 1000)

    def finished(self, job_id: str, spec: bytes, version: int, tenant: str | None) -> JobRow:
        return JobRow(job_id, self.shard, spec, version, "finished", None, None,
                      self.retention_s, tenant)

    async def write_due(self, row: DueRow, now: int, job: JobRow | None = None, *,
                        counted: bool = False) -> None:
        """Write a due row (with its jobs row, when given) and count it in its bucket."""
        # The bucket count is written before the row's wheel decision: the loader skips
        # minutes whose count is zero, so a row must never exist uncounted at that point.
        # The due row and the jobs row go in one logged batch: both or neither, so a command
        # re-delivered after a crash is never mistaken for an already-applied one.
        ttl = self.ttl_s(row.slot_ms, now)
        write = (self.store.put_due(row, ttl) if job is None
                 else self.store.put_due_and_job(row, ttl, job))
        if counted:
            await write
        else:
            await asyncio.gather(write, self.store.add_bucket_count(self.shard, row.minute, 1))
