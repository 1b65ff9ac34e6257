"""How long a takeover's state read takes with many records on the state partition.

A state partition's active segment (`segment.ms`, 10 minutes) is never compacted: it holds a
record for every node transaction that wrote to the shard. This writes `--records` state
records to partition 0 of a scratch namespace (ten per transaction) and times
`KafkaNodeBus.read_last(..., settled=True)` reading from the partition's tail (the node's way)
and from its beginning (how it read before), `--reads` times each.

    .venv/bin/python loadtest/bench/state_read_bench.py --records 100000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import chronowheel.bus.kafka_node as kafka_node
from chronowheel.bus.kafka import transactional_producer
from chronowheel.core.wire import StateRecord

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.testing import drop_namespace
from common import scratch_namespace

PER_TRANSACTION = 10


async def run(args: argparse.Namespace) -> None:
    settings = await scratch_namespace("sr")
    try:
        record = StateRecord(shard=0, watermark=1_796_471_906_556,
                             owner=f"{settings.namespace}-node-bench", node="bench",
                             at=1_796_471_906_556).encode()
        key = StateRecord.key(0)
        writer = transactional_producer(settings, f"{settings.namespace}-bench")
        await writer.start()
        try:
            for done in range(0, args.records, PER_TRANSACTION):
                await writer.begin_transaction()
                for _ in range(PER_TRANSACTION):
                    await writer.send(settings.state_topic, record, key=key, partition=0)
                await writer.commit_transaction()
                if done and done % 20_000 == 0:
                    print(f"  {done:,} records written", flush=True)
        finally:
            await writer.stop()
        bus = kafka_node.KafkaNodeBus(settings)
        tail = kafka_node.STATE_TAIL_OFFSETS
        try:
            await bus.read_last(settings.state_topic, 0, key, 30_000)  # a reader started
            for name, back in (("tail", tail), ("from the beginning", 1 << 62)):
                kafka_node.STATE_TAIL_OFFSETS = back
                took = []
                for _ in range(args.reads):
                    t0 = time.monotonic()
                    found = await bus.read_last(settings.state_topic, 0, key, 60_000,
                                                settled=True)
                    took.append((time.monotonic() - t0) * 1000)
                    assert found == record
                print(f"{args.records:,} records, read {name}: median {statistics.median(took):.1f}"
                      f" ms, min {min(took):.1f}, max {max(took):.1f} ({args.reads} reads)")
        finally:
            kafka_node.STATE_TAIL_OFFSETS = tail
            await bus.close()
    finally:
        await drop_namespace(settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--reads", type=int, default=5)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
