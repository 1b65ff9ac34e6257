"""The state a shard's tasks share, and the devices by which they coordinate.

One shard runs three tasks on one event loop (so no threads, but every `await` is a point where
another task may run): ingest (`node/ingest.py`) applies submit commands, the loader
(`node/loader.py`) fills the wheel from Cassandra's minute buckets, dispatch
(`node/dispatch.py`) takes due occurrences out of the wheel and hands them to the transaction
publisher (`node/publisher.py`). `ShardState` is what they share; it has one owner, the shard
actor (`node/shard.py`), which creates it, starts the tasks and sets `stopping`.

Invariants (they carry the contract's musts; see docs/design.md):
- `watermark`: every due row of this shard with slot <= watermark has been published (or is in
  the transaction being committed), except, while the shard catches up at a paced rate, the
  late rows at or before `late_cut` outside the published ranges of `ahead`, which are in
  `late` (or, after a takeover, still to be loaded into it: `behind_from` < slot <= `late_cut`,
  `late_range`). Ingest never writes a slot <= watermark;
  the loader never puts a row with slot <= watermark into the wheel; so nothing is published
  twice. The state record says the same (`record_watermark`).
- `horizon_ms`: every due row with slot <= horizon_ms is in the wheel (or already published).
  Dispatch never looks past min(now, horizon_ms), so nothing is skipped and nothing is early.
- Offsets are sent only in the transaction that follows the commands' durable writes.
- An ingest write in flight holds the dispatch limit below its slot (`ingest_slots`), so the
  watermark can never pass a row that is not in the wheel yet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter

from chronowheel.core.buckets import minute_of
from chronowheel.core.wheel import TimingWheel
from chronowheel.node.lateness import LateQueue
from chronowheel.node.pending import OccurrenceKey, Pending, WheelKey
from chronowheel.store.base import RequestRow


@dataclass(slots=True)
class Outgoing:
    """A message that is not a fired occurrence (forwarded, rejected, dead-lettered)."""

    topic: str
    partition: int | None  # None: by the key's hash over the topic's partitions
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


# An entry fires at its slot and is its own wheel key (see node.pending), so the wheel keeps
# neither a due nor a key beside it.
_slot_of: Callable[[Pending], int] = attrgetter("slot_ms")


class Arrivals:
    """A node's shards that are being taken over or have not committed since (one per node,
    shared by its shards' states). While any is, the loaders of the node hold the rest of
    their first load back (`Loader.first_load`): a takeover's first transaction waited up to
    0.6 s behind another shard's look-ahead being read on the same loop."""

    def __init__(self) -> None:
        self._shards: dict[int, int] = {}
        """Arriving shard -> when its takeover began (the node's clock, ms)."""
        self.none = asyncio.Event()
        """Set while no shard of the node is arriving."""
        self.none.set()

    def arrive(self, shard: int, at_ms: int) -> None:
        self._shards[shard] = at_ms
        self.none.clear()

    def settled(self, shard: int) -> int | None:
        """The shard has arrived: returns when its takeover began, or None when it was not
        arriving (settled already)."""
        began = self._shards.pop(shard, None)
        if began is not None and not self._shards:
            self.none.set()
        return began

    def __contains__(self, shard: object) -> bool:
        return shard in self._shards


