"""Takeover time: from a node's kill -9 to its shards firing again, and a herd across the kill.

Against the Cassandra and Kafka of CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA (loopback only),
on a scratch namespace dropped afterwards:

1. `--nodes` `chronowheel node` processes share `--shards` shards (session timeout
   `--session-timeout-ms`, static membership with `--static`).
2. A tick of jobs due every `--tick-ms` on every shard, from a few seconds before the kill until
   `--after-s` after it, and a herd of `--herd` jobs due `--herd-delay-ms` after the kill
   (spread over `--herd-spread-ms`) are submitted and ingested before the kill.
3. The first node is killed with SIGKILL at its instant. A read_committed reader records
   every fired message.

Reported: for the killed node's shards, the time from the kill to the survivors' group
assignment, to each claim (with its phases: settle, claimer init, state read, fence, settled
read, claim, claimer stop, seek), to "taken over", and to the first fire; the herd's lateness
(cw-fired-at minus due: p50, p99, max); lost, early and duplicate occurrences. One JSON line
per run is appended to loadtest/results/takeover.jsonl.

Usage: python loadtest/takeover.py [--session-timeout-ms 10000] [--static] [--herd 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

from chronowheel.admin import init_namespace
from chronowheel.core.shard import shard_of
from chronowheel.settings import Settings
from chronowheel.testing import drop_namespace, require_loopback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's testkit/

from testkit.faults import (
    Tally,
    first_fire_after,
    judge,
    now_ms,
    submit_jobs,
    takeover_log,
)
from testkit.fleet import Fleet

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "loadtest" / "results" / "takeover.jsonl"
# Assumed ingest rate (jobs/s) when planning the kill instant; measured on this machine under
# load at 250-1,000 jobs/s.
INGEST_RATE = 300


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    p.add_argument("--static", action="store_true",
                   help="give each node a group instance id (static membership)")
    p.add_argument("--herd", type=int, default=10_000)
    p.add_argument("--herd-delay-ms", type=int, default=500)
    p.add_argument("--herd-spread-ms", type=int, default=1_000)
    p.add_argument("--tick-ms", type=int, default=100)
    p.add_argument("--after-s", type=int, default=25)
    p.add_argument("--keep", action="store_true", help="keep the namespace and the logs")
    return p.parse_args()


async def run(args: argparse.Namespace) -> dict[str, object]:
    cassandra = os.environ.get("CHRONOWHEEL_CASSANDRA", "127.0.0.1:9042")
    kafka = os.environ.get("CHRONOWHEEL_KAFKA", "127.0.0.1:9092")
    require_loopback("cassandra", cassandra)
    require_loopback("kafka", kafka)
    settings = Settings(namespace="lt" + secrets.token_hex(5), cassandra=cassandra,
                        kafka=kafka, shards=args.shards, http_port=0)
    await init_namespace(settings)
    log_dir = Path(tempfile.mkdtemp(prefix="takeover-"))
    env = {"CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS": str(args.session_timeout_ms)}
    fleet = Fleet(settings, log_dir, env=env, cwd=REPO)
    tally = Tally(settings)
    try:
        members = [fleet.start(f"n{i}", **({"CHRONOWHEEL_NODE_INSTANCE_ID": f"n{i}"}
                                             if args.static else {}))
                   for i in range(args.nodes)]
        await fleet.until(lambda: fleet.sharing(*members), 180, "the nodes sharing the shards")
        victim, survivors = members[0], members[1:]
        victim_shards = fleet.owned(victim) or set()
        await tally.start()

        ticks_per_shard = (args.after_s * 1000 + 5_000) // args.tick_ms
        total = args.herd + ticks_per_shard * args.shards
        kill_at = int(now_ms()) + total * 1000 // INGEST_RATE + 5_000
        jobs: dict[str, int] = {}
        # Ticks: ids are drawn until every shard has its series.
        per_shard = dict.fromkeys(range(args.shards), 0)
        i = 0
        while min(per_shard.values()) < ticks_per_shard:
            job_id = f"tick-{i:06d}"
            k = shard_of(job_id, args.shards)
            if per_shard[k] < ticks_per_shard:
                jobs[job_id] = kill_at - 5_000 + per_shard[k] * args.tick_ms
                per_shard[k] += 1
            i += 1
        herd_at = kill_at + args.herd_delay_ms
        herd = {f"herd-{j:06d}": herd_at + j * args.herd_spread_ms // max(1, args.herd)
                for j in range(args.herd)}
        jobs |= herd
        t_submit = time.monotonic()
        await submit_jobs(settings, jobs)
        await fleet.until(lambda: fleet.ingested(*members) >= len(jobs),
                          max(60.0, (kill_at - now_ms()) / 1000 + 120), "ingest")
        ingest_s = time.monotonic() - t_submit
        slack_s = (kill_at - now_ms()) / 1000
        if slack_s < 1:
            raise SystemExit(f"ingest of {len(jobs)} jobs took {ingest_s:.0f} s, past the kill "
                             "instant: lower --herd or run on a less loaded machine")
        await asyncio.sleep(slack_s)
        victim.kill()
        killed = now_ms()
        deadline = time.monotonic() + args.after_s + 90
        while tally.seen() < len(jobs) and time.monotonic() < deadline:
            tally.check_alive()
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # a late duplicate would show here
        outcome = judge(tally.messages, jobs)
        herd_out = judge([m for m in tally.messages if m.job_id.startswith("herd-")], herd)
        first = first_fire_after(tally.messages, victim_shards, killed)
        logs = [takeover_log(s.log_text(), victim_shards, killed - 1_000) for s in survivors]
        assigned = [t.assigned_ms for t in logs if t.assigned_ms is not None]
        claimed = {k: v for t in logs for k, v in t.claimed.items()}
        taken = {k: v for t in logs for k, v in t.taken_ms.items()}

        def since(ms: float | None) -> float | None:
            return None if ms is None else round((ms - killed) / 1000, 2)

        phase_max: dict[str, int] = {}
        for _at, phases in claimed.values():
            for name, v in phases.items():
                phase_max[name] = max(phase_max.get(name, 0), v)
        result: dict[str, object] = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "nodes": args.nodes, "shards": args.shards,
            "session_timeout_ms": args.session_timeout_ms, "static": args.static,
            "herd": args.herd, "jobs": len(jobs), "ingest_s": round(ingest_s, 1),
            "load_1m": os.getloadavg()[0],
            "victim_shards": sorted(victim_shards),
            "assigned_s": since(min(assigned) if assigned else None),
            "claimed_s": since(max((v[0] for v in claimed.values()), default=None)),
            "taken_over_s": since(max(taken.values(), default=None)),
            "first_fire_s": {str(k): since(v) for k, v in sorted(first.items())},
            "all_fire_again_s": since(max(first.values())) if len(first) == len(
                victim_shards) else None,
            "claim_phases_max_ms": phase_max,
            "lost": outcome.lost, "early": outcome.early, "duplicates": outcome.duplicates,
            "unexpected": outcome.unexpected,
            "herd_p50_ms": herd_out.p(50), "herd_p99_ms": herd_out.p(99),
            "herd_max_ms": herd_out.max_ms,
        }
        return result
    finally:
        await tally.stop()
        fleet.close()
        if args.keep:
            print(f"kept namespace {settings.namespace}, logs in {log_dir}", file=sys.stderr)
        else:
            await drop_namespace(settings)


def main() -> None:
    args = parse()
    result = asyncio.run(run(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
