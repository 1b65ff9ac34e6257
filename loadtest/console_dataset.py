"""Fill a namespace with many stored jobs for measuring the console, then time its pages.

The jobs are written straight through the store (`CassandraStore.put_dues_and_jobs` and
`add_bucket_counts`), as a node's ingest writes them, without Kafka or a node: the point is
the size of the tables the console reads, not ingest. One-shot jobs are spread uniformly over
the next 24 hours, plus a herd all due at the next midnight UTC. No node should run on the
namespace (the jobs would fire); every row expires after --ttl-hours.

    python loadtest/console_dataset.py load --namespace cwconsole1m --jobs 1000000 \
        --herd 100000
    python loadtest/console_dataset.py time --namespace cwconsole1m --url http://127.0.0.1:8089

`time` requests each page --repeat times and prints the wall time of every request and the
app's own time (Server-Timing), with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import time
import urllib.request
from collections import Counter

import orjson
from chronowheel.admin import init_namespace
from chronowheel.core.buckets import minute_of
from chronowheel.core.shard import shard_of
from chronowheel.ops.format import rfc3339
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow
from chronowheel.store.cassandra import CassandraStore

DAY_MS = 86_400_000
# Jobs per logged batch (a due row and a jobs row each, some 250 bytes): well under
# Cassandra's batch size warning, like the node's ingest groups.
GROUP = 12
CONCURRENCY = 48


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def plan(jobs: int, herd: int, start_ms: int, seed: int) -> list[tuple[str, int]]:
    """(job id, instant) of every job: `herd` at the next midnight UTC, the rest uniform over
    the next 24 hours (beginning 10 minutes from now, so nothing is due while loading)."""
    rng = random.Random(seed)
    midnight = start_ms - start_ms % DAY_MS + DAY_MS
    first = start_ms + 600_000
    out = [(f"herd-{i:07d}", midnight) for i in range(herd)]
    out += [(f"load-{i:07d}", rng.randrange(first, start_ms + DAY_MS))
            for i in range(jobs - herd)]
    return out


async def load(args: argparse.Namespace) -> int:
    settings = Settings.from_env(namespace=args.namespace, shards=args.shards)
    await init_namespace(settings)
    store = await asyncio.to_thread(CassandraStore.open, settings)
    start = now_ms()
    jobs = plan(args.jobs, args.herd, start, args.seed)
    ttl_s = args.ttl_hours * 3600
    topic = settings.fired_topic
    counts: dict[int, Counter[int]] = {k: Counter() for k in range(settings.shards)}
    groups: list[list[tuple[DueRow, int, JobRow]]] = []
    current: list[tuple[DueRow, int, JobRow]] = []
    for job_id, at in jobs:
        shard = shard_of(job_id, settings.shards)
        spec = orjson.dumps({"at": rfc3339(at), "id": job_id, "payload": {"n": 1}},
                            option=orjson.OPT_SORT_KEYS)
        minute = minute_of(at)
        counts[shard][minute] += 1
        due = DueRow(minute, shard, at, job_id, 1, at, 1, topic, b'{"n":1}', (), None)
        current.append((due, ttl_s, JobRow(job_id, shard, spec, 1, "scheduled", at, at,
                                           ttl_s)))
        if len(current) == GROUP:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    print(f"writing {len(jobs):,} jobs in {len(groups):,} batches to {settings.keyspace} "
          f"(load {os.getloadavg()[0]:.2f})", flush=True)
    done = 0
    started = time.monotonic()
    queue = iter(groups)

    async def writer() -> None:
        nonlocal done
        for group in queue:
            await store.put_dues_and_jobs(group)
            done += len(group)
            if done % 100_000 < len(group):
                rate = done / (time.monotonic() - started)
                print(f"  {done:,} jobs, {rate:,.0f}/s (load {os.getloadavg()[0]:.2f})",
                      flush=True)

    try:
        await asyncio.gather(*(writer() for _ in range(CONCURRENCY)))
        await asyncio.gather(*(store.add_bucket_counts(k, c) for k, c in counts.items()))
    finally:
        await asyncio.to_thread(store.close)
    took = time.monotonic() - started
    print(f"wrote {len(jobs):,} jobs in {took:.0f} s ({len(jobs) / took:,.0f}/s); herd of "
          f"{args.herd:,} at {rfc3339(start - start % DAY_MS + DAY_MS)}; load "
          f"{os.getloadavg()[0]:.2f}")
    return 0


def fetch(url: str, token: str | None) -> tuple[float, float | None, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        timing = response.headers.get("Server-Timing", "")
    wall = (time.perf_counter() - t0) * 1000
    app = None
    if "dur=" in timing:
        app = float(timing.split("dur=", 1)[1].split(";")[0])
    return wall, app, body


def time_pages(args: argparse.Namespace) -> int:
    token = os.environ.get("CHRONOWHEEL_CONSOLE_TOKEN")
    paths = args.path or ["/", "/cluster/fragment", "/upcoming"]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    reads: list[float] = []
    for path in paths:
        walls = []
        for _ in range(args.repeat):
            wall, app, body = fetch(args.url.rstrip("/") + path, token)
            walls.append(wall)
            # The heat map page says how long its (background) read of bucket_counts took.
            read = re.search(rb"bucket_counts</code> in (\d+) ms", body)
            if read:
                reads.append(float(read.group(1)))
            note = "" if read is None else f", map read in {read.group(1).decode()} ms"
            print(f"  {path}: {wall:.0f} ms (app {app if app is not None else '-'} ms, "
                  f"{len(body):,} bytes{note})")
            if read:
                time.sleep(args.pause)  # let the map go stale, so the next visits read it again
        print(f"{path}: median {statistics.median(walls):.0f} ms, max {max(walls):.0f} ms "
              f"over {len(walls)}")
    if reads:
        print(f"heat map reads of bucket_counts: median {statistics.median(reads):.0f} ms, "
              f"max {max(reads):.0f} ms over {len(reads)} page views")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load", help="init the namespace and write the jobs")
    lp.add_argument("--namespace", required=True)
    lp.add_argument("--jobs", type=int, default=1_000_000)
    lp.add_argument("--herd", type=int, default=100_000)
    lp.add_argument("--shards", type=int, default=16)
    lp.add_argument("--ttl-hours", type=int, default=48)
    lp.add_argument("--seed", type=int, default=15)
    tp = sub.add_parser("time", help="time the console's pages")
    tp.add_argument("--url", default="http://127.0.0.1:8089")
    tp.add_argument("--path", action="append", help="page path (repeatable)")
    tp.add_argument("--repeat", type=int, default=5)
    tp.add_argument("--pause", type=float, default=6.0,
                    help="seconds between heat map views (the map is read again after 5 s)")
    args = p.parse_args(argv)
    if args.cmd == "load":
        return asyncio.run(load(args))
    return time_pages(args)


if __name__ == "__main__":
    sys.exit(main())