class ShardState:
    """Everything two or more of a shard's tasks read or write. Each attribute group below is
    one coordination device; its docstring says who writes it and what it guarantees."""

    def __init__(self, *, shard: int, start_ms: int, tick_ms: int, ingest_slack_ms: int,
                 arrivals: Arrivals | None = None) -> None:
        self.shard = shard
        self.ingest_slack_ms = ingest_slack_ms

        self.wheel: TimingWheel[WheelKey, Pending] = TimingWheel(
            start_ms=start_ms, tick_ms=tick_ms, due_of=_slot_of)
        """Pending occurrences by due slot. Inserted into by ingest (its own rows), the loader
        (rows read from buckets) and dispatch (a recurring job's next occurrence); emptied
        only by dispatch."""

        self.watermark = 0
        """All rows with slot <= watermark are published or being published. Raised only by
        dispatch, before its first await after taking entries out of the wheel."""
        self.committed_watermark = 0
        """The watermark of the last committed transaction (what a takeover would resume
        from). Written only by the publisher."""
        self.last_commit_ms = 0
        """Clock time of the last committed transaction; paces idle watermark commits."""
        self.last_fired_ms = -(1 << 62)
        """Clock time dispatch last took occurrences to publish (the node's ingest writes
        stay few for a while after it: `node/write_permits.py`)."""

        self.late = LateQueue()
        """Late occurrences dispatch took from the wheel, published at the catch-up rate
        (`node/lateness.py`). Filled by dispatch, and by the loader after a takeover of a
        shard that was catching up; emptied only by dispatch."""
        self.late_cut: int | None = None
        """While the shard catches up: the slot up to which late rows go to `late` rather
        than being published in order (None otherwise). The watermark is at or above it."""
        self.behind_from = 0
        """While catching up: every row with slot <= behind_from is published. The loader
        puts rows in (behind_from, late_cut] outside `ahead` into `late` (after a takeover)."""
        self.ahead: list[tuple[int, int]] = []
        """While catching up: ranges (cut, high] below `late_cut`, in order, that are
        published although late rows before and between them still wait (a takeover or the
        end of a clock-skew block in the middle of a catch-up cut again: the range the shard
        had published past its cut is closed here, and the new late work is queued)."""

        self.horizon_ms = 0
        """Every row with slot <= horizon_ms is in the wheel (or published). Raised only by the
        loader, after the rows up to it are in the wheel."""
        self.reading_upto = 0
        """The loader is reading rows up to here (>= horizon_ms). Ingest inserts its own rows
        with slots up to here itself: a read that began before their write misses them."""
        self.loaded_minutes: set[int] = set()
        """Hot minutes beyond the horizon that are loaded or being loaded ahead of time
        (pre-warm); ingest inserts its rows of these minutes too."""
        self.prewarmed: set[int] = set()
        """Minutes whose pre-warm read completed: the loader moves the horizon over them
        without reading them again."""
        self.upcoming_rows: int | None = None
        """Rows counted in the minute buckets beyond the horizon up to the pre-warm window, as
        the loader last read them (None before its first read, or with pre-warm off)."""

        self.touch_seq = 0
        """Counts job changes made by ingest and dispatch (see `touch`)."""
        self.touched: dict[str, int] = {}
        """job id -> `touch_seq` of its last change while a loader read was in flight. A
        loader page started before that change is stale for that job and is not applied."""
        self.reads_in_flight = 0
        """Loader reads in progress; `touched` is recorded only while there are some, and
        cleared when the last one ends."""

        self.ingest_slots: dict[int, int] = {}
        """slot -> ingest writes in flight for it, or changes of a job whose unpublished
        occurrence is there (`holding`). Dispatch never moves the watermark up to the smallest
        of these, so it cannot pass a row that is written but not yet in the wheel, nor publish
        an occurrence a command is withdrawing. Changed only through `claim_slot` /
        `release_slot` and `holding`."""

        self.outbox: list[Outgoing] = []
        """Messages ingest produced (forwards, rejections), published by the next
        transaction, together with `offset_to_commit`."""
        self.offset_to_commit: int | None = None
        """The submit offset after the last fully applied ingest batch; the publisher takes
        it (and the outbox) at the start of a transaction."""

        self.wake = asyncio.Event()
        """Wakes the dispatch loop: something may be due or there is something to commit."""
        self.ingest_wake = asyncio.Event()
        """Wakes the ingest task: records were queued."""
        self.loader_wake = asyncio.Event()
        """Wakes the loader early (stop)."""
        self.arrivals = Arrivals() if arrivals is None else arrivals
        """The node's shards between the start of a takeover and their first commit since: the
        actor enters the shard at the start of its run and the publisher clears it at its first
        commit (or the actor at the run's end)."""
        self.stopping = False
        """Set by the actor on a stop; every task finishes its current step and returns."""

        self.backfills: dict[tuple[str, str], RequestRow] = {}
        """(job id, request id) -> backfill request with occurrences still to hand over.
        Filled by ingest (a new backfill) and at takeover; the backfill task
        (`node/backfill.py`) hands them to the due table and removes finished ones."""
        self.backfill_wake = asyncio.Event()
        """Wakes the backfill task: a backfill was added, or the shard stops."""

        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}

    # --- per-job order -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def job_lock(self, job_id: str) -> AsyncIterator[None]:
        """Orders what ingest and dispatch do to one job (an edit against a recurring fire).
        A lock exists only while someone holds or waits for it."""
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

    @contextlib.asynccontextmanager
    async def job_locks(self, job_ids: Iterable[str]) -> AsyncIterator[None]:
        """`job_lock` of every job in `job_ids` (distinct ids), held together. Only ingest
        takes more than one lock at a time, and dispatch never waits for a lock while holding
        one, so taking them one after the other cannot deadlock. (Inlined rather than one
        `job_lock` per job: ingest takes hundreds per step.)"""
        locks, users = self._locks, self._lock_users
        taken: list[str] = []
        held: list[asyncio.Lock] = []
        try:
            for job_id in job_ids:
                lock = locks.get(job_id)
                if lock is None:
                    lock = locks[job_id] = asyncio.Lock()
                users[job_id] = users.get(job_id, 0) + 1
                taken.append(job_id)
                await lock.acquire()
                held.append(lock)
            yield
        finally:
            for lock in held:
                lock.release()
            for job_id in taken:
                left = users[job_id] - 1
                if left:
                    users[job_id] = left
                else:
                    del users[job_id], locks[job_id]

    def busy_jobs(self) -> set[str]:
        """Jobs some task is changing right now (their rows and wheel entries may differ)."""
        return set(self._locks)

    # --- ingest slots --------------------------------------------------------------------
    def claim_slot(self, computed: int, now: int) -> int:
        """The slot for a row about to be written, held as a floor for dispatch until the
        row is in the wheel (see `release_slot`): never <= watermark, and a little ahead of
        now so the write normally completes before dispatch reaches it."""
        slot = max(computed, self.watermark + 1, now + self.ingest_slack_ms)
        self.ingest_slots[slot] = self.ingest_slots.get(slot, 0) + 1
        return slot

    def release_slot(self, slot: int) -> None:
        left = self.ingest_slots[slot] - 1
        if left:
            self.ingest_slots[slot] = left
        else:
            del self.ingest_slots[slot]
        self.wake.set()

    @contextlib.contextmanager
    def holding(self, pending: Iterable[tuple[int, OccurrenceKey | None]]) -> Iterator[None]:
        """Hold dispatch below each pending occurrence (slot, key) still beyond the watermark,
        and the catch-up queue at each one in its queued range, while commands change the jobs
        whose pending occurrences they are. A command decides that an occurrence is not
        published yet, then awaits its writes before it drops the wheel entry or the queued
        one: dispatch must not publish the occurrence in between (a pause would then withhold
        an occurrence that is out, and its resume would publish it again; a cancel or an edit
        would report withdrawn an occurrence that fired)."""
        held: list[int] = []
        pinned: list[OccurrenceKey] = []
        for slot, key in pending:
            if slot > self.watermark:
                held.append(slot)
            elif key is not None and self.late_range(slot):
                pinned.append(key)  # queued, or loaded into the queue meanwhile
        for s in held:
            self.ingest_slots[s] = self.ingest_slots.get(s, 0) + 1
        self.late.hold(pinned)
        try:
            yield
        finally:
            for s in held:
                self.release_slot(s)
            if pinned:
                self.late.release(pinned)
                self.wake.set()

    def dispatch_limit(self, now: int) -> int:
        """How far dispatch may fire: never early, never past the loaded horizon, never up to
        a row whose write is in flight."""
        limit = min(now, self.horizon_ms)
        if self.ingest_slots:
            limit = min(limit, min(self.ingest_slots) - 1)
        return limit

    # --- wheel changes by ingest and dispatch --------------------------------------------
    def insert_bound(self, slot: int) -> bool:
        """True when a row at `slot` written now must go into the wheel by its writer: the
        loader has passed it, is reading it, or pre-warmed its minute."""
        return slot <= max(self.horizon_ms, self.reading_upto) or \
            minute_of(slot) in self.loaded_minutes

    def touch(self, job_id: str) -> None:
        """Mark a job changed: loader pages read before this moment must not overwrite it."""
        self.touch_seq += 1
        if self.reads_in_flight:
            self.touched[job_id] = self.touch_seq

    def apply_job_change(self, job_id: str, old_key: OccurrenceKey | None,
                         new: Pending | None) -> None:
        """All wheel changes of one command, after its writes, with no await in between, so
        a loader page applied meanwhile cannot leave a stale entry behind."""
        if old_key is not None:
            self.wheel.cancel(old_key)
            self.late.remove(old_key)
        if new is not None and self.insert_bound(new.slot_ms):
            self.wheel.insert(new, new.slot_ms, new)
        self.touch(job_id)
        self.wake.set()

    # --- paced catch-up ------------------------------------------------------------------
    def late_range(self, slot: int) -> bool:
        """Whether a row at `slot` (at or below the watermark) belongs to the catch-up queue:
        the shard catches up and the slot is in (behind_from, late_cut], outside the
        published ranges of `ahead`."""
        cut = self.late_cut
        if cut is None or not self.behind_from < slot <= cut:
            return False
        return not any(c < slot <= h for c, h in self.ahead)

    def _queued_ranges(self) -> list[tuple[int, int]]:
        """The ranges (low, high] whose rows go through the catch-up queue, in order."""
        assert self.late_cut is not None
        out, low = [], self.behind_from
        for c, h in self.ahead:
            out.append((low, c))
            low = h
        out.append((low, self.late_cut))
        return out

    def unpublished(self, slot: int, key: OccurrenceKey) -> bool:
        """Whether the job's occurrence `key`, whose due row has `slot`, is not published
        yet, so that a cancel, an edit or a pause must delete its row and drop its entry:
        beyond the watermark, or waiting in the catch-up queue (or, after a takeover of a
        shard that was catching up, still to be loaded into it). Taken out of the queue by a
        dispatch step, it is published (or in the transaction being committed), as taken out
        of the wheel."""
        if slot > self.watermark:
            return True
        if not self.late_range(slot):
            return False
        return slot > self.horizon_ms or key in self.late

    def record_watermark(self) -> tuple[int, tuple[tuple[int, int], ...] | None]:
        """What the state record says is published: every slot up to the first value, and,
        while catching up, also the ranges (cut, high] of the second. Nothing in `late` is
        published (the entries a step takes from it are, in the transaction it commits)."""
        cut = self.late_cut
        if cut is None:
            return self.watermark, None
        oldest = self.late.oldest()
        low = cut if oldest is None else oldest - 1
        # Rows of a queued range not loaded yet (a takeover is still reading it) are not
        # published.
        for lo, hi in self._queued_ranges():
            if hi > self.horizon_ms:
                low = min(low, max(lo, self.horizon_ms))
                break
        low = max(self.behind_from, low)
        published = [*self.ahead, *([(cut, self.watermark)] if self.watermark > cut else [])]
        ranges = []
        for c, h in published:
            if h <= low:
                continue
            if c <= low:  # everything up to its start is published: the watermark covers it
                low = h
                continue
            ranges.append((c, h))
        return low, tuple(ranges) or None

    def dispatch_lag_ms(self, now: int) -> int:
        oldest = self.wheel.next_deadline()
        queued = self.late.oldest()
        if queued is not None and (oldest is None or queued < oldest):
            oldest = queued
        lag: int = 0 if oldest is None else now - oldest
        if self.horizon_ms < now:
            lag = max(lag, now - self.horizon_ms)
        return max(0, lag)
