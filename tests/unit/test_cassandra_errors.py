"""Which Cassandra driver errors a node retries, and for how long: a replica dying or a
cluster pausing must not stop it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    ReadFailure,
    WriteFailure,
    WriteTimeout,
    WriteType,
)
from cassandra.connection import ConnectionShutdown
from chronowheel import retry
from chronowheel.errors import RetriableError
from chronowheel.retry import is_retriable
from chronowheel.store.cassandra import CassandraError, _settle_error, execute


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


class FlakyResponse:
    """Stands in for the driver's ResponseFuture: fails with `error` until `failures` run out."""

    def __init__(self, session: FlakySession) -> None:
        self.session = session
        self.cleared = False
        self._timer: object | None = object()  # the driver's timeout timer
        # What the driver stores with an answer before it calls back.
        self._warnings = None
        self._col_names = ["row"]
        self._col_types = None
        self._paging_state = None
        self.has_more_pages = False

    def add_callbacks(self, ok: Any, err: Any) -> None:
        if self.session.failures > 0:
            self.session.failures -= 1
            err(WriteTimeout("Operation timed out - received only 1 responses.",
                             consistency=ConsistencyLevel.LOCAL_QUORUM, required_responses=2,
                             received_responses=1, write_type=WriteType.BATCH))
        else:
            ok(["row"])

    def result(self) -> list[str]:
        return ["row"]

    def clear_callbacks(self) -> None:
        self.cleared = True


class FlakySession:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.responses: list[FlakyResponse] = []

    def execute_async(self, *_args: Any, **_kw: Any) -> FlakyResponse:
        self.calls += 1
        self.responses.append(FlakyResponse(self))
        return self.responses[-1]


def test_a_statement_rides_out_tens_of_seconds_of_timeouts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty timeouts in a row (a replica killed under load, a coordinator pausing) are
    retried instead of failing the shard, which stopped the node; the backoff is the retry
    module's (recorded here instead of slept)."""
    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(retry.asyncio, "sleep", no_sleep)
    session = FlakySession(failures=20)
    rows = asyncio.run(execute(session, None, (), "write due rows"))  # type: ignore[arg-type]
    assert rows == ["row"] and session.calls == 21
    # Every answered request lets go of our callbacks and of its timer (no reference cycle).
    assert all(r.cleared and r._timer is None for r in session.responses)
    assert 15 < sum(slept) < 50 and max(slept) <= 2.0

    # It still gives up in the end, and the failure names the statement's purpose.
    session, slept[:] = FlakySession(failures=1_000), []
    with pytest.raises(CassandraError, match="WriteTimeout"):
        asyncio.run(execute(session, None, (), "write due rows"))  # type: ignore[arg-type]
    assert session.calls == retry.STORE_POLICY.attempts
    assert 20 < sum(slept) < 60
