"""Ingest: apply a shard's submit commands, durable Cassandra writes first.

Records arrive from the node's pump (`enqueue`) in offset order. A batch is parsed, commands of
another shard are forwarded, the rest are applied per job in order (jobs concurrently), and
only then are the batch's outbox and next offset handed to the publisher: the offsets go in
the transaction that follows the writes.

This is the batch's front: it parses, routes and counts. New jobs are written in groups
(`node/ingest_batch.py`); everything else one command at a time (`node/transitions.py`);
refused and quarantined commands are collected for the batch's outbox (`node/rejections.py`).
New one-shots due soon are taken out of turn by the urgent lane (`node/urgent.py`), a second
task with parts of its own, so that a backlog does not hold them back.
"""

# mypy: strict-equality
# (a job status compared with a string no JobStatus can be is an error)
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from chronowheel.bus.ports import BusError, SubmitRecord
from chronowheel.core import wire
from chronowheel.core.buckets import minute_of, slot_for
from chronowheel.core.clock import Clock
from chronowheel.core.model import (
    Command,
    DeleteCalendar,
    PutCalendar,
    Retry,
    Upsert,
    ValidationPolicy,
    parse_command,
    routing_key,
)
from chronowheel.core.recurrence import next_after
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.node.calendars import Calendars
from chronowheel.node.ingest_batch import NewJobs
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.rejections import Rejections
from chronowheel.node.state import Outgoing, ShardState
from chronowheel.node.transitions import READ, STORED, UNCHANGED, Transitions, unchanged
from chronowheel.node.urgent import LaneBatch, UrgentLane
from chronowheel.node.write_permits import NodeWritePermits
from chronowheel.node.writes import RowWriter, schedule_of
from chronowheel.settings import Settings
from chronowheel.store.base import JobRow, JobStore, RunHistoryStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Appliers:
    """The parts that apply one batch of commands. The in-order pass and the urgent lane
    each have their own, as they run at the same time: `counted` and the rejections'
    `sources` and `late` belong to one batch."""

    rejections: Rejections
    transitions: Transitions
    new_jobs: NewJobs
    counted: set[int]
    """Minutes whose bucket counts the current batch already raised (`precount`), so its
    rows there do not count themselves again. Updated in place: the writers read this set."""


class Permits:
    """A permit of the step's own semaphore, then one of the node's (`ingest_writes_in_flight`,
    shared by every shard's in-order pass): the node keeps few writes queued at Cassandra, so
    that the urgent lane's, which take no node permit, do not wait behind hundreds."""

    def __init__(self, own: asyncio.Semaphore, node: NodeWritePermits | None) -> None:
        self.own = own
        self.node = node

    async def __aenter__(self) -> None:
        await self.own.acquire()
        if self.node is not None:
            try:
                await self.node.acquire()
            except BaseException:
                self.own.release()
                raise

    async def __aexit__(self, *exc: object) -> None:
        if self.node is not None:
            self.node.release()
        self.own.release()


async def _no_reread(offset: int) -> int:
    raise RuntimeError("this ingest cannot seek its partition")


