"""The shard actor: one single-writer loop per owned shard.

Three tasks share the shard's state (one event loop, so no threads): the dispatch loop takes
due occurrences out of the wheel and publishes them, the rejected/forwarded commands, the
shard's new watermark and the submit offsets of fully applied commands in ONE Kafka
transaction; the ingest task applies submit commands (durable Cassandra writes first); the
loader task keeps the wheel filled from Cassandra's minute buckets ahead of time. Ingest and
dispatch run concurrently so a burst of submissions does not delay firing; a per-job lock
orders what both do to one job.

Invariants (they carry the contract's musts):
- `watermark`: every due row of this shard with slot <= watermark has been published (or is in
  the transaction being committed). Ingest never writes a slot <= watermark; the loader never
  puts a row with slot <= watermark into the wheel; so nothing is published twice.
- `horizon_ms`: every due row with slot <= horizon_ms is in the wheel (or already published).
  Dispatch never looks past min(now, horizon_ms), so nothing is skipped and nothing is early.
- Offsets are sent only in the transaction that follows the commands' durable writes.
- An ingest write in flight holds the dispatch limit below its slot (`_ingest_slots`), so the
  watermark can never pass a row that is not in the wheel yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from chronowheel.bus.kafka import reader, transactional_producer
from chronowheel.core.buckets import MINUTE_MS, minute_of, slot_for
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.core.model import (
    Cancel,
    Command,
    JobSpec,
    Retry,
    Upsert,
    ValidationPolicy,
    parse_command,
)
from chronowheel.core.recurrence import Schedule, catch_up, compile_schedule, next_after
from chronowheel.core.shard import shard_of
from chronowheel.core.wheel import TimingWheel
from chronowheel.errors import ChronowheelError, ValidationError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, Pending, pending_from_row, with_schedule
from chronowheel.retry import with_retries
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow, JobStore

log = logging.getLogger(__name__)

# A recurring occurrence fired at most this late counts as on time; later ones went missing
# (outage) and the job's catch-up policy decides what fires.
CATCH_UP_GRACE_MS = 60_000
# With nothing to publish, still commit the advancing watermark this often, so a takeover
# reloads little.
IDLE_WATERMARK_COMMIT_MS = 2_000
# When the loaded horizon trails its target by more than this, empty minutes are skipped by
# their bucket counts instead of being read one partition at a time.
SKIP_EMPTY_AFTER_MS = 10 * 60_000
IDLE_COMMIT_CLEARANCE_MS = 250
INGEST_BATCH = 2_000
INGEST_CONCURRENCY = 64
# A command due in the past (or within this margin) gets a slot this far ahead, so that its
# own write normally completes before dispatch reaches it instead of holding dispatch back.
INGEST_SLACK_MS = 50
# On a graceful stop, wait this long at most for the ingest batch in flight.
STOP_DRAIN_MS = 20_000
# Without a watermark record (never initialised, or the state topic lost it), reload this far.
MISSING_WATERMARK_LOOKBACK_MS = 3_600_000
_FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)


class ShardLost(ChronowheelError):
    """Another node owns this shard now (our producer was fenced)."""


@dataclass(slots=True)
class Outgoing:
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


class ShardActor:
    def __init__(self, *, shard: int, shards: int, settings: Settings, store: JobStore,
                 consumer: AIOKafkaConsumer, clock: Clock, metrics: NodeMetrics,
                 policy: ValidationPolicy, group_id: str, node_id: str,
                 dispatch_blocked: Callable[[], bool]) -> None:
        self.shard = shard
        self.shards = shards
        self.settings = settings
        self.store = store
        self.consumer = consumer
        self.clock = clock
        self.metrics = metrics
        self.policy = policy
        # Specs already accepted stay valid if the operator tightens limits or the allowlist.
        self.stored_policy = ValidationPolicy(
            namespace=policy.namespace, allowed_topic_pattern=".*",
            max_id_bytes=1 << 20, max_payload_bytes=1 << 30, max_horizon_ms=1 << 60,
            max_max_catch_up=policy.max_max_catch_up, max_headers_bytes=1 << 30)
        self.group_id = group_id
        self.node_id = node_id
        self.dispatch_blocked = dispatch_blocked
        self.tp = TopicPartition(settings.submit_topic, shard)
        self.label = str(shard)

        self.wheel: TimingWheel[OccurrenceKey, Pending] = TimingWheel(
            start_ms=clock.now_ms(), tick_ms=settings.tick_ms)
        self.queue: deque[Any] = deque()
        self.wake = asyncio.Event()          # wakes the dispatch loop
        self.ingest_wake = asyncio.Event()   # wakes the ingest task
        self.ready = False
        self.stopping = False
        self.producer: AIOKafkaProducer | None = None

        self.watermark = 0
        self.committed_watermark = 0
        self.last_commit_ms = 0
        self.horizon_ms = 0
        self.reading_upto = 0
        self.loaded_minutes: set[int] = set()  # hot minutes beyond the horizon, (being) loaded
        self.prewarmed: set[int] = set()
        self.touch_seq = 0
        self.touched: dict[str, int] = {}
        self.reads_in_flight = 0
        self.loader_wake = asyncio.Event()

        self.next_offset: int | None = None
        self.offset_to_commit: int | None = None
        self.outbox: list[Outgoing] = []
        self._ingest_slots: dict[int, int] = {}  # slot -> ingest writes in flight for it
        self._counted: set[int] = set()  # minutes the current ingest batch already counted
        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        self._partitions: dict[str, int] = {}
        self._schedules: OrderedDict[bytes, tuple[JobSpec, Schedule]] = OrderedDict()
        self._stopped = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------
    def enqueue(self, records: Iterable[Any]) -> None:
        self.queue.extend(records)
        self.ingest_wake.set()

    async def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        self.ingest_wake.set()
        self.loader_wake.set()
        await self._stopped.wait()

    async def run(self) -> None:
        helpers: list[asyncio.Task[None]] = []
        try:
            await self._takeover()
            helpers = [
                asyncio.create_task(self._loader_loop(), name=f"loader-{self.shard}"),
                asyncio.create_task(self._ingest_loop(), name=f"ingest-{self.shard}"),
            ]
            while not self.stopping:
                self.wake.clear()
                for task in helpers:
                    if task.done():
                        task.result()  # a failed helper fails the shard loudly
                        raise RuntimeError(f"shard {self.shard}: {task.get_name()} stopped")
                await self._dispatch_step()
                self._update_gauges()
                await self._wait()
            # Graceful stop: let ingest finish its batch, still dispatching what comes due
            # meanwhile (the shard is ours until the stop returns), then commit what is done.
            ingest = helpers[1]
            give_up = self.clock.now_ms() + STOP_DRAIN_MS
            while not ingest.done():
                if self.clock.now_ms() > give_up:
                    raise ChronowheelError(f"shard {self.shard}: ingest did not finish its "
                                           f"batch within {STOP_DRAIN_MS} ms of the stop")
                await self._dispatch_step()
                self._update_gauges()
                nd = self.wheel.next_deadline()
                pause_ms = 50 if nd is None or self.dispatch_blocked() else \
                    min(50, max(1, nd - self.clock.now_ms()))
                await asyncio.wait({ingest}, timeout=pause_ms / 1000)
            ingest.result()
            await self._dispatch_step(final=True)
        finally:
            self.ready = False
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.producer is not None:
                with contextlib.suppress(Exception):
                    await self.producer.stop()
            self.metrics.wheel_entries.labels(self.label).set(0)
            self._stopped.set()

    async def _takeover(self) -> None:
        txn_id = f"{self.settings.namespace}-shard-{self.shard}"
        producer = transactional_producer(self.settings, txn_id)
        # init_transactions bumps the epoch of this transactional.id: the previous owner is
        # fenced from here on, and its open transaction (if any) is aborted.
        await with_retries(producer.start, f"shard {self.shard}: init transactional producer")
        self.producer = producer
        w = await self._read_watermark()
        self.watermark = self.committed_watermark = w
        self.horizon_ms = self.reading_upto = w
        self.last_commit_ms = self.clock.now_ms()
        committed = await self.consumer.committed(self.tp)
        if committed is None:
            await self.consumer.seek_to_beginning(self.tp)
            self.next_offset = None
        else:
            self.consumer.seek(self.tp, committed)
            self.next_offset = committed
        self.queue.clear()
        self.ready = True
        log.info("shard %d: taken over (watermark %d, submit offset %s)", self.shard, w,
                 committed, extra={"shard": self.shard, "node": self.node_id})

    async def _read_watermark(self) -> int:
        tp = TopicPartition(self.settings.state_topic, self.shard)
        consumer = reader(self.settings)
        await consumer.start()
        try:
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            await consumer.seek_to_beginning(tp)
            found: int | None = None
            deadline = self.clock.now_ms() + 30_000
            while await consumer.position(tp) < end:
                if self.clock.now_ms() > deadline:
                    raise ChronowheelError(f"shard {self.shard}: timed out reading watermark")
                batch = await consumer.getmany(tp, timeout_ms=500)
                for msg in batch.get(tp, []):
                    if msg.key == state_key(self.shard) and msg.value:
                        found = int(orjson.loads(msg.value)["watermark"])
        finally:
            await consumer.stop()
        if found is None:
            found = self.clock.now_ms() - MISSING_WATERMARK_LOOKBACK_MS
            log.warning("shard %d: no watermark in %s; loading from %d (1 hour back)",
                        self.shard, self.settings.state_topic, found)
        return found

    # --- ingest ---------------------------------------------------------------------------
    async def _ingest_loop(self) -> None:
        while not self.stopping:
            if not self.queue:
                self.ingest_wake.clear()
                await self.ingest_wake.wait()
                continue
            await self._ingest_step()

    async def _ingest_step(self) -> None:
        if not self.queue:
            return
        records: list[Any] = []
        while self.queue and len(records) < INGEST_BATCH:
            rec = self.queue.popleft()
            if self.next_offset is not None:
                if rec.offset < self.next_offset:
                    continue  # already seen (re-delivery after a seek)
                if rec.offset > self.next_offset:
                    # Read_committed skips aborted records and control markers, so gaps are
                    # normal; only a gap caused by our own dropped records would matter, and
                    # the pump never drops records of a ready shard.
                    pass
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
                                       rec.value, list(rec.headers or ())))
                self.metrics.forwarded.inc()
                continue
            chains[job_id].append(cmd)
        await self._precount(chains, now)
        sem = asyncio.Semaphore(INGEST_CONCURRENCY)

        async def run_chain(job_id: str, cmds: list[Command]) -> None:
            async with sem, self._job_lock(job_id):
                for cmd in cmds:
                    await self._apply(cmd, self.clock.now_ms())

        await asyncio.gather(*(run_chain(j, c) for j, c in chains.items()))
        self.outbox.extend(outbox)
        self.offset_to_commit = records[-1].offset + 1
        self.wake.set()

    async def _precount(self, chains: dict[str, list[Command]], now: int) -> None:
        """Count the batch's rows per minute before writing any of them: one counter update
        per minute instead of one per row. A row whose slot lands elsewhere when it is
        written (time moved on) counts itself (`_write_due`); over-counting is harmless."""
        counts: dict[int, int] = defaultdict(int)
        floor = max(self.watermark + 1, now + INGEST_SLACK_MS)
        for cmds in chains.values():
            for cmd in cmds:
                if isinstance(cmd, Upsert):
                    job = cmd.job
                    first = (next_after(self._schedule(job), now, inclusive=True)
                             if job.recurring else job.at_ms)
                    if first is not None:
                        counts[minute_of(max(slot_for(job.id, first, job.window_ms),
                                             floor))] += 1
                elif isinstance(cmd, Retry):
                    counts[minute_of(max(cmd.at_ms, floor))] += 1
        await asyncio.gather(*(self.store.add_bucket_count(self.shard, m, n)
                               for m, n in counts.items()))
        self._counted = set(counts)

    def _parse(self, rec: Any, now: int, outbox: list[Outgoing]) -> Command | None:
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

    @contextlib.asynccontextmanager
    async def _job_lock(self, job_id: str) -> AsyncIterator[None]:
        lock = self._locks.get(job_id)
        if lock is None:
            lock = self._locks[job_id] = asyncio.Lock()
        self._lock_users[job_id] = self._lock_users.get(job_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            left = self._lock_users[job_id] - 1
            if left:
                self._lock_users[job_id] = left
            else:
                del self._lock_users[job_id], self._locks[job_id]

    def _claim_slot(self, computed: int, now: int) -> int:
        """The slot for a row about to be written, held as a floor for dispatch until the
        row is in the wheel (see `_release_slot`)."""
        slot = max(computed, self.watermark + 1, now + INGEST_SLACK_MS)
        self._ingest_slots[slot] = self._ingest_slots.get(slot, 0) + 1
        return slot

    def _release_slot(self, slot: int) -> None:
        left = self._ingest_slots[slot] - 1
        if left:
            self._ingest_slots[slot] = left
        else:
            del self._ingest_slots[slot]
        self.wake.set()

    def _insert_bound(self, slot: int) -> bool:
        return slot <= max(self.horizon_ms, self.reading_upto) or \
            minute_of(slot) in self.loaded_minutes

    def _touch(self, job_id: str) -> None:
        # Loader pages read before this moment must not overwrite what ingest just decided.
        self.touch_seq += 1
        if self.reads_in_flight:
            self.touched[job_id] = self.touch_seq

    @property
    def _retention_s(self) -> int:
        return max(1, self.settings.retention_ms // 1000)

    def _ttl_s(self, slot: int, now: int) -> int:
        return max(1, (max(0, slot - now) + self.settings.retention_ms) // 1000)

    async def _upsert(self, job: JobSpec, now: int) -> None:
        existing = await self.store.get_job(job.id)
        if existing is not None and existing.status != "cancelled" \
                and existing.spec == job.canonical:
            return  # identical re-submit: a no-op, also after the job fired
        version = existing.version + 1 if existing is not None else 1
        first = (next_after(self._schedule(job), now, inclusive=True) if job.recurring
                 else job.at_ms)
        old_key = await self._remove_pending(existing)
        if first is None:  # a recurring job whose end has passed
            await self.store.put_job(JobRow(job.id, self.shard, job.canonical, version,
                                            "finished", None, None, self._retention_s))
            self._finish_ingest(job.id, old_key, None)
            return
        slot = self._claim_slot(slot_for(job.id, first, job.window_ms), self.clock.now_ms())
        try:
            row = DueRow(minute_of(slot), self.shard, slot, job.id, 1, first, version,
                         job.topic, job.payload, job.headers,
                         job.canonical if job.recurring else None, job.max_attempts,
                         job.backoff_ms)
            # A one-shot's jobs row outlives its occurrence by the retention period (so an
            # identical re-submit stays a no-op that long); a recurring one lives until changed.
            ttl = 0 if job.recurring else self._ttl_s(slot, now)
            await self._write_due(row, now, JobRow(job.id, self.shard, job.canonical, version,
                                                   "scheduled", first, slot, ttl),
                                  counted=row.minute in self._counted)
            self._finish_ingest(job.id, old_key, pending_from_row(row))
        finally:
            self._release_slot(slot)

    async def _remove_pending(self, existing: JobRow | None) -> OccurrenceKey | None:
        if existing is None or existing.status != "scheduled" or existing.slot_ms is None \
                or existing.scheduled_ms is None:
            return None
        if existing.slot_ms > self.watermark:  # not published yet: delete the pending row
            await self.store.delete_due(minute_of(existing.slot_ms), self.shard,
                                        existing.slot_ms, existing.job_id, 1)
        return (existing.job_id, existing.scheduled_ms, 1)

    def _finish_ingest(self, job_id: str, old_key: OccurrenceKey | None,
                       new: Pending | None) -> None:
        # All wheel changes of one command happen here, after its writes, with no await in
        # between, so a loader page applied meanwhile cannot leave a stale entry behind.
        if old_key is not None:
            self.wheel.cancel(old_key)
        if new is not None and self._insert_bound(new.slot_ms):
            self.wheel.insert(new.wheel_key, new.slot_ms, new)
        self._touch(job_id)
        self.wake.set()

    async def _cancel(self, job_id: str) -> None:
        existing = await self.store.get_job(job_id)
        if existing is None or existing.status != "scheduled":
            return
        old_key = await self._remove_pending(existing)
        await self.store.put_job(JobRow(job_id, self.shard, existing.spec, existing.version + 1,
                                        "cancelled", None, None, self._retention_s))
        self._finish_ingest(job_id, old_key, None)

    async def _retry(self, cmd: Retry, now: int) -> None:
        slot = self._claim_slot(cmd.at_ms, self.clock.now_ms())
        try:
            row = DueRow(minute_of(slot), self.shard, slot, cmd.id, cmd.attempt,
                         cmd.scheduled_ms, 0, cmd.topic, cmd.payload, cmd.headers, None,
                         cmd.max_attempts if cmd.max_attempts is not None else 5,
                         cmd.backoff_ms if cmd.backoff_ms is not None else 10_000)
            await self._write_due(row, now, counted=row.minute in self._counted)
            p = pending_from_row(row)
            if self._insert_bound(slot):
                self.wheel.insert(p.wheel_key, slot, p)
        finally:
            self._release_slot(slot)

    async def _write_due(self, row: DueRow, now: int, job: JobRow | None = None, *,
                         counted: bool = False) -> None:
        # The bucket count is written before the row's wheel decision: the loader skips
        # minutes whose count is zero, so a row must never exist uncounted at that point.
        # The due row and the jobs row go in one logged batch: both or neither, so a command
        # re-delivered after a crash is never mistaken for an already-applied one.
        ttl = self._ttl_s(row.slot_ms, now)
        write = (self.store.put_due(row, ttl) if job is None
                 else self.store.put_due_and_job(row, ttl, job))
        if counted:
            await write
        else:
            await asyncio.gather(write, self.store.add_bucket_count(self.shard, row.minute, 1))

    def _schedule(self, job: JobSpec) -> Schedule:
        return compile_schedule(cron=job.cron, every_ms=job.every_ms, tz=job.tz,
                                start_ms=job.start_ms, end_ms=job.end_ms, dst=job.dst)

    def _recurring(self, spec: bytes) -> tuple[JobSpec, Schedule]:
        hit = self._schedules.get(spec)
        if hit is not None:
            self._schedules.move_to_end(spec)
            return hit
        cmd = parse_command(b'{"v":1,"op":"upsert","job":' + spec + b"}", key=None,
                            policy=self.stored_policy, now_ms=self.clock.now_ms())
        assert isinstance(cmd, Upsert)
        hit = (cmd.job, self._schedule(cmd.job))
        self._schedules[spec] = hit
        if len(self._schedules) > 10_000:
            self._schedules.popitem(last=False)
        return hit

    # --- dispatch -------------------------------------------------------------------------
    async def _dispatch_step(self, *, final: bool = False) -> None:
        now = self.clock.now_ms()
        fired: list[Pending] = []
        if not self.dispatch_blocked():
            limit = min(now, self.horizon_ms)
            if self._ingest_slots:
                limit = min(limit, min(self._ingest_slots) - 1)
            if limit > self.watermark:
                fired = await self._take_due(limit, now)
        nd = self.wheel.next_deadline()
        idle_commit = (self.watermark > self.committed_watermark
                       and (final or (now - self.last_commit_ms >= IDLE_WATERMARK_COMMIT_MS
                                      # not right before a due entry: it would wait for it
                                      and (nd is None or nd > now + IDLE_COMMIT_CLEARANCE_MS))))
        if fired or self.outbox or self.offset_to_commit is not None or idle_commit:
            await self._commit(fired)

    async def _take_due(self, limit: int, now: int) -> list[Pending]:
        max_batch = self.settings.max_batch
        entries = self.wheel.advance(limit, max_batch)
        complete = len(entries) < max_batch
        if not complete:
            # Finish the last millisecond, so the watermark can say "all up to here".
            entries.extend(self.wheel.advance(entries[-1][0]))
            nd = self.wheel.next_deadline()
            complete = nd is None or nd > limit
        new_watermark = limit if complete else entries[-1][0]
        # Raise the watermark now, before any await: the loader must not re-insert these.
        self.watermark = max(self.watermark, new_watermark)
        fired: list[Pending] = []
        writes = []
        for _due, _key, p in entries:
            if p.spec is None:
                fired.append(p)
            else:
                writes.append(self._fire_recurring(p, now, fired))
        if writes:
            await asyncio.gather(*writes)
        return fired

    async def _fire_recurring(self, p: Pending, now: int, fired: list[Pending]) -> None:
        async with self._job_lock(p.job_id):
            current = await self.store.get_job(p.job_id)
            if current is None or current.status != "scheduled" or current.version != p.version \
                    or current.scheduled_ms != p.scheduled_ms:
                # Edited or cancelled while this occurrence was on its way out: it still goes
                # (an occurrence being published may run), but the old spec schedules nothing.
                fired.append(p)
                return
            await self._fire_recurring_locked(p, now, fired)

    async def _fire_recurring_locked(self, p: Pending, now: int, fired: list[Pending]) -> None:
        job, schedule = self._recurring(p.spec or b"")
        if now - p.slot_ms <= CATCH_UP_GRACE_MS:
            fires: tuple[int, ...] = (p.scheduled_ms,)
            nxt = next_after(schedule, p.scheduled_ms)
        else:
            cu = catch_up(schedule, policy=job.catch_up, max_catch_up=job.max_catch_up,
                          first_missed_ms=p.scheduled_ms, now_ms=now)
            fires, nxt = cu.fire, cu.next_ms
            if cu.coalesced:
                self.metrics.coalesced.inc()
            log.info("shard %d: job %s missed occurrences since %d; catch_up=%s fires %d",
                     self.shard, p.job_id, p.scheduled_ms, job.catch_up, len(fires),
                     extra={"shard": self.shard, "job_id": p.job_id})
        fired.extend(p if s == p.scheduled_ms else with_schedule(p, s) for s in fires)
        # The next occurrence is durable before the transaction that publishes this one.
        if nxt is None:
            await self.store.put_job(JobRow(p.job_id, self.shard, p.spec or b"", p.version,
                                            "finished", None, None, self._retention_s))
            self._touch(p.job_id)
            return
        slot = max(slot_for(p.job_id, nxt, job.window_ms), self.watermark + 1)
        row = DueRow(minute_of(slot), self.shard, slot, p.job_id, 1, nxt, p.version, p.topic,
                     p.payload, job.headers, p.spec, job.max_attempts, job.backoff_ms)
        await self._write_due(row, now, JobRow(p.job_id, self.shard, p.spec or b"", p.version,
                                               "scheduled", nxt, slot))
        self._finish_ingest(p.job_id, None, pending_from_row(row))

    async def _commit(self, fired: list[Pending]) -> None:
        producer = self.producer
        assert producer is not None
        started = self.clock.now_ms()
        watermark = self.watermark
        # Ingest keeps appending while the transaction is open: take what is there now.
        outbox, self.outbox = self.outbox, []
        offset, self.offset_to_commit = self.offset_to_commit, None
        try:
            await producer.begin_transaction()
            try:
                fired_at = str(self.clock.now_ms()).encode()
                batches: dict[tuple[str, int], Any] = {}
                dead: list[Outgoing] = []
                known = self._partitions
                for p in fired:
                    # Hot path (a herd is thousands of messages): dict lookups and a batch
                    # append; awaits only for an unknown topic or a full batch.
                    parts = known.get(p.topic) or await self._partition_count(p.topic)
                    if parts is None:
                        dead.append(self._undeliverable(p, fired_at))
                        continue
                    part = shard_of(p.job_id, parts)
                    headers = [*p.headers, ("cw-fired-at", fired_at)]
                    batch = batches.get((p.topic, part))
                    if batch is None or batch.append(key=p.key, value=p.payload, timestamp=None,
                                                     headers=headers) is None:
                        await self._append(producer, batches, p.topic, part, p.key, p.payload,
                                           headers)
                for out in (*outbox, *dead):
                    target = out.partition
                    if target is None:
                        n = await self._partition_count(out.topic) or 1
                        target = shard_of(out.key.decode("utf-8", "replace"), n) if out.key else 0
                    await self._append(producer, batches, out.topic, target, out.key, out.value,
                                       out.headers)
                await self._append(producer, batches, self.settings.state_topic, self.shard,
                                   state_key(self.shard), orjson.dumps(
                                       {"shard": self.shard, "watermark": watermark,
                                        "horizon": self.horizon_ms, "wheel": len(self.wheel),
                                        "node": self.node_id, "at": started}), [])
                for (topic, part), batch in batches.items():
                    await producer.send_batch(batch, topic, partition=part)
                if offset is not None:
                    await producer.send_offsets_to_transaction({self.tp: offset}, self.group_id)
                await producer.commit_transaction()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.abort_transaction()
                raise
        except _FENCED as exc:
            raise ShardLost(f"shard {self.shard}: fenced by a newer owner ({exc})") from exc
        except KafkaError as exc:
            # Crash-only recovery: the shard restarts from its committed watermark and offset.
            raise ChronowheelError(f"shard {self.shard}: transaction failed: {exc!r}") from exc
        done = self.clock.now_ms()
        self.metrics.txn_seconds.observe((done - started) / 1000)
        observe = self.metrics.lateness.observe
        for p in fired:
            observe(max(0, done - p.slot_ms) / 1000)
        self.metrics.fired.inc(len(fired))
        self.committed_watermark = watermark
        self.last_commit_ms = done

    async def _append(self, producer: AIOKafkaProducer, batches: dict[tuple[str, int], Any],
                      topic: str, part: int, key: bytes | None, value: bytes,
                      headers: list[tuple[str, bytes]]) -> None:
        batch = batches.get((topic, part))
        if batch is not None and batch.append(key=key, value=value, timestamp=None,
                                              headers=headers) is not None:
            return
        if batch is not None:
            await producer.send_batch(batch, topic, partition=part)  # full: ship it
        batch = batches[(topic, part)] = producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            raise ChronowheelError(f"message for {topic} too large for one batch")

    async def _partition_count(self, topic: str) -> int | None:
        n = self._partitions.get(topic)
        if n is not None:
            return n
        assert self.producer is not None
        try:
            parts = await asyncio.wait_for(self.producer.partitions_for(topic), 10)
        except (TimeoutError, KafkaError):
            return None
        if not parts:
            return None
        self._partitions[topic] = len(parts)
        return len(parts)

    def _undeliverable(self, p: Pending, fired_at: bytes) -> Outgoing:
        log.error("shard %d: target topic %s unavailable; %s dead-lettered", self.shard,
                  p.topic, p.job_id, extra={"shard": self.shard, "job_id": p.job_id,
                                            "occurrence": f"{p.job_id}@{p.scheduled_ms}"})
        return Outgoing(self.settings.dead_topic, None, p.key, p.payload,
                        [*p.headers, ("cw-fired-at", fired_at), ("cw-target-topic",
                                                                 p.topic.encode()),
                         ("cw-error", f"target topic {p.topic} is unavailable".encode())])

    async def _wait(self) -> None:
        if self.stopping:
            return
        now = self.clock.now_ms()
        wake_at = now + IDLE_WATERMARK_COMMIT_MS
        nd = self.wheel.next_deadline()
        # While dispatch is blocked (clock skew) due entries cannot go: the skew monitor
        # wakes us when it lifts, so only the idle commit interval bounds the sleep.
        if nd is not None and nd <= self.horizon_ms and not self.dispatch_blocked():
            wake_at = min(wake_at, nd)
        if wake_at <= now:
            await asyncio.sleep(0)
            return
        await sleep_until_or_event(self.clock, wake_at, self.wake)

    # --- loading --------------------------------------------------------------------------
    async def _loader_loop(self) -> None:
        while not self.stopping:
            self.loader_wake.clear()
            await self._load_horizon()
            await self._prewarm()
            await sleep_until_or_event(self.clock, self.clock.now_ms() + 500, self.loader_wake)

    async def _load_horizon(self) -> None:
        target = self.clock.now_ms() + self.settings.lookahead_ms
        cap = self.settings.bucket_cap_rows
        if target - self.horizon_ms > SKIP_EMPTY_AFTER_MS:
            await self._skip_empty_minutes(target)
        while self.horizon_ms < target and not self.stopping:
            if len(self.wheel) >= cap:
                return  # bounded memory: continue once dispatch has drained the wheel
            m = minute_of(self.horizon_ms + 1)
            if m in self.prewarmed:
                self.prewarmed.discard(m)
                self.loaded_minutes.discard(m)
                self.horizon_ms = m + MINUTE_MS - 1
                continue
            self.reading_upto = m + MINUTE_MS - 1
            last_slot = await self._read_minute(m, self.horizon_ms + 1, cap)
            if last_slot is not None:  # stopped at the cap inside this minute
                self.horizon_ms = max(self.horizon_ms, last_slot - 1)
            else:
                self.horizon_ms = m + MINUTE_MS - 1
            self.reading_upto = self.horizon_ms
            self.wake.set()

    async def _skip_empty_minutes(self, target: int) -> None:
        """Far behind (a long outage, a clock jump): jump over minutes that never had a row.

        Counts are written with every due row before its wheel decision, so a zero count means
        no row; rows written while the counts are read are inside `reading_upto` and ingest
        puts them into the wheel itself.
        """
        first = minute_of(self.horizon_ms + 1)
        last = minute_of(target)
        self.reading_upto = last + MINUTE_MS - 1
        self.reads_in_flight += 1
        try:
            counts = await self.store.bucket_counts(self.shard, first, last)
        finally:
            self.reads_in_flight -= 1
        nonempty = sorted(m for m, n in counts.items() if n > 0)
        next_full = nonempty[0] if nonempty else last
        if next_full > first:
            self.horizon_ms = max(self.horizon_ms, next_full - 1)
        self.reading_upto = self.horizon_ms

    async def _read_minute(self, minute: int, from_slot: int, cap: int | None) -> int | None:
        """Load one bucket into the wheel; with a cap, stop once the wheel holds that many.

        Returns the slot of the last row loaded when it stopped at the cap, else None.
        """
        self.reads_in_flight += 1
        seq0 = self.touch_seq + 1
        try:
            pages = self.store.read_bucket(minute, self.shard, from_slot_ms=from_slot,
                                           page_rows=self.settings.bucket_page_rows)
            async with contextlib.aclosing(pages):  # type: ignore[type-var]
                async for page in pages:
                    self._apply_rows(page, seq0)
                    if cap is not None and len(self.wheel) >= cap and page:
                        return page[-1].slot_ms
            return None
        finally:
            self.reads_in_flight -= 1
            if not self.reads_in_flight:
                self.touched.clear()

    def _apply_rows(self, rows: list[DueRow], seq0: int) -> None:
        watermark, touched, insert = self.watermark, self.touched, self.wheel.insert
        for row in rows:
            if row.slot_ms <= watermark:
                continue  # published already
            if row.attempt == 1 and touched.get(row.job_id, 0) >= seq0:
                continue  # ingest or dispatch changed this job after the read began
            p = pending_from_row(row)
            insert(p.wheel_key, p.slot_ms, p)

    async def _prewarm(self) -> None:
        s = self.settings
        if s.prewarm_ms <= s.lookahead_ms:
            return
        start = minute_of(self.horizon_ms + 1)  # the next minute to load may be hot too
        end = minute_of(self.clock.now_ms() + s.prewarm_ms)
        if start > end:
            return
        counts = await self.store.bucket_counts(self.shard, start, end)
        for minute in sorted(counts):
            rows = counts[minute]
            if rows <= s.hot_bucket_rows or minute in self.loaded_minutes \
                    or minute <= self.horizon_ms or self.stopping:
                continue
            if len(self.wheel) + rows > s.bucket_cap_rows:
                log.info("shard %d: hot bucket %d (%d rows) exceeds the memory cap; it will "
                         "be loaded in pages as it approaches", self.shard, minute, rows)
                continue
            self.loaded_minutes.add(minute)  # before the read: ingest inserts into it too
            t0 = self.clock.now_ms()
            await self._read_minute(minute, minute, None)
            self.prewarmed.add(minute)
            log.info("shard %d: pre-warmed hot bucket %d (%d rows counted) in %d ms, %.0f s "
                     "ahead", self.shard, minute, rows, self.clock.now_ms() - t0,
                     (minute - self.clock.now_ms()) / 1000)

    # --- observability --------------------------------------------------------------------
    def dispatch_lag_ms(self) -> int:
        now = self.clock.now_ms()
        oldest = self.wheel.next_deadline()
        lag: int = 0 if oldest is None else now - oldest
        if self.horizon_ms < now:
            lag = max(lag, now - self.horizon_ms)
        return max(0, lag)

    def _update_gauges(self) -> None:
        m, label = self.metrics, self.label
        m.wheel_entries.labels(label).set(len(self.wheel))
        m.loaded_horizon.labels(label).set(self.horizon_ms / 1000)
        m.watermark.labels(label).set(self.committed_watermark / 1000)
        m.prewarmed_buckets.labels(label).set(len(self.prewarmed))
        m.dispatch_lag.labels(label).set(self.dispatch_lag_ms() / 1000)


def state_key(shard: int) -> bytes:
    return f"shard-{shard}".encode()
