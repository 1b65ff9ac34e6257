"""Dispatch: take due occurrences out of a shard's wheel and have them published.

Each step fires what is due up to `ShardState.dispatch_limit` (never early, never past the
loaded horizon or an ingest write in flight), raises the watermark before its first await,
makes a recurring job's next occurrence durable, and commits one transaction. With nothing
to publish it still commits an advancing watermark now and then, so a takeover reloads little.
Late occurrences go through the shard's catch-up queue at a paced rate, and an occurrence
beyond its job's lateness bound is recorded as missed instead of published
(`node/lateness.py`).
"""

# mypy: strict-equality
# (a job status compared with a string no JobStatus can be is an error)
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable

from chronowheel.core import limits
from chronowheel.core.buckets import slot_for
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.core.model import JobSpec, ValidationPolicy, decode_stored_job
from chronowheel.core.recurrence import Schedule, catch_up, is_excluded, next_after
from chronowheel.core.runs import iso_ms
from chronowheel.node import failures
from chronowheel.node.calendars import Calendars
from chronowheel.node.lateness import Missed, Pacer, lateness_bound
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import (
    Pending,
    Recurring,
    WheelKey,
    pending_from_row,
    with_schedule,
)
from chronowheel.node.publisher import Publisher
from chronowheel.node.runs import missed_sink, skipped_count
from chronowheel.node.state import ShardState
from chronowheel.node.writes import RowWriter, schedule_of
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow, JobStore

log = logging.getLogger(__name__)

# Compiled schedules of recurring specs kept for their next fires (least recently used out).
SCHEDULE_CACHE_SIZE = 10_000

MAX_AHEAD_RANGES = 8
"""The most published ranges a catching-up shard's state record names (`ahead`): each gap in
the middle of a catch-up (a takeover, a clock-skew block) that finds more late work adds one
until the queue drains past it. Beyond it such late work goes unpaced, as without pacing."""


def stored_policy(policy: ValidationPolicy) -> ValidationPolicy:
    """Specs already accepted stay valid if the operator tightens limits or the allowlist."""
    return ValidationPolicy(
        namespace=policy.namespace, allowed_topic_pattern=".*",
        max_id_bytes=1 << 20, max_payload_bytes=1 << 30, max_horizon_ms=1 << 60,
        max_max_catch_up=policy.max_max_catch_up, max_headers_bytes=1 << 30,
        min_period_ms=1, max_stored_bytes=1 << 60, max_reach_ms=1 << 60)