class Ingest:
    def __init__(self, *, state: ShardState, shards: int, settings: Settings, store: JobStore,
                 writer: RowWriter, clock: Clock, metrics: NodeMetrics,
                 policy: ValidationPolicy, calendars: Calendars,
                 history: Callable[[], RunHistoryStore | None] = lambda: None,
                 node_writes: NodeWritePermits | None = None) -> None:
        self.state = state
        self.node_writes = node_writes
        """The node's gate on in-order writes in flight (None: each shard's own only)."""
        self.shard = state.shard
        self.shards = shards
        self.settings = settings
        self.store = store
        self.writer = writer
        self.clock = clock
        self.metrics = metrics
        self.policy = policy
        self.calendars = calendars
        self.queue: deque[SubmitRecord] = deque()
        """Records fetched for this shard, not yet applied (the pump pauses on its length)."""
        self.next_offset: int | None = None
        """The offset expected next; records below it are re-deliveries after a seek."""
        self.history = history
        self.main = self._appliers()
        self.lane_parts = self._appliers()
        self.lane = UrgentLane(shard=self.shard, shards=shards, policy=policy,
                               urgent_ms=settings.urgent_ms,
                               lookahead=settings.urgent_lookahead_records,
                               queue_rows=settings.pump_pause_rows,
                               resume_rows=settings.pump_resume_rows)
        self.reread: Callable[[int], Awaitable[int]] = _no_reread
        """Seeks the shard's partition (the actor's; returns offsets lost to retention)."""
        self.lane_wake = asyncio.Event()
        self.lane_idle = asyncio.Event()
        self.lane_idle.set()
        self._lane_task: asyncio.Task[None] | None = None

    def _appliers(self) -> Appliers:
        s = self.settings
        counted: set[int] = set()
        rejections = Rejections(shard=self.shard, rejected_topic=s.rejected_topic,
                                metrics=self.metrics)
        transitions = Transitions(state=self.state, store=self.store, writer=self.writer,
                                  clock=self.clock, metrics=self.metrics, policy=self.policy,
                                  calendars=self.calendars, rejections=rejections,
                                  counted=counted, namespace=s.namespace, history=self.history)
        new_jobs = NewJobs(state=self.state, settings=s, store=self.store, writer=self.writer,
                           clock=self.clock, metrics=self.metrics, calendars=self.calendars,
                           rejections=rejections, counted=counted)
        return Appliers(rejections, transitions, new_jobs, counted)

    @property
    def rejections(self) -> Rejections:
        return self.main.rejections

    def enqueue(self, records: Iterable[SubmitRecord]) -> None:
        lane = self.lane
        if not lane.enabled:
            self.queue.extend(records)
        else:
            now, queue, next_offset = self.clock.now_ms(), self.queue, self.next_offset
            for rec in records:
                if next_offset is not None and rec.offset < next_offset:
                    continue  # a re-delivery after a seek: applied already
                if lane.arrived(rec, len(queue), now):
                    queue.append(rec)
            if lane.ready or lane.skip_from is not None:
                self.lane_wake.set()
        self.state.ingest_wake.set()

    def fetch_wanted(self, paused: bool) -> bool:
        """Whether the pump should fetch this shard's partition now (False: pause it)."""
        return self.lane.fetch_wanted(len(self.queue), paused)

    def reset(self, next_offset: int | None) -> None:
        """After a takeover: forget what was queued; the partition is read from next_offset."""
        self.queue.clear()
        self.next_offset = next_offset
        self.lane.reset()
        self.lane_idle.set()

    async def run(self) -> None:
        state = self.state
        lane = None
        if self.lane.enabled:
            lane = self._lane_task = asyncio.create_task(self._run_lane(),
                                                         name=f"urgent-{self.shard}")
            lane.add_done_callback(lambda _task: state.ingest_wake.set())
        try:
            while not state.stopping:
                if lane is not None and lane.done():
                    lane.result()  # a failed lane fails ingest loudly
                    raise RuntimeError(f"shard {self.shard}: the urgent lane stopped")
                if not self.queue:
                    state.ingest_wake.clear()
                    await state.ingest_wake.wait()
                    continue
                await self.step()
        except BaseException:
            # Failed or cancelled (a stop's deadline, a fence): so is the lane, at once.
            if lane is not None and not lane.done():
                lane.cancel()
                with contextlib.suppress(asyncio.CancelledError):  # cancelled again: go on
                    await asyncio.wait([lane])  # it has ended (its own error is dropped)
            raise
        if lane is not None and not lane.done():
            self.lane_wake.set()  # it sees `stopping` and ends after its batch
            await lane

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
        lane = self.lane
        todo = records
        if lane.enabled:
            # A record the lane has in flight: later ones of its job wait for its batch.
            todo = [rec for rec in records if lane.in_order(rec)]
            while lane.waits_for_lane(records):
                task = self._lane_task
                if task is not None and task.done():  # and its batch not finished
                    task.result()
                    raise RuntimeError(f"shard {self.shard}: the urgent lane stopped")
                await self.lane_idle.wait()
        now = self.clock.now_ms()
        chains: dict[str, list[Command]] = defaultdict(list)
        calendar_ops: list[PutCalendar | DeleteCalendar] = []
        outbox: list[Outgoing] = []  # published with this batch's offsets, not before
        rejections = self.main.rejections
        for i, rec in enumerate(todo):
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
            rejections.sources[id(cmd)] = rec
            if isinstance(cmd, PutCalendar | DeleteCalendar):
                calendar_ops.append(cmd)
            else:
                chains[job_id].append(cmd)
        try:
            # Calendars first, so jobs of the same batch that use them compute with them.
            await self._apply_calendars(calendar_ops)
            await self.calendars.refresh(cmds[0].job.calendar for cmds in chains.values()
                                         if isinstance(cmds[0], Upsert))
            await self._precount(chains, now, self.main.counted)
            await self._apply_chains(chains, self.main, self.node_writes)
        finally:
            rejections.sources.clear()
        outbox.extend(rejections.late)
        rejections.late.clear()
        if lane.enabled:
            # The lane's messages about records this step went past go out with its offsets.
            outbox.extend(lane.stepped(todo, records[-1].offset))
            if lane.ready or (lane.skip_from is not None
                              and len(self.queue) < self.settings.pump_resume_rows):
                self.lane_wake.set()
        # Handed to the next transaction after every step: a step is at most `ingest_batch`
        # records, so a takeover re-applies at most that many.
        self.state.outbox.extend(outbox)
        self.state.offset_to_commit = records[-1].offset + 1
        self.state.wake.set()

    # --- the urgent lane (node/urgent.py) -----------------------------------------------------
    async def _run_lane(self) -> None:
        lane, state = self.lane, self.state
        while not state.stopping:
            offset = lane.plan_seek(len(self.queue))
            if offset is not None:
                await self._seek(offset)
                continue
            batch = lane.take(self.settings.ingest_batch)
            if batch is None:
                self.lane_wake.clear()
                await self.lane_wake.wait()
                continue
            self.lane_idle.clear()
            started = self.clock.now_ms()
            try:
                messages = await self._apply_lane(batch)
                if log.isEnabledFor(logging.DEBUG):
                    took = self.clock.now_ms() - started
                    log.debug("shard %d: urgent lane applied %d command(s) in %d ms, the "
                              "first due in %d ms", self.shard, len(batch.records), took,
                              min(cmd.job.at_ms or 0 for _rec, cmd in batch.records)
                              - self.clock.now_ms())
            except BaseException:
                # Its records stay in flight: the in-order step that reaches one raises
                # instead of going past it.
                self.lane_idle.set()
                raise
            lane.finished(batch, messages)
            self.lane_idle.set()
            state.wake.set()

    async def _apply_lane(self, batch: LaneBatch) -> list[tuple[int, Outgoing]]:
        """Apply a lane batch with the lane's own parts; the messages it produced, each with
        the offset of the record it is about (held until the in-order pass is past it)."""
        parts = self.lane_parts
        chains: dict[str, list[Command]] = defaultdict(list)
        for rec, cmd in batch.records:
            parts.rejections.sources[id(cmd)] = rec
            chains[cmd.job.id].append(cmd)
        try:
            await self._precount(chains, self.clock.now_ms(), parts.counted)
            await self._apply_chains(chains, parts)
        finally:
            parts.rejections.sources.clear()
        messages = [(int(dict(msg.headers)[wire.SOURCE_OFFSET]), msg)
                    for msg in parts.rejections.late]
        parts.rejections.late.clear()
        self.metrics.urgent.inc(len(batch.records))
        return messages

    async def _seek(self, offset: int) -> None:
        """Make the lane's pending seek; retried while Kafka refuses it (a leader moving)."""
        for attempt in range(1, SEEK_ATTEMPTS + 1):
            try:
                expired = await self.reread(offset)
                break
            except Exception as exc:
                if self.state.stopping:
                    return
                if attempt == SEEK_ATTEMPTS:
                    raise BusError(f"shard {self.shard}: seek of the submit partition to "
                                   f"{offset} failed {attempt} times in a row: {exc!r}") from exc
                log.warning("shard %d: seek of the submit partition to %d failed (%r); "
                            "again in %d ms", self.shard, offset, exc, SEEK_RETRY_MS)
                await asyncio.sleep(SEEK_RETRY_MS / 1000)
        self.lane.sought()
        if expired:
            self.metrics.submit_expired.inc(expired)
            log.warning("shard %d: up to %d submitted commands (offsets %d to %d) were "
                        "deleted by %s's retention before this node applied them: raise the "
                        "topic's retention.ms or add nodes so that ingest keeps up",
                        self.shard, expired, offset, offset + expired - 1,
                        self.settings.submit_topic)

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
                self.rejections.quarantine(op, exc)
                continue
            self.metrics.ingested.labels(op.op, STORED).inc()

    async def _apply_chains(self, chains: dict[str, list[Command]], parts: Appliers,
                            node_writes: NodeWritePermits | None = None) -> None:
        """Apply every job's commands, each job's in order, all jobs' locks held throughout.

        The common case, an upsert of a job with no pending due row to replace, goes in groups:
        the jobs rows are read together (`get_jobs`) and several jobs' due and jobs rows are
        written per logged batch (`NewJobs.write`). Everything else (cancels, retries, edits of
        a scheduled job, several commands for one job) goes one command at a time as before,
        its first command using the row read with the group.
        """
        state = self.state
        async with state.job_locks(chains):
            # The locks make these reads current until the step ends: every writer of a jobs
            # row (ingest, a recurring fire) holds the job's lock.
            wanted = [j for j, cmds in chains.items() if not isinstance(cmds[0], Retry)]
            existing = await self.store.get_jobs(wanted) if wanted else {}
            transitions, rejections = parts.transitions, parts.rejections
            # From here until the step's changes are in the wheel, dispatch stays below the
            # pending occurrences of these jobs (no await in between: one it took meanwhile
            # is beyond the watermark no more, and counts as published).
            pending = ((r.slot_ms, None if r.scheduled_ms is None
                        else (r.job_id, r.scheduled_ms, 1)) for r in existing.values()
                       if r.status == "scheduled" and r.slot_ms is not None)
            with state.holding(pending):
                fresh: list[tuple[Upsert, JobRow | None]] = []
                one_by_one: list[tuple[str, list[Command]]] = []
                for job_id, cmds in chains.items():
                    cmd = cmds[0]
                    if len(cmds) == 1 and isinstance(cmd, Upsert):
                        row = existing.get(job_id)
                        if unchanged(row, cmd.job):
                            self.metrics.ingested.labels(cmd.op, UNCHANGED).inc()
                            continue
                        # A paused job stays paused through an edit (`Transitions`).
                        if not self._has_pending_row(row) \
                                and (row is None or row.status != "paused"):
                            fresh.append((cmd, row))
                            continue
                    one_by_one.append((job_id, cmds))
                sem = asyncio.Semaphore(self.settings.ingest_concurrency)
                # New jobs' writes (a herd's) also take a node permit; a chain does not: it
                # may hold dispatch below a pending occurrence of its job while it runs.
                fresh_sem = Permits(sem, node_writes)

                async def run_chain(job_id: str, cmds: list[Command]) -> None:
                    async with sem:
                        for i, cmd in enumerate(cmds):
                            try:
                                await transitions.apply(
                                    cmd, self.clock.now_ms(),
                                    existing.get(job_id) if i == 0 else READ)
                            except Exception as exc:
                                # Only this command is set aside; the job's later ones read
                                # what is stored (READ) and apply to that.
                                rejections.quarantine(cmd, exc)

                # Every chain ends before the holds are released, also when one fails.
                outcomes = await asyncio.gather(parts.new_jobs.write(fresh, fresh_sem),
                                                *(run_chain(j, c) for j, c in one_by_one),
                                                return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome

    def _has_pending_row(self, row: JobRow | None) -> bool:
        """Whether a new version of the job must first delete its unpublished due row."""
        return row is not None and row.status == "scheduled" and row.slot_ms is not None \
            and row.scheduled_ms is not None \
            and self.state.unpublished(row.slot_ms, (row.job_id, row.scheduled_ms, 1))

    async def _precount(self, chains: dict[str, list[Command]], now: int,
                        counted: set[int]) -> None:
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
            await self.store.add_bucket_counts(self.shard, counts,
                                               self.settings.ingest_counts_in_flight)
        counted.clear()
        counted.update(counts)

    def _parse(self, rec: SubmitRecord, now: int, outbox: list[Outgoing]) -> Command | None:
        try:
            return parse_command(rec.value or b"", key=rec.key, policy=self.policy, now_ms=now)
        except ValidationError as exc:
            reason = str(exc)
        except Exception as exc:  # a parser bug must not stop the pipeline either
            log.exception("shard %d: parser failed on offset %d", self.shard, rec.offset)
            reason = f"internal error while validating: {type(exc).__name__}: {exc}"
        self.rejections.rejection(rec, reason, outbox)
        return None


PARSE_YIELD_EVERY = 50
"""Commands an ingest step parses between two yields to the event loop."""

SEEK_RETRY_MS = 200
"""A failed seek of the urgent lane is made again after this long..."""
SEEK_ATTEMPTS = 150
"""...this many times at most (30 s): then Kafka is unreachable for the shard, which fails."""
