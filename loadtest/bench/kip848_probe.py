"""Kafka 4's consumer group protocol (KIP-848) as a node's group would meet it (issue 27):
which partitions a member gives up when another joins or leaves, how long a moved partition
waits, and whether the broker takes the node's transactional offset commit (aiokafka's
`send_offsets_to_transaction`, which carries no member id or epoch) into such a group.

Members are librdkafka consumers (`confluent-kafka` 2.12 or later, where KIP-848 is GA; not a
dependency of chronowheel: `pip install 'confluent-kafka>=2.12'` first) with
`group.protocol=consumer`; each polls on a thread of its own and logs every assignment and
revocation. A and B share 8 partitions, C joins, an aiokafka transactional producer commits
an offset for the group while the three are members, C leaves.

    .venv/bin/python loadtest/bench/kip848_probe.py [--kafka 127.0.0.1:9092]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from confluent_kafka import Consumer  # type: ignore[import-not-found]

T0 = time.monotonic()


def log(*parts: object) -> None:
    print(f"{time.monotonic() - T0:7.3f}s", *parts, flush=True)


def member(name: str, kafka: str, topic: str, group: str, stop: threading.Event) -> None:
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": group,
                         "group.protocol": "consumer", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})

    def on_assign(_c: object, parts: list) -> None:  # type: ignore[type-arg]
        log(name, "assigned", sorted(p.partition for p in parts))

    def on_revoke(_c: object, parts: list) -> None:  # type: ignore[type-arg]
        log(name, "revoked", sorted(p.partition for p in parts))

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while not stop.is_set():
        consumer.poll(0.05)
    consumer.close()


async def run(kafka: str, settle_s: float) -> None:
    topic = f"kip848probe{int(time.time())}"
    group = f"{topic}.nodes"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=8, replication_factor=1)])
    stops = {name: threading.Event() for name in "ABC"}
    threads: dict[str, threading.Thread] = {}

    def start(name: str) -> None:
        threads[name] = threading.Thread(target=member, args=(name, kafka, topic, group,
                                                              stops[name]))
        threads[name].start()

    try:
        start("A")
        start("B")
        await asyncio.sleep(settle_s)
        log("--- C joins")
        start("C")
        await asyncio.sleep(settle_s)
        producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True,
                                    transactional_id=f"{topic}.txn")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"x", partition=0)
                await producer.send_offsets_to_transaction({TopicPartition(topic, 3): 42},
                                                           group)
            log("transactional offset commit: committed")
        except Exception as exc:
            log("transactional offset commit: FAILED", repr(exc))
        finally:
            await producer.stop()
        offsets = await admin.list_consumer_group_offsets(group)
        log("group offsets", {tp.partition: o.offset for tp, o in offsets.items()})
        log("--- C leaves")
        stops["C"].set()
        threads["C"].join()
        await asyncio.sleep(settle_s)
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads.values():
            thread.join()
        await admin.delete_topics([topic])
        await admin.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kafka", default="127.0.0.1:9092")
    p.add_argument("--settle-s", type=float, default=8.0,
                   help="time given to each membership change (the broker's consumer "
                        "heartbeat interval is 5 s by default)")
    args = p.parse_args()
    asyncio.run(run(args.kafka, args.settle_s))


if __name__ == "__main__":
    main()
