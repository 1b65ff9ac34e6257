"""`chronowheel status`: per shard, who owns it and how far its dispatch has come.

Sources: the `<ns>-nodes` consumer group (owner = the member assigned the shard's `<ns>.submit`
partition), the shard's newest watermark record in `<ns>.state` (read_committed), and the
`bucket_counts` table for the coming minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from chronowheel.cli._format import count, human_ms, rfc3339, table
from chronowheel.core.buckets import MINUTE_MS, minute_of
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)

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


def shard_status(shard: int, owner: str | None, record: Any | None, due_rows: int,
                 now_ms: int, behind_ms: int) -> ShardStatus:
    """Combine the sources for one shard (pure: unit-tested). `record` is a StateRecord."""
    if record is None:
        return ShardStatus(shard, owner, None, None, None, None, None, None, None, due_rows)
    age = now_ms - record.watermark
    return ShardStatus(
        shard=shard, owner=owner, writer=record.node, watermark_ms=record.watermark,
        watermark_age_ms=age, lag_ms=age if age > behind_ms else None,
        horizon_ms=record.horizon,
        horizon_ahead_ms=None if record.horizon is None else record.horizon - now_ms,
        wheel=record.wheel, due_rows=due_rows)


def render(rows: list[ShardStatus], *, group_state: str, members: int, minutes: int,
           now_ms: int, behind_ms: int) -> str:
    body = []
    for r in rows:
        body.append([
            str(r.shard),
            r.owner or "(none)",
            r.writer or "-",
            "-" if r.watermark_ms is None else rfc3339(r.watermark_ms),
            "-" if r.watermark_age_ms is None else human_ms(r.watermark_age_ms),
            "-" if r.lag_ms is None else human_ms(r.lag_ms),
            "-" if r.horizon_ahead_ms is None else _signed(r.horizon_ahead_ms),
            "-" if r.wheel is None else count(r.wheel),
            count(r.due_rows),
        ])
    text = table(["SHARD", "OWNER", "LAST WRITER", "WATERMARK", "AGE", "LAG", "HORIZON",
                  "WHEEL", f"DUE {minutes}m"], body, right=(0, 4, 5, 6, 7, 8))
    owned = sum(1 for r in rows if r.owner)
    behind = [r for r in rows if r.lag_ms is not None]
    summary = (f"{len(rows)} shards, {owned} owned by {members} group member(s) (group "
               f"{group_state}); {len(behind)} behind (lag > {human_ms(behind_ms)})")
    if behind:
        summary += f", worst {human_ms(max(r.lag_ms or 0 for r in behind))}"
    summary += (f"; DUE = rows written into the next {minutes} minute bucket(s), as of "
                f"{rfc3339(now_ms)}")
    return text + "\n" + summary


def _signed(ms: int) -> str:
    return ("+" if ms >= 0 else "") + human_ms(ms)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="per-shard owner, watermark, dispatch lag, horizon, upcoming rows",
        description=(
            "Per shard: OWNER (the <ns>-nodes group member assigned it), LAST WRITER (node id "
            "in its newest watermark record), WATERMARK (everything due up to it is "
            "published) and its AGE, LAG (estimated dispatch lag, shown when the age exceeds "
            "--behind-ms), HORIZON (how far ahead the wheel is loaded, relative to now), WHEEL "
            "(entries in the wheel) and DUE (rows written into the next --minutes minute "
            "buckets, from bucket_counts; cancelled or already fired rows still count)."))
    add_settings_arguments(p, CONNECTION_SETTINGS)
    p.add_argument("--minutes", type=int, default=10, metavar="N",
                   help="bucket_counts window: the current minute and the next N-1 (10)")
    p.add_argument("--behind-ms", type=int, default=BEHIND_MS_DEFAULT, metavar="MS",
                   help=f"a shard whose watermark is older is behind ({BEHIND_MS_DEFAULT})")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.cli._cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    return asyncio.run(_status(settings, args))


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from chronowheel.bus.kafka import open_admin
    from chronowheel.cli._cluster import (
        describe_group,
        nodes_group,
        open_store,
        read_state_records,
        recorded_shards,
    )

    minutes = max(1, args.minutes)
    store = await open_store(settings)
    try:
        shards = await recorded_shards(store, settings)
        admin = await open_admin(settings)
        try:
            group = await describe_group(admin, nodes_group(settings), settings.submit_topic)
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
                         records.get(k), sum(counts[k].values()), now, args.behind_ms)
            for k in range(shards)]
    if args.json:
        print(orjson.dumps({
            "namespace": settings.namespace, "now_ms": now, "shards": shards,
            "group": {"id": nodes_group(settings), "state": group.state,
                      "members": [asdict(m) for m in group.members]},
            "due_minutes": minutes, "behind_ms": args.behind_ms,
            "rows": [asdict(r) for r in rows],
        }).decode())
    else:
        print(render(rows, group_state=group.state, members=len(group.members),
                     minutes=minutes, now_ms=now, behind_ms=args.behind_ms))
    return 0
