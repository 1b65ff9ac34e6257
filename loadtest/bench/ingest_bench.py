"""Focused ingest and memory benchmark of one `chronowheel node` on the local stack.

1. Creates a fresh namespace and measures raw prepared inserts of `due` rows (the limit the
   node's writes run into), in the same run.
2. Submits N jobs (not due soon: `--due-from-s` .. `--due-to-s` ahead) with
   `SchedulerClient.submit_many` *before* the node starts, so the node finds a full submit
   topic and ingest alone sets the pace.
3. Starts the node, and times from "owns every shard" until every jobs row is stored (with
   `--live` the node runs first and the time starts with the submission): the
   first-apply metric is polled cheaply, then the rows are counted (a paged scan of `jobs`),
   and the figure is only reported when the count matches.
4. Reports the node's RSS before and after ingest; with `--restart`, restarts the node and
   reports its RSS with the same jobs stored and, when the jobs are inside the node's
   lookahead (`--node-env CHRONOWHEEL_LOOKAHEAD_MS=...`), RSS per loaded occurrence.

    .venv/bin/python loadtest/bench/ingest_bench.py --jobs 100000
    .venv/bin/python loadtest/bench/ingest_bench.py --jobs 1000000 --due-from-s 1800 \
        --due-to-s 3000 --node-env CHRONOWHEEL_LOOKAHEAD_MS=3600000 --restart
"""

from __future__ import annotations

import argparse
import asyncio
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cassandra.query import SimpleStatement
from chronowheel.client.scheduler import SchedulerClient
from chronowheel.settings import Settings
from chronowheel.store.cassandra import connect
from chronowheel.testing import (
    NodeProcess,
    drop_namespace,
    metric_sum,
    wall_ms,
)
from common import (
    LOG_DIR,
    PAD,
    ROOT,
    ZONES,
    add_stack_args,
    fresh_namespace,
    init_with_cli,
    say,
    stored_commands,
)
from limits import raw_cassandra_rate


def count_jobs(settings: Settings) -> int:
    """The jobs rows, counted here from a paged scan of their keys: `count(*)` over a table
    makes Cassandra log a warning (an aggregation without a partition key) at every run, and
    a benchmark's server log is to carry none."""
    cluster, session = connect(settings)
    try:
        statement = SimpleStatement(f"SELECT job_id FROM {settings.keyspace}.jobs",
                                    fetch_size=5000)
        return sum(1 for _ in session.execute(statement, timeout=300))
    finally:
        cluster.shutdown()


def first_applies(m: dict[str, float]) -> float:
    # Nodes that label the outcome count first applies as outcome="stored"; older ones
    # count every apply, re-applies included.
    return stored_commands(m) or metric_sum(m, "chronowheel_ingested_total")


async def wait_stored(node: NodeProcess, settings: Settings, n: int, t0: float,
                      timeout_s: float, rss: list[tuple[float, float]]) -> float:
    """Seconds from t0 until n jobs rows are stored (metric first, then counted rows).
    Appends (jobs applied, node RSS MiB) to `rss` as it goes: RSS should plateau, not grow
    with the jobs applied (none of them is due soon)."""
    deadline = t0 + timeout_s
    last_say = 0.0
    while True:
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"not all {n:,} jobs applied within {timeout_s:.0f}s")
        if not node.alive():
            raise RuntimeError(f"the node exited:\n{node.log_tail()}")
        done = first_applies(await asyncio.to_thread(node.metrics))
        if done >= n:
            t_metric = time.monotonic()
            break
        if now - last_say > 5:
            last_say = now
            mib = (node.rss_bytes() or 0) / 2**20
            rss.append((done, round(mib, 1)))
            say(f"  {done:,.0f} applied after {now - t0:.1f}s, node RSS {mib:.0f} MiB")
        await asyncio.sleep(0.1)
    while True:
        rows = await asyncio.to_thread(count_jobs, settings)
        say(f"  jobs rows counted: {rows:,}")
        if rows >= n:
            return t_metric - t0
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {rows:,} of {n:,} jobs rows stored")
        await asyncio.sleep(1)


def is_cron(i: int, cron_share: float) -> bool:
    """Spreads the cron jobs evenly through the submission: job i is one when the running
    count of cron jobs steps up at i."""
    return math.floor((i + 1) * cron_share) > math.floor(i * cron_share)


