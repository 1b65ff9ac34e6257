"""Quick measurement of the per-node figures the capacity model needs; writes
loadtest/results/measured-quick.json, in the format of measured.json (the benchmark's file,
which `chronowheel capacity` reads by default; pass `--measured` to use this one, or `--out
loadtest/results/measured.json` to replace it).

A first, modest measurement, made so that capacity planning starts from numbers taken on real
servers rather than guesses; the benchmark (loadtest/bench/run_bench.py) is the reference.

What it does (against the Cassandra and Kafka given by CHRONOWHEEL_CASSANDRA/KAFKA):
  1. the wheel structure alone: in this process, under tracemalloc, turns N due rows into the
     node's wheel entries (node.pending.pending_from_row + TimingWheel.insert, as the loader
     does) and divides what stays allocated by N (job ids of 16 characters, no payload, no job
     headers). Recorded in details as a lower bound.
  2. ingest_jobs_per_s_per_node: one `chronowheel node` process owning every shard; a
     SchedulerClient writes K1 one-shot jobs due in a day; the rate is K1 divided by the time
     from the first send until the node's committed offsets of <ns>.submit cover them all
     (each command = a jobs read, a due row, a bucket count and a jobs row in Cassandra).
  3. fires_per_s_per_node: the same node; K2 one-shot jobs all due at the same instant T,
     written early enough to be loaded into the wheel before T (the pre-warmed herd case);
     the rate is K2 over (T to the moment the last one became visible to a read_committed
     consumer of <ns>.fired that was polling from before T).
     Publishing is transactional (one transaction per batch of up to max_batch messages).
  4. wheel_bytes_per_entry: the node's resident memory (VmRSS) just before the herd is
     submitted and just before T (herd ingested and loaded), divided by K2: what one pending
     occurrence really costs a node process, allocator and ingest garbage included (payloads
     of ~10 bytes). Falls back to the tracemalloc figure where /proc is not available.

Usage: python loadtest/measure_quick.py [--ingest-jobs 50000] [--herd-jobs 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import secrets
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import open_admin
from chronowheel.client import SchedulerClient
from chronowheel.core.buckets import minute_of
from chronowheel.core.wheel import TimingWheel
from chronowheel.node.pending import Pending, pending_from_row
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow
from chronowheel.testing import NodeProcess, collecting, drop_namespace

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "loadtest" / "results" / "measured-quick.json"
LOG = ROOT / "loadtest" / "out" / "measure-quick-node.log"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def log(msg: str) -> None:
    print(f"[measure] {msg}", file=sys.stderr, flush=True)


# --- 1. memory per wheel entry -----------------------------------------------------------

def wheel_bytes_per_entry(n: int) -> float:
    base = now_ms()
    gc.collect()
    tracemalloc.start()
    rows = [DueRow(minute_of(base + i % 120_000), 0, base + i % 120_000, f"job-{i:012d}", 1,
                   base + i % 120_000, 1, "ns.fired", b"", (), None) for i in range(n)]
    wheel: TimingWheel[tuple[str, int, int], Pending] = TimingWheel(start_ms=base)
    for row in rows:
        p = pending_from_row(row)
        wheel.insert(p.wheel_key, p.slot_ms, p)
    # The loader keeps only what the wheel holds: with the rows gone, what is still traced
    # is the entries and the row fields they share (job id string, ints).
    del rows, row, p
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(wheel) == n
    return held / n


# --- 2 and 3: a real node -----------------------------------------------------------------

async def committed_total(settings: Settings, shards: int) -> int:
    admin = await open_admin(settings)
    try:
        offsets = await admin.list_consumer_group_offsets(f"{settings.namespace}-nodes")
    finally:
        await admin.close()
    return sum(meta.offset for tp, meta in offsets.items()
               if tp.topic == settings.submit_topic and meta.offset > 0 and tp.partition < shards)


async def wait_committed(settings: Settings, shards: int, target: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while await committed_total(settings, shards) < target:
        if time.monotonic() > deadline:
            raise SystemExit(f"ingest did not reach {target} commands in {timeout_s}s")
        await asyncio.sleep(0.2)


async def send_jobs(settings: Settings, prefix: str, k: int, at_ms: int) -> None:
    async with SchedulerClient(settings, linger_ms=20) as client:
        report = await client.submit_many(
            {"id": f"{prefix}-{i:09d}", "at": at_ms, "payload": {"n": i}} for i in range(k))
    if report.failed or report.invalid:
        raise SystemExit(f"send failed: {report.failed[:3]} {report.invalid[:3]}")


async def node_figures(settings: Settings, ingest_k: int, herd_k: int) -> dict[str, Any]:
    proc = NodeProcess(settings, LOG)
    proc.start()
    try:
        # Owned and taken over once the first idle watermark commit moves the offsets of the
        # group; simpler: wait until a probe command is committed.
        await send_jobs(settings, "probe", settings.shards, now_ms() + 86_400_000)
        await wait_committed(settings, settings.shards, settings.shards, 120)
        base = settings.shards

        log(f"ingest: {ingest_k} jobs due in a day")
        t0 = time.monotonic()
        await send_jobs(settings, "ingest", ingest_k, now_ms() + 86_400_000)
        sent_s = time.monotonic() - t0
        await wait_committed(settings, settings.shards, base + ingest_k, 600)
        ingest_s = time.monotonic() - t0
        ingest_rate = ingest_k / ingest_s
        log(f"ingest: {ingest_rate:,.0f}/s (sending took {sent_s:.1f}s of {ingest_s:.1f}s)")

        rss_before = proc.rss_bytes()
        lead_s = herd_k / ingest_rate * 1.5 + 20
        herd_at = now_ms() + int(lead_s * 1000)
        log(f"herd: {herd_k} jobs all due at +{lead_s:.0f}s")
        await send_jobs(settings, "herd", herd_k, herd_at)
        await wait_committed(settings, settings.shards, base + ingest_k + herd_k, 600)
        # The reader runs from before T, so receive times are when messages became visible
        # to a read_committed consumer (cw-fired-at is stamped before the commit).
        async with collecting(settings) as reader:
            # Loaded into the wheel ahead of T (lookahead 2 min): sample memory just before T.
            await asyncio.sleep(max(0.0, (herd_at - now_ms()) / 1000 - 1.0))
            rss_loaded = proc.rss_bytes()
            await reader.wait_for(lambda got: len(got) >= herd_k, 600, f"{herd_k} fired")
            fired = [(m.fired_ms, m.received_ms) for m in reader.messages[:herd_k]]
        last_visible = max(r for _, r in fired)
        fire_s = max(0.001, (last_visible - herd_at) / 1000)
        fire_rate = herd_k / fire_s
        first_visible = round(min(r for _, r in fired) - herd_at)
        stamped_s = (max(f for f, _ in fired) - herd_at) / 1000
        log(f"herd: {fire_rate:,.0f}/s visible ({herd_k} visible {fire_s:.2f}s after T; first "
            f"{first_visible} ms after T; last cw-fired-at {stamped_s:.2f}s after T)")
    finally:
        proc.stop(timeout_s=60)
    rss_delta = None
    if rss_before is not None and rss_loaded is not None:
        rss_delta = (rss_loaded - rss_before) / herd_k
    return {"ingest_rate": ingest_rate, "fire_rate": fire_rate, "fire_span_s": fire_s,
            "first_fire_after_t_ms": first_visible, "last_stamp_after_t_s": stamped_s,
            "rss_delta_per_loaded_job": rss_delta,
            "rss_before_herd_bytes": rss_before, "rss_herd_loaded_bytes": rss_loaded}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ingest-jobs", type=int, default=50_000)
    ap.add_argument("--herd-jobs", type=int, default=100_000)
    ap.add_argument("--wheel-entries", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    load_before = os.getloadavg()
    per_entry = wheel_bytes_per_entry(args.wheel_entries)
    log(f"wheel: {per_entry:.0f} bytes per entry (without payload)")
    # a scratch namespace in a keyspace of its own, whatever the environment names
    settings = Settings.from_env(namespace="m" + secrets.token_hex(5), cassandra_keyspace="",
                                 shards=args.shards)
    await init_namespace(settings)
    try:
        node = await node_figures(settings, args.ingest_jobs, args.herd_jobs)
    finally:
        await drop_namespace(settings)
    load_after = os.getloadavg()

    result = {
        "fires_per_s_per_node": round(node["fire_rate"]),
        "ingest_jobs_per_s_per_node": round(node["ingest_rate"]),
        "wheel_bytes_per_entry": round(node["rss_delta_per_loaded_job"] or per_entry),
        "measured_on": datetime.now(UTC).strftime("%Y-%m-%d") + (
            f": one node process (Python {platform.python_version()}, {os.cpu_count()} CPUs "
            f"visible) with single-node Cassandra and single-broker Kafka on the same host, "
            f"{args.shards} shards"),
        "command": "python loadtest/measure_quick.py " + " ".join(sys.argv[1:]),
        "details": {
            "method": "loadtest/measure_quick.py docstring",
            "ingest_jobs": args.ingest_jobs, "herd_jobs": args.herd_jobs,
            "herd_last_visible_after_t_s": round(node["fire_span_s"], 3),
            "herd_first_visible_after_t_ms": node["first_fire_after_t_ms"],
            "herd_last_cw_fired_at_after_t_s": round(node["last_stamp_after_t_s"], 3),
            "node_rss_before_herd_bytes": node["rss_before_herd_bytes"],
            "node_rss_herd_loaded_bytes": node["rss_herd_loaded_bytes"],
            "wheel_structure_bytes_per_entry_tracemalloc": round(per_entry),
            "wheel_entries_traced": args.wheel_entries,
            # The servers share the host with the node: a busy host lowers every figure.
            "host_load_average_1m_before_after": [round(load_before[0], 2),
                                                  round(load_after[0], 2)],
            "note": "fires_per_s_per_node is the throughput of a pre-loaded herd (all due at "
                    "one instant), not a rate sustained under a lateness target. The capacity "
                    "model adds payload and header bytes to wheel_bytes_per_entry.",
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
