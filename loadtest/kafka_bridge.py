"""Kafka side of the locust scenarios, run as a child process of locust.

Locust runs on gevent, which patches sockets and threads; an asyncio Kafka client does not mix
with that inside one process. So the locustfile starts this small asyncio program and talks to
it over an inherited socket with one JSON object per line:

  locust -> bridge  {"t": "send", "id": 7, "k": "<job id>", "v": "<command JSON>"}
                    {"t": "stop"}
  bridge -> locust  {"t": "ready", "partitions": 16, "worker": false}
                    {"t": "ack", "id": 7, "err": null}          (Kafka acknowledged the send)
                    {"t": "fires", "items": [[occurrence, scheduled_ms, fired_ms, recv_ms], ..]}
                    {"t": "starts", "items": [[occurrence, scheduled_ms, started_ms], ..]}
                    {"t": "error", "err": "..."}

Submits go to <ns>.submit through aiokafka's default partitioner (murmur2, i.e. the job's
shard). The bridge also reads <ns>.fired read_committed from its end (chronowheel.testing's
Collector) and reports the fired messages whose key starts with the run's prefix, stamped with
the time they were received here.

With --worker it also runs chronowheel's Worker (default settings: concurrency 16, idempotency
on, so Cassandra is needed) on <ns>.fired in a consumer group of its own that starts at the
topic's end, and reports when its handler started for each occurrence of the run: what a user's
handler sees. It exits when the socket closes (locust gone) or on "stop".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from typing import Any

import orjson
from aiokafka import TopicPartition
from chronowheel.bus.kafka import group_consumer, plain_producer
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.testing import Collector, Fired, wall_ms
from chronowheel.worker import Occurrence, Worker

FLUSH_EVERY_S = 0.05


class Bridge:
    def __init__(self, settings: Settings, prefix: bytes, writer: asyncio.StreamWriter) -> None:
        self.settings = settings
        self.prefix = prefix
        self.job_prefix = prefix.decode()  # the key is the job id
        self.writer = writer
        self.fires: list[list[Any]] = []
        self.starts: list[list[Any]] = []

    def emit(self, obj: dict[str, Any]) -> None:
        self.writer.write(orjson.dumps(obj) + b"\n")

    def on_fired(self, m: Fired) -> None:
        self.fires.append([m.occurrence, m.scheduled_ms, m.fired_ms, round(m.received_ms, 3)])

    async def handle(self, occ: Occurrence) -> None:
        """The worker's handler: notes when it started, for the run's own jobs."""
        started = wall_ms()
        if occ.job_id.startswith(self.job_prefix):
            self.starts.append([occ.occurrence, occ.scheduled_ms, round(started, 3)])

    def emit_pending(self) -> None:
        if self.fires:
            items, self.fires = self.fires, []
            self.emit({"t": "fires", "items": items})
        if self.starts:
            items, self.starts = self.starts, []
            self.emit({"t": "starts", "items": items})

    async def flush(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            self.emit_pending()
            await self.writer.drain()


async def start_group_at_end(settings: Settings, group_id: str, topic: str,
                             partitions: int) -> None:
    """Commit the end of `topic` for a new consumer group, so that a worker joining it reads
    only what is fired from now on (a new group would otherwise start at the beginning)."""
    consumer = group_consumer(settings, group_id)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.commit(dict(ends))
    finally:
        await consumer.stop()


async def serve(fd: int, settings: Settings, prefix: str, with_worker: bool) -> int:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 24)
    bridge = Bridge(settings, prefix.encode(), writer)
    probe = Collector(settings, (settings.fired_topic,), keep_messages=False, from_end=True,
                      key_prefix=bridge.prefix, on_fired=bridge.on_fired)
    try:
        await probe.start()
    except ConfigError as exc:
        bridge.emit({"t": "error", "err": f"{exc}: run `chronowheel init --namespace "
                                          f"{settings.namespace}` first"})
        await writer.drain()
        return 2
    producer = plain_producer(settings, linger_ms=2)
    await producer.start()
    worker: Worker | None = None
    if with_worker:
        group_id = f"{settings.namespace}-locust-{prefix.rstrip('.')}"
        await start_group_at_end(settings, group_id, settings.fired_topic,
                                 probe.partitions(settings.fired_topic))
        worker = Worker(settings, handlers={settings.fired_topic: bridge.handle},
                        group_id=group_id)
        await worker.start()
    tasks = [asyncio.create_task(bridge.flush())]
    bridge.emit({"t": "ready", "partitions": probe.partitions(settings.fired_topic),
                 "worker": worker is not None})
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
            probe.check_alive()
            if worker is not None and worker.failure is not None:
                raise RuntimeError(f"the worker failed: {worker.failure!r}")
    finally:
        with contextlib.suppress(Exception):
            await producer.flush()
        await asyncio.sleep(FLUSH_EVERY_S * 2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if worker is not None:
            await worker.shutdown()
        await asyncio.gather(producer.stop(), probe.stop(), return_exceptions=True)
        bridge.emit_pending()
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--kafka", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--prefix", required=True, help="report fired messages whose key starts so")
    p.add_argument("--cassandra", default=Settings.cassandra,
                   help="Cassandra of the namespace (for --worker's idempotency)")
    p.add_argument("--worker", action="store_true",
                   help="also run a Worker and report its handler's start times")
    a = p.parse_args()
    # from_env: the security settings come from the environment too
    settings = Settings.from_env(namespace=a.namespace, kafka=a.kafka, cassandra=a.cassandra)
    return asyncio.run(serve(a.fd, settings, a.prefix, a.worker))


if __name__ == "__main__":
    sys.exit(main())
