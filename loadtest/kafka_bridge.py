"""Kafka side of the locust scenarios, run as a child process of locust.

Locust runs on gevent, which patches sockets and threads; an asyncio Kafka client does not mix
with that inside one process. So the locustfile starts this small asyncio program and talks to
it over an inherited socket with one JSON object per line:

  locust -> bridge  {"t": "send", "id": 7, "k": "<job id>", "v": "<command JSON>"}
                    {"t": "stop"}
  bridge -> locust  {"t": "ready", "partitions": 16}
                    {"t": "ack", "id": 7, "err": null}          (Kafka acknowledged the send)
                    {"t": "fires", "items": [[occurrence, scheduled_ms, fired_ms, recv_ms], ..]}
                    {"t": "error", "err": "..."}

Submits go to <ns>.submit through aiokafka's default partitioner (murmur2, i.e. the job's
shard). The bridge also reads <ns>.fired read_committed from its end and reports the fired
messages whose key starts with the run's prefix, stamped with the time they were received here.
It exits when the socket closes (locust gone) or on "stop".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from chronowheel.bus.kafka import open_admin, partition_counts, plain_producer
from chronowheel.bus.kafka import reader as kafka_reader
from chronowheel.settings import Settings

FLUSH_EVERY_S = 0.05


class Bridge:
    def __init__(self, settings: Settings, prefix: bytes, writer: asyncio.StreamWriter) -> None:
        self.settings = settings
        self.prefix = prefix
        self.writer = writer
        self.fires: list[list[Any]] = []

    def emit(self, obj: dict[str, Any]) -> None:
        self.writer.write(orjson.dumps(obj) + b"\n")

    async def consume(self, consumer: AIOKafkaConsumer) -> None:
        prefix = self.prefix
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            now = time.time_ns() / 1e6
            for msgs in batches.values():
                for m in msgs:
                    if not (m.key or b"").startswith(prefix):
                        continue
                    h = dict(m.headers or ())
                    self.fires.append([h.get("cw-occurrence", b"").decode(),
                                       int(h.get("cw-scheduled-at", b"0")),
                                       int(h.get("cw-fired-at", b"0")), round(now, 3)])

    async def flush_fires(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            if self.fires:
                items, self.fires = self.fires, []
                self.emit({"t": "fires", "items": items})
                await self.writer.drain()


async def serve(fd: int, settings: Settings, prefix: str) -> int:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 24)
    bridge = Bridge(settings, prefix.encode(), writer)
    admin = await open_admin(settings)
    try:
        counts = await partition_counts(admin, [settings.submit_topic, settings.fired_topic])
    finally:
        await admin.close()
    missing = [t for t in (settings.submit_topic, settings.fired_topic) if t not in counts]
    if missing:
        bridge.emit({"t": "error", "err": f"topics {missing} do not exist: run `chronowheel init "
                                          f"--namespace {settings.namespace}` first"})
        await writer.drain()
        return 2
    producer = plain_producer(settings, linger_ms=2)
    consumer = kafka_reader(settings, auto_offset_reset="latest", fetch_max_wait_ms=20,
                      max_partition_fetch_bytes=8 << 20)
    await asyncio.gather(producer.start(), consumer.start())
    tps = [TopicPartition(settings.fired_topic, p) for p in range(counts[settings.fired_topic])]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)  # resolve "end" now: later fires are all seen
    tasks = [asyncio.create_task(bridge.consume(consumer)),
             asyncio.create_task(bridge.flush_fires())]
    bridge.emit({"t": "ready", "partitions": len(tps)})
    await writer.drain()

    def acked(req_id: int, fut: asyncio.Future[Any]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        bridge.emit({"t": "ack", "id": req_id,
                     "err": None if exc is None and not fut.cancelled() else repr(exc)})

    try:
        while True:
            line = await reader.readline()
            if not line:
                break  # locust is gone
            msg = orjson.loads(line)
            if msg["t"] == "stop":
                break
            if msg["t"] == "send":
                req_id = int(msg["id"])
                try:
                    fut = await producer.send(settings.submit_topic, msg["v"].encode(),
                                              key=msg["k"].encode())
                except Exception as exc:
                    bridge.emit({"t": "ack", "id": req_id, "err": repr(exc)})
                    continue
                fut.add_done_callback(lambda f, r=req_id: acked(r, f))
            for task in tasks:
                if task.done():
                    task.result()
    finally:
        with contextlib.suppress(Exception):
            await producer.flush()
        await asyncio.sleep(FLUSH_EVERY_S * 2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if bridge.fires:
            bridge.emit({"t": "fires", "items": bridge.fires})
        with contextlib.suppress(Exception):
            await writer.drain()
        await asyncio.gather(producer.stop(), consumer.stop(), return_exceptions=True)
        writer.close()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--kafka", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--prefix", required=True, help="report fired messages whose key starts so")
    a = p.parse_args()
    settings = Settings.from_env(namespace=a.namespace, kafka=a.kafka)  # + security settings
    return asyncio.run(serve(a.fd, settings, a.prefix))


if __name__ == "__main__":
    sys.exit(main())
