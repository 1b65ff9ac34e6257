"""The loader: keeps a shard's wheel filled from Cassandra's minute buckets ahead of time.

It raises `horizon_ms` minute by minute up to now + lookahead, within the memory cap; jumps
over empty minutes by their bucket counts when far behind; and pre-warms hot buckets (more rows
than `hot_bucket_rows`) up to `prewarm_ms` ahead, so a herd is in memory before its minute.
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


class Loader:
    def __init__(self, *, state: ShardState, settings: Settings, store: JobStore,
                 clock: Clock) -> None:
        self.state = state
        self.shard = state.shard
        self.settings = settings
        self.store = store
        self.clock = clock

    async def run(self) -> None:
        state = self.state
        began, rows = self.clock.now_ms(), len(state.wheel)
        first = True
        while not state.stopping:
            state.loader_wake.clear()
            await self.load_horizon()
            if first:
                # How long a takeover's shard waited for its wheel (a slow failover shows it).
                first = False
                log.info("shard %d: wheel loaded to %d in %d ms (%d rows)", self.shard,
                         state.horizon_ms, self.clock.now_ms() - began,
                         len(state.wheel) - rows, extra={"shard": self.shard})
            await self.prewarm()
            await sleep_until_or_event(self.clock, self.clock.now_ms() + LOADER_POLL_MS,
                                       state.loader_wake)

    async def load_horizon(self) -> None:
        state = self.state
        target = self.clock.now_ms() + self.settings.lookahead_ms
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
            last_slot = await self._read_minute(m, state.horizon_ms + 1, cap)
            if last_slot is not None:  # stopped at the cap inside this minute
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

    async def _read_minute(self, minute: int, from_slot: int, cap: int | None) -> int | None:
        """Load one bucket into the wheel; with a cap, stop once the wheel holds that many.

        Returns the slot of the last row loaded when it stopped at the cap, else None.
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
        start = minute_of(state.horizon_ms + 1)  # the next minute to load may be hot too
        end = minute_of(self.clock.now_ms() + s.prewarm_ms)
        if start > end:
            return
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
