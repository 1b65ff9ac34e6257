"""Helpers for tests against the real servers: namespaces, nodes (in-process or subprocess),
workers, the command line, producers and read_committed collectors (the last two from
chronowheel.testing)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from chronowheel import cli, testing
from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import open_admin, plain_producer, reader
from chronowheel.core.clock import Clock
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore
from chronowheel.testing import Collector, Fired, collecting, committed_past, wait_owned
from chronowheel.worker import Worker

from tests.namespace_pool import keyspace_of

# re-exported for the tests
__all__ = ["Collector", "Fired", "collecting", "committed_past", "wait_owned"]

REPO = Path(__file__).resolve().parents[2]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def make_namespace(stack: Any, namespace: str, *, shards: int = 4,
                         **overrides: Any) -> Settings:
    overrides.setdefault("node_session_timeout_ms", 6000)
    overrides.setdefault("cassandra_keyspace", keyspace_of(namespace))
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


@contextlib.asynccontextmanager
async def running_worker(settings: Settings, handler: Any, **kw: Any) -> AsyncIterator[Worker]:
    """A worker of <ns>.fired calling `handler` (a 6 s group session unless `kw` says
    otherwise), shut down after the block, which then fails if the worker failed."""
    kw.setdefault("session_timeout_ms", 6000)
    worker = Worker(settings, handlers={settings.fired_topic: handler}, **kw)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.shutdown()
    assert worker.failure is None, f"worker failed: {worker.failure!r}"


async def run_cli(capsys: pytest.CaptureFixture[str], settings: Settings, *argv: str,
                  connection: bool = True) -> tuple[int, str, str]:
    """`chronowheel ARGV` on the namespace's servers (without --cassandra unless
    `connection`), in a thread: its exit status, stdout and stderr."""
    flags = ["--namespace", settings.namespace, "--kafka", settings.kafka]
    if connection:
        flags += ["--cassandra", settings.cassandra]
        if settings.cassandra_keyspace:
            flags += ["--cassandra-keyspace", settings.cassandra_keyspace]
    code = await asyncio.to_thread(cli.main, [*argv, *flags])
    out, err = capsys.readouterr()
    return code, out, err


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


# --- barriers: instead of sleeping until the nodes are probably done -------------------------


async def stored_jobs(settings: Settings) -> int:
    """How many rows the namespace's `jobs` table holds (a full scan: small tests only)."""
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        return await asyncio.to_thread(lambda: sum(1 for _ in store.session.execute(
            f"SELECT job_id FROM {settings.keyspace}.jobs")))
    finally:
        await asyncio.to_thread(store.close)


async def nodes_group_offsets(settings: Settings,
                              tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
    """The nodes group's committed offsets (OffsetAndMetadata) of those of `tps` it has."""
    admin = await open_admin(settings)
    try:
        found = await admin.list_consumer_group_offsets(f"{settings.namespace}-nodes",
                                                        partitions=tps)
    finally:
        await admin.close()
    return {tp: o for tp, o in found.items() if o.offset >= 0}


async def applied(settings: Settings, timeout_s: float = 30) -> None:
    """Return once the nodes have applied every command on <ns>.submit so far: no command
    is left past the node group's committed offset of any partition (what lies there may be
    transaction markers of commands a node forwarded). A node commits a command's offset in
    the transaction that carries what the command published (rejections, forwards, the state
    record), so those are visible to read_committed readers by then."""
    tps = [TopicPartition(settings.submit_topic, k) for k in range(settings.shards)]
    group = f"{settings.namespace}-nodes"
    commands = reader(settings, fetch_max_wait_ms=20)
    admin = await open_admin(settings)
    await commands.start()
    try:
        commands.assign(tps)
        deadline = time.monotonic() + timeout_s
        while True:
            ends = await commands.end_offsets(tps)
            done = await admin.list_consumer_group_offsets(group, partitions=tps)
            committed = {tp: done[tp].offset if tp in done and done[tp].offset >= 0 else 0
                         for tp in tps}
            past = {tp: (committed[tp], end) for tp, end in ends.items() if committed[tp] < end}
            for tp, (at, _end) in past.items():
                commands.seek(tp, at)
            left: dict[int, int] = {}
            while past:
                batches = await commands.getmany(*past, timeout_ms=100)
                for tp, records in batches.items():
                    n = sum(1 for r in records if r.offset < past[tp][1])
                    if n:
                        left[tp.partition] = left.get(tp.partition, 0) + n
                past = {tp: span for tp, span in past.items()
                        if await commands.position(tp) < span[1]}
            if not left:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"commands not applied after {timeout_s}s: partition -> "
                                     f"commands past the committed offset {left}")
            await asyncio.sleep(0.05)
    finally:
        await commands.stop()
        await admin.close()


async def settled(settings: Settings, *collectors: Collector, clock: Clock | None = None,
                  upto_ms: int | None = None, more_ms: int = 0, timeout_s: float = 30) -> None:
    """Everything the nodes publish for the commands sent so far and for instants up to
    `upto_ms` is in the collectors' messages: the commands applied, every shard's committed
    watermark past that instant, each collector read to the end of its topics. What a check
    of "nothing more arrives" waits for, exactly. `upto_ms` defaults to the moment the
    commands are applied (by `clock`, else this machine's) plus the ingest slack (the
    earliest slot a command applied then can take) plus `more_ms`."""
    await applied(settings, timeout_s)
    if upto_ms is None:
        upto_ms = ((clock.now_ms() if clock is not None else now_ms())
                   + settings.ingest_slack_ms + more_ms)
    await committed_past(settings, upto_ms, timeout_s)
    for c in collectors:
        await c.read_to_end(timeout_s)
