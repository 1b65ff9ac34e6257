"""How soon a fenced node publishes again: its shards' first commits after each fence.

A node whose producer is fenced (another process initialised its transactional id, as a
takeover's fence does to a node paused past its session) or whose transaction failed starts a
new producer and takes every one of its shards over again (`node/transactions.py`). This runs
one node on a fresh namespace (`--shards`, default 16) under a steady load of one-shots
(`--rate` a second), fences it `--fences` times `--gap-s` apart by starting a producer with
its transactional id (`--second-fence-ms`: each time twice, that far apart), and reads the
node's own lines for each shard's first commit after a takeover (`first commit N ms after its
takeover began (..., the latest L ms late; its part came P ms after the takeover began and
took C ms to commit)`) and for shards it gave up as claimed by another node (there is none),
summed up over the run, and how many shards it owns at the end.

    .venv/bin/python loadtest/bench/fence_recovery_bench.py --rate 300
    .venv/bin/python loadtest/bench/fence_recovery_bench.py --second-fence-ms 150
    .venv/bin/python loadtest/bench/fence_recovery_bench.py \
        --node-env PYTHONPATH=<a checkout of other code>/services

On the local stack (CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA, loopback only).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from chronowheel.bus.kafka import plain_producer, transactional_producer
from chronowheel.node.transactions import node_transactional_id
from chronowheel.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.testing import drop_namespace
from chronowheel.testing.node_process import NodeProcess
from common import scratch_namespace, upserts

FIRST_COMMIT = re.compile(
    r"first commit (\d+) ms after its takeover began \((\d+) fired, the latest (\d+) ms late; "
    r"its part came (\d+) ms after the takeover began and took (\d+) ms to commit\)")
LEAD_S = 8
"""The first occurrence is due this long after the submissions, so all are ingested first."""
SETTLE_S = 3
"""Steady firing before the first fence."""


async def fence_once(settings: Settings, txn_id: str) -> None:
    fencer = transactional_producer(settings, txn_id)
    await fencer.start()  # InitProducerId: the node's producer is fenced
    await fencer.stop()


def summary(values: list[int]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.0f}, max {max(values)}"


async def run(args: argparse.Namespace) -> None:
    env = dict(kv.split("=", 1) for kv in args.node_env)
    settings = await scratch_namespace("fencerec", shards=args.shards)
    log_path = Path(tempfile.mkdtemp(prefix="fence-recovery-")) / "node.log"
    node = NodeProcess(settings, log_path, env=env)
    node.start()
    try:
        await node.wait_ready(timeout_s=120)
        first_due = int(time.time() * 1000) + LEAD_S * 1000
        span_s = int(args.fences * args.gap_s) + 10
        dues = [first_due + i * 1000 // args.rate for i in range(args.rate * span_s)]
        producer = plain_producer(settings)
        await producer.start()
        try:
            sent = [await producer.send(settings.submit_topic, value, key=key)
                    for key, value in upserts("fr", "steady", dues)]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        while time.time() * 1000 < first_due + SETTLE_S * 1000:
            await asyncio.sleep(0.2)
        # The node's id is its host name and process id (`node/service.py`).
        txn_id = node_transactional_id(settings.namespace, f"{socket.gethostname()}-{node.pid}")
        since = len(node.log_text())
        for _ in range(args.fences):
            await fence_once(settings, txn_id)
            if args.second_fence_ms:
                # Again while the node takes its shards over after the first (a takeover's
                # staggered fencers, or a second failed transaction, do that).
                await asyncio.sleep(args.second_fence_ms / 1000)
                await fence_once(settings, txn_id)
            await asyncio.sleep(args.gap_s)
        text = node.log_text()[since:]
        firsts = [tuple(int(x) for x in m.groups()) for m in FIRST_COMMIT.finditer(text)]
        lost = text.count("another node is claiming it")
        metrics = await asyncio.to_thread(node.metrics)
        owned = metrics.get("chronowheel_owned_shards")
        print(f"{args.fences} fences{' (each twice)' if args.second_fence_ms else ''}, "
              f"{len(firsts)} first commits after takeovers ({args.shards} shards, "
              f"{args.rate}/s); shards given up as claimed elsewhere: {lost}; owned at the "
              f"end: {owned:.0f}; after the takeover began "
              f"{summary([f[0] for f in firsts])} ms; the part came "
              f"{summary([f[3] for f in firsts])} ms; took to commit "
              f"{summary([f[4] for f in firsts])} ms; the latest occurrence "
              f"{summary([f[2] for f in firsts])} ms late; node log {log_path}", flush=True)
    finally:
        node.signal(15)
        node.wait(60)
        await drop_namespace(settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=300, help="one-shots due a second")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--fences", type=int, default=6)
    p.add_argument("--gap-s", type=float, default=5.0, help="between two fences")
    p.add_argument("--second-fence-ms", type=int, default=0,
                   help="fence again this long after each fence (0: once)")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the node (repeatable)")
    args = p.parse_args()
    if args.rate <= 0 or args.shards <= 0 or args.fences <= 0 or args.gap_s <= 0:
        p.error("--rate, --shards, --fences and --gap-s must be positive")
    if args.second_fence_ms < 0:
        p.error("--second-fence-ms must be 0 or more")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
