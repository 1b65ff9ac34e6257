"""init's schema step (`chronowheel.admin.apply_schema`): the statements go to one
coordinator, one after another, and the nodes are waited for once at the end, each asked for
its own schema version; transient failures of a statement are retried after the nodes agree,
up to a deadline, on another node when the coordinator could not be reached; anything else, or
nodes that never agree, fails init with an error naming what."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from cassandra import InvalidRequest, OperationTimedOut
from cassandra.cluster import NoHostAvailable
from cassandra.policies import HostDistance
from chronowheel.admin import apply_schema
from chronowheel.errors import RetriableError

STATEMENTS = [
    "CREATE KEYSPACE IF NOT EXISTS ks WITH replication = {'class': 'SimpleStrategy'}",
    "CREATE TABLE IF NOT EXISTS ks.meta (name text PRIMARY KEY, value text)",
    "CREATE TABLE IF NOT EXISTS ks.jobs (job_id text PRIMARY KEY, spec blob)",
]
VERSION = "SELECT schema_version FROM system.local"
DRIVER_WAIT_S = 10
NEW = "v-new"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@dataclass(eq=False)
class Host:
    endpoint: str
    is_up: bool = True
    remote: bool = False  # in another data centre: the session has no connection to it

    def __str__(self) -> str:
        return self.endpoint


@dataclass
class Metadata:
    hosts: list[Host]

    def all_hosts(self) -> list[Host]:
        return list(self.hosts)


class ProfileManager:
    def distance(self, host: Host) -> int:
        return HostDistance.IGNORED if host.remote else HostDistance.LOCAL


@dataclass
class ControlConnection:
    """The driver's check through its control connection: answers in turn, then True."""
    answers: list[bool] = field(default_factory=list)
    waits: int = 0
    cluster: Cluster | None = None
    driver_waits: list[float] = field(default_factory=list)

    def wait_for_schema_agreement(self, wait_time: float) -> bool:
        self.waits += 1
        if self.cluster is not None:
            self.driver_waits.append(self.cluster.max_schema_agreement_wait)
        return self.answers.pop(0) if self.answers else True


@dataclass
class Cluster:
    control_connection: ControlConnection
    metadata: Metadata = field(default_factory=lambda: Metadata(
        [Host("127.0.0.3:9042"), Host("127.0.0.2:9042"), Host("127.0.0.4:9042")]))
    profile_manager: ProfileManager = field(default_factory=ProfileManager)
    max_schema_agreement_wait: float = DRIVER_WAIT_S

    def host(self, endpoint: str) -> Host:
        return next(h for h in self.metadata.hosts if h.endpoint == endpoint)


class Row(tuple[str]):
    def one(self) -> tuple[str]:
        return self


@dataclass
class Session:
    """Schema statements are recorded with the node they went to; a node's version is NEW
    unless `behind` holds answers for it (taken in turn, the last one kept)."""
    cluster: Cluster
    failures: dict[str, list[BaseException]] = field(default_factory=dict)
    behind: dict[str, list[str]] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)
    hosts: list[str | None] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    driver_waits: list[float] = field(default_factory=list)

    unreachable: set[str] = field(default_factory=set)  # nodes the session has no pool for

    def execute(self, stmt: str, timeout: float, host: Host | None) -> Row | None:
        if stmt == VERSION:
            assert host is not None and not host.remote, "asked a node it has no connection to"
            self.asked.append(host.endpoint)
            if host.endpoint in self.unreachable:
                raise NoHostAvailable("no connection", {host.endpoint: "no pool"})
            answers = self.behind.get(host.endpoint)
            if answers:
                return Row((answers.pop(0) if len(answers) > 1 else answers[0],))
            return Row((NEW,))
        self.sent.append(stmt)
        self.hosts.append(None if host is None else host.endpoint)
        self.driver_waits.append(self.cluster.max_schema_agreement_wait)
        pending = self.failures.get(stmt)
        if pending:
            raise pending.pop(0)
        return None


def rig(answers: list[bool] | None = None,
        failures: dict[str, list[BaseException]] | None = None,
        behind: dict[str, list[str]] | None = None) -> tuple[Session, Cluster, Clock]:
    clock = Clock()
    cluster = Cluster(ControlConnection(list(answers or [])))
    cluster.control_connection.cluster = cluster
    return Session(cluster, dict(failures or {}), dict(behind or {})), cluster, clock


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
    # once at the end: the coordinator's version, then each other node's own
    assert session.asked == ["127.0.0.2:9042", "127.0.0.3:9042", "127.0.0.4:9042"]
    assert cluster.control_connection.waits == 1
    assert clock.slept == []


async def test_a_node_that_lags_is_waited_for_at_the_end_naming_it(
        caplog: pytest.LogCaptureFixture) -> None:
    # 127.0.0.4 answers the old version for 25 s of polls (every 0.5 s), then the new one.
    session, cluster, clock = rig(behind={"127.0.0.4:9042": ["v-old"] * 50 + [NEW]})
    with caplog.at_level(logging.INFO, logger="chronowheel.admin"):
        await run(session, cluster, clock)
    assert session.sent == STATEMENTS
    assert clock.now == 25.0 and set(clock.slept) == {0.5}
    progress = [r.getMessage() for r in caplog.records if "to have it" in r.getMessage()]
    assert len(progress) == 2  # at 10 s and 20 s
    assert "applied on 127.0.0.2:9042; waiting for 127.0.0.4:9042 to have it" in progress[0]
    assert "(10 s of at most 120 s" in progress[0] and "(20 s of at most 120 s" in progress[1]
    # the driver's own wait stays off meanwhile: it would hold this one behind its lock
    assert cluster.control_connection.driver_waits == [0]
    assert cluster.max_schema_agreement_wait == DRIVER_WAIT_S


