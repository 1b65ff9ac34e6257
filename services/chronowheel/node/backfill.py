"""Backfill: hand a shard's backfill requests to the due table, a bounded chunk per cycle.

Ingest validates a backfill and stores its request row (`job_requests`), with `next_ms` the
first scheduled instant of the range. This task then moves the occurrences into `due` a few at a
time: each logged batch holds a chunk of due rows and the request row with `next_ms` advanced
past them, so after a crash the new owner resumes exactly where the batch log says, and the
rows themselves are published by dispatch like any other (the watermark makes that exactly
once). All rows of one chunk share one slot a little ahead of now: their entries (their own
occurrence keys) keep them apart.

Pacing: at most `backfill_rows_per_cycle` rows per `backfill_cycle_ms`, and none in a cycle
that finds an on-time occurrence waiting in the wheel (due but not yet dispatched) or the
loaded horizon behind now: a backfill never delays on-time firing by more than one chunk.
"""

# mypy: strict-equality
# (a job status compared with a string no JobStatus can be is an error)
from __future__ import annotations

import logging
from dataclasses import replace

from chronowheel.core import wire
from chronowheel.core.buckets import minute_of
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.core.model import JobSpec, ValidationPolicy, decode_stored_job
from chronowheel.core.recurrence import next_after
from chronowheel.node.dispatch import stored_policy
from chronowheel.node.pending import pending_from_row
from chronowheel.node.state import ShardState
from chronowheel.node.writes import RowWriter, schedule_of
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobStore, RequestRow

log = logging.getLogger(__name__)

# A due row of a backfill costs about this much of a logged batch besides its payload, its
# occurrence key and request id (spec-free); the chunk's request row, which carries the job's
# spec, about REQUEST_OVERHEAD_BYTES besides it. Measured against the size Cassandra 5.0 names
# in its batch size warning: 270 and 307 bytes (a 60-byte payload, a 179-byte spec: 12 rows
# and the request row counted 5,478 bytes, over the 5 KiB warn threshold, when the chunk was
# sized by 300 bytes a row and nothing for the request row).
ROW_OVERHEAD_BYTES = 300
REQUEST_OVERHEAD_BYTES = 340


class Backfiller:
    def __init__(self, *, state: ShardState, settings: Settings, store: JobStore,
                 writer: RowWriter, clock: Clock, policy: ValidationPolicy) -> None:
        self.state = state
        self.shard = state.shard
        self.settings = settings
        self.store = store
        self.writer = writer
        self.clock = clock
        self.stored_policy = stored_policy(policy)

    async def resume(self) -> None:
        """After a takeover: pick up the shard's unfinished backfills."""
        for request in await self.store.shard_requests(self.shard):
            if request.kind == wire.BACKFILL_ORIGIN and request.next_ms is not None:
                self.state.backfills[(request.job_id, request.request_id)] = request

    async def run(self) -> None:
        await self.resume()
        state = self.state
        while not state.stopping:
            if not state.backfills:
                state.backfill_wake.clear()
                await state.backfill_wake.wait()
                continue
            await self.step()
            await sleep_until_or_event(self.clock,
                                       self.clock.now_ms() + self.settings.backfill_cycle_ms,
                                       state.loader_wake)

    def on_time_work_waiting(self, now: int) -> bool:
        """Whether dispatch is behind: something due sits in the wheel, or the loader has not
        read up to now. Backfills wait for it to catch up."""
        state = self.state
        due = state.wheel.next_deadline()
        return (due is not None and due <= now) or state.horizon_ms < now

    async def step(self) -> int:
        """One cycle: hand over up to `backfill_rows_per_cycle` occurrences; how many."""
        budget = self.settings.backfill_rows_per_cycle
        handed = 0
        for key, request in list(self.state.backfills.items()):
            if handed >= budget or self.state.stopping:
                break
            if self.on_time_work_waiting(self.clock.now_ms()):
                break
            async with self.state.job_lock(request.job_id):
                current = await self.store.get_job(request.job_id)
                if current is not None and current.status == "paused":
                    continue  # a paused job publishes nothing: the backfill waits for resume
                if current is None or current.status != "scheduled":
                    # Cancelled or finished meanwhile: the rest of the range is dropped.
                    await self.store.put_request(replace(request, next_ms=None,
                                                         ttl_s=self.writer.retention_s))
                    del self.state.backfills[key]
                    log.info("shard %d: backfill %s of job %s stopped after %d of %d: the job "
                             "is no longer scheduled", self.shard, request.request_id,
                             request.job_id, request.handed, request.total)
                    continue
                handed += await self._hand_over(key, request, budget - handed)
        return handed

    async def _hand_over(self, key: tuple[str, str], request: RequestRow, budget: int) -> int:
        job = decode_stored_job(request.spec, policy=self.stored_policy,
                                now_ms=self.clock.now_ms())
        schedule = schedule_of(job)
        # A chunk's rows and its request row go in one logged batch: keep it under about
        # ingest_group_bytes, as ingest's groups (under batch_size_warn_threshold).
        entry = wire.requested_occurrence_id(job.id, request.to_ms, wire.BACKFILL_ORIGIN,
                                             request.request_id)
        cost = (len(job.payload) + ROW_OVERHEAD_BYTES + len(entry.encode())
                + len(wire.BACKFILL_ORIGIN) + len(request.request_id.encode())
                + sum(len(k) + len(v) + 8 for k, v in job.headers))
        room = self.settings.ingest_group_bytes - len(request.spec) - REQUEST_OVERHEAD_BYTES
        per_batch = max(1, room // cost)
        handed = 0
        while handed < budget and request.next_ms is not None:
            instants: list[int] = []
            at: int | None = request.next_ms
            while at is not None and at < request.to_ms \
                    and len(instants) < min(per_batch, budget - handed):
                instants.append(at)
                at = next_after(schedule, at)
            following = at if at is not None and at < request.to_ms else None
            request = await self._write_chunk(request, job, instants, following)
            handed += len(instants)
        if request.next_ms is None:
            del self.state.backfills[key]
            log.info("shard %d: backfill %s of job %s handed over all %d occurrences",
                     self.shard, request.request_id, request.job_id, request.total)
        else:
            self.state.backfills[key] = request
        return handed

    async def _write_chunk(self, request: RequestRow, job: JobSpec, instants: list[int],
                           following: int | None) -> RequestRow:
        state = self.state
        now = self.clock.now_ms()
        slot = state.claim_slot(now, now)
        try:
            rows = [DueRow.for_request(job, shard=self.shard, slot_ms=slot, scheduled_ms=at,
                                       version=0, origin=wire.BACKFILL_ORIGIN,
                                       request_id=request.request_id) for at in instants]
            advanced = replace(request, next_ms=following, handed=request.handed + len(rows),
                               ttl_s=self.writer.retention_s)
            ttl = self.writer.ttl_s(slot, now)
            # The count first: the loader skips a minute counted zero.
            await self.store.add_bucket_count(self.shard, minute_of(slot), len(rows))
            await self.store.put_request(advanced, [(row, ttl) for row in rows])
            if state.insert_bound(slot):
                for row in rows:
                    p = pending_from_row(row)
                    state.wheel.insert(p, slot, p)
            state.wake.set()
        finally:
            state.release_slot(slot)
        return advanced
