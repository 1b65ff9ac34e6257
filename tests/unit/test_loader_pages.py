"""The loader reads a minute that has begun (a takeover's first read, rows due now) in small
pages and raises the shard's horizon after each, so dispatch goes on before the whole minute
is read; a minute still ahead is read whole before the horizon moves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from chronowheel.core.buckets import MINUTE_MS
from chronowheel.core.clock import ManualClock
from chronowheel.node.loader import DUE_PAGE_ROWS, Loader
from chronowheel.node.state import ShardState
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow
from chronowheel.store.memory import MemoryStore

MINUTE = 1_796_115_600_000  # 2026-12-01T09:00:00Z, a minute's start


class PagedStore(MemoryStore):
    """Every page after the first waits for `more`; `sizes` records the pages asked for."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.more = asyncio.Event()
        self.sizes: list[int] = []

    async def read_bucket(self, minute: int, shard: int, *, from_slot_ms: int | None = None,
                          page_rows: int = 5000) -> AsyncIterator[list[DueRow]]:
        self.sizes.append(page_rows)
        first = True
        async for page in super().read_bucket(minute, shard, from_slot_ms=from_slot_ms,
                                              page_rows=page_rows):
            if not first:
                await self.more.wait()
            first = False
            yield page


def row(slot: int, i: int) -> DueRow:
    return DueRow(minute=MINUTE, shard=0, slot_ms=slot, job_id=f"j{i:05d}", attempt=1,
                  scheduled_ms=slot, version=1, topic="t", payload=b"", headers=(), spec=None)


async def loaded(now: int, page_rows: int = Settings.bucket_page_rows
                 ) -> tuple[ShardState, PagedStore, asyncio.Task[None]]:
    clock = ManualClock(now)
    store = PagedStore(clock)
    for i in range(3 * DUE_PAGE_ROWS):  # a row every 10 ms from the minute's start
        await store.put_due(row(MINUTE + 10 * i, i), ttl_s=86_400)
    settings = Settings(namespace="unit", shards=1, lookahead_ms=1_000,
                        bucket_page_rows=page_rows)
    state = ShardState(shard=0, start_ms=MINUTE, tick_ms=settings.tick_ms,
                       ingest_slack_ms=settings.ingest_slack_ms)
    state.watermark = state.committed_watermark = state.horizon_ms = MINUTE - 1
    loader = Loader(state=state, settings=settings, store=store, clock=clock)
    reading = asyncio.create_task(loader.load_horizon())
    while not store.sizes or (len(state.wheel) == 0 and not reading.done()):
        await asyncio.sleep(0)
    return state, store, reading


async def test_a_begun_minute_raises_the_horizon_page_by_page() -> None:
    state, store, reading = await loaded(now=MINUTE + 5_000)  # 500 rows due already
    await asyncio.sleep(0)
    assert store.sizes == [DUE_PAGE_ROWS]
    # After the first page: its rows are in, and dispatch may take all but its last slot.
    assert len(state.wheel) == DUE_PAGE_ROWS
    assert state.horizon_ms == MINUTE + 10 * (DUE_PAGE_ROWS - 1) - 1
    assert state.wake.is_set() and not reading.done()
    store.more.set()
    await reading
    assert len(state.wheel) == 3 * DUE_PAGE_ROWS
    assert state.horizon_ms == MINUTE + MINUTE_MS - 1


async def test_a_minute_ahead_moves_the_horizon_only_once_read_whole() -> None:
    # The minute has not begun; pages of the configured size (here three for the minute).
    state, store, reading = await loaded(now=MINUTE - 500, page_rows=DUE_PAGE_ROWS)
    await asyncio.sleep(0)
    assert store.sizes == [DUE_PAGE_ROWS] and len(state.wheel) == DUE_PAGE_ROWS
    assert state.horizon_ms == MINUTE - 1
    store.more.set()
    await reading
    assert len(state.wheel) == 3 * DUE_PAGE_ROWS
    assert state.horizon_ms == MINUTE + MINUTE_MS - 1
