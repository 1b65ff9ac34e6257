"""Kafka and Cassandra side of the locust scenarios, run as a child process of locust.

Locust runs on gevent, which patches sockets and threads; an asyncio Kafka client does not mix
with that inside one process. So the locustfile starts this small asyncio program and talks to
it over an inherited socket with one JSON object per line:

  locust -> bridge  {"t": "send", "id": 7, "jobs": [["<job id>", {<upsert>} or null], ...]}
                    {"t": "stop"}
  bridge -> locust  {"t": "ready", "partitions": 16, "worker": false,
                     "cassandra_nodes": 1, "kafka_brokers": 1}
                    {"t": "ack", "id": 7, "err": null}     (Kafka acknowledged every command)
                    {"t": "skew", "skew_ms": 3, "uncertainty_ms": 1}
                    {"t": "fires", "items": [[occurrence, scheduled_ms, fired_ms, recv_ms,
                                              skew_ms, uncertainty_ms], ..]}
                    {"t": "starts", "items": [[occurrence, scheduled_ms, started_ms, skew_ms,
                                               uncertainty_ms], ..]}
                    {"t": "error", "err": "..."}

A send carries a batch of commands: an upsert (the job as a dict) or, for null, a cancel of
the job. The commands that arrive while a send to <ns>.submit is in flight go together in the
next one, one record batch per partition (`Submitter`), and one ack answers each of locust's
batches once Kafka acknowledged the send that carried it (acks=all).

The cluster comes from the same flags, CHRONOWHEEL_* variables and `..._FILE` secrets as every
chronowheel command (the locustfile passes its resolved settings as flags; secrets come from
the inherited environment), and every client is made by the package (chronowheel.bus.kafka,
chronowheel.store.cassandra), so TLS, SASL and Cassandra authentication work as everywhere.

The bridge reads <ns>.fired read_committed from its end (chronowheel.testing's Collector) and
reports the fired messages whose key starts with the run's prefix, stamped with the time they
were received here. It measures this machine's clock offset to Cassandra's as the node measures
its own skew (chronowheel.node.clock_guard.measure_skew: the tightest of three round trips,
with half of it as the uncertainty), before it is ready and then every
skew_check_interval_ms, and sends each receive time with the offset then current: receive time
- offset is the receive time on Cassandra's clock, which the nodes keep theirs close to, so
lateness stays right when locust runs on another machine than the nodes.

With --worker it also runs chronowheel's Worker (default settings: concurrency 16, idempotency
on) on <ns>.fired in a consumer group of its own that starts at the topic's end, and reports
when its handler started for each occurrence of the run: what a user's handler sees. It exits
when the socket closes (locust gone) or on "stop".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import TopicPartition
from chronowheel.bus.kafka import group_consumer, plain_producer
from chronowheel.core.clock import SystemClock
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.node.clock_guard import measure_skew
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)
from chronowheel.store.cassandra import CassandraStore
from chronowheel.testing import Collector, Fired, wall_ms
from chronowheel.worker import Occurrence, Worker

FLUSH_EVERY_S = 0.05


class Bridge:
    def __init__(self, settings: Settings, prefix: bytes, writer: asyncio.StreamWriter,
                 store: CassandraStore) -> None:
        self.settings = settings
        self.prefix = prefix
        self.job_prefix = prefix.decode()  # the key is the job id
        self.writer = writer
        self.store = store
        self.fires: list[list[Any]] = []
        self.starts: list[list[Any]] = []
        self.skew: tuple[int, int] = (0, 0)
        """this machine's clock - Cassandra's, and its uncertainty, in ms (the latest)"""

    def emit(self, obj: dict[str, Any]) -> None:
        self.writer.write(orjson.dumps(obj) + b"\n")

    def on_fired(self, m: Fired) -> None:
        self.fires.append([m.occurrence, m.scheduled_ms, m.fired_ms, round(m.received_ms, 3),
                           *self.skew])

    async def handle(self, occ: Occurrence) -> None:
        """The worker's handler: notes when it started, for the run's own jobs."""
        started = wall_ms()
        if occ.job_id.startswith(self.job_prefix):
            self.starts.append([occ.occurrence, occ.scheduled_ms, round(started, 3),
                                *self.skew])

    async def measure_skew(self) -> None:
        self.skew = await measure_skew(self.store, SystemClock())
        self.emit({"t": "skew", "skew_ms": self.skew[0], "uncertainty_ms": self.skew[1]})

    async def watch_skew(self) -> None:
        while True:
            await asyncio.sleep(self.settings.skew_check_interval_ms / 1000)
            try:
                await self.measure_skew()
            except Exception as exc:  # keep the last offset; say so once per failure
                print(f"kafka_bridge: measuring the clock offset to Cassandra failed: {exc}",
                      file=sys.stderr)

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


class Submitter:
    """Sends locust's batches of commands to <ns>.submit: the commands that arrived meanwhile
    go as one record batch per partition (a job's partition is its shard, what the default
    partitioner, murmur2, picks) once the previous send is acknowledged, one send in flight.
    Few, full record batches, whatever the size of locust's batches: about a fifth of the CPU
    of aiokafka's send() per record. Each locust batch is acknowledged (`ack(id, error)`)
    once every record of the send that carried it is (acks=all)."""

    LINGER_S = 0.002

    def __init__(self, producer: Any, topic: str, partitions: int,
                 ack: Callable[[int, str | None], None]) -> None:
        self.producer = producer
        self.topic = topic
        self.partitions = partitions
        self.ack = ack
        self.commands: list[tuple[str, bytes]] = []
        self.batches: list[int] = []  # ids of the locust batches in `commands`
        self.wake = asyncio.Event()
        self.sending = False

    def add(self, req_id: int, jobs: list[list[Any]]) -> None:
        self.commands += [(key, encode_cancel(key) if spec is None else encode_upsert(spec))
                          for key, spec in jobs]
        self.batches.append(req_id)
        self.wake.set()

    async def idle(self, timeout_s: float) -> None:
        """Return once everything added was sent and acknowledged (or after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while (self.batches or self.sending) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.LINGER_S)
            self.wake.clear()
            commands, self.commands = self.commands, []
            ids, self.batches = self.batches, []
            self.sending = True
            err: str | None = None
            try:
                await self._send(commands)
            except Exception as exc:
                err = repr(exc)
            finally:
                self.sending = False
            for req_id in ids:
                self.ack(req_id, err)

    async def _send(self, commands: list[tuple[str, bytes]]) -> None:
        producer, topic = self.producer, self.topic
        open_batches: dict[int, Any] = {}
        futs = []
        for key, value in commands:
            part = shard_of(key, self.partitions)
            batch = open_batches.get(part)
            if batch is None:
                batch = open_batches[part] = producer.create_batch()
            if batch.append(key=key.encode(), value=value, timestamp=None) is None:
                futs.append(await producer.send_batch(batch, topic, partition=part))
                batch = open_batches[part] = producer.create_batch()
                batch.append(key=key.encode(), value=value, timestamp=None)
        for part, batch in open_batches.items():
            futs.append(await producer.send_batch(batch, topic, partition=part))
        await asyncio.gather(*futs)


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


