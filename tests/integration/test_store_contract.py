"""The JobStore contract (tests/contract/job_store.py) against Cassandra."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore

from tests.conftest import Stack
from tests.contract.job_store import JobStoreContract

pytestmark = pytest.mark.integration


# One store in one namespace for the module: the contract's tests keep to ids of their own
# (tests/contract/job_store.py).
@pytest.fixture(scope="module")
async def store(stack: Stack, shared_namespace: str) -> AsyncIterator[CassandraStore]:
    settings = Settings(namespace=shared_namespace, cassandra=stack.cassandra,
                        kafka=stack.kafka, shards=2)
    await init_namespace(settings)
    store = CassandraStore.open(settings)
    try:
        yield store
    finally:
        store.close()


class TestCassandraStoreContract(JobStoreContract):
    pass


@pytest.mark.usefixtures("quiet_namespace_pool")  # its thread's requests leave garbage too
async def test_finished_requests_leave_no_cyclic_garbage(stack: Stack, namespace: str) -> None:
    # Every object of a finished request must be freed by reference counting: cyclic garbage
    # made the node's full collections (event-loop pauses) frequent (node/gc_policy.py).
    settings = Settings(namespace=namespace, cassandra=stack.cassandra, kafka=stack.kafka,
                        shards=2)
    await init_namespace(settings)
    store = CassandraStore.open(settings)
    ids = [f"job-{i}" for i in range(120)]
    try:
        await store.get_jobs(ids)  # prepared statements and connections settle first
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(5):
                await store.get_jobs(ids)
                await asyncio.gather(*(store.get_job(i) for i in ids[:40]))
            gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        store.close()
    driver = {k: n for k, n in kinds.items()
              if k in ("ResponseFuture", "ExecuteMessage", "ResultSet", "Timer", "Future")}
    assert driver == {}, kinds.most_common(10)
