"""A node's start opens Cassandra (its connection, the shard count, the statements) in a thread
beside the Kafka steps (the HTTP endpoint, the producer's start, the topics read ahead), so a
restart waits for the longer of the two instead of both; a refusal from either ends the start
and leaves nothing of the other open."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from chronowheel.bus.ports import BusError
from chronowheel.errors import ConfigError
from chronowheel.node.service import Node
from chronowheel.node.transactions import node_transactional_id
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore
from chronowheel.store.memory import MemoryStore
from chronowheel.store.memory_history import MemoryRunHistory
from chronowheel.store.server_warnings import ServerWarnings

from tests.unit.node_rig import NodeRig

WAIT_S = 10.0
"""A bound on waits for the thread standing in for Cassandra (never reached when all is well)."""


class OpenedStore:
    """What `CassandraStore.open_counting_shards` returns, over the rig's in-memory store."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.server_warnings = ServerWarnings()
        self.closed = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
async def nodes() -> AsyncIterator[NodeRig]:
    async with NodeRig() as rig:
        yield rig


def cassandra_opening(monkeypatch: pytest.MonkeyPatch, result: Callable[[], Any]
                      ) -> tuple[threading.Event, threading.Event]:
    """Stand in for Cassandra's open: it signals `entered`, waits for `release`, then returns
    `result()` (or raises what it raises). Returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()

    def open_counting_shards(settings: Settings) -> Any:
        entered.set()
        assert release.wait(WAIT_S), "the test never released Cassandra's open"
        return result()

    monkeypatch.setattr(CassandraStore, "open_counting_shards", open_counting_shards)
    return entered, release


def node_without_store(rig: NodeRig, node_id: str = "n1") -> Node:
    # No store and no shard count: the node opens "Cassandra" and reads the count there.
    return Node(rig.settings, clock=rig.clock, bus=rig.bus, node_id=node_id,
                history=MemoryRunHistory(clock=rig.clock))


async def test_cassandra_opens_while_the_producer_starts(
        nodes: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    opened = OpenedStore(nodes.store)
    entered, release = cassandra_opening(monkeypatch, lambda: (opened, nodes.settings.shards))
    node = node_without_store(nodes)
    producer_held = nodes.bus.hold_starts(node_transactional_id(nodes.settings.namespace, "n1"))
    starting = asyncio.create_task(node.start())
    # Cassandra's open began while the producer's start is still held: the two overlap.
    assert await asyncio.to_thread(entered.wait, WAIT_S)
    assert nodes.bus.starts == [] and not starting.done()
    producer_held.set()
    await nodes.settle()
    # The Kafka steps are done; the start waits for Cassandra, and no shard is taken before.
    assert nodes.bus.starts != [] and not starting.done() and node.owned == {}
    release.set()
    await starting
    await nodes.settle()
    assert node.shards == nodes.settings.shards
    assert sorted(node.owned) == list(range(nodes.settings.shards))
    await node.shutdown()
    assert opened.closed.is_set()


async def test_a_namespace_cassandra_refuses_ends_the_start_without_waiting_for_kafka(
        nodes: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> Any:
        raise ConfigError("namespace 'unit' is not initialised")

    entered, release = cassandra_opening(monkeypatch, refuse)
    release.set()
    node = node_without_store(nodes)
    # The producer's start never ends: the start must not wait for it.
    nodes.bus.hold_starts(node_transactional_id(nodes.settings.namespace, "n1"))
    with pytest.raises(ConfigError, match="not initialised"):
        await asyncio.wait_for(node.start(), WAIT_S)
    assert entered.is_set() and node.owned == {} and nodes.bus.members == {}


async def test_a_kafka_failure_closes_what_cassandra_opened(
        nodes: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    opened = OpenedStore(nodes.store)
    entered, release = cassandra_opening(monkeypatch, lambda: (opened, nodes.settings.shards))
    node = node_without_store(nodes)

    async def refused(_steps: object) -> None:
        await asyncio.to_thread(entered.wait, WAIT_S)
        release.set()  # Cassandra's open ends after the failure below has begun to unwind
        raise BusError("the producer's start was refused")

    monkeypatch.setattr(node, "_start_kafka_side", refused)
    with pytest.raises(BusError, match="refused"):
        await node.start()
    # The open finished in its thread and what it opened was closed, not left behind.
    assert opened.closed.is_set()
    assert node.owned == {} and nodes.bus.members == {}