async def test_a_node_is_asked_its_own_version_not_trusted_from_the_control_connection() -> None:
    # The control connection sees one version everywhere (its node too has not heard of the
    # last change); the node asked directly says it is behind.
    session, cluster, clock = rig(behind={"127.0.0.3:9042": ["v-old"] * 4 + [NEW]})
    await run(session, cluster, clock)
    assert clock.now == 2.0
    assert cluster.control_connection.waits == 1  # only once the nodes here agreed


async def test_nodes_of_other_data_centres_are_left_to_the_drivers_check() -> None:
    session, cluster, clock = rig(answers=[False, False, True])
    cluster.metadata.hosts.append(Host("10.1.0.1:9042", remote=True))
    cluster.metadata.hosts.append(Host("10.1.0.0:9042", remote=True))  # lowest address
    await run(session, cluster, clock)
    assert set(session.hosts) == {"127.0.0.2:9042"}  # never a node without a connection
    assert "10.1.0.1:9042" not in session.asked
    assert cluster.control_connection.waits == 3 and clock.now == 1.0


async def test_a_node_the_session_cannot_ask_is_left_to_the_drivers_check() -> None:
    # 127.0.0.4 was paused while the session connected: no pool, so no direct answer.
    session, cluster, clock = rig(answers=[False, False, False, True])
    session.unreachable.add("127.0.0.4:9042")
    with pytest.raises(RetriableError) as caught:  # the driver disagrees throughout
        session_never, cluster_never, clock_never = rig(answers=[False] * 1000)
        session_never.unreachable.add("127.0.0.4:9042")
        await run(session_never, cluster_never, clock_never)
    assert "still without it: 127.0.0.4:9042 (asked through the driver)" in str(caught.value)
    await run(session, cluster, clock)
    assert cluster.control_connection.waits == 4 and clock.now == 1.5


async def test_an_unreachable_coordinator_hands_the_statement_to_the_next_node() -> None:
    unreachable = NoHostAvailable("Unable to complete the operation against any hosts",
                                  {"127.0.0.2:9042": ConnectionError("refused")})
    session, cluster, clock = rig(failures={STATEMENTS[1]: [unreachable]})
    await run(session, cluster, clock)
    assert session.hosts == ["127.0.0.2:9042", "127.0.0.2:9042", "127.0.0.3:9042",
                             "127.0.0.3:9042"]
    assert session.asked[0] == "127.0.0.3:9042"  # the version awaited is the new coordinator's


async def test_a_coordinator_that_goes_down_hands_over_to_the_next_up_node() -> None:
    session, cluster, clock = rig()
    execute = session.execute

    def then_down(stmt: str, timeout: float, host: Host | None) -> Row | None:
        result = execute(stmt, timeout, host)
        if stmt == STATEMENTS[0]:
            cluster.host("127.0.0.2:9042").is_up = False
        return result
    session.execute = then_down  # type: ignore[method-assign]
    await run(session, cluster, clock)
    assert session.hosts == ["127.0.0.2:9042", "127.0.0.3:9042", "127.0.0.3:9042"]
    assert "127.0.0.2:9042" not in session.asked  # a node that is down is not waited for


async def test_a_statement_that_times_out_is_sent_again_after_the_nodes_agree() -> None:
    timed_out = OperationTimedOut({"127.0.0.2:9042": "Connection defunct by heartbeat"})
    session, cluster, clock = rig(failures={STATEMENTS[1]: [timed_out, timed_out]})
    await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0], STATEMENTS[1], STATEMENTS[1], STATEMENTS[1],
                            STATEMENTS[2]]
    assert session.hosts == ["127.0.0.2:9042"] * 5  # a timeout is no reason to move
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
    assert cluster.max_schema_agreement_wait == DRIVER_WAIT_S  # given back on the way out


async def test_an_invalid_statement_is_not_retried() -> None:
    session, cluster, clock = rig(failures={STATEMENTS[0]: [InvalidRequest("bad replication")]})
    with pytest.raises(InvalidRequest):
        await run(session, cluster, clock)
    assert session.sent == [STATEMENTS[0]]
    assert clock.slept == []
    assert cluster.max_schema_agreement_wait == DRIVER_WAIT_S


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


async def test_nodes_that_never_agree_fail_init_naming_the_coordinator_and_them() -> None:
    session, cluster, clock = rig(behind={"127.0.0.4:9042": ["v-old"]})
    with pytest.raises(RetriableError) as caught:
        await run(session, cluster, clock)
    text = str(caught.value)
    assert "did not agree on the schema within 120 s of its last statement" in text
    assert "on 127.0.0.2:9042 (still without it: 127.0.0.4:9042)" in text
    assert session.sent == STATEMENTS
    assert clock.now == 120
    assert cluster.max_schema_agreement_wait == DRIVER_WAIT_S


async def test_a_control_connection_that_cannot_answer_is_asked_again_until_the_limit() -> None:
    session, cluster, clock = rig()

    def broken(wait_time: float) -> bool:
        raise OperationTimedOut("control connection reconnecting")
    cluster.control_connection.wait_for_schema_agreement = broken  # type: ignore[method-assign]
    with pytest.raises(RetriableError, match="the driver's control connection"):
        await run(session, cluster, clock)
    assert clock.now == 120
