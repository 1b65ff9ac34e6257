"""init's schema step (`chronowheel.admin.apply_schema`): transient failures of a statement
are retried after the nodes agree, up to a deadline; anything else, or nodes that never agree,
fails init with an error naming the statement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from cassandra import InvalidRequest, OperationTimedOut
from chronowheel.admin import apply_schema
from chronowheel.errors import RetriableError

STATEMENTS = [
    "CREATE KEYSPACE IF NOT EXISTS ks WITH replication = {'class': 'SimpleStrategy'}",
    "CREATE TABLE IF NOT EXISTS ks.meta (name text PRIMARY KEY, value text)",
    "CREATE TABLE IF NOT EXISTS ks.jobs (job_id text PRIMARY KEY, spec blob)",
]


@dataclass
class Future:
    is_schema_agreed: bool = True


@dataclass
class Result:
    response_future: Future


@dataclass
class Session:
    failures: dict[str, list[BaseException]] = field(default_factory=dict)
    agreed: bool = True
    sent: list[str] = field(default_factory=list)

    def execute(self, stmt: str, timeout: float) -> Result:
        self.sent.append(stmt)
        pending = self.failures.get(stmt)
        if pending:
            raise pending.pop(0)
        return Result(Future(self.agreed))


@dataclass
class ControlConnection:
    waits: int = 0

    def wait_for_schema_agreement(self, wait_time: float) -> bool:
        self.waits += 1
        return True


@dataclass
class Cluster:
    control_connection: ControlConnection = field(default_factory=ControlConnection)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def run(session: Session, cluster: Cluster, clock: Clock,
              deadline_s: float = 300) -> None:
    fake_cluster: Any = cluster
    fake_session: Any = session
    await apply_schema(fake_cluster, fake_session, STATEMENTS, deadline_s=deadline_s,
                       clock=clock, sleep=clock.sleep)


async def test_a_statement_that_times_out_is_sent_again_after_the_nodes_agree() -> None:
    timed_out = OperationTimedOut({"127.0.0.2:9042": "Connection defunct by heartbeat"})
    session = Session(failures={STATEMENTS[1]: [timed_out, timed_out]})
    cluster, clock = Cluster(), Clock()
    await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0], STATEMENTS[1], STATEMENTS[1], STATEMENTS[1],
                            STATEMENTS[2]]
    assert cluster.control_connection.waits == 2
    assert clock.slept == [2.0, 4.0]


async def test_a_statement_still_failing_at_the_deadline_fails_init_naming_it() -> None:
    session = Session(failures={STATEMENTS[2]: [OperationTimedOut("busy")] * 100})
    clock = Clock()
    with pytest.raises(RetriableError) as caught:
        await run(session, Cluster(), clock, deadline_s=30)
    text = str(caught.value)
    assert "'CREATE TABLE IF NOT EXISTS ks.jobs'" in text
    assert "limit 30 s" in text and "attempts" in text
    assert clock.now >= 30
    assert session.sent.count(STATEMENTS[2]) == len(clock.slept) + 1


async def test_an_invalid_statement_is_not_retried() -> None:
    session = Session(failures={STATEMENTS[0]: [InvalidRequest("bad replication")]})
    clock = Clock()
    with pytest.raises(InvalidRequest):
        await run(session, Cluster(), clock)
    assert session.sent == [STATEMENTS[0]]
    assert clock.slept == []


async def test_a_keyspace_not_yet_on_the_coordinator_is_waited_for_like_a_timeout() -> None:
    # The keyspace statement timed out on one coordinator and its repeat was a no-op on
    # another that had it; the next statement reached a third that did not have it yet.
    missing = InvalidRequest("Error from server: code=2200 [Invalid query] "
                             "message=\"Keyspace 'ks' doesn't exist\"")
    session = Session(failures={STATEMENTS[0]: [OperationTimedOut("busy")],
                                STATEMENTS[1]: [missing, missing]})
    cluster, clock = Cluster(), Clock()
    await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0], STATEMENTS[0], STATEMENTS[1], STATEMENTS[1],
                            STATEMENTS[1], STATEMENTS[2]]
    assert cluster.control_connection.waits == 3
    assert clock.slept == [2.0, 2.0, 4.0]


async def test_nodes_that_never_agree_fail_init_naming_the_statement() -> None:
    session = Session(agreed=False)
    with pytest.raises(RetriableError) as caught:
        await run(session, Cluster(), Clock())
    assert "did not agree on the schema within 120 s" in str(caught.value)
    assert "after \"CREATE KEYSPACE IF NOT EXISTS ks WITH" in str(caught.value)
    assert session.sent == [STATEMENTS[0]]