class Dispatcher:
    def __init__(self, *, state: ShardState, settings: Settings, store: JobStore,
                 writer: RowWriter, publisher: Publisher, clock: Clock, metrics: NodeMetrics,
                 policy: ValidationPolicy, dispatch_blocked: Callable[[], bool],
                 calendars: Calendars, missed: Missed | None = None) -> None:
        self.state = state
        self.shard = state.shard
        self.settings = settings
        self.store = store
        self.writer = writer
        self.publisher = publisher
        self.clock = clock
        self.metrics = metrics
        self.stored_policy = stored_policy(policy)
        self.dispatch_blocked = dispatch_blocked
        self.calendars = calendars
        self.missed = missed if missed is not None else Missed(
            shard=self.shard, namespace=settings.namespace, metrics=metrics)
        """Where occurrences beyond their lateness bound go (a hook for the run history)."""
        if self.missed.sink is None:  # each missed occurrence is a run of the job's history
            self.missed.sink = missed_sink(lambda: publisher.transactions.history,
                                           publisher.node_id)
        self.pacer = Pacer(settings.catch_up_rate, clock.now_ms())
        self.gap = True
        """Whether the shard comes back from a gap in dispatch (a takeover, a clock-skew
        block): only then do late occurrences go through the catch-up queue. A shard that
        merely fell behind (a herd) goes on in order as fast as it can."""
        self._schedules: OrderedDict[bytes, tuple[JobSpec, Schedule]] = OrderedDict()
        self._missed: list[tuple[Pending, int, int]] = []
        """Occurrences found beyond their bound (with their lateness and bound) by steps
        whose transaction has not committed yet: they are recorded (`Missed.record`) once
        one has. A part that does not commit ends the shard's actor, and the next owner
        takes them again from the committed watermark: recorded at the take, an aborted
        transaction would count them twice."""
        self._skipped: list[tuple[str, int]] = []
        """(job id, occurrences) a catch-up left out, counted after the commit likewise."""

    async def step(self, *, final: bool = False) -> None:
        """Fire what is due and commit; `final` (graceful stop) commits at once and releases
        the shard."""
        state = self.state
        now = self.clock.now_ms()
        fired: list[Pending] = []
        if self.dispatch_blocked():
            self.gap = True
        else:
            limit = state.dispatch_limit(now)
            late = self._take_late(limit, now)
            if limit > state.watermark or late:
                fired = await self._take_due(limit, now, late)
                if fired:
                    state.last_fired_ms = now
        nd = state.wheel.next_deadline()
        s = self.settings
        idle_commit = (state.watermark > state.committed_watermark
                       and (final or (now - state.last_commit_ms >= s.idle_commit_ms
                                      # not right before a due entry: it would wait for it
                                      and (nd is None or nd > now + s.idle_commit_clearance_ms))))
        # The final commit of a graceful stop always goes: it releases the shard (its record
        # names no owner), so the next owner has no reason to fence this node.
        # Missed occurrences are recorded by the commit that covers them: it goes at once.
        if fired or state.outbox or state.offset_to_commit is not None or idle_commit or final \
                or self._missed:
            await self.publisher.commit(fired, release=final)
            self._committed()

    def _committed(self) -> None:
        """A part committed: everything taken before it is settled, the missed occurrences
        and skipped counts of its steps too."""
        if self._missed:
            missed, self._missed = self._missed, []
            for p, late_by, bound in missed:
                self.missed.record(p, late_by, bound)
            self.missed.step_done()
        if self._skipped:
            skipped, self._skipped = self._skipped, []
            history = self.publisher.transactions.history
            if history is not None:
                for job_id, n in skipped:
                    history.count(job_id, "skipped", n)

    async def wait(self) -> None:
        """Sleep until the next due entry, the next idle commit, or a wake-up."""
        state = self.state
        if state.stopping:
            return
        now = self.clock.now_ms()
        wake_at = now + self.settings.idle_commit_ms
        nd = state.wheel.next_deadline()
        # While dispatch is blocked (clock skew) due entries cannot go: the skew monitor
        # wakes us when it lifts, so only the idle commit interval bounds the sleep.
        # Nor can one at or past a slot a command holds (`ShardState.holding`, an ingest
        # write in flight): its release wakes us. Waking for it would spin the loop.
        if nd is not None and nd <= state.horizon_ms and not self.dispatch_blocked() \
                and not (state.ingest_slots and nd >= min(state.ingest_slots)):
            wake_at = min(wake_at, nd)
        if state.late and not self.dispatch_blocked() and not state.late.head_held():
            wake_at = min(wake_at, self.pacer.next_ms(now) if self.pacer.rate > 0 else now)
        if wake_at <= now:
            await asyncio.sleep(0)
            return
        await sleep_until_or_event(self.clock, wake_at, state.wake)

    def _take_late(self, limit: int, now: int) -> list[Pending]:
        """Paced catch-up (`node/lateness.py`): move the occurrences due up to the cut
        (now - catch_up_lag_ms) out of the wheel into the catch-up queue, and take this step's
        share of the queue: at most catch_up_rate a second, the missed ones free. No await."""
        state, s = self.state, self.settings
        rate = s.catch_up_rate
        behind = now - s.catch_up_lag_ms
        cut = min(behind, limit)
        begin = False
        if rate > 0 and state.late_cut is None and self.gap:
            nd = state.wheel.next_deadline()
            if nd is not None and nd <= cut:
                begin, self.gap = True, False
                state.behind_from = state.watermark
                log.info("shard %d: catching up: occurrences due up to %d, %d ms late and "
                         "more, go at %d a second after the on-time ones", self.shard, cut,
                         now - nd, rate, extra={"shard": self.shard})
            elif limit >= behind:
                self.gap = False  # loaded past the cut and nothing late: back to normal
        elif rate > 0 and state.late_cut is not None:
            if state.late_cut == state.watermark:
                # The cut moves on while nothing past it has been published (a takeover
                # still loading a backlog: all it loads is late); after that, on-time work
                # goes on from the watermark.
                begin = cut > state.watermark
            elif self.gap:
                begin = self._cut_again(cut, limit >= behind, now)
        if begin:
            for _due, _key, p in state.wheel.advance(cut):
                state.late.push(p)
            # Raised before any await, as in _take_due: these are taken.
            state.watermark = state.late_cut = cut
        if state.late_cut is None:
            return []
        if rate <= 0 or len(state.wheel) + len(state.late) >= s.bucket_cap_rows:
            # Unpaced, or a backlog larger than the memory cap: the loader waits for room, so
            # pacing would hold the on-time work behind it for (backlog - cap) / rate seconds.
            # Such a backlog goes as fast as it can, as a herd does.
            budget = len(state.late)
        else:
            budget = self.pacer.available(now)
        default = s.max_lateness_ms

        def free(p: Pending) -> bool:  # a one-shot it will not publish costs no token
            if p.recurring is not None:
                return False
            bound = lateness_bound(p, default)
            return bound is not None and now - p.scheduled_ms > bound

        taken = state.late.pop(budget, free, state.horizon_ms)
        if rate > 0:
            self.pacer.spend(sum(1 for p in taken if not free(p)))
        if not state.late and state.horizon_ms >= state.late_cut:
            log.info("shard %d: caught up (late occurrences up to %d are out)", self.shard,
                     state.late_cut, extra={"shard": self.shard})
            state.late_cut = None
            state.ahead.clear()
        return taken

    def _cut_again(self, cut: int, loaded: bool, now: int) -> bool:
        """Back from a gap in the middle of a catch-up (a takeover of a shard whose record
        has `ahead`, the end of a clock-skew block) with late occurrences past the watermark
        in the wheel: they are queued too, behind the ones already waiting. What was published
        past the old cut becomes a closed range of `state.ahead` (the state record names each
        such range), and the new cut begins another. True when it does."""
        state = self.state
        assert state.late_cut is not None
        nd = state.wheel.next_deadline()
        if nd is None or nd > cut:
            if loaded:
                self.gap = False  # loaded past the cut and nothing late: back to normal
            return False
        self.gap = False
        if len(state.ahead) + 1 >= MAX_AHEAD_RANGES:
            log.warning("shard %d: %d ms late occurrences after another gap in the middle of "
                        "a catch-up go unpaced: the state record already names %d published "
                        "ranges", self.shard, now - nd, MAX_AHEAD_RANGES,
                        extra={"shard": self.shard})
            return False
        state.ahead.append((state.late_cut, state.watermark))
        log.info("shard %d: catching up again: occurrences due up to %d, %d ms late and more, "
                 "are queued behind the %d waiting", self.shard, cut, now - nd,
                 len(state.late), extra={"shard": self.shard})
        return True

    def _publishable(self, p: Pending, now: int) -> bool:
        """False when `p` is beyond its lateness bound: it is then recorded as missed."""
        bound = lateness_bound(p, self.settings.max_lateness_ms)
        if bound is None:
            return True
        late_by = now - p.scheduled_ms
        if late_by <= bound:
            return True
        self._missed.append((p, late_by, bound))  # recorded once its part commits
        return False

    async def _take_due(self, limit: int, now: int,
                        late: list[Pending] | None = None) -> list[Pending]:
        state = self.state
        max_batch = self.settings.max_batch
        entries: list[tuple[int, WheelKey, Pending]] = []
        if limit > state.watermark:
            entries = state.wheel.advance(limit, max_batch)
            complete = len(entries) < max_batch
            if not complete:
                # Finish the last millisecond, so the watermark can say "all up to here".
                entries.extend(state.wheel.advance(entries[-1][0]))
                nd = state.wheel.next_deadline()
                complete = nd is None or nd > limit
            new_watermark = limit if complete else entries[-1][0]
            # Raise the watermark now, before any await: the loader must not re-insert these.
            state.watermark = max(state.watermark, new_watermark)
        fired: list[Pending] = []
        writes = []
        # Most jobs have no bound: then a one-shot is not looked at (a herd is thousands).
        check = self.settings.max_lateness_ms > 0
        for p in (*(late or ()), *(p for _due, _key, p in entries)):
            if p.recurring is None:
                if (check or p.delivery.max_lateness_ms is not None) \
                        and not self._publishable(p, now):
                    continue
                fired.append(p)
            else:
                writes.append(self._fire_recurring(p, p.recurring, now, fired))
        if writes:
            await asyncio.gather(*writes)
        return fired

    async def _fire_recurring(self, p: Pending, rec: Recurring, now: int,
                              fired: list[Pending]) -> None:
        async with self.state.job_lock(p.job_id):
            current = await self.store.get_job(p.job_id)
            if current is None or current.status != "scheduled" or current.version != rec.version \
                    or current.scheduled_ms != p.scheduled_ms:
                # Edited or cancelled while this occurrence was on its way out: it still goes
                # (an occurrence being published may run), but the old spec schedules nothing.
                if self._publishable(p, now):
                    fired.append(p)
                return
            await self._fire_recurring_locked(p, rec, now, fired)

    async def _fire_recurring_locked(self, p: Pending, rec: Recurring, now: int,
                                     fired: list[Pending]) -> None:
        job, schedule = self._recurring(rec.spec)
        if job.calendar is not None:
            await self.calendars.refresh([job.calendar])
            schedule = self.calendars.schedule(job, schedule)
        # Lateness counts from the occurrence's own slot, not from the slot it was given: a
        # resumed job's first occurrence gets a slot of now, however long the pause was. The
        # grace makes only this occurrence on time; the ones after it that are due already
        # were missed, and the job's catch-up policy decides them (core/recurrence.py).
        lateness = now - slot_for(p.job_id, p.scheduled_ms, job.window_ms)
        on_time = lateness <= self.settings.catch_up_grace_ms
        excluded = on_time and is_excluded(schedule, p.scheduled_ms)
        if excluded:
            # The calendar may have gained this date after the occurrence was computed: it is
            # then dropped here, unpublished, and the next allowed one takes its place.
            self.metrics.excluded.inc()
            log.info("shard %d: job %s: occurrence %d falls on an excluded date; skipped",
                     self.shard, p.job_id, p.scheduled_ms,
                     extra={"shard": self.shard, "job_id": p.job_id})
        if lateness <= self.settings.catch_up_lag_ms:
            # A node running behind (a herd, a loaded machine), not a gap: nothing was
            # withheld, so nothing counts as missed; the next occurrence follows this one and
            # fires in turn, late, like this one.
            fires: tuple[int, ...] = () if excluded else (p.scheduled_ms,)
            nxt = next_after(schedule, p.scheduled_ms)
        else:
            cu = catch_up(schedule, policy=job.catch_up, max_catch_up=job.max_catch_up,
                          first_missed_ms=p.scheduled_ms, now_ms=now, first_on_time=on_time,
                          window_ms=job.window_ms)
            fires, nxt = cu.fire, cu.next_ms
            if cu.coalesced:
                self.metrics.coalesced.inc()
            if cu.missed:
                log.info("shard %d: job %s missed occurrences since %d (%s); catch_up=%s "
                         "fires %d", self.shard, p.job_id, p.scheduled_ms,
                         "the first on time" if on_time else "beyond the grace", job.catch_up,
                         len(fires), extra={"shard": self.shard, "job_id": p.job_id})
                history = self.publisher.transactions.history
                if history is not None:  # the job's `skipped` counter (run history)
                    left_out = skipped_count(schedule, p.scheduled_ms, nxt, fires)
                    if left_out:  # counted once the part commits, as missed ones
                        self._skipped.append((p.job_id, left_out))
        for s in fires:
            # The bound is checked on what the catch-up policy chose: a missed one is not
            # published, and the schedule goes on from `nxt` all the same.
            occurrence = p if s == p.scheduled_ms else with_schedule(p, s)
            if self._publishable(occurrence, now):
                fired.append(occurrence)
        # The next occurrence is durable before the transaction that publishes this one.
        state = self.state
        if nxt is None:
            await self.store.put_job(self.writer.finished(p.job_id, rec.spec, rec.version,
                                                          job.tenant))
            state.touch(p.job_id)
            return
        slot = max(slot_for(p.job_id, nxt, job.window_ms), state.watermark + 1)
        row = DueRow.for_job(job, shard=self.shard, slot_ms=slot, scheduled_ms=nxt,
                             version=rec.version, spec=rec.spec)
        try:
            await self.writer.write_due(row, now, JobRow(p.job_id, self.shard, rec.spec,
                                                         rec.version, "scheduled", nxt, slot, 0,
                                                         job.tenant))
        except Exception as exc:
            if failures.concerns_the_node(exc):
                raise
            await self._park(p.job_id, rec, job.tenant, nxt, exc)
            return
        state.apply_job_change(p.job_id, None, pending_from_row(row))

    async def _park(self, job_id: str, rec: Recurring, tenant: str | None, nxt: int,
                    exc: Exception) -> None:
        """The job's next occurrence cannot be stored (its due row would outlive Cassandra's
        20-year TTL, or the store refused it): this occurrence still goes out, and the job is
        paused at `nxt` instead of stopping the shard. Nothing is lost: `jobs list --status
        paused` shows it, and a resume re-arms it once `nxt` is within reach."""
        self.metrics.quarantined.labels("dispatch", failures.reason_label(exc)).inc()
        log.warning("shard %d: job %s paused: its next occurrence (%d) cannot be stored: %s",
                    self.shard, job_id, nxt, failures.describe(exc),
                    extra={"shard": self.shard, "job_id": job_id})
        note = limits.cut_reason(
            f"paused by node {self.publisher.node_id} at {iso_ms(self.clock.now_ms())}: its "
            f"next occurrence ({iso_ms(nxt)}) cannot be stored: {failures.describe(exc)}",
            limits.MAX_PAUSE_NOTE_CHARS)
        await self.store.put_job(JobRow(job_id, self.shard, rec.spec, rec.version + 1,
                                        "paused", nxt, None, 0, tenant, note))
        self.state.touch(job_id)

    def _recurring(self, spec: bytes) -> tuple[JobSpec, Schedule]:
        hit = self._schedules.get(spec)
        if hit is not None:
            self._schedules.move_to_end(spec)
            return hit
        job = decode_stored_job(spec, policy=self.stored_policy, now_ms=self.clock.now_ms())
        hit = (job, schedule_of(job))
        self._schedules[spec] = hit
        if len(self._schedules) > SCHEDULE_CACHE_SIZE:
            self._schedules.popitem(last=False)
        return hit
