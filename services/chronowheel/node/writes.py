"""Durable writes of due rows, shared by ingest (new jobs) and dispatch (a recurring job's next
occurrence)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

from chronowheel.core import limits
from chronowheel.core.model import JobSpec
from chronowheel.core.recurrence import Schedule, compile_schedule
from chronowheel.errors import ValidationError
from chronowheel.store.base import DueRow, JobRow, JobStore, RequestRow, RetiredDue


def schedule_of(job: JobSpec) -> Schedule:
    """The job's own recurrence, its `exclude_dates` included; a named calendar's dates are
    added by `node.calendars.Calendars`."""
    return compile_schedule(cron=job.cron, every_ms=job.every_ms, tz=job.tz,
                            start_ms=job.start_ms, end_ms=job.end_ms, dst=job.dst,
                            exclude_dates=job.exclude_dates)


class RowWriter:
    def __init__(self, store: JobStore, shard: int, retention_ms: int,
                 batch_fail_bytes: int = limits.CASSANDRA_BATCH_FAIL_BYTES) -> None:
        self.store = store
        self.shard = shard
        self.retention_ms = retention_ms
        self.batch_fail_bytes = batch_fail_bytes

    def check(self, row: DueRow, now: int, job: JobRow | None = None,
              request: RequestRow | None = None, *, retiring: bool = False) -> None:
        """Raise ValidationError, naming the limit, when Cassandra would refuse this due row
        (with its jobs row, when given, and with the retirement of the job's old due row when
        `retiring`): a TTL over 20 years, or the logged batch over `batch_fail_bytes`. Called
        before anything of the command is written, so a command over a limit is rejected whole
        instead of failing half-way."""
        ttl = self.ttl_s(row.slot_ms, now)
        if ttl > limits.CASSANDRA_MAX_TTL_S:
            at = datetime.fromtimestamp(row.scheduled_ms / 1000, UTC).isoformat()
            raise ValidationError(
                "job", f"its next occurrence, {at}, is further ahead than Cassandra keeps a row "
                       f"(a TTL of at most {limits.CASSANDRA_MAX_TTL_S} s, 20 years, and the due "
                       f"row must live until its occurrence plus the retention period)")
        if request is not None:
            # The due row alone (no spec) with its request row, in one logged batch.
            size = limits.job_rows_bytes(
                job_id=row.job_id, topic=row.topic, payload_len=len(row.payload), spec_len=0,
                recurring=False, headers=row.headers) + len(request.request_id.encode())
            if size > self.batch_fail_bytes:
                raise ValidationError(
                    "payload_b64", f"the retry's due row and its request row take about {size} "
                                   f"bytes in one Cassandra batch, over the limit of "
                                   f"{self.batch_fail_bytes} (batch_size_fail_threshold, "
                                   f"setting store_batch_fail_bytes)")
        if job is not None:
            size = limits.job_rows_bytes(
                job_id=row.job_id, topic=row.topic, payload_len=len(row.payload),
                spec_len=len(job.spec), recurring=False,
                headers=row.headers) + len(row.spec or b"")
            if retiring:
                size += limits.retired_row_bytes(row.job_id)
            if size > self.batch_fail_bytes:
                raise ValidationError(
                    "job", f"its rows take about {size} bytes in one Cassandra batch, over "
                           f"the limit of {self.batch_fail_bytes} (batch_size_fail_threshold, "
                           f"setting store_batch_fail_bytes); the payload is stored twice, in "
                           f"the due row and in the job's spec")

    @property
    def retention_s(self) -> int:
        return max(1, self.retention_ms // 1000)

    def ttl_s(self, slot: int, now: int) -> int:
        """A due row lives until its slot, then the retention period."""
        return max(1, (max(0, slot - now) + self.retention_ms) // 1000)

    def retired_ttl_s(self, slot: int, now: int) -> int:
        """A retirement (`RetiredDue`) outlives the due row it hides: that row's TTL was
        counted from an earlier now and rounded down, so one second more (within the largest
        TTL Cassandra takes, which that row's TTL was checked against)."""
        return min(limits.CASSANDRA_MAX_TTL_S, self.ttl_s(slot, now) + 1)

    def scheduled(self, job: JobSpec, *, slot: int, first: int, version: int,
                  now: int) -> tuple[DueRow, JobRow]:
        """A version of the job scheduled at `first` (published at `slot`): its due row, and
        its jobs row saying so."""
        due = DueRow.for_job(job, shard=self.shard, slot_ms=slot, scheduled_ms=first,
                             version=version)
        # A one-shot's jobs row outlives its occurrence by the retention period (so an
        # identical re-submit stays a no-op that long); a recurring one lives until changed.
        ttl = 0 if job.recurring else self.ttl_s(slot, now)
        # `since_ms`: a streak of failed runs (auto-pause) counts from this version's first.
        return due, JobRow(job.id, self.shard, job.canonical, version, "scheduled", first, slot,
                           ttl, job.tenant, since_ms=first)

    def finished(self, job_id: str, spec: bytes, version: int, tenant: str | None) -> JobRow:
        return JobRow(job_id, self.shard, spec, version, "finished", None, None,
                      self.retention_s, tenant)

    async def write_due(self, row: DueRow, now: int, job: JobRow | None = None, *,
                        counted: bool = False, replaces: RetiredDue | None = None,
                        request: RequestRow | None = None) -> None:
        """Write a due row (with its jobs row, or a request row recording the command, when
        given) and count it in its bucket. A request row lives as long as the due row."""
        # The bucket count is written before the row's wheel decision: the loader skips
        # minutes whose count is zero, so a row must never exist uncounted at that point.
        # The due row and the jobs row go in one logged batch: both or neither, so a command
        # re-delivered after a crash is never mistaken for an already-applied one.
        assert job is None or request is None, "a due row goes with a jobs row or a request row"
        self.check(row, now, job, request,
                   retiring=replaces is not None and replaces.key != row.key)
        ttl = self.ttl_s(row.slot_ms, now)
        if request is not None:
            write = self.store.put_request(replace(request, ttl_s=ttl), [(row, ttl)])
        elif job is None:
            write = self.store.put_due(row, ttl)
        else:
            write = self.store.put_due_and_job(row, ttl, job, replaces)
        if counted:
            await write
        else:
            await asyncio.gather(write, self.store.add_bucket_count(self.shard, row.minute, 1))
