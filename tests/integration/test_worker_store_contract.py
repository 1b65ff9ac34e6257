"""The worker's storage contract (tests/contract/worker_store.py) against Cassandra."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.store.base import WorkerStores
from chronowheel.store.cassandra_marks import CassandraWorkerStores

from tests.conftest import Stack
from tests.contract.worker_store import PassTime, WorkerStoreContract
from tests.namespace_pool import keyspace_of

pytestmark = pytest.mark.integration


# One set of stores in one namespace for the module: the contract's tests keep to scopes of
# their own (tests/contract/worker_store.py).
@pytest.fixture(scope="module")
async def stores(stack: Stack, shared_namespace: str) -> AsyncIterator[WorkerStores]:
    settings = Settings(namespace=shared_namespace,
                        cassandra_keyspace=keyspace_of(shared_namespace),
                        cassandra=stack.cassandra,
                        kafka=stack.kafka, shards=2)
    await init_namespace(settings)
    opened = await asyncio.to_thread(CassandraWorkerStores, settings)
    try:
        yield opened.stores
    finally:
        await asyncio.to_thread(opened.close)


class TestCassandraWorkerStoreContract(WorkerStoreContract):
    @pytest.fixture
    def pass_time(self) -> PassTime:
        return asyncio.sleep