def cluster_size(store: CassandraStore, producer: Any) -> dict[str, int | None]:
    """The Cassandra nodes and Kafka brokers this bridge's clients know of (None: unknown)."""
    out: dict[str, int | None] = {"cassandra_nodes": None, "kafka_brokers": None}
    with contextlib.suppress(Exception):
        out["cassandra_nodes"] = len(store.cluster.metadata.all_hosts())
    with contextlib.suppress(Exception):
        out["kafka_brokers"] = len(producer.client.cluster.brokers())
    return out


def _failure(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def serve(fd: int, settings: Settings, prefix: str, with_worker: bool) -> int:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 26)
    try:
        store = await asyncio.to_thread(CassandraStore.open, settings)
    except Exception as exc:
        writer.write(orjson.dumps({"t": "error", "err": f"Cassandra: {_failure(exc)}"}) + b"\n")
        await writer.drain()
        return 2
    bridge = Bridge(settings, prefix.encode(), writer, store)
    probe = Collector(settings, (settings.fired_topic,), keep_messages=False, from_end=True,
                      key_prefix=bridge.prefix, on_fired=bridge.on_fired)
    producer = plain_producer(settings, linger_ms=2)
    worker: Worker | None = None
    tasks: list[asyncio.Task[Any]] = []
    try:
        try:
            await bridge.measure_skew()
            await probe.start()
            await producer.start()
            if with_worker:
                group_id = f"{settings.namespace}-locust-{prefix.rstrip('.')}"
                await start_group_at_end(settings, group_id, settings.fired_topic,
                                         probe.partitions(settings.fired_topic))
                worker = Worker(settings, handlers={settings.fired_topic: bridge.handle},
                                group_id=group_id)
                await worker.start()
        except Exception as exc:
            bridge.emit({"t": "error", "err": f"{_failure(exc)} (is namespace "
                                              f"{settings.namespace} initialised and served?)"})
            await writer.drain()
            return 2
        tasks += [asyncio.create_task(bridge.flush()), asyncio.create_task(bridge.watch_skew())]
        bridge.emit({"t": "ready", "partitions": probe.partitions(settings.fired_topic),
                     "worker": worker is not None, **cluster_size(store, producer)})
        await writer.drain()

        submitter = Submitter(producer, settings.submit_topic,
                              len(await producer.partitions_for(settings.submit_topic)),
                              lambda req_id, err: bridge.emit({"t": "ack", "id": req_id,
                                                              "err": err}))
        tasks.append(asyncio.create_task(submitter.run()))
        while True:
            line = await reader.readline()
            if not line:
                break  # locust is gone
            msg = orjson.loads(line)
            if msg["t"] == "stop":
                break
            if msg["t"] == "send":
                submitter.add(int(msg["id"]), msg["jobs"])
            for t in tasks:
                if t.done():
                    t.result()
            probe.check_alive()
            if worker is not None and worker.failure is not None:
                raise RuntimeError(f"the worker failed: {worker.failure!r}")
        await submitter.idle(30)
    finally:
        with contextlib.suppress(Exception):
            await producer.flush()
        await asyncio.sleep(FLUSH_EVERY_S * 2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if worker is not None:
            await worker.shutdown()
        await asyncio.gather(producer.stop(), probe.stop(), return_exceptions=True)
        store.close()
        bridge.emit_pending()
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--prefix", required=True, help="report fired messages whose key starts so")
    p.add_argument("--worker", action="store_true",
                   help="also run a Worker and report its handler's start times")
    add_settings_arguments(p, CONNECTION_SETTINGS)
    return p


def main() -> int:
    a = parser().parse_args()
    return asyncio.run(serve(a.fd, settings_from_args(a), a.prefix, a.worker))


if __name__ == "__main__":
    sys.exit(main())
