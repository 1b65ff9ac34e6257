"""init's schema step (`chronowheel.admin.apply_schema`): the statements go to one
coordinator, one after another, and the nodes are waited for once at the end; transient
failures of a statement are retried after the nodes agree, up to a deadline; anything else, or
nodes that never agree, fails init with an error naming what."""

from __future__ import annotations

import logging
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
DRIVER_WAIT_S = 10


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@dataclass
class Host:
    endpoint: str
    is_up: bool = True

    def __str__(self) -> str:
        return self.endpoint


@dataclass
class Metadata:
    hosts: list[Host]

    def all_hosts(self) -> list[Host]:
        return list(self.hosts)


@dataclass
class ControlConnection:
    """Answers the agreement checks in turn (then True); a check that fails takes its whole
    wait on the clock, as the driver's does."""
    clock: Clock
    answers: list[bool] = field(default_factory=list)
    waits: int = 0
    cluster: Cluster | None = None
    driver_waits: list[float] = field(default_factory=list)

    def wait_for_schema_agreement(self, wait_time: float) -> bool:
        self.waits += 1
        if self.cluster is not None:
            self.driver_waits.append(self.cluster.max_schema_agreement_wait)
        agreed = self.answers.pop(0) if self.answers else True
        if not agreed:
            self.clock.now += wait_time
        return agreed


@dataclass
class Cluster:
    control_connection: ControlConnection
    metadata: Metadata = field(default_factory=lambda: Metadata(
        [Host("127.0.0.3:9042"), Host("127.0.0.2:9042"), Host("127.0.0.4:9042")]))
    max_schema_agreement_wait: float = DRIVER_WAIT_S


@dataclass
class Session:
    cluster: Cluster
    failures: dict[str, list[BaseException]] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)
    hosts: list[str | None] = field(default_factory=list)
    driver_waits: list[float] = field(default_factory=list)

    def execute(self, stmt: str, timeout: float, host: Host | None) -> None:
        self.sent.append(stmt)
        self.hosts.append(None if host is None else host.endpoint)
        self.driver_waits.append(self.cluster.max_schema_agreement_wait)
        pending = self.failures.get(stmt)
        if pending:
            raise pending.pop(0)


def rig(answers: list[bool] | None = None,
        failures: dict[str, list[BaseException]] | None = None
        ) -> tuple[Session, Cluster, Clock]:
    clock = Clock()
    cluster = Cluster(ControlConnection(clock, list(answers or [])))
    cluster.control_connection.cluster = cluster
    return Session(cluster, dict(failures or {})), cluster, clock


async def run(session: Session, cluster: Cluster, clock: Clock,
              deadline_s: float = 300) -> None:
    fake_cluster: Any = cluster
    fake_session: Any = session
    await apply_schema(fake_cluster, fake_session, STATEMENTS, deadline_s=deadline_s,
                       clock=clock, sleep=clock.sleep)


async def test_every_statement_goes_to_one_coordinator_and_the_nodes_are_awaited_once() -> None:
    session, cluster, clock = rig()
    await run(session, cluster, clock)
    assert session.sent == STATEMENTS
    assert session.hosts == ["127.0.0.2:9042"] * 3  # the first up node by address
    # the driver's wait after each statement is off while they run, and given back after
    assert session.driver_waits == [0, 0, 0]
    assert cluster.max_schema_agreement_wait == DRIVER_WAIT_S
    assert cluster.control_connection.waits == 1
    assert clock.slept == []


async def test_a_node_that_lags_is_waited_for_at_the_end_saying_how_long(
        caplog: pytest.LogCaptureFixture) -> None:
    session, cluster, clock = rig(answers=[False, False, False])
    with caplog.at_level(logging.INFO, logger="chronowheel.admin"):
        await run(session, cluster, clock)
    assert session.sent == STATEMENTS
    assert cluster.control_connection.waits == 4
    progress = [r.getMessage() for r in caplog.records if "waiting for every" in r.getMessage()]
    assert len(progress) == 3
    # the driver's own wait stays off meanwhile: it would hold these waits behind its lock
    assert cluster.control_connection.driver_waits == [0, 0, 0, 0]
    assert cluster.max_schema_agreement_wait == DRIVER_WAIT_S
    assert "applied on 127.0.0.2:9042" in progress[0]
    assert "(10 s of at most 120 s" in progress[0] and "(30 s of at most 120 s" in progress[2]


