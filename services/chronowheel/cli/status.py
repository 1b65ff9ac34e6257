"""`chronowheel status`: per shard, who owns it and how far its dispatch has come.

What it reads and how the sources combine: `ops/status.py`. Here: the arguments and the table.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from typing import Any

import orjson

from chronowheel.ops.format import count, human_ms, rfc3339, table
from chronowheel.ops.status import BEHIND_MS_DEFAULT, ShardStatus
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)


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
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    return asyncio.run(_status(settings, args))


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from chronowheel.ops.status import read_status

    status = await read_status(settings, minutes=args.minutes, behind_ms=args.behind_ms)
    group = status.group
    if args.json:
        print(orjson.dumps({
            "namespace": settings.namespace, "now_ms": status.now_ms, "shards": status.shards,
            "group": {"id": status.group_id, "state": group.state,
                      "members": [asdict(m) for m in group.members]},
            "due_minutes": status.minutes, "behind_ms": status.behind_ms,
            "rows": [asdict(r) for r in status.rows],
        }).decode())
    else:
        print(render(status.rows, group_state=group.state, members=len(group.members),
                     minutes=status.minutes, now_ms=status.now_ms, behind_ms=status.behind_ms))
    return 0