def job_spec(run: str, i: int, now: float, due_from_s: float, span_ms: float,
             cron_share: float) -> dict[str, Any]:
    """A one-shot due in the horizon, or (a `cron_share` of them) a daily cron job at a
    minute spread over the day in one of twenty zones, whose next run is within a day."""
    payload = {"bench": "ingest", "i": i, "pad": PAD}
    if is_cron(i, cron_share):
        return {"id": f"{run}.{i:08d}", "cron": f"{i % 60} {(i // 60) % 24} * * *",
                "tz": ZONES[(i // 7) % len(ZONES)], "payload": payload}
    return {"id": f"{run}.{i:08d}", "at": int(now + due_from_s * 1000 + (i * 7919) % span_ms),
            "payload": payload}


async def submit(settings: Settings, n: int, due_from_s: float, due_to_s: float,
                 run: str, cron_share: float = 0.0) -> float:
    now = wall_ms()
    span = max(1.0, (due_to_s - due_from_s) * 1000)
    items = (job_spec(run, i, now, due_from_s, span, cron_share) for i in range(n))
    t0 = time.monotonic()
    async with SchedulerClient(settings) as client:
        report = await client.submit_many(items)
    took = time.monotonic() - t0
    if report.failed if hasattr(report, "failed") else False:
        raise RuntimeError(f"submit failures: {report}")
    say(f"submitted {n:,} jobs in {took:.1f}s ({n / took:,.0f}/s)")
    return took


async def wait_loaded(node: NodeProcess, n: int, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        entries = metric_sum(await asyncio.to_thread(node.metrics), "chronowheel_wheel_entries")
        if entries >= n:
            return entries
        await asyncio.sleep(0.5)
    return metric_sum(await asyncio.to_thread(node.metrics), "chronowheel_wheel_entries")


def py_spy(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    spy = ROOT / ".venv" / "bin" / "py-spy"
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--format", "raw",
                             "-o", str(out), "-d", str(seconds), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ns, settings, env = fresh_namespace(args, "ingbench")
    out: dict[str, Any] = {"namespace": ns, "jobs": args.jobs, "node_env": env,
                           "cron_share": args.cron_share}
    init_with_cli(args, ns)
    node: NodeProcess | None = None
    try:
        if args.raw_s > 0:
            raw = await asyncio.to_thread(raw_cassandra_rate, settings, args.raw_concurrency,
                                          args.raw_s, ns, args.shards)
            out["raw_inserts_per_s"] = round(raw["inserts_per_s"])
            say(f"raw prepared inserts: {raw['inserts_per_s']:,.0f}/s "
                f"({args.raw_concurrency} in flight)")
        log_path = LOG_DIR / "ingest-bench-node.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")
        node = NodeProcess(settings, log_path, env=env, cwd=ROOT)
        if args.live:  # the node runs first and applies the jobs as they arrive
            node.start()
            await node.wait_ready(120)
            out["rss_ready_mib"] = round((node.rss_bytes() or 0) / 2**20, 1)
            t0 = time.monotonic()
            sub = asyncio.create_task(submit(settings, args.jobs, args.due_from_s,
                                             args.due_to_s, ns, args.cron_share))
        else:
            await submit(settings, args.jobs, args.due_from_s, args.due_to_s, ns,
                         args.cron_share)
            node.start()
            await node.wait_ready(120)
            t0 = time.monotonic()
            out["rss_ready_mib"] = round((node.rss_bytes() or 0) / 2**20, 1)
        spy = py_spy(node.pid, args.profile_s, Path(args.profile)) if args.profile else None
        rss_samples: list[tuple[float, float]] = []
        took = await wait_stored(node, settings, args.jobs, t0, args.timeout_s, rss_samples)
        out["rss_during_ingest_mib"] = rss_samples
        out["rss_peak_during_ingest_mib"] = max((mib for _, mib in rss_samples), default=None)
        if args.live:
            await sub
        if spy is not None:
            spy.wait()
        rate = args.jobs / took
        out["ingest_s"] = round(took, 2)
        out["jobs_per_s"] = round(rate)
        if "raw_inserts_per_s" in out:
            out["ratio_to_raw"] = round(rate / out["raw_inserts_per_s"], 2)
        await asyncio.sleep(3)
        out["rss_after_ingest_mib"] = round((node.rss_bytes() or 0) / 2**20, 1)
        m = await asyncio.to_thread(node.metrics)
        out["ingested_total"] = metric_sum(m, "chronowheel_ingested_total")
        out["ingested_stored"] = stored_commands(m)
        say(f"ingest: {args.jobs:,} jobs stored in {took:.1f}s = {rate:,.0f} jobs/s; RSS "
            f"{out['rss_ready_mib']} -> {out['rss_after_ingest_mib']} MiB")
        if args.restart:
            node.stop()
            node = NodeProcess(settings, log_path, env=env, cwd=ROOT)
            node.start()
            await node.wait_ready(120)
            entries = await wait_loaded(node, args.jobs, args.load_timeout_s)
            await asyncio.sleep(3)
            rss = node.rss_bytes() or 0
            out["restart_wheel_entries"] = entries
            out["rss_restarted_mib"] = round(rss / 2**20, 1)
            if entries:
                base = out["rss_ready_mib"] * 2**20
                out["rss_per_loaded_b"] = round((rss - base) / entries)
            say(f"restarted: {entries:,.0f} in the wheel, RSS {out['rss_restarted_mib']} MiB")
    finally:
        if node is not None:
            node.stop()
        if not args.keep:
            await drop_namespace(settings)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--due-from-s", type=float, default=86_400)
    p.add_argument("--due-to-s", type=float, default=2 * 86_400)
    p.add_argument("--cron-share", type=float, default=0.0,
                   help="share of the jobs that are daily cron jobs in twenty zones (0..1)")
    p.add_argument("--raw-s", type=float, default=5.0)
    p.add_argument("--raw-concurrency", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--load-timeout-s", type=float, default=600)
    p.add_argument("--restart", action="store_true")
    p.add_argument("--live", action="store_true",
                   help="start the node first and submit while it runs (else: submit first)")
    p.add_argument("--profile", help="py-spy raw output path (profiles the node during ingest)")
    p.add_argument("--profile-s", type=int, default=20)
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--namespace")
    p.add_argument("--keep", action="store_true")
    add_stack_args(p)
    args = p.parse_args()
    if not 0.0 <= args.cron_share <= 1.0:
        p.error(f"--cron-share must be within 0..1, not {args.cron_share}")
    out = asyncio.run(run(args))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
