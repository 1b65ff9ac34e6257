"""Ingest: apply a shard's submit commands, durable Cassandra writes first.

Records arrive from the node's pump (`enqueue`) in offset order. A batch is parsed, commands of
another shard are forwarded, the rest are applied per job in order (jobs concurrently), and
only then are the batch's outbox and next offset handed to the publisher: the offsets go in
the transaction that follows the writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Iterable

from chronowheel.bus.ports import SubmitRecord
from chronowheel.core.buckets import minute_of, slot_for
from chronowheel.core.clock import Clock
from chronowheel.core.model import (
    Cancel,
    Command,
    JobSpec,
    Retry,
    Upsert,
    ValidationPolicy,
    parse_command,
)
from chronowheel.core.recurrence import next_after
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, pending_from_row
from chronowheel.node.state import Outgoing, ShardState
from chronowheel.node.writes import RowWriter, schedule_of
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow, JobStore

log = logging.getLogger(__name__)


class Ingest:
    def __init__(self, *, state: ShardState, shards: int, settings: Settings, store: JobStore,
                 writer: RowWriter, clock: Clock, metrics: NodeMetrics,
                 policy: ValidationPolicy) -> None:
        self.state = state
        self.shard = state.shard
        self.shards = shards
        self.settings = settings
        self.store = store
        self.writer = writer
        self.clock = clock
        self.metrics = metrics
        self.policy = policy
        self.queue: deque[SubmitRecord] = deque()
        """Records fetched for this shard, not yet applied (the pump pauses on its length)."""
        self.next_offset: int | None = None
        """The offset expected next; records below it are re-deliveries after a seek."""
        self.counted: set[int] = set()
        """Minutes whose bucket counts the current batch already raised (`precount`), so its
        rows there do not count themselves again."""

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
        outbox: list[Outgoing] = []  # published with this batch's offsets, not before
        for rec in records:
            cmd = self._parse(rec, now, outbox)
            if cmd is None:
                continue
            job_id = cmd.job.id if isinstance(cmd, Upsert) else cmd.id
            target = shard_of(job_id, self.shards)
            if target != self.shard:
                outbox.append(Outgoing(self.settings.submit_topic, target, rec.key,
                                       rec.value or b"", list(rec.headers or ())))
                self.metrics.forwarded.inc()
                continue
            chains[job_id].append(cmd)
        await self._precount(chains, now)
        sem = asyncio.Semaphore(self.settings.ingest_concurrency)

        async def run_chain(job_id: str, cmds: list[Command]) -> None:
            async with sem, self.state.job_lock(job_id):
                for cmd in cmds:
                    await self._apply(cmd, self.clock.now_ms())

        await asyncio.gather(*(run_chain(j, c) for j, c in chains.items()))
        self.state.outbox.extend(outbox)
        self.state.offset_to_commit = records[-1].offset + 1
        self.state.wake.set()

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
        await asyncio.gather(*(self.store.add_bucket_count(self.shard, m, n)
                               for m, n in counts.items()))
        self.counted = set(counts)

    def _parse(self, rec: SubmitRecord, now: int, outbox: list[Outgoing]) -> Command | None:
        try:
            return parse_command(rec.value or b"", key=rec.key, policy=self.policy, now_ms=now)
        except ValidationError as exc:
            reason = str(exc)
        except Exception as exc:  # a parser bug must not stop the pipeline either
            log.exception("shard %d: parser failed on offset %d", self.shard, rec.offset)
            reason = f"internal error while validating: {type(exc).__name__}: {exc}"
        outbox.append(Outgoing(
            self.settings.rejected_topic, None, rec.key, rec.value or b"",
            [("cw-reason", reason.encode()),
             ("cw-source-topic", rec.topic.encode()),
             ("cw-source-partition", str(rec.partition).encode()),
             ("cw-source-offset", str(rec.offset).encode())]))
        self.metrics.rejected.inc()
        log.info("shard %d: rejected offset %d: %s", self.shard, rec.offset, reason,
                 extra={"shard": self.shard, "offset": rec.offset, "partition": rec.partition})
        return None

    async def _apply(self, cmd: Command, now: int) -> None:
        if isinstance(cmd, Upsert):
            await self._upsert(cmd.job, now)
        elif isinstance(cmd, Cancel):
            await self._cancel(cmd.id)
        else:
            await self._retry(cmd, now)
        self.metrics.ingested.labels(cmd.op).inc()

    async def _upsert(self, job: JobSpec, now: int) -> None:
        existing = await self.store.get_job(job.id)
        if existing is not None and existing.status != "cancelled" \
                and existing.spec == job.canonical:
            return  # identical re-submit: a no-op, also after the job fired
        version = existing.version + 1 if existing is not None else 1
        first = (next_after(schedule_of(job), now, inclusive=True) if job.recurring
                 else job.at_ms)
        old_key = await self._remove_pending(existing)
        if first is None:  # a recurring job whose end has passed
            await self.store.put_job(self.writer.finished(job.id, job.canonical, version))
            self.state.apply_job_change(job.id, old_key, None)
            return
        state = self.state
        slot = state.claim_slot(slot_for(job.id, first, job.window_ms), self.clock.now_ms())
        try:
            row = DueRow(minute_of(slot), self.shard, slot, job.id, 1, first, version,
                         job.topic, job.payload, job.headers,
                         job.canonical if job.recurring else None, job.max_attempts,
                         job.backoff_ms)
            # A one-shot's jobs row outlives its occurrence by the retention period (so an
            # identical re-submit stays a no-op that long); a recurring one lives until changed.
            ttl = 0 if job.recurring else self.writer.ttl_s(slot, now)
            await self.writer.write_due(row, now, JobRow(job.id, self.shard, job.canonical,
                                                         version, "scheduled", first, slot, ttl),
                                        counted=row.minute in self.counted)
            state.apply_job_change(job.id, old_key, pending_from_row(row))
        finally:
            state.release_slot(slot)

    async def _remove_pending(self, existing: JobRow | None) -> OccurrenceKey | None:
        if existing is None or existing.status != "scheduled" or existing.slot_ms is None \
                or existing.scheduled_ms is None:
            return None
        if existing.slot_ms > self.state.watermark:  # not published yet: delete the row
            await self.store.delete_due(minute_of(existing.slot_ms), self.shard,
                                        existing.slot_ms, existing.job_id, 1)
        return (existing.job_id, existing.scheduled_ms, 1)

    async def _cancel(self, job_id: str) -> None:
        existing = await self.store.get_job(job_id)
        if existing is None or existing.status != "scheduled":
            return
        old_key = await self._remove_pending(existing)
        await self.store.put_job(JobRow(job_id, self.shard, existing.spec, existing.version + 1,
                                        "cancelled", None, None, self.writer.retention_s))
        self.state.apply_job_change(job_id, old_key, None)

    async def _retry(self, cmd: Retry, now: int) -> None:
        state = self.state
        slot = state.claim_slot(cmd.at_ms, self.clock.now_ms())
        try:
            row = DueRow(minute_of(slot), self.shard, slot, cmd.id, cmd.attempt,
                         cmd.scheduled_ms, 0, cmd.topic, cmd.payload, cmd.headers, None,
                         cmd.max_attempts if cmd.max_attempts is not None else 5,
                         cmd.backoff_ms if cmd.backoff_ms is not None else 10_000)
            await self.writer.write_due(row, now, counted=row.minute in self.counted)
            p = pending_from_row(row)
            if state.insert_bound(slot):
                state.wheel.insert(p.wheel_key, slot, p)
        finally:
            state.release_slot(slot)