async def test_the_next_up_node_takes_over_when_the_coordinator_goes_down() -> None:
    session, cluster, clock = rig()

    def down_after_the_first(stmt: str) -> None:
        if stmt == STATEMENTS[0]:
            cluster.metadata.hosts[1].is_up = False  # 127.0.0.2
    execute = session.execute

    def execute_then_fail(stmt: str, timeout: float, host: Host | None) -> None:
        execute(stmt, timeout, host)
        down_after_the_first(stmt)
    session.execute = execute_then_fail  # type: ignore[method-assign]
    await run(session, cluster, clock)
    assert session.hosts == ["127.0.0.2:9042", "127.0.0.3:9042", "127.0.0.3:9042"]


async def test_a_statement_that_times_out_is_sent_again_after_the_nodes_agree() -> None:
    timed_out = OperationTimedOut({"127.0.0.2:9042": "Connection defunct by heartbeat"})
    session, cluster, clock = rig(failures={STATEMENTS[1]: [timed_out, timed_out]})
    await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0], STATEMENTS[1], STATEMENTS[1], STATEMENTS[1],
                            STATEMENTS[2]]
    assert cluster.control_connection.waits == 2 + 1  # before each repeat, and at the end
    assert clock.slept == [2.0, 4.0]


async def test_a_statement_still_failing_at_the_deadline_fails_init_naming_it() -> None:
    session, cluster, clock = rig(failures={STATEMENTS[2]: [OperationTimedOut("busy")] * 100})
    with pytest.raises(RetriableError) as caught:
        await run(session, cluster, clock, deadline_s=30)
    text = str(caught.value)
    assert "'CREATE TABLE IF NOT EXISTS ks.jobs'" in text
    assert "limit 30 s" in text and "attempts" in text
    assert clock.now >= 30
    assert session.sent.count(STATEMENTS[2]) == len(clock.slept) + 1


async def test_an_invalid_statement_is_not_retried() -> None:
    session, cluster, clock = rig(failures={STATEMENTS[0]: [InvalidRequest("bad replication")]})
    with pytest.raises(InvalidRequest):
        await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0]]
    assert clock.slept == []


async def test_a_keyspace_not_yet_on_the_coordinator_is_waited_for_like_a_timeout() -> None:
    # The keyspace statement timed out on one coordinator and its repeat was a no-op on
    # another that had it; the next statement reached a third that did not have it yet.
    missing = InvalidRequest("Error from server: code=2200 [Invalid query] "
                             "message=\"Keyspace 'ks' doesn't exist\"")
    session, cluster, clock = rig(failures={STATEMENTS[0]: [OperationTimedOut("busy")],
                                            STATEMENTS[1]: [missing, missing]})
    await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0], STATEMENTS[0], STATEMENTS[1], STATEMENTS[1],
                            STATEMENTS[1], STATEMENTS[2]]
    assert cluster.control_connection.waits == 3 + 1
    assert clock.slept == [2.0, 2.0, 4.0]


async def test_nodes_that_never_agree_fail_init_naming_the_coordinator() -> None:
    session, cluster, clock = rig(answers=[False] * 100)
    with pytest.raises(RetriableError) as caught:
        await run(session, cluster, clock)
    text = str(caught.value)
    assert "did not agree on the schema within 120 s of its last statement" in text
    assert "on 127.0.0.2:9042" in text
    assert session.sent == STATEMENTS
    assert clock.now == 120


async def test_a_control_connection_that_cannot_answer_is_asked_again_until_the_limit() -> None:
    session, cluster, clock = rig()

    def broken(wait_time: float) -> bool:
        raise ConnectionError("control connection reconnecting")
    cluster.control_connection.wait_for_schema_agreement = broken  # type: ignore[method-assign]
    with pytest.raises(RetriableError, match="did not agree on the schema within 120 s"):
        await run(session, cluster, clock)
    assert clock.slept == [1.0] * 120
