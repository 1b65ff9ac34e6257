"""End-to-end benchmark of one `chronowheel node` on the local stack, with the limits it runs on.

One command, one run, on loopback Cassandra + Kafka (a fresh namespace, dropped at the end):

  limits   raw aiokafka transactional produce (the node's message sizes, headers and batching;
           one producer, and one per shard at once), raw cassandra-driver prepared inserts of
           `due` rows (the node's row shape and concurrency), heapq push/pop for reference.
           Measured before the node starts, so nothing else of ours competes.
  ingest   M jobs far in the future are submitted; time until the node has applied them all
           (chronowheel_ingested_total on /metrics).
  ladder   for each rate R: R*T jobs due evenly over T seconds are submitted ahead of time;
           a read_committed consumer measures lateness = receive time - cw-scheduled-at (and
           cw-fired-at - cw-scheduled-at). A step passes when every occurrence arrived and the
           receive p99 < 100 ms; the ladder stops at the first failing step.
  herd     H jobs due at the same instant (top of a second): time from that instant to the last
           occurrence received (and to the largest cw-fired-at), lateness percentiles. The node's
           RSS before submitting the herd and once the wheel holds it gives bytes per entry.

Early fires (cw-fired-at or receive time before cw-scheduled-at), duplicate cw-occurrence and
missing occurrences are counted; any of them makes the exit status 1.

Writes loadtest/results/bench-<preset>.json, loadtest/results/measured.json (read by
`chronowheel capacity`) and the preset's section of loadtest/RESULTS.md.

The parts: common.py (presets, configuration, workload, output), machine.py, limits.py,
phases.py (the node process, the probe, ingest/ladder/herd, the run) and report.py (summary,
tables, result files); the node process, the read_committed probe and the lateness tally come
from chronowheel.testing, the node's defaults from its settings.

Usage (the local stack must be up: `./run stack up`):
  .venv/bin/python loadtest/bench/run_bench.py --preset quick
  .venv/bin/python loadtest/bench/run_bench.py --preset full
  .venv/bin/python loadtest/bench/run_bench.py --preset quick --rates 500,1000 --herd 20000 \
      --note "quick run, machine busy"
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

from chronowheel.errors import ConfigError
from common import PRESETS, SMALL_TXN_BATCH, Config, node_settings, say
from phases import run


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--shards", type=int)
    p.add_argument("--ingest-jobs", type=int)
    p.add_argument("--rates", help="comma-separated ladder of fire rates per second")
    p.add_argument("--step-s", type=float, help="seconds of due jobs per ladder step")
    p.add_argument("--herd", type=int, help="jobs due at the same instant (0 = skip)")
    p.add_argument("--raw-s", type=float, help="seconds per raw limit measurement")
    p.add_argument("--heap-n", type=int)
    p.add_argument("--namespace", help="default: bench<unix time> (fresh each run)")
    p.add_argument("--kafka", default="127.0.0.1:9092")
    p.add_argument("--cassandra", default="127.0.0.1:9042")
    p.add_argument("--keep", action="store_true", help="keep the namespace afterwards")
    p.add_argument("--note", default="", help="shown in RESULTS.md, e.g. 'machine busy'")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the node, e.g. CHRONOWHEEL_MAX_BATCH=2000")
    p.add_argument("--profile", type=Path, help="run the node under cProfile, write stats here")
    p.add_argument("--skip-limits", action="store_true")
    p.add_argument("--no-write", action="store_true",
                   help="print only: do not write results/ and RESULTS.md")
    p.add_argument("--record-memory", action="store_true",
                   help="write only the herd's node RSS per loaded occurrence (with when and "
                        "the command) into results/measured.json, keeping its other figures "
                        "(memory does not depend on the machine's speed; measure it with "
                        "--herd 1000000)")
    a = p.parse_args(argv)
    pre = PRESETS[a.preset]
    node_env = {}
    for item in a.node_env:
        k, sep, v = item.partition("=")
        if not sep or not k.startswith("CHRONOWHEEL_"):
            p.error(f"--node-env {item!r}: expected CHRONOWHEEL_NAME=VALUE")
        node_env[k] = v
    try:
        node = node_settings(node_env)
    except ConfigError as exc:
        p.error(f"--node-env: {exc}")
    cfg = Config(
        preset=a.preset,
        shards=a.shards or pre["shards"],
        ingest_jobs=a.ingest_jobs if a.ingest_jobs is not None else pre["ingest_jobs"],
        rates=[int(x) for x in a.rates.split(",")] if a.rates else list(pre["rates"]),
        step_s=a.step_s or pre["step_s"],
        herd=a.herd if a.herd is not None else pre["herd"],
        raw_s=a.raw_s or pre["raw_s"],
        # The node's largest transaction, and a small one.
        raw_batches=[node.max_batch, SMALL_TXN_BATCH],
        heap_n=a.heap_n or pre["heap_n"],
        refine=pre["refine"],
        namespace=a.namespace or f"bench{int(time.time())}",
        kafka=a.kafka, cassandra=a.cassandra, keep=a.keep, note=a.note, node_env=node_env,
        profile=a.profile, skip_limits=a.skip_limits,
        write_results=not a.no_write and not a.record_memory, record_memory=a.record_memory)
    if cfg.record_memory and not cfg.herd:
        p.error("--record-memory needs a herd (--herd 1000000)")
    if cfg.ingest_jobs < 1 or cfg.step_s <= 0 or any(r <= 0 for r in cfg.rates):
        p.error("sizes and rates must be positive")
    if cfg.ingest_jobs > 5_000_000 or cfg.herd > 5_000_000 or \
            max(cfg.rates) * cfg.step_s > 5_000_000:
        p.error("refusing more than 5,000,000 jobs in one phase")
    return cfg


async def run_until_signal(cfg: Config) -> int:
    """SIGTERM or SIGINT (even when started in the background) cancels the run: the node is
    stopped and the namespace dropped on the way out."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await run(cfg)
    except asyncio.CancelledError:
        say("interrupted")
        return 130


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    return asyncio.run(run_until_signal(cfg))


if __name__ == "__main__":
    sys.exit(main())
