"""The worker's storage contract (tests/contract/worker_store.py) in memory, on a manual clock."""

from __future__ import annotations

import pytest
from chronowheel.core.clock import ManualClock
from chronowheel.store.base import WorkerStores
from chronowheel.store.memory_worker import memory_worker_stores

from tests.contract.worker_store import PassTime, WorkerStoreContract

T0 = 1_796_115_600_000


class TestMemoryWorkerStoreContract(WorkerStoreContract):
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(T0)

    @pytest.fixture
    def stores(self, clock: ManualClock) -> WorkerStores:
        return memory_worker_stores(clock)

    @pytest.fixture
    def pass_time(self, clock: ManualClock) -> PassTime:
        async def advance(seconds: float) -> None:
            clock.advance(int(seconds * 1000))
        return advance
