"""Hierarchical timing wheel (Varghese & Lauck) with millisecond precision.

Layout
------
Time is counted in ticks of `tick_ms` since `start_ms` (floored to a tick). Level L has
`wheel_size` (= 2**b) slots of 2**(b*L) ticks each; levels are created when first needed, so
an entry 30 days or 10 years out costs the same as one due in a second.

Slots are *aligned* to absolute tick numbers (like the Linux kernel's timer wheel, unlike
Kafka's purgatory wheel whose levels float with the insertion time). With `c` the last tick the
wheel has reached, an entry due at tick `t > c` lives at the highest level L where `t` and `c`
differ in their L-th group of b bits, in slot `(t >> b*L) & mask`. Because the place of an
entry is a pure function of (its due tick, c):

* cancel/replace finds the entry from its due time alone: no per-entry pointer to its bucket
  and no per-entry node object, just two dict slots per timer (key -> due, and the bucket's
  key -> value). This is what keeps memory per timer under a binary heap's.
* every occupied slot on level L lies strictly after c's slot on that level, and all of level
  L comes before anything on level L+1. The next non-empty bucket is therefore the lowest set
  bit of the lowest non-empty level's occupancy bitmap: O(levels), and empty ticks cost
  nothing (the role of Kafka's DelayQueue of buckets, without a heap).

Entries with due tick <= c sit in one dict, `_cur` (the current tick plus anything inserted
already due). advance() fires `_cur` in due order, then takes the next non-empty bucket: if it
ends by `now` the whole dict is handed to `_cur` in O(1); otherwise (now falls inside it) its
entries are re-placed relative to `now` (cascade) and the ones already due go to `_cur`. Sub-tick
precision: an entry of the current tick whose exact due_ms is still ahead stays in `_cur`
until an advance whose now_ms reaches it.

A max_batch cut (or a partly due current tick) leaves `_cur` with an order to keep: a heap
`_ready` of (due, seq, key) over `_cur`, validated lazily on pop, exists only in that case.

Bounded work per call (cf. Netty's HashedWheelTimer): a bucket of more than `cascade_chunk`
timers is not cascaded in one go. Ahead of its start (see _stage_lead_ms) it is *staged*:
each advance() splits `cascade_chunk` of its timers into the slots they will occupy one level
down, while it stays where it is as far as the rest of the wheel can tell.
When c reaches it, the split slots are installed as the lower level's row in O(wheel_size)
and only its first sub-slot is cascaded. If the driver does not come back in time, the rest
is split then, in one go. The wheel is not thread-safe: one owner drives it.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections.abc import Hashable
from operator import itemgetter
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_by_due = itemgetter(0)
# next_deadline() scans a bucket this small for its exact minimum instead of returning the
# bucket's start: a sparse far-future wheel then costs one wake-up per timer, not one per level.
_EXACT_SCAN = 32
# Without inserts, advance() looks for a big bucket to stage at most this often.
_SCAN_EVERY_MS = 32


def _stage_lead_ms(entries: int) -> int:
    # How long before a big bucket's start to begin staging it: half a second, so a driver
    # that only wakes every few hundred ms still sees it coming, plus a generous 4 µs of the
    # owner's time per timer (one split step costs about 0.3-2 µs in CPython).
    return 500 + entries * 4 // 1000


class TimingWheel(Generic[K, V]):
    """Timers keyed by K carrying a V, fired by `advance(now_ms)`; never before their due_ms.

    `next_deadline()` is a lower bound, never later than the earliest pending due_ms. It is
    exact when the earliest non-empty bucket is the current tick, a level-0 slot with
    tick_ms=1, or holds at most 32 timers (it is then scanned); otherwise it is that bucket's
    start, so a driver sleeping until it may wake early, advance (which cascades the bucket
    and fires nothing), and then get a tighter deadline: at most one early wake-up per level.
    It is also earlier when there is staging to do (see the module doc): the time to begin it,
    and, while a staged bucket still has timers to split, one millisecond after the last now_ms
    given to advance(). A driver that honours it gets bounded work per advance() call.
    """

    __slots__ = (
        "_base",
        "_bits",
        "_c",
        "_chunk",
        "_cur",
        "_cur_min",
        "_cur_one_due",
        "_due",
        "_last_now",
        "_levels",
        "_mask",
        "_occ",
        "_ready",
        "_scan_ms",
        "_scan_size",
        "_seq",
        "_size",
        "_st_level",
        "_st_n",
        "_st_slot",
        "_st_sub",
        "_stage_wake",
        "_tick",
    )

    def __init__(
        self,
        *,
        start_ms: int,
        tick_ms: int = 1,
        wheel_size: int = 256,
        cascade_chunk: int = 4096,
    ) -> None:
        if cascade_chunk < 1:
            raise ValueError(f"cascade_chunk must be >= 1, got {cascade_chunk}")
        if tick_ms < 1:
            raise ValueError(f"tick_ms must be >= 1, got {tick_ms}")
        if wheel_size < 2 or wheel_size & (wheel_size - 1):
            # Powers of two make the level/slot arithmetic shifts and masks.
            raise ValueError(f"wheel_size must be a power of two >= 2, got {wheel_size}")
        self._tick = tick_ms
        self._size = wheel_size
        self._bits = wheel_size.bit_length() - 1
        self._mask = wheel_size - 1
        self._base = start_ms - start_ms % tick_ms  # instant of tick 0
        self._c = 0  # last tick reached: every bucket holds only ticks > _c
        self._due: dict[K, int] = {}  # every pending entry: key -> due_ms
        self._cur: dict[K, V] = {}  # entries with due tick <= _c
        self._cur_min: int | None = None  # lower bound on the smallest due in _cur
        # True when every entry in _cur has the same due_ms (a 1 ms level-0 slot handed over
        # whole, e.g. a herd): a max_batch cut then takes any entries, no ordering needed.
        self._cur_one_due = True
        self._ready: list[tuple[int, int, K]] | None = None  # order of _cur after a cut
        self._seq = itertools.count()  # heap tie-breaker: keys need not be comparable
        self._levels: list[list[dict[K, V] | None]] = []
        self._occ: list[int] = []  # per level: bit s set <=> slot s holds a bucket
        self._chunk = cascade_chunk
        self._last_now = start_ms  # latest now_ms given to advance()
        # The staged bucket, if any: levels[_st_level][_st_slot] still holds its unsplit
        # timers (possibly none); _st_sub[j] holds those already split to sub-slot j one
        # level down, _st_n of them.
        self._st_level = 0
        self._st_slot = 0
        self._st_sub: list[dict[K, V] | None] | None = None
        self._st_n = 0
        # When to look for a big bucket to stage next: once now_ms reaches _scan_ms, or the
        # wheel grew by more than a chunk since the last look (_scan_size). That look found
        # the earliest instant to begin staging one: _stage_wake.
        self._scan_ms = start_ms
        self._scan_size = 0
        self._stage_wake: int | None = None

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def due_times(self) -> dict[K, int]:
        """key -> due_ms of every pending entry (a copy, for checks and tests)."""
        return dict(self._due)

    def get(self, key: K) -> tuple[int, V] | None:
        due = self._due.get(key)
        if due is None:
            return None
        t = (due - self._base) // self._tick
        c = self._c
        if t <= c:
            return due, self._cur[key]
        bits = self._bits
        level = ((t ^ c).bit_length() - 1) // bits
        slot = (t >> (level * bits)) & self._mask
        bucket = self._levels[level][slot]
        assert bucket is not None
        if key not in bucket:
            assert self._st_sub is not None and (level, slot) == (self._st_level, self._st_slot)
            bucket = self._st_sub[(t >> ((level - 1) * bits)) & self._mask]
            assert bucket is not None
        return due, bucket[key]

    def next_deadline(self) -> int | None:
        """Lower bound on the earliest pending due_ms (see the class doc), None when empty."""
        if not self._due:
            return None
        bound: int | None = None
        if self._cur:
            ready = self._ready
            if ready is not None:
                due = self._due
                while due.get(ready[0][2]) != ready[0][0]:
                    heapq.heappop(ready)  # stale: cancelled or moved since it was pushed
                bound = ready[0][0]
            else:
                bound = self._cur_min
        else:
            occ = self._occ
            for level in range(len(occ)):
                bitmap = occ[level]
                if bitmap:
                    shift = level * self._bits
                    up = shift + self._bits
                    slot = (bitmap & -bitmap).bit_length() - 1
                    bucket = self._levels[level][slot]
                    assert bucket is not None
                    if (
                        (level or self._tick > 1)
                        and len(bucket) <= _EXACT_SCAN
                        and not (self._st_sub is not None and level == self._st_level)
                    ):
                        # Cheap to be exact: saves the driver a wake-up per level.
                        bound = min(map(self._due.__getitem__, bucket))
                    else:
                        start = ((self._c >> up) << up) | (slot << shift)
                        bound = self._base + start * self._tick
                    break
        if self._st_sub is not None:
            if self._levels[self._st_level][self._st_slot] and (
                bound is None or self._last_now < bound
            ):
                # Staging still has timers to split: come back in a millisecond (one chunk per
                # ms is well within the lead time). Taking the minimum keeps this a lower
                # bound: anything due by then is covered by the bound above.
                bound = self._last_now + 1
        else:
            if len(self._due) - self._scan_size > self._chunk:
                self._scan_stage(None)  # inserts since the last look may have made a big bucket
            wake = self._stage_wake
            if wake is not None and (bound is None or wake < bound):
                bound = wake
        return bound

    # ------------------------------------------------------------------ updates
    def insert(self, key: K, due_ms: int, value: V) -> None:
        """Add a timer, or replace the one with the same key (its due time and value)."""
        due = self._due
        old = due.setdefault(key, due_ms)  # one hash lookup for the common, new-key case
        if old is not due_ms:
            # Replacing a timer with another due time. (The same int object means the same
            # place, so the value is simply overwritten there below.)
            self._detach(key, old)
            due[key] = due_ms
        t = (due_ms - self._base) // self._tick
        c = self._c
        if t <= c:
            # Already at or behind the wheel's tick: comes out on the next advance.
            cur = self._cur
            if cur and self._cur_one_due and due[next(iter(cur))] != due_ms:
                self._cur_one_due = False
            cur[key] = value
            if self._cur_min is None or due_ms < self._cur_min:
                self._cur_min = due_ms
            if self._ready is not None:
                heapq.heappush(self._ready, (due_ms, next(self._seq), key))
            return
        bits = self._bits
        level = ((t ^ c).bit_length() - 1) // bits
        slot = (t >> (level * bits)) & self._mask
        levels = self._levels
        while level >= len(levels):
            levels.append([None] * self._size)
            self._occ.append(0)
        row = levels[level]
        bucket = row[slot]
        if bucket is None:
            bucket = row[slot] = {}
            self._occ[level] |= 1 << slot
        bucket[key] = value

    def cancel(self, key: K) -> bool:
        """Remove a timer; True if it was pending."""
        due_ms = self._due.pop(key, None)
        if due_ms is None:
            return False
        # _detach inlined: cancel is on the ingest hot path.
        t = (due_ms - self._base) // self._tick
        c = self._c
        if t <= c:
            cur = self._cur
            del cur[key]
            if not cur:
                self._ready = None
                self._cur_min = None
                self._cur_one_due = True
            return True
        bits = self._bits
        level = ((t ^ c).bit_length() - 1) // bits
        slot = (t >> (level * bits)) & self._mask
        if self._st_sub is not None and level == self._st_level and slot == self._st_slot:
            self._stage_remove(key, t)
            return True
        row = self._levels[level]
        bucket = row[slot]
        assert bucket is not None
        del bucket[key]
        if not bucket:
            row[slot] = None
            self._occ[level] &= ~(1 << slot)
        return True

    def _detach(self, key: K, due_ms: int) -> None:
        # Remove key from the dict that holds its value; the caller maintains _due.
        t = (due_ms - self._base) // self._tick
        c = self._c
        if t <= c:
            cur = self._cur
            del cur[key]  # a _ready heap entry for it goes stale; skipped on pop
            if not cur:
                self._ready = None
                self._cur_min = None
                self._cur_one_due = True
            return
        bits = self._bits
        level = ((t ^ c).bit_length() - 1) // bits
        slot = (t >> (level * bits)) & self._mask
        if self._st_sub is not None and level == self._st_level and slot == self._st_slot:
            self._stage_remove(key, t)
            return
        row = self._levels[level]
        bucket = row[slot]
        assert bucket is not None
        del bucket[key]
        if not bucket:
            row[slot] = None
            self._occ[level] &= ~(1 << slot)

    def _stage_remove(self, key: K, t: int) -> None:
        level = self._st_level
        row = self._levels[level]
        src = row[self._st_slot]
        subs = self._st_sub
        assert src is not None and subs is not None
        if key in src:
            del src[key]
        else:
            j = (t >> ((level - 1) * self._bits)) & self._mask
            sub = subs[j]
            assert sub is not None
            del sub[key]
            self._st_n -= 1
            if not sub:
                subs[j] = None
        if not src and not self._st_n:
            # Every timer of the staged bucket was cancelled: drop it.
            row[self._st_slot] = None
            self._occ[level] &= ~(1 << self._st_slot)
            self._st_sub = None
            self._scan_ms = self._scan_size = 0

    # ------------------------------------------------------------------ time
    def advance(self, now_ms: int, max_batch: int | None = None) -> list[tuple[int, K, V]]:
        """Fire due entries: (due_ms, key, value) with due_ms <= now_ms, in nondecreasing due
        order, at most max_batch of them; the rest come first on the next call(s).

        The wheel's time never goes back: an older now_ms only returns entries still pending
        with due_ms <= now_ms (a max_batch remainder, a late insert), so with nothing such it
        is a no-op; `advance(last_fired_due)` after a cut finishes that millisecond. An entry
        inserted with a due_ms before an instant already fired comes out on the next call
        whose now_ms reaches it, ahead of everything later, so across calls the order is
        nondecreasing except for such late inserts.
        """
        if max_batch is None:
            budget = sys.maxsize
        elif max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        else:
            budget = max_batch
        n = (now_ms - self._base) // self._tick
        out: list[tuple[int, K, V]] = []
        while True:
            cur = self._cur
            if cur:
                c = self._c
                if (
                    self._ready is None
                    and len(cur) <= budget
                    and (c < n or (c == n and self._tick == 1))
                ):
                    # Common case: the whole of _cur is due and fits; one sort, no heap.
                    pop = self._due.pop
                    fired = [(pop(k), k, v) for k, v in cur.items()]
                    if len(fired) > 1:
                        fired.sort(key=_by_due)
                    self._cur = {}
                    self._cur_min = None
                    self._cur_one_due = True
                    if out:
                        out.extend(fired)
                    else:
                        out = fired
                    budget -= len(fired)
                elif self._cur_one_due and self._ready is None:
                    budget -= self._fire_one_due(now_ms, budget, out)
                else:
                    budget -= self._fire_ordered(now_ms, budget, out)
                if budget <= 0:
                    break
            # Here _cur holds nothing due by now_ms; if _c < n it is empty (its ticks are past).
            if self._c >= n:
                break
            self._absorb(n, budget)
        if now_ms > self._last_now:
            self._last_now = now_ms
        if budget > 0:  # not cut short by max_batch: spend a chunk on staging
            if self._st_sub is not None:
                self._stage_split(self._chunk)
            elif now_ms >= self._scan_ms or len(self._due) - self._scan_size > self._chunk:
                self._scan_stage(now_ms)
        return out

    def _scan_stage(self, now_ms: int | None) -> None:
        # Look at the next bucket of every level >= 1 (the only ones that get cascaded). A big
        # one (> cascade_chunk timers) whose start is within its lead time is staged now,
        # given a now_ms; otherwise remember when to begin.
        occ = self._occ
        wake: int | None = None
        for level in range(1, len(occ)):
            bitmap = occ[level]
            if not bitmap:
                continue
            slot = (bitmap & -bitmap).bit_length() - 1
            bucket = self._levels[level][slot]
            assert bucket is not None
            size = len(bucket)
            if size <= self._chunk:
                continue
            shift = level * self._bits
            up = shift + self._bits
            start = ((self._c >> up) << up) | (slot << shift)
            begin = self._base + start * self._tick - _stage_lead_ms(size)
            if now_ms is not None and begin <= now_ms:
                self._st_level = level
                self._st_slot = slot
                self._st_sub = [None] * self._size
                self._st_n = 0
                self._stage_wake = None
                self._stage_split(self._chunk)
                return
            if wake is None or begin < wake:
                wake = begin
        self._stage_wake = wake
        self._scan_size = len(self._due)
        if now_ms is not None:
            self._scan_ms = now_ms + _SCAN_EVERY_MS
        if wake is not None and wake < self._scan_ms:
            # advance() must look again by then: next_deadline() sends the driver at `wake`.
            self._scan_ms = wake

    def _stage_split(self, limit: int) -> None:
        # Move up to `limit` unsplit timers of the staged bucket to their sub-slot.
        src = self._levels[self._st_level][self._st_slot]
        subs = self._st_sub
        assert src is not None and subs is not None
        due = self._due
        base = self._base
        tick = self._tick
        mask = self._mask
        shift = (self._st_level - 1) * self._bits
        popitem = src.popitem
        moved = min(limit, len(src))
        for _ in range(moved):
            k, v = popitem()
            j = (((due[k] - base) // tick) >> shift) & mask
            b = subs[j]
            if b is None:
                b = subs[j] = {}
            b[k] = v
        self._st_n += moved

    def _enter_stage(self) -> dict[K, V]:
        # _c has reached the staged bucket (it is the next event, so every lower level is
        # empty): install its sub-slots as the row below and return sub-slot 0, the part
        # that starts at the bucket's start, for the caller to hand over or cascade.
        level = self._st_level
        self._stage_split(len(self._levels[level][self._st_slot] or ()))
        subs = self._st_sub
        assert subs is not None
        self._st_sub = None
        self._scan_ms = self._scan_size = 0  # look for the next one on the next advance()
        self._levels[level][self._st_slot] = None
        self._occ[level] &= ~(1 << self._st_slot)
        below = self._levels[level - 1]
        assert not self._occ[level - 1]
        bitmap = 0
        for j in range(1, self._size):
            b = subs[j]
            if b is not None:
                below[j] = b
                bitmap |= 1 << j
        self._occ[level - 1] = bitmap
        return subs[0] or {}

    def _fire_ordered(self, now: int, budget: int, out: list[tuple[int, K, V]]) -> int:
        # _cur after a max_batch cut, or with entries later in the current tick: keep a heap.
        cur = self._cur
        ready = self._ready
        if ready is None:
            due = self._due
            seq = self._seq
            ready = [(due[k], next(seq), k) for k in cur]
            heapq.heapify(ready)
            self._ready = ready
        due = self._due
        heappop = heapq.heappop
        fired_n = 0
        while ready and fired_n < budget:
            d, _, k = ready[0]
            if due.get(k) != d:
                heappop(ready)  # stale entry of a cancelled or replaced timer
                continue
            if d > now:
                break  # sub-tick: due later within the current tick
            heappop(ready)
            del due[k]
            out.append((d, k, cur.pop(k)))
            fired_n += 1
        if cur:
            self._cur_min = ready[0][0]
        else:
            self._ready = None
            self._cur_min = None
            self._cur_one_due = True
        return fired_n

    def _fire_one_due(self, now: int, budget: int, out: list[tuple[int, K, V]]) -> int:
        # Every entry in _cur has the same due (a herd): any `budget` of them are in order, so
        # a cut costs O(budget), not a sort or heap of the whole herd.
        cur = self._cur
        due = self._due
        if due[next(iter(cur))] > now:
            return 0
        take = min(budget, len(cur))
        popitem = cur.popitem
        pop = due.pop
        for _ in range(take):
            k, v = popitem()
            out.append((pop(k), k, v))
        if not cur:
            self._cur_min = None
        return take

    def _absorb(self, n: int, budget: int) -> None:
        # Move _c towards n bucket by bucket, collecting due entries into _cur, until _c == n
        # or _cur holds enough to fill the batch. Precondition: nothing due is in _cur and
        # there is no _ready heap (so _cur is empty, as _c < n).
        c = self._c
        cur = self._cur
        levels = self._levels
        occ = self._occ
        bits = self._bits
        base = self._base
        tick = self._tick
        cur_min = self._cur_min
        one_due = self._cur_one_due
        nlevels = len(occ)
        while c < n and len(cur) < budget:
            level = 0
            while level < nlevels and not occ[level]:
                level += 1
            if level == nlevels:
                c = n  # no bucket at all: jump
                break
            bitmap = occ[level]
            low = bitmap & -bitmap
            slot = low.bit_length() - 1
            shift = level * bits
            up = shift + bits
            start = ((c >> up) << up) | (slot << shift)
            if start > n:
                c = n  # nothing starts before n: jump; every bucket keeps its place
                break
            if self._st_sub is not None and level == self._st_level and slot == self._st_slot:
                # The staged bucket: its split part becomes the row below; what remains to
                # place now is its first sub-slot, a bucket one level down at the same start.
                bucket = self._enter_stage()
                level -= 1
                shift -= bits
            else:
                row = levels[level]
                taken = row[slot]
                assert taken is not None
                bucket = taken
                row[slot] = None
                occ[level] = bitmap ^ low
            last = start + (1 << shift) - 1
            if last <= n:
                # The whole bucket is at or before n: hand it over without touching entries.
                start_ms = base + start * tick
                if cur_min is None or start_ms < cur_min:
                    cur_min = start_ms
                c = last
                if cur:
                    cur.update(bucket)
                    one_due = False
                else:
                    cur = self._cur = bucket
                    one_due = level == 0 and tick == 1  # a 1 ms slot: a single due_ms
                continue
            # n falls inside this bucket: cascade its entries relative to c = n. The ones due
            # by n join _cur; their exact minimum and whether they share one due_ms are kept,
            # so a herd found by a late wake-up is still cut without ordering all of it.
            c = n
            due = self._due
            mask = self._mask
            common = due[next(iter(cur))] if cur and one_due else None
            if not cur:
                one_due = True
            for k, v in bucket.items():
                d = due[k]
                t = (d - base) // tick
                if t <= c:
                    cur[k] = v
                    if cur_min is None or d < cur_min:
                        cur_min = d
                    if one_due:
                        if common is None:
                            common = d
                        elif d != common:
                            one_due = False
                    continue
                lv = ((t ^ c).bit_length() - 1) // bits
                s = (t >> (lv * bits)) & mask
                r = levels[lv]
                b = r[s]
                if b is None:
                    b = r[s] = {}
                    occ[lv] |= 1 << s
                b[k] = v
        self._c = c
        self._cur_min = cur_min if cur else None
        self._cur_one_due = one_due if cur else True
