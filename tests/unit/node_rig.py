"""A whole node without servers: in-memory store and bus, driven by a manual clock.

Time moves only when a test moves it (`advance`, `advance_to`); `settle` lets every task of the
node run until none has anything left to do at the current instant, so no test sleeps waiting
for time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from chronowheel.bus.memory import MemoryBus, Message
from chronowheel.core.clock import ManualClock
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.core.wire import StateRecord
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.store.base import RetiredDue
from chronowheel.store.memory import MemoryStore

from tests.unit.rig_settle import settle

T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z


class NodeRig:
    def __init__(self, *, shards: int = 2, **settings: Any) -> None:
        self.clock = ManualClock(T0)
        # One skew check, at start: later ones would need real seconds to pass.
        settings.setdefault("skew_check_interval_ms", 3_600_000)
        self.settings = Settings(namespace="unit", shards=shards, http_port=0, **settings)
        self.store = MemoryStore(clock=self.clock, retention_ms=self.settings.retention_ms)
        self.bus = MemoryBus(self.settings, self.clock)
        self.bus.create_namespace(shards)
        for k in range(shards):  # what `chronowheel init` does: nothing before now is pending
            self.bus.produce(self.settings.state_topic, k, StateRecord.key(k),
                             StateRecord(shard=k, watermark=T0, node="init").encode())
        self.nodes: list[Node] = []

    def new_node(self, node_id: str = "unit-node") -> Node:
        node = Node(self.settings, clock=self.clock, store=self.store, bus=self.bus,
                    shards=self.settings.shards, node_id=node_id)
        self.nodes.append(node)
        return node

    async def start(self, node_id: str = "unit-node") -> Node:
        node = self.new_node(node_id)
        await node.start()
        await self.settle()
        assert sorted(node.owned) == list(range(self.settings.shards))
        assert all(o.actor.ready for o in node.owned.values()) and not node.blocked
        return node

    async def __aenter__(self) -> NodeRig:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_all()

    async def stop_all(self) -> None:
        for node in self.nodes:
            await node.shutdown()
        self.nodes.clear()

    # --- input ---------------------------------------------------------------------------
    def submit(self, key: str, value: bytes, *, partition: int | None = None) -> None:
        """Send a command to `<ns>.submit`, by default to the job's own shard."""
        shard = shard_of(key, self.settings.shards) if partition is None else partition
        self.bus.produce(self.settings.submit_topic, shard, key.encode(), value)

    def upsert(self, job_id: str, **fields: Any) -> None:
        self.submit(job_id, encode_upsert({"id": job_id, **fields}))

    def cancel(self, job_id: str) -> None:
        self.submit(job_id, encode_cancel(job_id))

    def hold_due_retires(self) -> asyncio.Event:
        """From now on every `retire_due` of the store waits until the returned event is set:
        a command's writes held while time moves on."""
        release = asyncio.Event()
        retire_due = self.store.retire_due

        async def held_retire_due(retired: RetiredDue) -> None:
            await release.wait()
            await retire_due(retired)

        self.store.retire_due = held_retire_due  # type: ignore[method-assign]
        return release

    # --- time ----------------------------------------------------------------------------
    async def settle(self) -> None:
        await settle(lambda: (self.store.calls, self.bus.commits, self.clock.now_ms()), "the node")

    async def advance_to(self, when_ms: int, step_ms: int = 100) -> None:
        """Move the clock to `when_ms` in steps, letting the node work after each."""
        while self.clock.now_ms() < when_ms:
            self.clock.set(min(when_ms, self.clock.now_ms() + step_ms))
            await self.settle()

    async def advance(self, delta_ms: int, step_ms: int = 100) -> None:
        await self.advance_to(self.clock.now_ms() + delta_ms, step_ms)

    # --- output --------------------------------------------------------------------------
    def fired(self, job_id: str | None = None) -> list[Message]:
        return [m for m in self.bus.messages(self.settings.fired_topic)
                if job_id is None or m.key == job_id.encode()]


def scheduled_at(msg: Message) -> int:
    raw = msg.header("cw-scheduled-at")
    assert raw is not None, f"fired message without cw-scheduled-at: {msg}"
    return int(raw)
