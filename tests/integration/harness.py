"""Helpers for tests against the real servers: namespaces, nodes (in-process or subprocess),
producers and read_committed collectors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import open_admin, partition_counts, plain_producer
from chronowheel.bus.kafka import reader as kafka_reader
from chronowheel.core.clock import Clock
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.node.service import Node
from chronowheel.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def make_namespace(stack: Any, namespace: str, *, shards: int = 4,
                         **overrides: Any) -> Settings:
    overrides.setdefault("node_session_timeout_ms", 6000)
    settings = Settings(namespace=namespace, cassandra=stack.cassandra, kafka=stack.kafka,
                        shards=shards, http_port=0, **overrides)
    await init_namespace(settings)
    return settings


@dataclass
class Fired:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, str]

    @property
    def occurrence(self) -> str:
        return self.headers["cw-occurrence"]

    @property
    def scheduled_ms(self) -> int:
        return int(self.headers["cw-scheduled-at"])

    @property
    def fired_ms(self) -> int:
        return int(self.headers["cw-fired-at"])


@dataclass
class Collector:
    """Reads topics from the beginning (read_committed unless told), in the background."""

    settings: Settings
    topics: tuple[str, ...]
    isolation: str = "read_committed"
    messages: list[Fired] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _consumer: AIOKafkaConsumer | None = None

    async def start(self) -> Collector:
        c = kafka_reader(self.settings, isolation_level=self.isolation,
                   max_partition_fetch_bytes=4 << 20)
        await c.start()
        admin = await open_admin(self.settings)
        try:
            counts = await partition_counts(admin, self.topics)
        finally:
            await admin.close()
        tps = [TopicPartition(t, p) for t in self.topics for p in range(counts[t])]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        self._consumer = c
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            arrived = now_ms()
            for tp, msgs in batches.items():
                for m in msgs:
                    self.messages.append(Fired(
                        tp.topic, tp.partition, m.offset, m.key, m.value or b"",
                        {k: v.decode() for k, v in (m.headers or ())}))
                    self.on_message(m, arrived)

    def on_message(self, record: Any, arrived_ms: int) -> None:
        """Hook for subclasses that note more per message (called after it is appended)."""

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    def on(self, topic: str) -> list[Fired]:
        return [m for m in self.messages if m.topic == topic]

    async def wait_for(self, predicate: Callable[[list[Fired]], bool], timeout_s: float,
                       what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.messages):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; "
                                     f"have {len(self.messages)} messages")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def collecting(settings: Settings, *topics: str) -> AsyncIterator[Collector]:
    c = await Collector(settings, topics or (settings.fired_topic,)).start()
    try:
        yield c
    finally:
        await c.stop()


async def produce(settings: Settings, records: Iterable[tuple[bytes | None, bytes]], *,
                  partition: Callable[[bytes | None], int] | None = None) -> None:
    """Send raw (key, value) records to <ns>.submit; `partition` overrides the partitioner."""
    p = plain_producer(settings, linger_ms=5)
    await p.start()
    try:
        futs = []
        for key, value in records:
            part = None if partition is None else partition(key)
            futs.append(await p.send(settings.submit_topic, value, key=key, partition=part))
        await asyncio.gather(*futs)
    finally:
        await p.stop()


def upsert(job_id: str, **fields: Any) -> tuple[bytes, bytes]:
    return job_id.encode(), encode_upsert({"id": job_id, **fields})


def cancel(job_id: str) -> tuple[bytes, bytes]:
    return job_id.encode(), encode_cancel(job_id)


@contextlib.asynccontextmanager
async def running_node(settings: Settings, *, clock: Clock | None = None,
                       node_id: str = "test-node") -> AsyncIterator[Node]:
    node = Node(settings, clock=clock, node_id=node_id)
    await node.start()
    try:
        await wait_owned(node, settings.shards)
        yield node
    finally:
        await node.shutdown()


async def wait_owned(node: Node, shards: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not (len(node.owned) == shards and all(o.actor.ready for o in node.owned.values())):
        if node._failure is not None:
            raise AssertionError(f"node failed: {node._failure!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"node owns {sorted(node.owned)} after {timeout_s}s")
        await asyncio.sleep(0.05)


def misroute(shards: int) -> Callable[[bytes | None], int]:
    """A partitioner that always picks a partition other than the job's shard."""
    return lambda key: (shard_of((key or b"").decode(), shards) + 1) % shards


class NodeProcess:
    """`chronowheel node` as a child process, for kill -9 and SIGSTOP tests."""

    def __init__(self, settings: Settings, name: str, log_dir: Path) -> None:
        self.settings = settings
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, **env_overrides: str) -> None:
        env = dict(os.environ)
        env.update({
            "CHRONOWHEEL_NAMESPACE": self.settings.namespace,
            "CHRONOWHEEL_CASSANDRA": self.settings.cassandra,
            "CHRONOWHEEL_KAFKA": self.settings.kafka,
            "CHRONOWHEEL_HTTP_PORT": "0",
            "CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS": "6000",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(env_overrides)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([sys.executable, "-m", "chronowheel", "node"],
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=REPO)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait()

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        self._log.close()
        return rc

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict[str, Any] | None:
        port = self.http_port()
        if port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return dict(orjson.loads(r.read()))
        except urllib.error.HTTPError as e:
            return dict(orjson.loads(e.read()))
        except OSError:
            return None

    def http_port(self) -> int | None:
        marker = "serving /metrics and /healthz on http://127.0.0.1:"
        for line in self.log_text().splitlines():
            if marker in line:
                return int(line.split(marker, 1)[1].split()[0])
        return None

    async def wait_owning(self, predicate: Callable[[list[int]], bool], timeout_s: float = 90,
                          ) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while True:
            h = self.health()
            if h is not None and predicate(list(h.get("shards", []))):
                return list(h["shards"])
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: shards {h and h.get('shards')} after "
                                     f"{timeout_s}s\n{self.log_text()[-3000:]}")
            await asyncio.sleep(0.2)


def fired_json(messages: list[Fired]) -> list[Any]:
    return [orjson.loads(m.value) for m in messages]
