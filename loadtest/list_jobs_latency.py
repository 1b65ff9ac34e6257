"""Latency of one `jobs list` page with 1,000,000 jobs stored.

Builds the dataset by writing jobs rows straight through the store (`put_jobs`: unlogged
batches, a few in flight; no node, no Kafka): `--jobs` rows over `--tenants` tenants, 85%
scheduled, 5% each paused, finished and cancelled, pending occurrences spread over 30 days.
Then times `CassandraStore.list_jobs` pages (the code behind `chronowheel jobs list` and
`SchedulerClient.list_jobs`) for a set of filter combinations, `--repeat` times each, and
prints p50/p95/max per query with the machine's load average before and after. Results go to
loadtest/results/list-jobs-latency.json.

Usage (against CHRONOWHEEL_CASSANDRA; the namespace is created, and dropped unless --keep):
  python loadtest/list_jobs_latency.py [--jobs 1000000] [--tenants 100] [--repeat 20]
  python loadtest/list_jobs_latency.py --namespace cwlist1m --skip-load   # measure again
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.store.base import JobQuery, JobRow
from chronowheel.store.cassandra import CassandraStore

RESULTS = Path(__file__).resolve().parent / "results" / "list-jobs-latency.json"
DAY_MS = 86_400_000
STATUSES = ["scheduled"] * 17 + ["paused", "finished", "cancelled"]  # 85/5/5/5 %


def job_row(i: int, tenants: int, now: int) -> JobRow:
    tenant = i % tenants
    status = STATUSES[(i // tenants) % len(STATUSES)]
    job_id = f"t{tenant:03d}-job-{i:07d}"
    spec = b'{"every":"1h","id":"%s","tenant":"t%03d"}' % (job_id.encode(), tenant)
    scheduled = None if status in ("finished", "cancelled") else now + (i * 7919) % (30 * DAY_MS)
    return JobRow(job_id, i % 16, spec, 1, status, scheduled,
                  scheduled if status == "scheduled" else None, 0, f"t{tenant:03d}")


async def load(store: CassandraStore, jobs: int, tenants: int, in_flight: int) -> float:
    now = time.time_ns() // 1_000_000
    t0 = time.monotonic()
    sem = asyncio.Semaphore(in_flight)
    done = 0
    chunk = 200

    async def put(start: int) -> None:
        nonlocal done
        async with sem:
            await store.put_jobs([job_row(i, tenants, now)
                                  for i in range(start, min(jobs, start + chunk))])
        before, done = done, done + min(chunk, jobs - start)
        if before // 50_000 != done // 50_000:
            print(f"  {done:,} rows, {done / (time.monotonic() - t0):,.0f}/s", flush=True)

    for first in range(0, jobs, 100_000):  # bounded task creation
        await asyncio.gather(*(put(s) for s in range(first, min(jobs, first + 100_000), chunk)))
    return time.monotonic() - t0


QUERIES: dict[str, dict[str, Any]] = {
    "tenant (1% of jobs)": {"tenant": "t042"},
    "tenant + status paused": {"tenant": "t042", "status": "paused"},
    "status paused (5%)": {"status": "paused"},
    "tenant + due before now+1d": {"tenant": "t042", "due_before_ms": 1},
    "tenant + status + due before now+1d": {"tenant": "t042", "status": "scheduled",
                                            "due_before_ms": 1},
    "tenant + id prefix": {"tenant": "t042", "prefix": "t042-job-00"},
    "no filter (full scan order)": {},
}


async def measure(store: CassandraStore, limit: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    now = time.time_ns() // 1_000_000
    for name, filters in QUERIES.items():
        if "due_before_ms" in filters:
            filters = {**filters, "due_before_ms": now + DAY_MS}
        first, second, sizes = [], [], []
        for _ in range(repeat):
            t = time.perf_counter()
            page = await store.list_jobs(JobQuery(limit=limit, **filters))
            first.append((time.perf_counter() - t) * 1000)
            sizes.append(len(page.jobs))
            if page.next_token is not None:
                t = time.perf_counter()
                await store.list_jobs(JobQuery(limit=limit, page_token=page.next_token,
                                               **filters))
                second.append((time.perf_counter() - t) * 1000)
        out[name] = {"filters": filters, "rows_on_first_page": sizes[0],
                     "first_page_ms": _summary(first), "next_page_ms": _summary(second)}
        page_ms = out[name]["first_page_ms"]
        print(f"  {name:40s} rows {sizes[0]:4d}  first page p50 {page_ms['p50']:7.1f} ms"
              f"  p95 {page_ms['p95']:7.1f} ms", flush=True)
    return out


def _summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {}
    ordered = sorted(ms)
    return {"n": len(ms), "p50": round(statistics.median(ordered), 1),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
            "max": round(ordered[-1], 1)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namespace", default="cwlist1m")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--in-flight", type=int, default=2,
                    help="put_jobs calls (of 200 rows) in flight")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave the keyspace in place")
    args = ap.parse_args()
    settings = Settings.from_env(namespace=args.namespace, shards=4)
    load_before = os.getloadavg()
    if not args.skip_load:
        await init_namespace(settings)
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        load_s = None
        if not args.skip_load:
            print(f"writing {args.jobs:,} jobs rows to {settings.keyspace} ...", flush=True)
            load_s = await load(store, args.jobs, args.tenants, args.in_flight)
            print(f"  done in {load_s:,.0f} s ({args.jobs / load_s:,.0f} rows/s)", flush=True)
        print(f"page latency, limit {args.limit}, {args.repeat} runs each:", flush=True)
        results = await measure(store, args.limit, args.repeat)
        report = {"jobs": args.jobs, "tenants": args.tenants, "limit": args.limit,
                  "load_seconds": None if load_s is None else round(load_s),
                  "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                  "cpus": os.cpu_count(), "queries": results}
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(f"load average before {load_before}, after {os.getloadavg()}; "
              f"written to {RESULTS}")
    finally:
        if not args.keep:
            await asyncio.to_thread(store.session.execute,
                                    f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
        await asyncio.to_thread(store.close)


if __name__ == "__main__":
    asyncio.run(main())
