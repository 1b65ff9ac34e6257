"""Helpers for tests against the real servers: namespaces, nodes (in-process or subprocess),
producers and read_committed collectors (the last two from chronowheel.testing)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
from chronowheel import testing
from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import plain_producer
from chronowheel.core.clock import Clock
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.testing import Collector, Fired, collecting, wait_owned

__all__ = ["Collector", "Fired", "collecting", "wait_owned"]  # re-exported for the tests

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


def misroute(shards: int) -> Callable[[bytes | None], int]:
    """A partitioner that always picks a partition other than the job's shard."""
    return lambda key: (shard_of((key or b"").decode(), shards) + 1) % shards


class NodeProcess(testing.NodeProcess):
    """`chronowheel node` as a child process, for kill -9 and SIGSTOP tests: logs to
    `<log_dir>/<name>.log`, and a dead node's shards move after 6 s."""

    def __init__(self, settings: Settings, name: str, log_dir: Path) -> None:
        super().__init__(settings, log_dir / f"{name}.log", name=name, cwd=REPO,
                         env={"CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS": "6000"})


def fired_json(messages: list[Fired]) -> list[Any]:
    return [orjson.loads(m.value) for m in messages]
