"""Paced catch-up after an outage: how fast late occurrences go, and how late on-time ones are.

Against the Cassandra and Kafka of CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA (loopback only),
on scratch namespaces dropped afterwards. One run:

1. A node (in this process) ingests `--jobs` one-shots due within one second, `--outage-s`
   ahead, and probes: one-shots due every 100 ms from the end of the outage for `--probe-s`.
2. The node stops before they are due; after the outage another node starts with
   `--catch-up-rate` (0: unpaced, everything at once: the raw rate this machine publishes).
3. A read_committed reader records every fired message until all have arrived.

Reported per run: the late occurrences' publish rate (count / span from the first to the last
one) and per shard; how long they took; the probes' lateness (cw-fired-at minus due, p50 and
max); lost, early and duplicate occurrences (must be 0). `--runs` runs per rate, alternating,
with the median and the spread; one JSON line per run appended to
loadtest/results/catch_up.jsonl.

Usage: python loadtest/catch_up.py [--jobs 4000] [--shards 4] [--rates 0,250] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chronowheel.admin import init_namespace
from chronowheel.core.shard import shard_of
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.testing import collecting, drop_namespace, require_loopback, wait_owned

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's testkit/

from testkit.faults import now_ms, submit_jobs

RESULTS = Path(__file__).resolve().parent / "results" / "catch_up.jsonl"
PROBE_EVERY_MS = 100


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def one_run(base: Settings, *, rate: int, jobs: int, shards: int, outage_s: float,
                  probe_s: float) -> dict[str, Any]:
    ns = f"cu{secrets.token_hex(4)}"
    # a scratch namespace in a keyspace of its own, whatever the environment names
    settings = base.replace(namespace=ns, cassandra_keyspace="", shards=shards,
                            catch_up_rate=rate)
    await init_namespace(settings)
    try:
        async with collecting(settings) as seen:
            node = Node(settings, node_id="before")
            await node.start()
            await wait_owned(node, shards)
            due = int(now_ms()) + int(outage_s * 1000) // 2
            late = {f"late-{i:06d}": due + i * 1_000 // jobs for i in range(jobs)}
            back = due + int(outage_s * 1000) // 2
            probes = {f"probe-{i:04d}": back + 2_000 + i * PROBE_EVERY_MS
                      for i in range(int(probe_s * 1000) // PROBE_EVERY_MS)}
            await submit_jobs(settings, late | probes)
            while sum(node.metrics.ingested.labels("upsert", o)._value.get()
                      for o in ("stored", "unchanged")) < len(late) + len(probes):
                await asyncio.sleep(0.1)
            if now_ms() >= due:
                raise SystemExit("ingest took longer than half the outage: use a longer "
                                 "--outage-s or fewer --jobs")
            await node.shutdown()
            while now_ms() < back:
                await asyncio.sleep(0.05)
            after = Node(settings, node_id="after")
            started = now_ms()
            await after.start()
            try:
                want = len(late) + len(probes)
                deadline = time.monotonic() + 300
                while len({m.occurrence for m in seen.messages}) < want:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"only {len(seen.messages)} of {want} arrived")
                    await asyncio.sleep(0.1)
            finally:
                await after.shutdown()
        fired = seen.messages
        keys = Counter(m.occurrence for m in fired)
        late_fired = sorted(m.fired_ms for m in fired if (m.key or b"").startswith(b"late-"))
        span_s = max(0.001, (late_fired[-1] - late_fired[0]) / 1000)
        per_shard: Counter[int] = Counter(shard_of((m.key or b"").decode(), shards)
                                          for m in fired if (m.key or b"").startswith(b"late-"))
        probe_late = [m.fired_ms - m.scheduled_ms for m in fired
                      if (m.key or b"").startswith(b"probe-")]
        return {
            "rate_setting": rate, "jobs": jobs, "shards": shards, "outage_s": outage_s,
            "late_per_s": round(len(late_fired) / span_s, 1),
            "late_per_s_per_shard": round(len(late_fired) / span_s / len(per_shard), 1),
            "late_span_s": round(span_s, 2),
            "first_late_after_start_s": round((late_fired[0] - started) / 1000, 2),
            "probe_late_p50_ms": pct(probe_late, 0.5), "probe_late_max_ms": max(probe_late),
            "duplicates": sum(n - 1 for n in keys.values() if n > 1),
            "early": sum(1 for m in fired if m.fired_ms < m.scheduled_ms),
            "lost": len(late) + len(probes) - len(keys),
        }
    finally:
        await drop_namespace(settings)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=4_000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--rates", default="0,250", help="catch_up_rate values, 0 = unpaced")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--outage-s", type=float, default=20.0)
    p.add_argument("--probe-s", type=float, default=10.0)
    args = p.parse_args()
    base = Settings.from_env()
    require_loopback("catch_up", base.kafka)
    require_loopback("catch_up", base.cassandra)
    rates = [int(r) for r in args.rates.split(",")]
    rows: list[dict[str, Any]] = []
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for i in range(args.runs):
        for rate in rates:
            row = await one_run(base, rate=rate, jobs=args.jobs, shards=args.shards,
                                outage_s=args.outage_s, probe_s=args.probe_s)
            row["run"] = i + 1
            row["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            rows.append(row)
            print(json.dumps(row), flush=True)
            with RESULTS.open("a") as f:
                f.write(json.dumps(row) + "\n")
    for rate in rates:
        mine = [r for r in rows if r["rate_setting"] == rate]
        for name in ("late_per_s_per_shard", "late_span_s", "probe_late_p50_ms",
                     "probe_late_max_ms"):
            values = [float(r[name]) for r in mine]
            print(f"rate {rate}: {name} median {statistics.median(values):.1f} "
                  f"(min {min(values):.1f}, max {max(values):.1f}, n={len(values)})")


if __name__ == "__main__":
    asyncio.run(main())
