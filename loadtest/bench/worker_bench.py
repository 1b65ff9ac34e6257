"""The path a user runs, timed end to end: from an occurrence's due instant to the start of the
user's handler in the real worker, with default settings.

Two measurements, each with its limit measured in the same run:

`e2e`: N one-shot jobs due uniformly in a window of W seconds (N/W due per second) are submitted
with the Python client ahead of the window; a real node (`chronowheel node`) and a real worker
(`chronowheel worker`, default settings: idempotency on, concurrency 16) run as child processes;
the handler records when it started. Reported per rate: lateness of each job's first handler
start against its due instant (p50/p95/p99/max), early starts, duplicates, missing, and the
node's own dispatch lateness from its /metrics histogram. The limit is the due instant itself;
the targets are absolute (p99 <= 100 ms at 1,000 due/s, <= 1 s at 5,000 due/s).

`backlog`: N fired occurrences (real `cw-*` headers) are put on `<ns>.fired` first; then a bare
read_committed consumer reads them all (the raw consume rate, the limit), then the real Worker
(default settings, in this process) handles them all with a trivial handler, once with an
`async def` handler and once with a plain function. Reported: handled/s and its ratio to the raw
rate (target: >= 0.5 with idempotency on).

    python loadtest/bench/worker_bench.py e2e --rates 1000,5000 --window-s 10
    python loadtest/bench/worker_bench.py backlog --n 1000000

Writes loadtest/results/worker-<mode>.json and prints a table. Exit status 1 on any early,
duplicate or missing handler start. Servers: CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA
(default the local stack on loopback).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from chronowheel.bus.kafka import plain_producer, reader
from chronowheel.client import SchedulerClient
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.testing import Collector, Fired, NodeProcess, summarize
from chronowheel.worker import Occurrence, Worker
from common import stored_commands

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "loadtest" / "results"
SHARDS = 16
ASSIGNED_RE = re.compile(r"worker \S+ assigned")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def settings_for(namespace: str) -> Settings:
    return Settings.from_env(namespace=namespace)


def cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "chronowheel", *args], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"chronowheel {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def new_namespace(prefix: str) -> str:
    ns = f"{prefix}{secrets.token_hex(4)}"
    cli("init", "--namespace", ns, "--shards", str(SHARDS), "--replication", "1")
    return ns


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),
            "platform": platform.platform(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "when": datetime.now(UTC).isoformat(timespec="seconds")}


def histogram_quantile(m: dict[str, float], name: str, q: float) -> float | None:
    """Upper bound of the bucket holding quantile q (seconds) of a Prometheus histogram."""
    buckets = sorted((float("inf") if le == "+Inf" else float(le), v)
                     for k, v in m.items()
                     for le in re.findall(rf'^{name}_bucket\{{.*le="([^"]+)"', k))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return None


async def wait_for(pred: Any, timeout_s: float, what: str, every: float = 0.25) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(every)


# --- e2e ---------------------------------------------------------------------------------------
async def e2e_rate(rate: int, window_s: float, workdir: Path, handler: str,
                   lead_s: float | None) -> dict[str, Any]:
    n = int(rate * window_s)
    ns = new_namespace("wbe")
    settings = settings_for(ns)
    sink = workdir / f"starts-{ns}.csv"
    env = {"CHRONOWHEEL_BENCH_SINK": str(sink),
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", ""))
                                         if p)}
    node = NodeProcess(settings, workdir / f"node-{ns}.log", env=env, cwd=ROOT)
    worker = NodeProcess(settings, workdir / f"worker-{ns}.log", name="worker", env=env,
                         cwd=ROOT, args=("worker", "--topic", settings.fired_topic,
                                         "--handler", handler))
    received: dict[str, float] = {}

    def on_fired(f: Fired) -> None:
        received.setdefault(f.job_id, f.received_ms - f.scheduled_ms)

    probe = Collector(settings, keep_messages=False, on_fired=on_fired)
    node.start()
    worker.start()
    await probe.start()
    try:
        await node.wait_ready()
        await wait_for(lambda: bool(ASSIGNED_RE.search(worker.log_text())), 120,
                       "the worker to be assigned its partitions")
        if lead_s is None:  # time for the node to ingest everything before the window opens
            lead_s = max(15.0, n / 700.0 + 10.0)
        t0_ms = int(time.time() * 1000 + lead_s * 1000)
        rng = secrets.SystemRandom()
        dues = sorted(t0_ms + int(rng.random() * window_s * 1000) for _ in range(n))
        jobs = {f"{ns}-{i}": due for i, due in enumerate(dues)}
        say(f"{rate}/s: submitting {n:,} jobs due in [{lead_s:.0f}s, {lead_s + window_s:.0f}s)")
        client = SchedulerClient(settings)
        await client.start()
        t_submit = time.time()
        try:
            items = [{"id": jid, "at": due} for jid, due in jobs.items()]
            rep = await client.submit_many(items)
        finally:
            await client.close()
        if rep.failed:
            raise RuntimeError(f"{len(rep.failed)} submits failed")
        await wait_for(lambda: stored_commands(node.metrics(), "upsert") >= n,
                       lead_s + window_s + 120,
            "the node to ingest every job")
        ingested_s = time.time() - t_submit
        ingest_done_before_window = time.time() * 1000 < t0_ms
        say(f"{rate}/s: ingested in {ingested_s:.1f}s "
            f"({'before' if ingest_done_before_window else 'AFTER'} the window opened)")

        def starts() -> dict[str, list[float]]:
            out: dict[str, list[float]] = {}
            if sink.exists():
                for line in sink.read_text().splitlines():
                    jid, _due, start, _pid = line.split(",")
                    out.setdefault(jid, []).append(float(start))
            return out

        end_ms = t0_ms + window_s * 1000
        while time.time() * 1000 < end_ms + 60_000:
            if len(starts()) >= n:
                break
            await asyncio.sleep(0.5)
        m = node.metrics()
        seen = starts()
    finally:
        await probe.stop()
        worker_rc = worker.stop()
        node_rc = node.stop()
    late = [min(s) - jobs[j] for j, s in seen.items() if j in jobs]
    early = sum(1 for j, s in seen.items() if j in jobs for x in s if x < jobs[j])
    dup = sum(len(s) - 1 for s in seen.values())
    missing = n - len(late)
    stats = re.search(r"WorkerStats\([^)]*\)", worker.log_text())
    res = {
        "rate": rate, "n": n, "window_s": window_s, "handler": handler, "namespace": ns,
        "handler_start_lateness_ms": summarize(late),
        "read_committed_receive_lateness_ms": summarize(
            v for j, v in received.items() if j in jobs), "early": early, "duplicates": dup,
        "missing_60s_after_window": missing, "ingest_s": round(ingested_s, 1),
        "ingest_done_before_window": ingest_done_before_window,
        "node_dispatch_p99_s_upper": histogram_quantile(m, "chronowheel_lateness_seconds", 0.99),
        "worker_rc": worker_rc, "node_rc": node_rc,
        "worker_stats": stats.group(0) if stats else None,
    }
    rc = res["read_committed_receive_lateness_ms"]
    if rc["n"]:
        say(f"{rate}/s: read_committed receive lateness p50 {rc['p50']:.0f} p95 {rc['p95']:.0f} "
            f"p99 {rc['p99']:.0f} max {rc['max']:.0f} ms (batches stamped when fetched)")
    s = res["handler_start_lateness_ms"]
    say(f"{rate}/s: handler start lateness p50 {s['p50']:.0f} p95 {s['p95']:.0f} "
        f"p99 {s['p99']:.0f} max {s['max']:.0f} ms; early {early}, dup {dup}, missing {missing}"
        if s["n"] else f"{rate}/s: nothing handled")
    return res


# --- backlog -----------------------------------------------------------------------------------
async def fill(settings: Settings, n: int) -> None:
    producer = plain_producer(settings, linger_ms=20)
    await producer.start()
    try:
        now = int(time.time() * 1000)
        futures = []
        for i in range(n):
            jid = f"b{i}"
            headers = encode_headers(jid, now, 1, 5, 10_000, ())
            headers.append(("cw-fired-at", str(now).encode()))
            futures.append(await producer.send(settings.fired_topic, b'{"n":1}',
                                               key=jid.encode(), headers=headers))
            if len(futures) >= 20_000:
                await asyncio.gather(*futures)
                futures.clear()
                if i % 200_000 < 20_000:
                    say(f"  produced {i + 1:,}")
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def raw_consume(settings: Settings, n: int) -> float:
    consumer = reader(settings, max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(settings.fired_topic, p) for p in range(SHARDS)])
        seen = 0
        t0 = time.monotonic()
        while seen < n:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for records in batches.values():
                for rec in records:  # what any reader does at least: look at each header
                    _ = rec.headers
                seen += sum(len(r) for r in batches.values())
        return n / (time.monotonic() - t0)
    finally:
        await consumer.stop()


async def worker_consume(settings: Settings, n: int, kind: str, idempotency: bool,
                         ) -> dict[str, Any]:
    done = 0
    first = last = 0.0

    def count() -> None:
        nonlocal done, first, last
        if done == 0:
            first = time.monotonic()
        done += 1
        last = time.monotonic()

    async def handle_async(occ: Occurrence) -> None:
        count()

    def handle_sync(occ: Occurrence) -> None:
        count()

    handler: Any = handle_async if kind == "async" else handle_sync
    group = f"{settings.namespace}-bench-{kind}-{'idem' if idempotency else 'noidem'}"
    worker = Worker(settings, handlers={settings.fired_topic: handler}, group_id=group,
                    idempotency=idempotency)
    t0 = time.monotonic()
    cpu0 = time.process_time()  # every thread of this process: the loop's and the driver's
    gc0 = [g["collections"] for g in gc.get_stats()]
    await worker.start()
    try:
        while done < n:
            if worker.failure is not None:
                raise RuntimeError(f"worker failed: {worker.failure!r}")
            await asyncio.sleep(0.2)
        cpu_s = time.process_time() - cpu0
        collections = [g["collections"] - c for g, c in zip(gc.get_stats(), gc0, strict=True)]
    finally:
        # Run history as it stood when the last record was handled (the shutdown then
        # writes what is queued for at most a few seconds).
        h = worker.history
        history = None if h is None else {"written": h.written, "dropped": h.dropped,
                                           "failed": h.failed, "queued": h.queued}
        await worker.shutdown()
    return {"kind": kind, "idempotency": idempotency, "handled": done,
            "rate_incl_join": round(n / (last - t0)), "rate": round(n / max(last - first, 1e-9)),
            "stats": str(worker.stats), "history": history,
            # CPU of the whole process from the worker's start to its last record: less
            # sensitive than handled/s to what else the machine runs.
            "cpu_s": round(cpu_s, 2), "cpu_us_per_record": round(cpu_s / n * 1e6, 1),
            "gc_collections": collections}


async def backlog(n: int, variants: list[str]) -> dict[str, Any]:
    ns = new_namespace("wbb")
    settings = settings_for(ns)
    say(f"backlog: producing {n:,} fired occurrences to {settings.fired_topic}")
    t0 = time.monotonic()
    await fill(settings, n)
    say(f"  produced in {time.monotonic() - t0:.1f}s")
    raw = await raw_consume(settings, n)
    say(f"raw read_committed consume: {raw:,.0f} records/s")
    out: dict[str, Any] = {"n": n, "namespace": ns, "raw_consume_per_s": round(raw),
                           "runs": []}
    for v in variants:
        kind, _, idem = v.partition(":")
        r = await worker_consume(settings, n, kind, idem != "noidem")
        r["ratio_to_raw"] = round(r["rate"] / raw, 3)
        say(f"worker {kind} handler, idempotency {'on' if r['idempotency'] else 'off'}: "
            f"{r['rate']:,} handled/s ({r['ratio_to_raw']:.2f} of raw; "
            f"{r['rate_incl_join']:,}/s counting the group join); CPU {r['cpu_s']} s "
            f"({r['cpu_us_per_record']} µs a record), collections {r['gc_collections']}; "
            f"run history {r['history'] or 'off'}")
        out["runs"].append(r)
    return out


# Goals (issue "The worker"): absolute for e2e lateness, a ratio to the raw consume rate
# measured in the same run for the backlog.
E2E_GOALS_MS = {1000: (100.0, None), 5000: (1000.0, 100.0)}
"""due/s -> (must: p99 handler-start lateness at most, aim: at most)"""
BACKLOG_GOAL_RATIO = 0.5
"""handled/s with idempotency on, as a share of the raw read_committed consume rate"""


def goals(mode: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if mode == "e2e":
        for r in result["runs"]:
            must, aim = E2E_GOALS_MS.get(r["rate"], (None, None))
            p99 = r["handler_start_lateness_ms"]["p99"]
            for kind, limit in (("must", must), ("aim", aim)):
                if limit is not None and p99 is not None:
                    out.append({"goal": f"{r['rate']} due/s: handler start p99 <= {limit:.0f} ms",
                                "kind": kind, "value": round(p99, 1), "met": p99 <= limit})
    else:
        for r in result["runs"]:
            if r["idempotency"]:
                out.append({"goal": f"backlog, {r['kind']} handler, idempotency on: >= "
                                    f"{BACKLOG_GOAL_RATIO} x raw consume",
                            "kind": "must", "value": r["ratio_to_raw"],
                            "met": r["ratio_to_raw"] >= BACKLOG_GOAL_RATIO})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("e2e", help="due instant -> handler start, node + worker processes")
    e.add_argument("--rates", default="1000,5000", help="due/s, comma separated")
    e.add_argument("--window-s", type=float, default=10.0)
    e.add_argument("--lead-s", type=float, default=None,
                   help="seconds from submitting to the window (default: enough for ingest "
                        "at 700 jobs/s, at least 15)")
    e.add_argument("--handler", default="bench_handler:handle",
                   help="bench_handler:handle (async) or bench_handler:handle_sync")
    b = sub.add_parser("backlog", help="the worker alone against a backlog")
    b.add_argument("--n", type=int, default=1_000_000)
    b.add_argument("--variants", default="async:idem,sync:idem,async:noidem",
                   help="kind:idem|noidem, comma separated")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    workdir = ROOT / ".state" / "worker-bench"
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine(), "command": " ".join(
        ["python", "loadtest/bench/worker_bench.py", *(argv or sys.argv[1:])])}
    bad = 0
    if args.mode == "e2e":
        result["runs"] = []
        for rate in [int(r) for r in args.rates.split(",") if r]:
            r = asyncio.run(e2e_rate(rate, args.window_s, workdir, args.handler, args.lead_s))
            result["runs"].append(r)
            bad += r["early"] + r["duplicates"] + r["missing_60s_after_window"]
    else:
        result.update(asyncio.run(backlog(args.n, [v for v in args.variants.split(",") if v])))
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["goals"] = goals(args.mode, result)
    for g in result["goals"]:
        say(f"goal ({g['kind']}) {g['goal']}: {g['value']} -> {'met' if g['met'] else 'MISSED'}")
    path = RESULTS / f"worker-{args.mode}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {path.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
