"""The JobStore contract (tests/contract/job_store.py) against Cassandra."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore

from tests.conftest import Stack
from tests.contract.job_store import JobStoreContract

pytestmark = pytest.mark.integration


class TestCassandraStoreContract(JobStoreContract):
    @pytest.fixture
    async def store(self, stack: Stack, namespace: str) -> AsyncIterator[CassandraStore]:
        settings = Settings(namespace=namespace, cassandra=stack.cassandra, kafka=stack.kafka,
                            shards=2)
        await init_namespace(settings)
        store = CassandraStore.open(settings)
        try:
            yield store
        finally:
            store.close()
