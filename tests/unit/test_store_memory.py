"""The JobStore contract against the in-memory store, plus what only it does (TTL by a clock)."""

from __future__ import annotations

import pytest
from chronowheel.core.clock import ManualClock
from chronowheel.store.base import JobRow
from chronowheel.store.memory import MemoryStore

from tests.contract.job_store import T0, Ids, JobStoreContract, due, read_all


class TestMemoryStoreContract(JobStoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()


async def test_rows_expire_by_their_ttl_on_the_stores_clock() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    ids = Ids(1, "ttl")
    await store.put_due(due(ids, "a", T0 + 10), 2)
    await store.put_job(JobRow(ids.job("a"), 1, b"{}", 1, "finished", None, None, ttl_s=3))
    await store.put_job(JobRow(ids.job("b"), 1, b"{}", 1, "scheduled", T0, T0, ttl_s=0))
    clock.advance(1_999)
    assert len([r for p in await read_all(store, T0, 1) for r in p]) == 1
    clock.advance(1)
    assert await read_all(store, T0, 1) == []
    assert await store.get_job(ids.job("a")) is not None
    clock.advance(1_000)
    assert await store.get_job(ids.job("a")) is None
    assert await store.get_job(ids.job("b")) is not None  # ttl 0: never expires
