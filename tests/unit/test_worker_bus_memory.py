"""The worker's bus contract (tests/contract/worker_bus.py) in memory."""

from __future__ import annotations

import secrets

import pytest
from chronowheel.bus.memory import MemoryBus
from chronowheel.bus.memory_worker import MemoryWorkerBus
from chronowheel.core.clock import SystemClock
from chronowheel.settings import Settings

from tests.contract.worker_bus import Stored, WorkerBusContract


class MemoryEnv:
    def __init__(self) -> None:
        self.memory = MemoryBus(Settings(namespace="unit"), SystemClock())
        self.bus = MemoryWorkerBus(self.memory)

    async def new_topic(self, partitions: int) -> str:
        name = "t-" + secrets.token_hex(4)
        self.memory.create_topic(name, partitions)
        return name

    async def put(self, topic: str, partition: int, key: bytes | None, value: bytes,
                  headers: list[tuple[str, bytes]]) -> None:
        self.memory.produce(topic, partition, key, value, headers)

    async def read(self, topic: str) -> list[Stored]:
        return [(m.partition, m.key, m.value, list(m.headers))
                for m in self.memory.messages(topic)]

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        return {p: o for (g, t, p), o in self.memory.group_offsets.items()
                if g == group and t == topic}


class TestMemoryWorkerBusContract(WorkerBusContract):
    @pytest.fixture
    def env(self) -> MemoryEnv:
        return MemoryEnv()
