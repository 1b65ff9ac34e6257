"""Whether the nodes applied given commands of `<ns>.submit`, and which they refused.

A node commits the submit offsets it consumed in the same Kafka transaction as what applying
those commands produced, rejections to `<ns>.rejected` included (each rejection names the
partition and offset of its command in `cw-source-partition` / `cw-source-offset`). So once
the `<ns>-nodes` group's committed offset of a partition is past a command's offset, the command
was applied or refused, and its refusal, if any, is on `<ns>.rejected` for a read_committed
reader. Used by the bulk operations' wait (`chronowheel jobs pause ... --wait`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Set

from aiokafka import TopicPartition

from chronowheel.core import wire
from chronowheel.errors import ChronowheelError
from chronowheel.ops.cluster import nodes_group
from chronowheel.settings import Settings

Position = tuple[int, int]
"""(partition, offset) of a command on `<ns>.submit`."""


async def rejected_ends(settings: Settings) -> dict[int, int]:
    """The committed end of each partition of `<ns>.rejected` now: refusals of commands sent
    after this are past it."""
    from chronowheel.bus.kafka import open_admin, partition_counts, reader

    admin = await open_admin(settings)
    try:
        parts = (await partition_counts(admin, [settings.rejected_topic])).get(
            settings.rejected_topic, 0)
    finally:
        await admin.close()
    if not parts:
        return {}
    consumer = reader(settings)
    await consumer.start()
    try:
        tps = [TopicPartition(settings.rejected_topic, k) for k in range(parts)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def wait_applied(settings: Settings, positions: Set[Position], *, timeout_s: float,
                       poll_s: float = 0.2) -> None:
    """Until the nodes' committed offset of every partition is past the highest of
    `positions` there; ChronowheelError after `timeout_s` naming the partitions behind."""
    from chronowheel.bus.kafka import open_admin

    highest: dict[int, int] = {}
    for partition, offset in positions:
        highest[partition] = max(offset, highest.get(partition, -1))
    if not highest:
        return
    tps = [TopicPartition(settings.submit_topic, p) for p in sorted(highest)]
    admin = await open_admin(settings)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            committed = await admin.list_consumer_group_offsets(nodes_group(settings),
                                                                partitions=tps)
            behind = {tp.partition: (committed[tp].offset if tp in committed else -1)
                      for tp in tps if tp not in committed
                      or committed[tp].offset <= highest[tp.partition]}
            if not behind:
                return
            if time.monotonic() > deadline:
                shown = ", ".join(f"{p} (committed {c}, sent up to {highest[p]})"
                                  for p, c in sorted(behind.items())[:5])
                raise ChronowheelError(
                    f"the nodes had not applied every command after {timeout_s:g}s: "
                    f"{settings.submit_topic} partitions {shown} (is a node running for "
                    f"namespace {settings.namespace}?)")
            await asyncio.sleep(poll_s)  # polling the group's offsets, bounded by the deadline
    finally:
        await admin.close()


async def refusals(settings: Settings, positions: Set[Position],
                   since: Mapping[int, int], *, timeout_s: float = 30.0) -> dict[Position, str]:
    """The reasons `<ns>.rejected` gives, from `since` (partition -> offset) to its committed
    end, for the commands at `positions`. Call after `wait_applied`."""
    from chronowheel.bus.kafka import reader

    if not positions:
        return {}
    ends_now = await rejected_ends(settings)
    tps = [TopicPartition(settings.rejected_topic, p) for p, end in sorted(ends_now.items())
           if end > since.get(p, 0)]
    if not tps:
        return {}
    found: dict[Position, str] = {}
    consumer = reader(settings, max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, since.get(tp.partition, 0))
        remaining = set(tps)
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise ChronowheelError(f"timed out reading {settings.rejected_topic} after "
                                       f"{timeout_s:g}s")
            batches = await consumer.getmany(*remaining, timeout_ms=200)
            for msgs in batches.values():
                for m in msgs:
                    headers = {k: v for k, v in (m.headers or ())}
                    if headers.get(wire.SOURCE_TOPIC, b"").decode() != settings.submit_topic:
                        continue
                    try:
                        at = (int(headers[wire.SOURCE_PARTITION]),
                              int(headers[wire.SOURCE_OFFSET]))
                    except (KeyError, ValueError):
                        continue
                    if at in positions:
                        found[at] = headers.get(wire.REASON, b"").decode("utf-8", "replace")
            for tp in list(remaining):
                if await consumer.position(tp) >= ends_now[tp.partition]:
                    remaining.discard(tp)
        return found
    finally:
        await consumer.stop()
