"""Back-to-back transactions shaped like the node's, on aiokafka (the node's producer) and on
librdkafka (confluent-kafka, the claimers' client), alternating, with the event loop idle or
kept busy: whether moving the node's own producer to librdkafka would shorten its
transactions or cost it less CPU.

Each transaction carries `--messages` messages over 16 partitions of the fired topic and one
state record, and commits; the next begins when it returns, for `--seconds`. Printed per
client and round: transactions a second, their duration p50/p90/p99 (begin to commit
returned), and the process's CPU per transaction (librdkafka's own threads included).

    .venv/bin/python loadtest/bench/txn_client_bench.py --rounds 2
    .venv/bin/python loadtest/bench/txn_client_bench.py --rounds 2 --busy-ms 3
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path
from typing import Any

from chronowheel.bus.kafka_consumer_group import librdkafka_call, librdkafka_config
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.testing import drop_namespace
from claim_bench import busy
from common import scratch_namespace

PARTITIONS = 16
VALUE = b"x" * 200


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def on_aiokafka(bus: KafkaNodeBus, s: Settings, seconds: float, messages: int
                      ) -> tuple[list[float], float]:
    producer = bus.producer(f"{s.namespace}-node-a", f"{s.namespace}-nodes")
    await producer.start()
    took: list[float] = []
    began_cpu, end = cpu_s(), time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        txn = await producer.begin()
        for i in range(messages):
            await txn.publish(s.fired_topic, i % PARTITIONS, b"k%d" % i, VALUE, [("h", b"v")])
        await txn.publish(s.state_topic, 0, b"0", b"state", [])
        await txn.commit({})
        took.append((time.perf_counter() - began) * 1000)
    used = cpu_s() - began_cpu
    await producer.stop()
    return took, used


async def on_librdkafka(s: Settings, seconds: float, messages: int
                        ) -> tuple[list[float], float]:
    from confluent_kafka import Producer

    producer: Any = Producer({**librdkafka_config(s), "transactional.id": f"{s.namespace}-node-r",
                              "enable.sparse.connections": False, "linger.ms": 0,
                              "retry.backoff.ms": 20, "retry.backoff.max.ms": 100})
    await librdkafka_call(lambda: producer.init_transactions(20))
    took: list[float] = []
    began_cpu, end = cpu_s(), time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        producer.begin_transaction()
        for i in range(messages):
            producer.produce(s.fired_topic, value=VALUE, key=b"k%d" % i,
                             partition=i % PARTITIONS, headers=[("h", b"v")])
        producer.produce(s.state_topic, value=b"state", key=b"0", partition=0)
        await librdkafka_call(lambda: producer.commit_transaction(20))
        took.append((time.perf_counter() - began) * 1000)
    used = cpu_s() - began_cpu
    await librdkafka_call(producer.close)
    return took, used


def report(client: str, took: list[float], cpu: float, args: argparse.Namespace) -> None:
    took.sort()
    n = len(took)
    if not n:
        print(f"loop busy {args.busy_ms:g} ms, {client}: no transaction in {args.seconds:g} s")
        return
    print(f"loop busy {args.busy_ms:g} ms, {client}: {n / args.seconds:.0f} transactions/s, "
          f"p50 {took[n // 2]:.1f} p90 {took[int(n * .9)]:.1f} p99 {took[int(n * .99)]:.1f} "
          f"ms, CPU {1000 * cpu / n:.2f} ms a transaction", flush=True)


async def run(args: argparse.Namespace) -> None:
    settings = await scratch_namespace("tb", shards=PARTITIONS)
    bus = KafkaNodeBus(settings)
    spinner = asyncio.create_task(busy(args.busy_ms)) if args.busy_ms > 0 else None
    try:
        for _ in range(args.rounds):
            report("aiokafka", *await on_aiokafka(bus, settings, args.seconds, args.messages),
                   args)
            report("librdkafka", *await on_librdkafka(settings, args.seconds, args.messages),
                   args)
    finally:
        if spinner is not None:
            spinner.cancel()
        await bus.close()
        await drop_namespace(settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--messages", type=int, default=8, help="messages a transaction")
    p.add_argument("--busy-ms", type=float, default=0,
                   help="keep the event loop busy this long at every turn (0: idle)")
    p.add_argument("--rounds", type=int, default=2)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
