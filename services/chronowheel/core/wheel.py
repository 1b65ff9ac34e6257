"""Hierarchical timing wheel (Varghese & Lauck) with millisecond precision.

Layout
------
Time is counted in ticks of `tick_ms` since `start_ms` (floored to a tick). Level L has
`wheel_size` (= 2**b) slots of 2**(b*L) ticks each; levels are created when first needed, so
an entry 30 days or 10 years out costs the same as one due in a second.

Slots are *aligned* to absolute tick numbers (like the Linux kernel's timer wheel, unlike
Kafka's purgatory wheel whose levels float with the insertion time). With `c` the last tick the
wheel has reached, an entry due at tick `t > c` lives at the highest level L where `t` and `c`
differ in their L-th group of b bits, in slot `(t >> b*L) & mask`. The place of an entry is a
pure function of (its due tick, c), and, as c only grows towards t, an entry inserted twice
for the same tick lands in the same bucket both times. Two consequences:

* every occupied slot on level L lies strictly after c's slot on that level, and all of level
  L comes before anything on level L+1. The next non-empty bucket is therefore the lowest set
  bit of the lowest non-empty level's occupancy bitmap: O(levels), and empty ticks cost
  nothing (the role of Kafka's DelayQueue of buckets, without a heap).
* a bucket need not be a set: it is a plain list of keys (8 bytes an entry, against 30-40 for
  a dict slot), and cancel/replace never touch it. One dict, `_items`, says what is pending:
  key -> the entry. A key in a bucket is *live* there only while `_items` holds it with a due
  tick inside the bucket's range; otherwise it is a leftover of a cancel or a move, dropped
  when its bucket is reached (or by `_compact`, when leftovers outnumber live timers). A
  timer inserted again for the same tick is twice in one bucket; firing it removes it from
  `_items`, so the second copy is dropped, never fired twice.

The entry `_items` holds is the value itself when the wheel is given `due_of` (the value then
knows its due; the node's entries do), else a (due, value) pair.

Entries with due tick <= c sit in one list, `_cur` (the current tick plus anything inserted
already due). advance() fires `_cur` in due order, then takes the next non-empty bucket: if it
ends by `now` the whole list is handed to `_cur` in O(1); otherwise (now falls inside it) its
entries are re-placed relative to `now` (cascade) and the ones already due go to `_cur`. Sub-tick
precision: an entry of the current tick whose exact due_ms is still ahead stays in `_cur`
until an advance whose now_ms reaches it.

A max_batch cut (or a partly due current tick) leaves the current entries with an order to
keep: they move to a heap `_ready` of (due, seq, key), validated lazily on pop, which exists
only in that case and then replaces `_cur`.

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
from collections.abc import Callable, Hashable
from operator import itemgetter
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_by_due = itemgetter(0)
_MISSING: Any = object()
# next_deadline() scans a bucket this small for its exact minimum instead of returning the
# bucket's start: a sparse far-future wheel then costs one wake-up per timer, not one per level.
_EXACT_SCAN = 32
# Without inserts, advance() looks for a big bucket to stage at most this often.
_SCAN_EVERY_MS = 32
# Leftover keys of cancels and moves are swept out of the buckets once they may outnumber
# both the live timers and this: a sweep is O(keys in buckets), so its cost per cancel is O(1),
# and a wheel never holds more than about twice its live keys plus this.
_COMPACT_MIN = 4096


def _stage_lead_ms(entries: int) -> int:
    # How long before a big bucket's start to begin staging it: half a second, so a driver
    # that only wakes every few hundred ms still sees it coming, plus a generous 4 µs of the
    # owner's time per timer (one split step costs about 0.3-2 µs in CPython).
    return 500 + entries * 4 // 1000


class TimingWheel(Generic[K, V]):
    """Timers keyed by K carrying a V, fired by `advance(now_ms)`; never before their due_ms.

    Given `due_of`, each value knows its own due (`due_of(value) == due_ms` on insert, checked)
    and is held as it is; the wheel then returns, as the key of a fired timer, its value: the
    caller's keys are its values, or compare equal to them. Without it, each timer costs a
    (due, value) pair more.

    `next_deadline()` is a lower bound, never later than the earliest pending due_ms. It is
    exact when the earliest non-empty bucket is the current tick, a level-0 slot with
    tick_ms=1, or holds at most 32 timers (it is then scanned); otherwise it is that bucket's
    start, so a driver sleeping until it may wake early, advance (which cascades the bucket
    and fires nothing), and then get a tighter deadline: at most one early wake-up per level
    (and one per bucket left holding only cancelled timers).
    It is also earlier when there is staging to do (see the module doc): the time to begin it,
    and, while a staged bucket still has timers to split, one millisecond after the last now_ms
    given to advance(). A driver that honours it gets bounded work per advance() call.
    """

    __slots__ = (
        "_bare",
        "_base",
        "_bits",
        "_c",
        "_chunk",
        "_cur",
        "_cur_min",
        "_cur_one_due",
        "_due_of",
        "_items",
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
        "_st_slot",
        "_st_sub",
        "_stage_wake",
        "_stale",
        "_tick",
    )

    def __init__(
        self,
        *,
        start_ms: int,
        tick_ms: int = 1,
        wheel_size: int = 256,
        cascade_chunk: int = 4096,
        due_of: Callable[[V], int] | None = None,
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
        # Every pending timer: key -> its value (given due_of) or (due_ms, value).
        self._items: dict[K, Any] = {}
        self._bare = due_of is not None
        self._due_of: Callable[[Any], int] = _by_due if due_of is None else due_of
        self._stale = 0  # at most this many leftover keys in _cur and the buckets
        self._cur: list[K] = []  # keys with due tick <= _c (and leftovers)
        self._cur_min: int | None = None  # lower bound on the smallest due in _cur
        # True when every live entry in _cur has the same due_ms (a 1 ms level-0 slot handed
        # over whole, e.g. a herd): a max_batch cut then takes any entries, no ordering needed.
        self._cur_one_due = True
        # After a cut: the current entries in order, in place of _cur (which is then empty).
        self._ready: list[tuple[int, int, K]] | None = None
        self._seq = itertools.count()  # heap tie-breaker: keys need not be comparable
        self._levels: list[list[list[K] | None]] = []
        self._occ: list[int] = []  # per level: bit s set <=> slot s holds a bucket
        self._chunk = cascade_chunk
        self._last_now = start_ms  # latest now_ms given to advance()
        # The staged bucket, if any: levels[_st_level][_st_slot] still holds its unsplit
        # keys (possibly none); _st_sub[j] holds those already split to sub-slot j one
        # level down.
        self._st_level = 0
        self._st_slot = 0
        self._st_sub: list[list[K] | None] | None = None
        # When to look for a big bucket to stage next: once now_ms reaches _scan_ms, or the
        # wheel grew by more than a chunk since the last look (_scan_size). That look found
        # the earliest instant to begin staging one: _stage_wake.
        self._scan_ms = start_ms
        self._scan_size = 0
        self._stage_wake: int | None = None

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def due_times(self) -> dict[K, int]:
        """key -> due_ms of every pending entry (a copy, for checks and tests)."""
        due_of = self._due_of
        return {k: due_of(x) for k, x in self._items.items()}

    def held(self) -> int:
        """Keys held in the buckets and the current list, leftovers of cancels and moves
        included: at least len(self), at most about twice it plus a few thousand."""
        n = len(self._cur) + len(self._ready or ())
        for row in self._levels:
            n += sum(len(b) for b in row if b is not None)
        if self._st_sub is not None:
            n += sum(len(b) for b in self._st_sub if b is not None)
        return n

    def get(self, key: K) -> tuple[int, V] | None:
        x = self._items.get(key, _MISSING)
        if x is _MISSING:
            return None
        if self._bare:
            return self._due_of(x), x
        due, value = x
        return due, value

    def _bucket_start(self, level: int, slot: int) -> int:
        # First tick of a bucket on `level` (the next occurrence of `slot` after _c's).
        shift = level * self._bits
        up = shift + self._bits
        return ((self._c >> up) << up) | (slot << shift)

    def next_deadline(self) -> int | None:
        """Lower bound on the earliest pending due_ms (see the class doc), None when empty."""
        items = self._items
        if not items:
            return None
        bound: int | None = None
        ready = self._ready
        if ready is not None:
            due_of = self._due_of
            while ready:
                d, _, k = ready[0]
                x = items.get(k, _MISSING)
                if x is not _MISSING and due_of(x) == d:
                    break
                heapq.heappop(ready)  # stale: cancelled, moved or fired since it was pushed
            if ready:
                bound = ready[0][0]
            else:
                self._ready = None
        elif self._cur:
            bound = self._cur_min
        if bound is None:
            occ = self._occ
            for level in range(len(occ)):
                bitmap = occ[level]
                if bitmap:
                    slot = (bitmap & -bitmap).bit_length() - 1
                    bucket = self._levels[level][slot]
                    assert bucket is not None
                    start = self._bucket_start(level, slot)
                    bound = self._base + start * self._tick
                    if (
                        (level or self._tick > 1)
                        and len(bucket) <= _EXACT_SCAN
                        and not (self._st_sub is not None and level == self._st_level)
                    ):
                        # Cheap to be exact: saves the driver a wake-up per level.
                        exact = self._live_min(bucket, start, start + (1 << level * self._bits))
                        if exact is not None:
                            bound = exact
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
            if len(items) - self._scan_size > self._chunk:
                self._scan_stage(None)  # inserts since the last look may have made a big bucket
            wake = self._stage_wake
            if wake is not None and (bound is None or wake < bound):
                bound = wake
        return bound

    def _live_min(self, bucket: list[K], start: int, end: int) -> int | None:
        # Smallest due of the keys live in a bucket of ticks [start, end); None if none is.
        items, due_of, base, tick = self._items, self._due_of, self._base, self._tick
        best: int | None = None
        for k in bucket:
            x = items.get(k, _MISSING)
            if x is _MISSING:
                continue
            d = due_of(x)
            if start <= (d - base) // tick < end and (best is None or d < best):
                best = d
        return best

    # ------------------------------------------------------------------ updates
    def insert(self, key: K, due_ms: int, value: V) -> None:
        """Add a timer, or replace the one with the same key (its due time and value)."""
        items = self._items
        if self._bare:
            if self._due_of(value) != due_ms:
                raise ValueError(f"due_ms {due_ms} is not the value's own due "
                                 f"{self._due_of(value)}")
            x: Any = value
        else:
            x = (due_ms, value)
        pending = len(items)
        old = items.setdefault(key, x)  # one hash lookup for the common, new-key case
        if len(items) == pending:  # the key was pending already (maybe with this very x)
            items[key] = x
            if self._due_of(old) == due_ms:
                return  # the key is already in the right place; it now fires the new value
            # Moved: its old place keeps a leftover key, dropped when reached.
            self._stale += 1
            if self._stale > _COMPACT_MIN and self._stale > len(items):
                self._compact()
        t = (due_ms - self._base) // self._tick
        c = self._c
        if t <= c:
            # Already at or behind the wheel's tick: comes out on the next advance.
            ready = self._ready
            if ready is not None:
                heapq.heappush(ready, (due_ms, next(self._seq), key))
                return
            cur = self._cur
            if cur and self._cur_one_due:
                first = items.get(cur[0], _MISSING)
                if first is _MISSING or self._due_of(first) != due_ms:
                    self._cur_one_due = False
            cur.append(key)
            if self._cur_min is None or due_ms < self._cur_min:
                self._cur_min = due_ms
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
            row[slot] = [key]
            self._occ[level] |= 1 << slot
        else:
            bucket.append(key)

    def cancel(self, key: K) -> bool:
        """Remove a timer; True if it was pending. O(1): its key is left where it was."""
        items = self._items
        if items.pop(key, _MISSING) is _MISSING:
            return False
        self._stale += 1
        if self._stale > _COMPACT_MIN and self._stale > len(items):
            self._compact()
        return True

    def _compact(self) -> None:
        # Drop every leftover key from _cur and the buckets (the staged one aside: it is
        # about to be split, which drops most of them), and empty buckets with them.
        items, due_of, base, tick = self._items, self._due_of, self._base, self._tick
        c = self._c

        def live(keys: list[K], start: int, end: int) -> list[K]:
            # One copy of each key live in a bucket of ticks [start, end): a timer moved
            # within its bucket, or cancelled and inserted again there, is in it twice.
            out = []
            seen: set[K] = set()
            for k in keys:
                if k in seen:
                    continue
                x = items.get(k, _MISSING)
                if x is not _MISSING and start <= (due_of(x) - base) // tick < end:
                    out.append(k)
                    seen.add(k)
            return out

        if self._cur:
            self._cur = live(self._cur, -sys.maxsize, c + 1)
            if not self._cur:
                self._cur_min = None
                self._cur_one_due = True
        staged = (self._st_level, self._st_slot) if self._st_sub is not None else None
        for level, row in enumerate(self._levels):
            for slot, bucket in enumerate(row):
                if bucket is None or (level, slot) == staged:
                    continue
                start = self._bucket_start(level, slot)
                kept = live(bucket, start, start + (1 << level * self._bits))
                if kept:
                    row[slot] = kept
                else:
                    row[slot] = None
                    self._occ[level] &= ~(1 << slot)
        self._stale = 0

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
            if self._ready is not None:
                budget -= self._fire_ordered(now_ms, budget, out)
            elif self._cur:
                c = self._c
                if len(self._cur) <= budget and (c < n or (c == n and self._tick == 1)):
                    # Common case: the whole of _cur is due and fits; one sort, no heap.
                    budget -= self._fire_all(out)
                elif self._cur_one_due:
                    budget -= self._fire_one_due(now_ms, budget, out)
                else:
                    budget -= self._fire_ordered(now_ms, budget, out)
            if budget <= 0:
                break
            # Here nothing current is due by now_ms; if _c < n there is nothing current at all
            # (its ticks are past).
            if self._c >= n:
                break
            self._absorb(n, budget)
        if now_ms > self._last_now:
            self._last_now = now_ms
        if budget > 0:  # not cut short by max_batch: spend a chunk on staging
            if self._st_sub is not None:
                self._stage_split(self._chunk)
            elif now_ms >= self._scan_ms or len(self._items) - self._scan_size > self._chunk:
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
            begin = self._base + self._bucket_start(level, slot) * self._tick - \
                _stage_lead_ms(size)
            if now_ms is not None and begin <= now_ms:
                self._st_level = level
                self._st_slot = slot
                self._st_sub = [None] * self._size
                self._stage_wake = None
                self._stage_split(self._chunk)
                return
            if wake is None or begin < wake:
                wake = begin
        self._stage_wake = wake
        self._scan_size = len(self._items)
        if now_ms is not None:
            self._scan_ms = now_ms + _SCAN_EVERY_MS
        if wake is not None and wake < self._scan_ms:
            # advance() must look again by then: next_deadline() sends the driver at `wake`.
            self._scan_ms = wake

    def _stage_split(self, limit: int) -> None:
        # Move up to `limit` unsplit keys of the staged bucket to their sub-slot; leftovers
        # of cancels and moves are dropped on the way.
        level = self._st_level
        src = self._levels[level][self._st_slot]
        subs = self._st_sub
        assert src is not None and subs is not None
        items = self._items
        due_of = self._due_of
        base = self._base
        tick = self._tick
        mask = self._mask
        start = self._bucket_start(level, self._st_slot)
        end = start + (1 << level * self._bits)
        shift = (level - 1) * self._bits
        pop = src.pop
        for _ in range(min(limit, len(src))):
            k = pop()
            x = items.get(k, _MISSING)
            if x is _MISSING:
                continue
            t = (due_of(x) - base) // tick
            if t < start or t >= end:
                continue
            j = (t >> shift) & mask
            b = subs[j]
            if b is None:
                subs[j] = [k]
            else:
                b.append(k)

    def _enter_stage(self) -> list[K]:
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
        return subs[0] or []

    def _fire_all(self, out: list[tuple[int, K, V]]) -> int:
        # Every live key of _cur is due: fire them all, in due order.
        cur = self._cur
        self._cur = []
        self._cur_min = None
        self._cur_one_due = True
        items = self._items
        pop = items.pop
        due_of = self._due_of
        base, tick, c = self._base, self._tick, self._c
        fired: list[tuple[int, Any, Any]] = []
        append = fired.append
        if self._bare:
            for k in cur:
                x = pop(k, _MISSING)
                if x is _MISSING:
                    continue  # cancelled, or a second copy of one fired just now
                d = due_of(x)
                if (d - base) // tick > c:
                    items[k] = x  # a leftover of a move to a later tick: it fires from there
                    continue
                append((d, x, x))
        else:
            for k in cur:
                x = pop(k, _MISSING)
                if x is _MISSING:
                    continue
                d = x[0]
                if (d - base) // tick > c:
                    items[k] = x
                    continue
                append((d, k, x[1]))
        if len(fired) > 1:
            fired.sort(key=_by_due)
        out.extend(fired)
        return len(fired)

    def _fire_ordered(self, now: int, budget: int, out: list[tuple[int, K, V]]) -> int:
        # The current entries after a max_batch cut, or with entries later in the current
        # tick: keep them in a heap, which then replaces _cur.
        items = self._items
        due_of = self._due_of
        ready = self._ready
        if ready is None:
            base, tick, c = self._base, self._tick, self._c
            seq = self._seq
            ready = []
            for k in self._cur:
                x = items.get(k, _MISSING)
                if x is _MISSING:
                    continue
                d = due_of(x)
                if (d - base) // tick <= c:
                    ready.append((d, next(seq), k))
            heapq.heapify(ready)
            self._ready = ready
            self._cur = []
            self._cur_min = None
            self._cur_one_due = True
        bare = self._bare
        heappop = heapq.heappop
        fired_n = 0
        while ready and fired_n < budget:
            d, _, k = ready[0]
            x = items.get(k, _MISSING)
            if x is _MISSING or due_of(x) != d:
                heappop(ready)  # stale entry of a cancelled, moved or fired timer
                continue
            if d > now:
                break  # sub-tick: due later within the current tick
            heappop(ready)
            del items[k]
            out.append((d, x, x) if bare else (d, k, x[1]))
            fired_n += 1
        if not ready:
            self._ready = None
        return fired_n

    def _fire_one_due(self, now: int, budget: int, out: list[tuple[int, K, V]]) -> int:
        # Every live entry in _cur has the same due (a herd): any `budget` of them are in
        # order, so a cut costs O(budget), not a sort or heap of the whole herd. A key whose
        # entry has another due is therefore a leftover of a move to a later tick.
        cur = self._cur
        items = self._items
        pop = items.pop
        due_of = self._due_of
        common: int | None = None
        while cur:  # the herd's due, from its first live entry
            x = items.get(cur[-1], _MISSING)
            if x is not _MISSING:
                d = due_of(x)
                if (d - self._base) // self._tick <= self._c:
                    common = d
                    break
            cur.pop()
        if common is None or common > now:
            if not cur:
                self._cur_min = None
                self._cur_one_due = True
            else:
                # The herd's instant is later within this tick. Every live entry here has that
                # due, so it is the exact bound: left at an earlier instant (a key moved within
                # the tick), next_deadline would send a driver back at once, again and again.
                self._cur_min = common
            return 0  # nothing current, or the herd's instant is later within this tick
        fired = 0
        if self._bare:
            while cur and fired < budget:
                k = cur.pop()
                x = pop(k, _MISSING)
                if x is _MISSING:
                    continue
                if due_of(x) != common:
                    items[k] = x
                    continue
                out.append((common, x, x))
                fired += 1
        else:
            while cur and fired < budget:
                k = cur.pop()
                x = pop(k, _MISSING)
                if x is _MISSING:
                    continue
                if x[0] != common:
                    items[k] = x
                    continue
                out.append((common, k, x[1]))
                fired += 1
        if not cur:
            self._cur_min = None
            self._cur_one_due = True
        return fired

    def _absorb(self, n: int, budget: int) -> None:
        # Move _c towards n bucket by bucket, collecting due entries into _cur, until _c == n
        # or _cur holds enough to fill the batch. Precondition: nothing is current (_cur is
        # empty and there is no _ready heap), as _c < n.
        c = self._c
        cur = self._cur
        levels = self._levels
        occ = self._occ
        bits = self._bits
        base = self._base
        tick = self._tick
        items = self._items
        due_of = self._due_of
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
                # The whole bucket is at or before n: hand it over without touching entries
                # (leftovers among them are dropped when fired).
                start_ms = base + start * tick
                if cur_min is None or start_ms < cur_min:
                    cur_min = start_ms
                c = last
                if cur:
                    cur.extend(bucket)
                    one_due = False
                else:
                    cur = self._cur = bucket
                    one_due = level == 0 and tick == 1  # a 1 ms slot: a single due_ms
                continue
            # n falls inside this bucket: cascade its entries relative to c = n. The ones due
            # by n join _cur; their exact minimum and whether they share one due_ms are kept,
            # so a herd found by a late wake-up is still cut without ordering all of it.
            c = n
            mask = self._mask
            common: int | None = None
            if cur and one_due:
                first = items.get(cur[0], _MISSING)
                if first is _MISSING:
                    one_due = False
                else:
                    common = due_of(first)
            if not cur:
                one_due = True
            for k in bucket:
                x = items.get(k, _MISSING)
                if x is _MISSING:
                    continue
                d = due_of(x)
                t = (d - base) // tick
                if t < start or t > last:
                    continue  # a leftover of a move: the timer is in its new place
                if t <= c:
                    cur.append(k)
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
                    r[s] = [k]
                    occ[lv] |= 1 << s
                else:
                    b.append(k)
        self._c = c
        self._cur_min = cur_min if cur else None
        self._cur_one_due = one_due if cur else True
