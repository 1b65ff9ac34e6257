"""How long a takeover's fence of an owner with an open transaction takes: one librdkafka
fencer, as fences were made before, against `node.takeover.fence`, which starts another fencer
every FENCE_STAGGER_MS while none has initialised.

An owner that crashed (or was paused) mid-transaction is what a fence meets after a `kill -9`.
Each round starts an owner (a librdkafka producer) with a transactional id of its own,
opens a transaction holding one state record, then fences that id both ways, alternating which
way goes first. The first InitProducerId of a fence is refused (CONCURRENT_TRANSACTIONS) while
the coordinator aborts the owner's transaction; librdkafka asks again only after 500 ms.

    CHRONOWHEEL_CASSANDRA=127.0.0.2:9042 CHRONOWHEEL_KAFKA=127.0.0.1:9192 \\
        .venv/bin/python loadtest/bench/fence_bench.py --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from chronowheel.bus.kafka_consumer_group import librdkafka_config
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.core.clock import SystemClock
from chronowheel.core.wire import StateRecord
from chronowheel.node.publisher import stop_quietly
from chronowheel.node.takeover import fence
from chronowheel.node.transactions import node_transactional_id
from chronowheel.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.testing import drop_namespace
from common import scratch_namespace

GROUP = "fence-bench"


def owner_mid_transaction(settings: Settings, owner: str) -> Any:
    """A producer of `owner` whose transaction holds one state record, sent and acknowledged
    (its partition is in the transaction), and is still open. librdkafka, blocking: the bench
    calls it from a thread."""
    from confluent_kafka import Producer

    producer = Producer({**librdkafka_config(settings), "transactional.id": owner,
                         "linger.ms": 0})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(settings.state_topic, StateRecord(
        shard=0, watermark=1, owner=owner, node="bench").encode(), StateRecord.key(0),
        partition=0)
    if producer.flush(30):
        raise RuntimeError(f"{owner}: the record was not acknowledged in 30 s")
    return producer


def close_fenced(producer: Any) -> None:
    """close() tries to abort the open transaction, which the fence has made fail."""
    from confluent_kafka import KafkaException

    with contextlib.suppress(KafkaException):
        producer.close()


async def one_fencer(bus: KafkaNodeBus, owner: str) -> None:
    fencer = bus.claimer(owner, GROUP)
    try:
        await fencer.start()
    finally:
        await stop_quietly(fencer)


async def run(args: argparse.Namespace) -> None:
    settings = await scratch_namespace("fb")
    bus = KafkaNodeBus(settings)
    clock = SystemClock()
    ways = {"one fencer": lambda owner: one_fencer(bus, owner),
            "staggered": lambda owner: fence(bus, owner, GROUP, 0, clock)}
    times: dict[str, list[float]] = {way: [] for way in ways}
    try:
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
            for way in order:
                owner = node_transactional_id(settings.namespace, f"{way[:3]}-{round_}")
                producer = await asyncio.to_thread(owner_mid_transaction, settings, owner)
                began = time.perf_counter()
                await ways[way](owner)
                times[way].append((time.perf_counter() - began) * 1000)
                await asyncio.to_thread(close_fenced, producer)
            print(f"round {round_ + 1}: " + ", ".join(f"{w} {times[w][-1]:.0f} ms" for w in ways),
                  flush=True)
    finally:
        await bus.close()
        await drop_namespace(settings)
    for way, ms in times.items():
        ms.sort()
        print(f"{way}: median {statistics.median(ms):.0f} ms ({ms[0]:.0f}-{ms[-1]:.0f}), "
              f"over 400 ms in {sum(m > 400 for m in ms)} of {len(ms)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
