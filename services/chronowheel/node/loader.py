"""The loader: keeps a shard's wheel filled from Cassandra's minute buckets ahead of time.

It raises `horizon_ms` minute by minute up to now + lookahead, within the memory cap; jumps
over empty minutes by their bucket counts when far behind; and pre-warms hot buckets (more rows
than `hot_bucket_rows`) up to `prewarm_ms` ahead, so a herd is in memory before its minute.
After a takeover it reads the next few seconds first, and the rest once no shard of the node is
still being taken over or waiting for its first commit (`first_load`).
"""

from __future__ import annotations

import contextlib
import logging

from chronowheel.core.buckets import MINUTE_MS, minute_of
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.node.pending import pending_from_row
from chronowheel.node.state import ShardState
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobStore

log = logging.getLogger(__name__)

LOADER_POLL_MS = 500
DUE_PAGE_ROWS = 500
"""Rows per page when reading a minute that has begun (after a takeover: the rows due now or
already): dispatch may go on after each such page, not only after the whole minute. A whole
minute of 3,600 rows took 60-85 ms to read on an idle cluster profile and several times that
under load; its first page of 500, 5-85 ms."""
FIRST_LOAD_AHEAD_MS = 5_000
"""After a takeover the loader reads the rows due within this much of now first (capped by
`lookahead_ms`), then holds the rest of the look-ahead back while shards of the node are
arriving (`Arrivals`)..."""
PREWARM_POLL_MS = 5_000
"""The pre-warm reads its window's bucket counts at most this often (the loader turns every
LOADER_POLL_MS): the herds it looks for are minutes ahead, and the read at every turn of every
shard was 32-64 requests a second to Cassandra from an idle node of 16 shards, a steady cost of
about 0.04 of Cassandra's cores for a count that changes only when jobs are ingested
(`loadtest/RESULTS.md`, "Requests in rounds")."""
FIRST_COMMIT_WAIT_MS = 2_000
"""...but not longer than this: dispatch has FIRST_LOAD_AHEAD_MS of rows meanwhile, so the hold
never leaves it without rows, whatever happens to the commits."""


