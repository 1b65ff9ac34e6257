"""Soak on the local cluster profile: a steady one-shot load for a long time, three chronowheel
nodes, one server fault at a fixed interval (a Cassandra node, the Kafka broker leading the
most submit/fired partitions, the active KRaft controller, in turn; each killed with SIGKILL
and started again after --down-s), and a read_committed checker.

It reports the verdict (lost, early, duplicate occurrences), lateness, and samples every
--sample-s of the nodes' resident memory and largest dispatch lag, and fails (exit 1) when
anything was lost, early or duplicated, a node exited, or RSS or lag grew between the first
and the last quarter of the run by more than the given limits.

    chronowheel stack up --profile cluster
    python loadtest/soak.py                                    # 30 min, 2,000/s, fault / 5 min
    python loadtest/soak.py --minutes 10 --fault-every-s 180 --rate 500
    chronowheel stack down --profile cluster

The namespace (six shards, replication 3) is made for the run and dropped afterwards; node
logs go to --log-dir. The summary is printed and written to --out as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from statistics import mean

from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.testing import drop_namespace, require_loopback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's testkit/

from testkit.chaos import SoakSample, run_soak
from testkit.cluster import LocalCluster


def quarter_means(samples: list[SoakSample]) -> tuple[float, float, float, float]:
    """(mean total RSS MB, mean max lag s) of the first and of the last quarter of samples."""
    q = max(1, len(samples) // 4)
    first, last = samples[1:q + 1] or samples[:1], samples[-q:]
    return (mean(sum(s.rss_mb) for s in first), mean(sum(s.rss_mb) for s in last),
            mean(s.max_lag_s for s in first), mean(s.max_lag_s for s in last))


async def main(args: argparse.Namespace) -> int:
    cluster = LocalCluster()
    cluster.require_up()
    cassandra, kafka = cluster.addresses()
    require_loopback("soak", cassandra)
    require_loopback("soak", kafka)
    settings = Settings(namespace="soak" + secrets.token_hex(4), cassandra=cassandra,
                        kafka=kafka, shards=args.shards, replication="3", http_port=0)
    await init_namespace(settings)
    log_dir = Path(args.log_dir).expanduser()
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        result, samples = await run_soak(
            settings, cluster, log_dir, rate=args.rate, minutes=args.minutes,
            fault_every_s=args.fault_every_s, down_s=args.down_s, sample_every_s=args.sample_s)
    finally:
        await drop_namespace(settings)
    rss_first, rss_last, lag_first, lag_last = quarter_means(samples)
    problems = result.problems()
    if rss_last > rss_first * (1 + args.max_rss_growth):
        problems.append(f"node RSS grew from {rss_first:.0f} to {rss_last:.0f} MB")
    if lag_last > lag_first + args.max_lag_growth_s:
        problems.append(f"dispatch lag grew from {lag_first:.1f} to {lag_last:.1f} s")
    if any(n.startswith("nodes exited") for n in result.notes):
        problems.append("a node exited")
    summary = {"row": result.row(), "result": vars(result),
               "rss_mb_first_quarter": rss_first, "rss_mb_last_quarter": rss_last,
               "max_lag_s_first_quarter": lag_first, "max_lag_s_last_quarter": lag_last,
               "samples": [vars(s) for s in samples], "problems": problems,
               "wall_s": round(time.monotonic() - t0, 1)}
    Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
    print(result.summary())
    print(f"RSS (3 nodes) {rss_first:.0f} -> {rss_last:.0f} MB; max dispatch lag "
          f"{lag_first:.1f} -> {lag_last:.1f} s (first -> last quarter)")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=int, default=2_000, help="one-shot jobs due per second")
    p.add_argument("--fault-every-s", type=float, default=300.0)
    p.add_argument("--down-s", type=float, default=20.0, help="how long a killed server stays "
                                                               "down")
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--max-rss-growth", type=float, default=0.25,
                   help="allowed growth of the nodes' RSS, last vs first quarter (fraction)")
    p.add_argument("--max-lag-growth-s", type=float, default=2.0)
    p.add_argument("--log-dir", default="loadtest/out/soak-logs")
    p.add_argument("--out", default="loadtest/out/soak.json")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
