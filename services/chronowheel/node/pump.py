"""The node's ingest pump: one consumer of `<ns>.submit` for all the node's shards.

It fetches records and routes each shard's to its actor, and pauses a shard's partition while
its actor wants no more: more than `pump_pause_rows` records queued (resumed below
`pump_resume_rows`), or, with the urgent lane, its look-ahead full or a seek pending
(`node/urgent.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

from chronowheel.bus.ports import SubmitGroup
from chronowheel.node.registry import Owned
from chronowheel.settings import Settings

# Fetches of the ingest pump wait at most this long for records.
PUMP_POLL_MS = 200


async def pump(group: SubmitGroup, owned: Mapping[int, Owned], settings: Settings) -> None:
    """Route fetched submit records to their shard's actor (`owned`: the shards' actors now,
    read at every fetch)."""
    s = settings
    paused: set[int] = set()
    while True:
        batches = await group.fetch(PUMP_POLL_MS, s.pump_fetch_records)
        for shard, records in batches.items():
            o = owned.get(shard)
            if o is not None and o.actor.ready:
                o.actor.enqueue(records)
            # Records of a shard still taking over are dropped: it seeks to its committed
            # offset when ready, so they are read again.
        for shard, o in owned.items():  # backpressure per shard
            was_paused = shard in paused
            wanted = o.actor.fetch_wanted(was_paused)
            if not wanted and not was_paused:
                group.pause(shard)
                paused.add(shard)
            elif wanted and was_paused:
                group.resume(shard)
                paused.discard(shard)
        paused &= group.assigned()
