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

One owner: like Netty's HashedWheelTimer, the wheel is driven by a single task and is not
thread-safe. Work per advance() is bounded by max_batch fired entries plus cascades.
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


class TimingWheel(Generic[K, V]):
    """Timers keyed by K carrying a V, fired by `advance(now_ms)`; never before their due_ms.

    `next_deadline()` is a lower bound, never later than the earliest pending due_ms. It is
    exact when the earliest non-empty bucket is the current tick, a level-0 slot with
    tick_ms=1, or holds at most 32 timers (it is then scanned); otherwise it is that bucket's
    start, so a driver sleeping until it may wake early, advance (which cascades the bucket
    and fires nothing), and then get a tighter deadline: at most one early wake-up per level.
    """

    __slots__ = (
        "_base",
        "_bits",
        "_c",
        "_cur",
        "_cur_min",
        "_cur_one_due",
        "_due",
        "_levels",
        "_mask",
        "_occ",
        "_ready",
        "_seq",
        "_size",
        "_tick",
    )

    def __init__(self, *, start_ms: int, tick_ms: int = 1, wheel_size: int = 256) -> None:
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

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def get(self, key: K) -> tuple[int, V] | None:
        due = self._due.get(key)
        if due is None:
            return None
        t = (due - self._base) // self._tick
        c = self._c
        if t <= c:
            return due, self._cur[key]
        bits = self._bits
        shift = ((t ^ c).bit_length() - 1) // bits * bits
        bucket = self._levels[shift // bits][(t >> shift) & self._mask]
        assert bucket is not None
        return due, bucket[key]

    def next_deadline(self) -> int | None:
        """Lower bound on the earliest pending due_ms (see the class doc), None when empty."""
        if self._cur:
            ready = self._ready
            if ready is not None:
                due = self._due
                while due.get(ready[0][2]) != ready[0][0]:
                    heapq.heappop(ready)  # stale: cancelled or moved since it was pushed
                return ready[0][0]
            return self._cur_min
        occ = self._occ
        for level in range(len(occ)):
            bitmap = occ[level]
            if bitmap:
                shift = level * self._bits
                up = shift + self._bits
                slot = (bitmap & -bitmap).bit_length() - 1
                if level or self._tick > 1:
                    bucket = self._levels[level][slot]
                    assert bucket is not None
                    if len(bucket) <= _EXACT_SCAN:
                        # Cheap to be exact: saves the driver a wake-up per level.
                        return min(map(self._due.__getitem__, bucket))
                start = ((self._c >> up) << up) | (slot << shift)
                return self._base + start * self._tick
        return None

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
            self._cur[key] = value
            self._cur_one_due = False
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
        row = self._levels[level]
        bucket = row[slot]
        assert bucket is not None
        del bucket[key]
        if not bucket:
            row[slot] = None
            self._occ[level] &= ~(1 << slot)

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
        return out

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
            row = levels[level]
            bucket = row[slot]
            assert bucket is not None
            row[slot] = None
            occ[level] = bitmap ^ low
            start_ms = base + start * tick
            if cur_min is None or start_ms < cur_min:
                cur_min = start_ms
            last = start + (1 << shift) - 1
            if last <= n:
                # The whole bucket is at or before n: hand it over without touching entries.
                c = last
                if cur:
                    cur.update(bucket)
                    one_due = False
                else:
                    cur = self._cur = bucket
                    one_due = level == 0 and tick == 1  # a 1 ms slot: a single due_ms
                continue
            # n falls inside this bucket: cascade its entries relative to c = n.
            c = n
            one_due = False
            due = self._due
            mask = self._mask
            for k, v in bucket.items():
                t = (due[k] - base) // tick
                if t <= c:
                    cur[k] = v
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
