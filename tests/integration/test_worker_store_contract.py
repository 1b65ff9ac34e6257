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

pytestmark = pytest.mark.integration


class TestCassandraWorkerStoreContract(WorkerStoreContract):
    @pytest.fixture
    async def stores(self, stack: Stack, namespace: str) -> AsyncIterator[WorkerStores]:
        settings = Settings(namespace=namespace, cassandra=stack.cassandra, kafka=stack.kafka,
                            shards=2)
        await init_namespace(settings)
        opened = await asyncio.to_thread(CassandraWorkerStores, settings)
        try:
            yield opened.stores
        finally:
            await asyncio.to_thread(opened.close)

    @pytest.fixture
    def pass_time(self) -> PassTime:
        return asyncio.sleep
