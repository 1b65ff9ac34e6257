"""A one-shot due 2 s after it is sent, while a herd of jobs due later is being applied
(issue 26, item 4): how late it fires, with the urgent lane and without.

1. Creates a fresh namespace (16 shards), starts one node and a read_committed reader of
   `<ns>.fired`.
2. Sends `--herd` one-shots due over `--herd-from-s`..`--herd-to-s` (a day to 30 days by
   default) as fast as one producer sends them.
3. From the first herd command on, until the node has applied the whole herd, sends
   `--probe-rate` probe one-shots a second, each due `--probe-lead-ms` after it is sent.
4. Reports the herd's ingest rate and the probes' lateness (received minus due), lost, early
   and duplicate. The probes sent while the herd was being applied are the `during` group.

    .venv/bin/python loadtest/bench/urgent_bench.py
    .venv/bin/python loadtest/bench/urgent_bench.py --node-env CHRONOWHEEL_URGENT_MS=0  # off
    .venv/bin/python loadtest/bench/urgent_bench.py --trace   # where each probe's time went

`--trace` runs the node under `trace_shim.py` and adds `probe_stages`: for the probes sent
while the herd was applied, sent -> applied (the change in its shard's wheel), applied -> due
(the slack left), due -> taken out of the wheel, taken -> its transaction committed; and of
the last, queued -> its transaction begins, of which the wait for the node transaction in
flight when it was queued (the node runs one at a time), and its own transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.bus.kafka import plain_producer
from chronowheel.core.model import encode_upsert
from chronowheel.testing import (
    Collector,
    Fired,
    LatenessTally,
    NodeProcess,
    drop_namespace,
    metric_sum,
    summarize,
    wall_ms,
)
from common import LOG_DIR, ROOT, add_stack_args, emit, fresh_namespace, init_with_cli, say
from trace_latency import Trace


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ns, settings, env = fresh_namespace(args, "urgent")
    init_with_cli(args, ns)
    out: dict[str, Any] = {"namespace": ns, "herd": args.herd, "node_env": env,
                           "probe_rate": args.probe_rate, "probe_lead_ms": args.probe_lead_ms}
    tally = LatenessTally()
    probe_group: dict[str, str] = {}
    stray: list[str] = []

    def on_fired(m: Fired) -> None:
        group = probe_group.get((m.key or b"").decode())
        if group is None:
            stray.append(m.occurrence)
            return
        tally.observe(m.occurrence, m.scheduled_ms, m.received_ms, fired_ms=m.fired_ms,
                      group=group)

    collector = Collector(settings, (settings.fired_topic,), keep_messages=False,
                          on_fired=on_fired)
    log_dir = LOG_DIR / "urgent"
    log_dir.mkdir(parents=True, exist_ok=True)
    sent_at: dict[str, float] = {}
    trace = log_dir / f"trace-{ns}.csv" if args.trace else None
    if trace is not None:
        here = Path(__file__).resolve().parent
        env = {**env, "CHRONOWHEEL_TRACE_OUT": str(trace), "CHRONOWHEEL_TRACE_APPLIED": ".probe.",
               "PYTHONPATH": os.pathsep.join(
                   p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p)}
    node = NodeProcess(settings, log_dir / "node.log", env=env, cwd=ROOT)
    if trace is not None:
        node.args_prefix = [sys.executable, str(Path(__file__).resolve().parent / "trace_shim.py")]
    producer = plain_producer(settings)
    rng = random.Random(7)
    now = int(wall_ms())
    lo, hi = int(args.herd_from_s * 1000), int(args.herd_to_s * 1000)
    herd = [(f"{ns}.herd.{i:07d}", now + rng.randrange(lo, hi)) for i in range(args.herd)]
    applied = asyncio.Event()
    try:
        await collector.start()
        node.start()
        await node.wait_ready(120)
        await producer.start()
        base = metric_sum(await asyncio.to_thread(node.metrics), "chronowheel_ingested_total")

        async def send_probes() -> None:
            i = after = 0
            t0 = time.monotonic()
            while after < args.probes_after:
                group = "after" if applied.is_set() else "during"
                after += group == "after"
                jid = f"{ns}.probe.{i:05d}"
                probe_group[jid] = group
                sent_at[jid] = wall_ms()
                await producer.send(settings.submit_topic, encode_upsert(
                    {"id": jid, "at": int(wall_ms()) + args.probe_lead_ms, "payload": {"i": i}}),
                    key=jid.encode())
                i += 1
                await asyncio.sleep(max(0.0, t0 + i / args.probe_rate - time.monotonic()))

        async def send_herd() -> float:
            t0 = time.monotonic()
            futs = [await producer.send(settings.submit_topic, encode_upsert(
                {"id": jid, "at": at, "payload": {"herd": n}}), key=jid.encode())
                for n, (jid, at) in enumerate(herd)]
            await asyncio.gather(*futs)
            return time.monotonic() - t0

        t0 = time.monotonic()
        probes = asyncio.create_task(send_probes())
        out["herd_sent_s"] = round(await send_herd(), 1)
        say(f"herd of {args.herd:,} sent in {out['herd_sent_s']}s")
        last = time.monotonic()
        while True:
            m = await asyncio.to_thread(node.metrics)
            done = metric_sum(m, "chronowheel_ingested_total") - base
            if done >= args.herd + len(probe_group) - 1:  # the herd, and the probes so far
                break
            if not node.alive():
                raise RuntimeError(f"the node exited:\n{node.log_tail()}")
            if metric_sum(m, "chronowheel_rejected_total"):
                raise RuntimeError(f"the node rejected commands:\n{node.log_tail()}")
            if time.monotonic() - t0 > args.timeout_s:
                raise RuntimeError(f"only {done:,.0f} commands applied in {args.timeout_s}s")
            if time.monotonic() - last > 10:
                last = time.monotonic()
                say(f"  {done:,.0f} commands applied after {last - t0:.0f}s; "
                    f"{tally.distinct} probes received")
            await asyncio.sleep(0.2)
        applied_s = time.monotonic() - t0
        applied.set()
        out["herd_applied_s"] = round(applied_s, 1)
        out["herd_commands_per_s"] = round(args.herd / applied_s)
        say(f"herd applied in {applied_s:.1f}s ({out['herd_commands_per_s']:,}/s)")
        await probes
        deadline = time.monotonic() + args.probe_lead_ms / 1000 + args.grace_s
        while tally.distinct < len(probe_group) and time.monotonic() < deadline:
            collector.check_alive()
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # anything fired twice
        m = await asyncio.to_thread(node.metrics)
        out["urgent_applied"] = metric_sum(m, "chronowheel_ingest_urgent_total")
        out["probes"] = len(probe_group)
        out["received"] = tally.distinct
        out["lost"] = len(probe_group) - tally.distinct
        out["duplicates"] = tally.duplicates
        out["early"] = tally.early
        out["stray"] = len(stray)
        for group in ("during", "after"):
            g = tally.group(group)
            out[f"{group}_probes"] = sum(1 for v in probe_group.values() if v == group)
            out[f"{group}_receive_lateness_ms"] = summarize(g.lateness_ms)
            out[f"{group}_fired_lateness_ms"] = summarize(g.fired_lateness_ms)
    finally:
        await producer.stop()
        await collector.stop()
        if node.alive():
            node.stop()
        if trace is not None and trace.exists():
            out["probe_stages"] = probe_stages(trace, sent_at, probe_group)
        if not args.keep:
            await drop_namespace(settings)
    return out


def probe_stages(path: Path, sent_at: dict[str, float],
                 group: dict[str, str]) -> dict[str, Any]:
    """Where each `during` probe's time went, from the node's trace (`trace_shim.py`, read by
    `trace_latency.Trace`): sent -> applied (in its shard's wheel), due -> taken out of the
    wheel, taken -> committed."""
    trace = Trace(path)
    stages: dict[str, list[float]] = {"sent -> applied": [], "applied -> due (slack)": [],
                                      "due -> taken": [], "taken -> committed": [],
                                      "queued -> its transaction begins": [],
                                      "of which the transaction in flight": [],
                                      "its transaction": []}
    txns = sorted(trace.txns, key=lambda t: t["begin"])
    for jid, g in group.items():
        row, applied = trace.node.get(jid), trace.applied.get(jid)
        if g != "during" or row is None or "committed" not in row or applied is None \
                or jid not in sent_at:
            continue
        stages["sent -> applied"].append(applied - sent_at[jid])
        stages["applied -> due (slack)"].append(row["scheduled"] - applied)
        stages["due -> taken"].append(row["take"] - row["scheduled"])
        stages["taken -> committed"].append(row["committed"] - row["take"])
        if "queued" in row and "begin" in row:
            queued, begin = row["queued"], row["begin"]
            stages["queued -> its transaction begins"].append(begin - queued)
            # The one transaction that may be running when the part is queued (one at a time).
            before = [t for t in txns if t["begin"] <= queued < t.get("done", t["begin"])]
            stages["of which the transaction in flight"].append(
                before[0]["done"] - queued if before else 0.0)
            stages["its transaction"].append(row["committed"] - begin)
    return {k: summarize(v) for k, v in stages.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--herd", type=int, default=100_000)
    p.add_argument("--herd-from-s", type=float, default=86_400)
    p.add_argument("--herd-to-s", type=float, default=30 * 86_400)
    p.add_argument("--probe-rate", type=float, default=5.0, help="probes sent per second")
    p.add_argument("--probe-lead-ms", type=int, default=2_000)
    p.add_argument("--probes-after", type=int, default=10,
                   help="probes sent once the herd is applied (a quiet baseline)")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--grace-s", type=float, default=30)
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--namespace")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--trace", action="store_true",
                   help="run the node under trace_shim.py and report where each probe's time "
                        "went (sent, applied, taken out of the wheel, committed)")
    p.add_argument("--json", help="also write the result to this file")
    add_stack_args(p)
    args = p.parse_args()
    out = asyncio.run(run(args))
    emit(out, args.json)
    lost, early, dup = out["lost"], out["early"], out["duplicates"]
    return 0 if not (lost or early or dup) else 1


if __name__ == "__main__":
    sys.exit(main())
