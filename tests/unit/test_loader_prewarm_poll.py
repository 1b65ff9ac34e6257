"""The pre-warm reads its window's bucket counts at most every PREWARM_POLL_MS, not at every
turn of the loader: the read of every shard every 500 ms was a steady stream of requests to
Cassandra from an idle node, for counts that change only when jobs are ingested."""

from __future__ import annotations

import dataclasses

from chronowheel.core.buckets import MINUTE_MS
from chronowheel.core.clock import ManualClock
from chronowheel.node.loader import LOADER_POLL_MS, PREWARM_POLL_MS, Loader
from chronowheel.node.state import ShardState
from chronowheel.settings import Settings
from chronowheel.store.memory import MemoryStore

from tests.unit.test_loader_pages import MINUTE, row


class CountingStore(MemoryStore):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.count_reads = 0

    async def bucket_counts(self, shard: int, from_minute: int, to_minute: int
                            ) -> dict[int, int]:
        self.count_reads += 1
        return await super().bucket_counts(shard, from_minute, to_minute)


def prewarming(clock: ManualClock, store: CountingStore) -> tuple[ShardState, Loader]:
    settings = Settings(namespace="unit", shards=1, lookahead_ms=30_000,
                        prewarm_ms=10 * MINUTE_MS, hot_bucket_rows=2)
    state = ShardState(shard=0, start_ms=MINUTE, tick_ms=settings.tick_ms,
                       ingest_slack_ms=settings.ingest_slack_ms)
    state.watermark = state.committed_watermark = MINUTE - 1
    state.horizon_ms = MINUTE + MINUTE_MS - 1
    return state, Loader(state=state, settings=settings, store=store, clock=clock)


async def test_the_counts_are_read_once_a_poll_and_a_herd_found_at_the_next_one() -> None:
    clock = ManualClock(MINUTE)
    store = CountingStore(clock)
    state, loader = prewarming(clock, store)
    await loader.prewarm()
    assert store.count_reads == 1 and not state.prewarmed
    # A herd ingested for five minutes ahead right after that read (a bucket count per row,
    # as ingest writes them).
    herd = MINUTE + 5 * MINUTE_MS
    for i in range(3):
        await store.put_due(dataclasses.replace(row(herd, i), minute=herd), ttl_s=86_400)
        await store.add_bucket_count(0, herd, 1)
    # The loader's next turns within the poll do not read the counts again...
    for _ in range(PREWARM_POLL_MS // LOADER_POLL_MS - 1):
        clock.advance(LOADER_POLL_MS)
        await loader.prewarm()
    assert store.count_reads == 1 and not state.prewarmed
    # ...the first one past it does, and pre-warms the herd's minute, minutes before it.
    clock.advance(LOADER_POLL_MS)
    await loader.prewarm()
    assert store.count_reads == 2
    assert state.prewarmed == {herd} and len(state.wheel) == 3
