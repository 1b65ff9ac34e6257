"""The run history storage contract (tests/contract/run_history.py) against Cassandra."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore
from chronowheel.store.cassandra_history import CassandraRunHistory

from tests.conftest import Stack
from tests.contract.run_history import PassTime, RunHistoryContract
from tests.namespace_pool import keyspace_of

pytestmark = pytest.mark.integration


# One store in one namespace for the module: the contract's tests keep to job ids of their
# own (tests/contract/run_history.py).
@pytest.fixture(scope="module")
async def history(stack: Stack, shared_namespace: str) -> AsyncIterator[CassandraRunHistory]:
    settings = Settings(namespace=shared_namespace,
                        cassandra_keyspace=keyspace_of(shared_namespace),
                        cassandra=stack.cassandra,
                        kafka=stack.kafka, shards=2)
    await init_namespace(settings)
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        yield await asyncio.to_thread(CassandraRunHistory, store.session, settings.keyspace)
    finally:
        await asyncio.to_thread(store.close)


class TestCassandraRunHistoryContract(RunHistoryContract):
    @pytest.fixture
    def pass_time(self) -> PassTime:
        return asyncio.sleep
