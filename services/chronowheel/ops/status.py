"""Per shard, who owns it and how far its dispatch has come (`chronowheel status`, the console's
overview).

Sources: the `<ns>-nodes` consumer group (owner = the member assigned the shard's `<ns>.submit`
partition), the shard's newest state record in `<ns>.state` (read_committed), and the
`bucket_counts` table for the coming minutes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chronowheel.core.buckets import MINUTE_MS, minute_of
from chronowheel.core.wire import StateRecord
from chronowheel.settings import Settings

if TYPE_CHECKING:  # the drivers load when a command reads, not when the CLI starts
    from chronowheel.ops.cluster import Group

# A healthy node commits its watermark at least every 2 s when idle (more often when busy);
# /healthz calls a shard unhealthy beyond 5 s of dispatch lag. Same default here.
BEHIND_MS_DEFAULT = 5_000


@dataclass
class ShardStatus:
    shard: int
    owner: str | None          # client_id@host of the group member holding the shard
    writer: str | None         # node id in the newest watermark record
    watermark_ms: int | None
    watermark_age_ms: int | None
    lag_ms: int | None         # now - watermark when behind, else None
    horizon_ms: int | None
    horizon_ahead_ms: int | None
    wheel: int | None
    due_rows: int              # bucket_counts rows over the next N minutes


def shard_status(shard: int, owner: str | None, record: StateRecord | None, due_rows: int,
                 now_ms: int, behind_ms: int) -> ShardStatus:
    """Combine the sources for one shard (pure: unit-tested)."""
    if record is None:
        return ShardStatus(shard, owner, None, None, None, None, None, None, None, due_rows)
    age = now_ms - record.watermark
    return ShardStatus(
        shard=shard, owner=owner, writer=record.node, watermark_ms=record.watermark,
        watermark_age_ms=age, lag_ms=age if age > behind_ms else None,
        horizon_ms=record.horizon,
        horizon_ahead_ms=None if record.horizon is None else record.horizon - now_ms,
        wheel=record.wheel, due_rows=due_rows)


@dataclass(frozen=True)
class NamespaceStatus:
    """Every shard's status, read at `now_ms`."""

    now_ms: int
    shards: int
    group_id: str
    group: Group
    minutes: int      # of bucket_counts in `due_rows`: the current minute and the next N-1
    behind_ms: int
    rows: list[ShardStatus]


async def read_status(settings: Settings, *, minutes: int,
                      behind_ms: int = BEHIND_MS_DEFAULT) -> NamespaceStatus:
    """Read the sources once and combine them per shard."""
    from chronowheel.bus.kafka import open_admin
    from chronowheel.ops.cluster import (
        describe_group,
        nodes_group,
        open_store,
        read_state_records,
        recorded_shards,
    )

    minutes = max(1, minutes)
    store = await open_store(settings)
    try:
        shards = await recorded_shards(store, settings)
        admin = await open_admin(settings)
        try:
            group = await describe_group(admin, nodes_group(settings), settings.submit_topic,
                                         settings=settings)
        finally:
            await admin.close()
        records = await read_state_records(settings, shards)
        now = time.time_ns() // 1_000_000
        first = minute_of(now)
        last = first + (minutes - 1) * MINUTE_MS
        counts = await asyncio.gather(*(store.bucket_counts(k, first, last)
                                        for k in range(shards)))
    finally:
        await asyncio.to_thread(store.close)
    rows = [shard_status(k, group.owners[k].label if k in group.owners else None,
                         records.get(k), sum(counts[k].values()), now, behind_ms)
            for k in range(shards)]
    return NamespaceStatus(now, shards, nodes_group(settings), group, minutes, behind_ms, rows)
