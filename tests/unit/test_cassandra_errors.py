"""Which Cassandra driver errors a node retries: a replica dying or starting must not stop it."""

from __future__ import annotations

import asyncio

import pytest
from cassandra import ConsistencyLevel, InvalidRequest, ReadFailure, WriteFailure
from cassandra.connection import ConnectionShutdown
from chronowheel.errors import RetriableError
from chronowheel.retry import is_retriable
from chronowheel.store.cassandra import CassandraError, _settle_error


def settled(exc: BaseException) -> BaseException:
    async def run() -> BaseException:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _settle_error(fut, exc)
        err = fut.exception()
        assert err is not None
        return err

    return asyncio.run(run())


@pytest.mark.parametrize("exc", [
    # What a LOCAL_QUORUM read saw when one of three replicas was killed under load and another
    # was too slow to answer: the coordinator reports failures instead of a timeout.
    ReadFailure("Operation failed - received 0 responses and 2 failures",
                consistency=ConsistencyLevel.LOCAL_QUORUM, required_responses=2,
                received_responses=0, failures=2),
    WriteFailure("Operation failed - received 1 responses and 1 failures",
                 consistency=ConsistencyLevel.LOCAL_QUORUM, required_responses=2,
                 received_responses=1, failures=1),
    ConnectionShutdown("Connection to 127.0.0.4:9042 was closed"),
])
def test_replica_failures_and_closed_connections_are_retried(exc: BaseException) -> None:
    err = settled(exc)
    assert isinstance(err, CassandraError) and isinstance(err, RetriableError)
    assert is_retriable(err)
    assert type(exc).__name__ in str(err)


def test_a_bad_statement_is_not_retried() -> None:
    err = settled(InvalidRequest("unconfigured table jobs"))
    assert isinstance(err, InvalidRequest)
    assert not is_retriable(err)