class Loader:
    def __init__(self, *, state: ShardState, settings: Settings, store: JobStore,
                 clock: Clock) -> None:
        self.state = state
        self.shard = state.shard
        self.settings = settings
        self.store = store
        self.clock = clock
        self._counts_read_at: int | None = None
        """When the pre-warm last read its window's bucket counts (None: never)."""

    async def run(self) -> None:
        state = self.state
        began, rows = self.clock.now_ms(), len(state.wheel)
        first = True
        while not state.stopping:
            state.loader_wake.clear()
            near = await self.first_load() if first else None
            await self.load_horizon()
            if first:
                # How long a takeover's shard waited for its wheel (a slow failover shows it).
                first = False
                log.info("shard %d: wheel loaded to %d in %d ms (%d rows%s)", self.shard,
                         state.horizon_ms, self.clock.now_ms() - began,
                         len(state.wheel) - rows,
                         "" if near is None else f"; the next {near[0] // 1000} s in {near[1]} ms",
                         extra={"shard": self.shard})
            await self.prewarm()
            await sleep_until_or_event(self.clock, self.clock.now_ms() + LOADER_POLL_MS,
                                       state.loader_wake)

    async def first_load(self) -> tuple[int, int] | None:
        """After a takeover: read the rows due within FIRST_LOAD_AHEAD_MS first, then nothing
        more while a shard of the node is arriving (this one included: its takeover or its
        first commit since is not done, `Arrivals`), for at most FIRST_COMMIT_WAIT_MS. The
        rest of the look-ahead (thousands of rows a shard: three minutes at 1,000 occurrences
        a second over 16 shards) is parsed on the node's loop and in the driver's thread; read
        at once, it held the first transactions of the shards taken over with it back by up to
        0.7 s on a loaded machine, and with them their first messages. Returns (how far ahead,
        how long that took in ms), or None when the wheel is loaded that far already (a warm
        resume)."""
        state = self.state
        began = self.clock.now_ms()
        ahead = min(FIRST_LOAD_AHEAD_MS, self.settings.lookahead_ms)
        if state.horizon_ms >= began + ahead:
            return None
        await self.load_horizon(upto=began + ahead)
        now = self.clock.now_ms()
        took = now - began
        due = state.wheel.next_deadline()
        if (due is None or due > now) and not state.late:
            # Nothing to publish at once: no first transaction of this shard to keep clear
            # (an idle shard commits only after idle_commit_ms).
            state.arrivals.settled(self.shard)
        if state.horizon_ms < began + ahead:
            return ahead, took  # stopped at the memory cap: the loop reads on as dispatch drains
        if not state.arrivals.none.is_set() and not state.stopping:
            await sleep_until_or_event(self.clock, now + FIRST_COMMIT_WAIT_MS,
                                       state.arrivals.none, state.loader_wake)
        return ahead, took

    async def load_horizon(self, upto: int | None = None) -> None:
        """Load the wheel up to now + `lookahead_ms`, or up to `upto` (at least: up to the end
        of the page that passes it)."""
        state = self.state
        target = self.clock.now_ms() + self.settings.lookahead_ms if upto is None else upto
        cap = self.settings.bucket_cap_rows
        if target - state.horizon_ms > self.settings.skip_empty_after_ms:
            await self._skip_empty_minutes(target)
        while state.horizon_ms < target and not state.stopping:
            if len(state.wheel) + len(state.late) >= cap:
                return  # bounded memory: continue once dispatch has drained the wheel
            m = minute_of(state.horizon_ms + 1)
            if m in state.prewarmed:
                state.prewarmed.discard(m)
                state.loaded_minutes.discard(m)
                state.horizon_ms = m + MINUTE_MS - 1
                continue
            state.reading_upto = m + MINUTE_MS - 1
            last_slot = await self._read_minute(m, state.horizon_ms + 1, cap, past=upto)
            if last_slot is not None:  # stopped at the cap, or past `upto`, inside this minute
                state.horizon_ms = max(state.horizon_ms, last_slot - 1)
            else:
                state.horizon_ms = m + MINUTE_MS - 1
            state.reading_upto = state.horizon_ms
            state.wake.set()

    async def _skip_empty_minutes(self, target: int) -> None:
        """Far behind (a long outage, a clock jump): jump over minutes that never had a row.

        Counts are written with every due row before its wheel decision, so a zero count means
        no row; rows written while the counts are read are inside `reading_upto` and ingest
        puts them into the wheel itself.
        """
        state = self.state
        first = minute_of(state.horizon_ms + 1)
        last = minute_of(target)
        state.reading_upto = last + MINUTE_MS - 1
        state.reads_in_flight += 1
        try:
            counts = await self.store.bucket_counts(self.shard, first, last)
        finally:
            state.reads_in_flight -= 1
        nonempty = sorted(m for m, n in counts.items() if n > 0)
        next_full = nonempty[0] if nonempty else last
        if next_full > first:
            state.horizon_ms = max(state.horizon_ms, next_full - 1)
        state.reading_upto = state.horizon_ms

    async def _read_minute(self, minute: int, from_slot: int, cap: int | None,
                           past: int | None = None) -> int | None:
        """Load one bucket into the wheel; with a cap, stop once the wheel holds that many;
        with `past`, after the first page that ends beyond that slot.

        Returns the slot of the last row loaded when it stopped so, else None.
        """
        state = self.state
        state.reads_in_flight += 1
        seq0 = state.touch_seq + 1
        # A minute that has begun, read on from the horizon, holds rows due now: small pages,
        # and the horizon raised after each (rows come in slot order: every row before the
        # page's last slot is in the wheel now).
        begun = minute <= self.clock.now_ms() and from_slot == state.horizon_ms + 1
        page_rows = self.settings.bucket_page_rows
        if begun:
            page_rows = min(page_rows, DUE_PAGE_ROWS)
        try:
            pages = self.store.read_bucket(minute, self.shard, from_slot_ms=from_slot,
                                           page_rows=page_rows)
            async with contextlib.aclosing(pages):  # type: ignore[type-var]
                async for page in pages:
                    self.apply_rows(page, seq0)
                    if cap is not None and len(state.wheel) + len(state.late) >= cap and page:
                        return page[-1].slot_ms
                    if past is not None and page and page[-1].slot_ms > past:
                        return page[-1].slot_ms
                    if begun and page and page[-1].slot_ms - 1 > state.horizon_ms:
                        state.horizon_ms = page[-1].slot_ms - 1
                        state.wake.set()
            return None
        finally:
            state.reads_in_flight -= 1
            if not state.reads_in_flight:
                state.touched.clear()

    def apply_rows(self, rows: list[DueRow], seq0: int) -> None:
        """Put a page of rows read from a bucket into the wheel; `seq0` is the `touch_seq` at
        which the read began (rows of jobs changed since are stale)."""
        state = self.state
        watermark, touched, insert = state.watermark, state.touched, state.wheel.insert
        # After a takeover of a shard that was catching up, its late rows (behind_from,
        # late_cut] are loaded again, into the catch-up queue; (late_cut, watermark] is
        # published.
        catching_up = state.late_cut is not None
        for row in rows:
            if row.attempt == 1 and not row.origin and touched.get(row.job_id, 0) >= seq0:
                # Ingest or dispatch changed this job after the read began: the row may be
                # gone (a cancel, an edit, a pause), and a row it wrote is put in by it.
                continue
            if row.slot_ms <= watermark:
                if catching_up and state.late_range(row.slot_ms):
                    state.late.push(pending_from_row(row))
                continue  # published already
            p = pending_from_row(row)
            insert(p, p.slot_ms, p)

    async def prewarm(self) -> None:
        s, state = self.settings, self.state
        if s.prewarm_ms <= s.lookahead_ms:
            return
        now = self.clock.now_ms()
        if self._counts_read_at is not None and now - self._counts_read_at < PREWARM_POLL_MS:
            return
        start = minute_of(state.horizon_ms + 1)  # the next minute to load may be hot too
        end = minute_of(now + s.prewarm_ms)
        if start > end:
            return
        self._counts_read_at = now
        counts = await self.store.bucket_counts(self.shard, start, end)
        state.upcoming_rows = sum(counts.values())
        for minute in sorted(counts):
            rows = counts[minute]
            if rows <= s.hot_bucket_rows or minute in state.loaded_minutes \
                    or minute <= state.horizon_ms or state.stopping:
                continue
            if len(state.wheel) + rows > s.bucket_cap_rows:
                log.info("shard %d: hot bucket %d (%d rows) exceeds the memory cap; it will "
                         "be loaded in pages as it approaches", self.shard, minute, rows)
                continue
            state.loaded_minutes.add(minute)  # before the read: ingest inserts into it too
            t0 = self.clock.now_ms()
            await self._read_minute(minute, minute, None)
            state.prewarmed.add(minute)
            log.info("shard %d: pre-warmed hot bucket %d (%d rows counted) in %d ms, %.0f s "
                     "ahead", self.shard, minute, rows, self.clock.now_ms() - t0,
                     (minute - self.clock.now_ms()) / 1000)
