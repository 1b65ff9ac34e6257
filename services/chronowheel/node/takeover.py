"""Takeover: make a shard ours and find where its previous owner stopped.

Starting the shard's transactional producer fences the previous owner (its open transaction is
aborted). The shard then resumes from the last committed watermark in `<ns>.state` and reads
`<ns>.submit` from the node group's committed offset: everything after them is redone, and
nothing before them was lost, because both were committed in the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chronowheel.bus.ports import NodeBus, ShardProducer, SubmitPositions
from chronowheel.core.clock import Clock
from chronowheel.node.publisher import decode_watermark, state_key
from chronowheel.settings import Settings

log = logging.getLogger(__name__)

STATE_READ_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Resume:
    watermark: int
    submit_offset: int | None  # None: the partition is read from its beginning


async def take_over(*, shard: int, producer: ShardProducer, bus: NodeBus,
                    submit: SubmitPositions, settings: Settings, clock: Clock) -> Resume:
    """Fence the previous owner, then read the watermark and seek the submit partition."""
    await producer.start()
    watermark = await read_watermark(shard=shard, bus=bus, settings=settings, clock=clock)
    committed = await submit.committed(shard)
    await submit.seek(shard, committed)
    return Resume(watermark, committed)


async def read_watermark(*, shard: int, bus: NodeBus, settings: Settings, clock: Clock) -> int:
    value = await bus.read_last(settings.state_topic, shard, state_key(shard),
                                STATE_READ_TIMEOUT_MS)
    if value is not None:
        return decode_watermark(value)
    # Never initialised, or the state topic lost it: reload a fixed period back.
    lookback = settings.missing_watermark_lookback_ms
    found = clock.now_ms() - lookback
    log.warning("shard %d: no watermark in %s; loading from %d (%d s back)", shard,
                settings.state_topic, found, lookback // 1000)
    return found
