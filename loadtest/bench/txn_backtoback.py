"""Kafka transactions committed back to back by one producer, as a busy node commits them:
the time each takes, at a given CONCURRENT_TRANSACTIONS retry pause (aiokafka's own is 20 ms;
the node's is chronowheel.bus.kafka.CONCURRENT_TRANSACTIONS_RETRY_S).

    python loadtest/bench/txn_backtoback.py --retry-ms 20
    python loadtest/bench/txn_backtoback.py --retry-ms 2

Servers: CHRONOWHEEL_KAFKA (default the local stack, 127.0.0.1:9092). Creates a scratch topic
`txnbb<hex>` and deletes it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time

import aiokafka.producer.sender as aiokafka_sender
from chronowheel.bus.kafka import TopicSpec, ensure_topics, open_admin, transactional_producer
from chronowheel.settings import Settings


async def run(retry_ms: float, transactions: int, records: int) -> list[float]:
    settings = Settings(kafka=os.environ.get("CHRONOWHEEL_KAFKA", "127.0.0.1:9092"))
    aiokafka_sender.BACKOFF_OVERRIDE = retry_ms / 1000  # after chronowheel.bus.kafka set its own
    topic = "txnbb" + secrets.token_hex(3)
    admin = await open_admin(settings)
    await ensure_topics(admin, [TopicSpec(topic, 4, {})], 1)
    producer = transactional_producer(settings, topic + "-producer")
    await producer.start()
    took: list[float] = []
    try:
        for _ in range(transactions):
            t0 = time.perf_counter()
            async with producer.transaction():
                for k in range(records):
                    await producer.send(topic, b"x" * 100, partition=k % 4)
            took.append((time.perf_counter() - t0) * 1000)
    finally:
        await producer.stop()
        await admin.delete_topics([topic])
        await admin.close()
    return sorted(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retry-ms", type=float, default=2.0)
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--records", type=int, default=10)
    args = parser.parse_args()
    took = asyncio.run(run(args.retry_ms, args.transactions, args.records))
    n = len(took)
    print(f"retry {args.retry_ms:g} ms, {n} transactions of {args.records} records back to "
          f"back: p50 {took[n // 2]:.1f} p90 {took[n * 9 // 10]:.1f} "
          f"p99 {took[min(n - 1, n * 99 // 100)]:.1f} ms")


if __name__ == "__main__":
    main()
