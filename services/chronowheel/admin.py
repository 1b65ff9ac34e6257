"""Namespace set-up (`chronowheel init`): Cassandra keyspace + tables, Kafka topics, shard count.

Idempotent; a second init with another shard count is refused before anything is changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiokafka import TopicPartition
from cassandra import InvalidRequest
from cassandra.cluster import Cluster, NoHostAvailable, Session
from cassandra.connection import ConnectionException
from cassandra.policies import HostDistance
from cassandra.pool import Host

from chronowheel.bus.kafka import (
    ensure_topics,
    namespace_topics,
    open_admin,
    partition_counts,
    plain_producer,
    reader,
)
from chronowheel.core.wire import StateRecord
from chronowheel.errors import ConfigError, RetriableError
from chronowheel.schema import cql_statements
from chronowheel.security import quiet_loggers
from chronowheel.settings import Settings, valid_keyspace
from chronowheel.store.cassandra import (
    TRANSIENT_ERRORS,
    check_keyspace_owner,
    check_recorded_owner,
    connect,
    recorded_meta,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InitReport:
    namespace: str
    shards: int
    created_topics: list[str]
    keyspace_created: bool


# How long init waits, once every statement is applied, for every Cassandra node to have them.
SCHEMA_AGREEMENT_WAIT_S = 120
# How often that wait says where it stands, and how often it asks the nodes.
SCHEMA_AGREEMENT_REPORT_S = 10.0
SCHEMA_AGREEMENT_POLL_S = 0.5
SCHEMA_VERSION_TIMEOUT_S = 2.0  # one node's answer to "which schema version is yours"
# How long init keeps retrying one schema statement that failed transiently. On a three-node
# ring that had just formed, on a loaded two-core machine, the first CREATE TABLE timed out
# ("Connection defunct by heartbeat"): the nodes were busy applying the previous change.
SCHEMA_STATEMENT_DEADLINE_S = 300.0
SCHEMA_STATEMENT_TIMEOUT_S = 60.0


def _keyspace_exists(session: Session, keyspace: str) -> bool:
    row = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (keyspace,)).one()
    return row is not None


def _statement_name(stmt: str) -> str:
    return " ".join(stmt.split("(")[0].split())


def _await_agreement(cluster: Cluster) -> None:
    # Before a statement is sent again: a first attempt that timed out may still be applied
    # by its coordinator, and a second coordinator must see that, not create the table anew
    # (two ids for one table). Best effort: the retried statement reports what still fails.
    try:
        cluster.control_connection.wait_for_schema_agreement(wait_time=SCHEMA_AGREEMENT_WAIT_S)
    except Exception as exc:  # the control connection may be reconnecting
        log.warning("init: waiting for schema agreement failed: %r", exc)


def _coordinator(cluster: Cluster, previous: Host | None,
                 unreachable: set[Host] | None = None) -> Host | None:
    """The node every schema statement goes to: the previous one while it is up and reachable,
    else the first other one (by address) that is up and in this client's data centre (the
    session has connections only to those); None (the driver's choice) when there is none."""
    unreachable = unreachable or set()
    if previous is not None and previous.is_up is not False and previous not in unreachable:
        return previous
    local = [h for h in cluster.metadata.all_hosts()
             if h.is_up is not False and h not in unreachable
             and cluster.profile_manager.distance(h) == HostDistance.LOCAL]
    return min(local, key=lambda h: str(h.endpoint)) if local else None


async def apply_schema(cluster: Cluster, session: Session, statements: Iterable[str], *,
                       deadline_s: float = SCHEMA_STATEMENT_DEADLINE_S,
                       agreement_wait_s: float = SCHEMA_AGREEMENT_WAIT_S,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Run the schema statements in order on one coordinator, then wait once for every node
    to have them.

    One coordinator has every change before it, so the statements need not wait for the other
    nodes in between (as cqlsh runs a file). Waiting after each one cost a whole schema pull
    whenever a node missed a change's push: Cassandra pulls a schema it lacks only after
    `cassandra.migration_delay_ms` (60 s by default), and on a loaded three-node ring one node
    missed six pushes in a row, so init took 406 s where it usually takes 27 s. Now a missed
    push costs one pull at the end. Every statement is idempotent (IF NOT EXISTS), so one that
    failed transiently (timeout, unavailable, a connection lost) is sent again, after the nodes
    agree, for up to `deadline_s`; then init fails with a retriable error naming the statement.
    """
    coordinator: Host | None = None
    unreachable: set[Host] = set()  # coordinators the session could not reach
    driver_wait = cluster.max_schema_agreement_wait
    cluster.max_schema_agreement_wait = 0  # the driver's own wait after each statement: off
    try:
        for stmt in statements:
            name = _statement_name(stmt)
            started = clock()
            attempt = 0
            while True:
                attempt += 1
                coordinator = _coordinator(cluster, coordinator, unreachable)
                try:
                    await asyncio.to_thread(session.execute, stmt,
                                            timeout=SCHEMA_STATEMENT_TIMEOUT_S,
                                            host=coordinator)
                    break
                except (*TRANSIENT_ERRORS, InvalidRequest) as exc:
                    # A keyspace or table an earlier statement created may not have reached
                    # this coordinator yet (the earlier one failed on a node that then went
                    # down, and its repeat went to this one): wait for the nodes to agree and
                    # send it again, as for a timeout. Any other invalid statement is a bug,
                    # not a moment.
                    if isinstance(exc, InvalidRequest) and "doesn't exist" not in str(exc):
                        raise
                    waited = clock() - started
                    if waited >= deadline_s:
                        raise RetriableError(
                            f"init: {name!r} still failed after {attempt} attempts in "
                            f"{waited:.0f} s (limit {deadline_s:.0f} s): {exc}; run "
                            "`chronowheel init` again once Cassandra answers (it is "
                            "idempotent)") from exc
                    if coordinator is not None and isinstance(
                            exc, (NoHostAvailable, ConnectionException)):
                        # Not reached at all: the next statement goes to another node. (One
                        # that went down after applying a CREATE TABLE that no other node got
                        # may come back with another id for that table than the one the next
                        # coordinator gives it; init says which statement moved.)
                        unreachable.add(coordinator)
                    log.warning("init: %r failed on %s (%s), attempt %d; sending it again",
                                name, coordinator, exc, attempt)
                    await asyncio.to_thread(_await_agreement, cluster)
                    await sleep(min(2.0 ** attempt, 10.0))
        # The driver's wait stays off through this one too: it also waits, under the same lock,
        # after each schema event the nodes send, and would hold this one's reports back.
        await _await_every_node(cluster, session, coordinator, agreement_wait_s, clock, sleep)
    finally:
        cluster.max_schema_agreement_wait = driver_wait


def _nodes_behind(cluster: Cluster, session: Session, coordinator: Host | None) -> list[str]:
    """The nodes that do not have the coordinator's schema yet: each up node of this data
    centre is asked for its own version (a node asked about the others reports what gossip
    told it, which may be old), and the driver's check, through its control connection, covers
    the nodes of other data centres and those that did not answer (a session may have no
    connection to a node that was paused while it connected). Empty when they all have it."""
    version = "SELECT schema_version FROM system.local"
    try:
        want = session.execute(version, timeout=SCHEMA_VERSION_TIMEOUT_S,
                               host=coordinator).one()[0]
    except TRANSIENT_ERRORS as exc:
        return [f"{coordinator or 'the coordinator'} (no answer: {exc})"]
    behind, unanswered = [], []
    for host in cluster.metadata.all_hosts():
        if (host == coordinator or host.is_up is False
                or cluster.profile_manager.distance(host) != HostDistance.LOCAL):
            continue
        try:
            have = session.execute(version, timeout=SCHEMA_VERSION_TIMEOUT_S,
                                   host=host).one()[0]
        except TRANSIENT_ERRORS:
            unanswered.append(f"{host} (asked through the driver)")
            continue
        if have != want:
            behind.append(str(host))
    if not behind:
        try:
            # Its warning at each disagreement, every half second, would bury the report.
            with quiet_loggers("cassandra.cluster"):
                agreed = cluster.control_connection.wait_for_schema_agreement(
                    wait_time=SCHEMA_AGREEMENT_POLL_S)
            if not agreed:
                behind = unanswered or ["a node of another data centre"]
        except TRANSIENT_ERRORS as exc:
            behind.append(f"the driver's control connection ({exc})")
    return behind


async def _await_every_node(cluster: Cluster, session: Session, coordinator: Host | None,
                            limit_s: float, clock: Callable[[], float],
                            sleep: Callable[[float], Awaitable[None]]) -> None:
    """Until every up node has the coordinator's schema version, saying every
    SCHEMA_AGREEMENT_REPORT_S which nodes it waits for; a retriable error past `limit_s`."""
    where = str(coordinator) if coordinator is not None else "the driver's choice of node"
    started = reported = clock()
    while True:
        behind = await asyncio.to_thread(_nodes_behind, cluster, session, coordinator)
        if not behind:
            return
        waited = clock() - started
        if waited >= limit_s:
            raise RetriableError(
                f"init: the Cassandra nodes did not agree on the schema within "
                f"{limit_s:.0f} s of its last statement on {where} (still without it: "
                f"{', '.join(behind)}); run `chronowheel init` again once every node is up (it "
                "is idempotent)")
        if clock() - reported >= SCHEMA_AGREEMENT_REPORT_S:
            reported = clock()
            log.info("init: the schema is applied on %s; waiting for %s to have it (%.0f s of "
                     "at most %.0f s; a node that missed a change pulls it after "
                     "cassandra.migration_delay_ms, 60 s by default)", where, ", ".join(behind),
                     waited, limit_s)
        await sleep(SCHEMA_AGREEMENT_POLL_S)


async def init_namespace(settings: Settings) -> InitReport:
    shards, ks = settings.shards, settings.keyspace
    cassandra_replication = settings.cassandra_replication()  # checks the text
    replication = settings.topic_replication
    if not 1 <= shards <= 4096:
        raise ConfigError(f"shards: must be 1..4096, got {shards}")
    if not valid_keyspace(ks):  # a cassandra_keyspace that is set was checked by Settings
        raise ConfigError(f"namespace: {settings.namespace!r} does not make a valid keyspace "
                          "(letters, digits, '-', '_', '.', starting with a letter, <= 48); "
                          "or name one with cassandra_keyspace")
    cluster, session = connect(settings)
    admin = await open_admin(settings)
    try:
        # 1. refuse a keyspace of another namespace, or a changed shard count, before touching
        # anything
        meta = await asyncio.to_thread(recorded_meta, session, ks)
        check_recorded_owner(meta, settings)
        recorded = int(meta["shards"]) if "shards" in meta else None
        if recorded is not None and recorded != shards:
            raise ConfigError(
                f"namespace {settings.namespace!r} was initialised with {recorded} shards; "
                f"refusing --shards {shards} (the shard count is fixed for a namespace's life)")
        specs = namespace_topics(settings, shards, replication)
        counts = await partition_counts(admin, (s.name for s in specs))
        for spec in specs:
            have = counts.get(spec.name)
            if have is not None and have != spec.partitions:
                raise ConfigError(f"topic {spec.name} exists with {have} partitions; this "
                                  f"namespace needs {spec.partitions} (--shards {shards})")
        # 2. storage
        existed = await asyncio.to_thread(_keyspace_exists, session, ks)
        await apply_schema(cluster, session, cql_statements(ks, cassandra_replication))
        # The owner first: a keyspace with a shard count always names its namespace, even
        # when this init stops between the two.
        claimed = await asyncio.to_thread(
            lambda: session.execute(
                f"INSERT INTO {ks}.meta (name, value) VALUES ('namespace', %s) IF NOT EXISTS",
                (settings.namespace,)).one())
        if not claimed[0]:  # there already, or written by a concurrent init of another one
            check_keyspace_owner(claimed.value, settings)
        applied = await asyncio.to_thread(
            lambda: session.execute(
                f"INSERT INTO {ks}.meta (name, value) VALUES ('shards', %s) IF NOT EXISTS",
                (str(shards),)).one())
        if not applied[0] and int(applied.value) != shards:  # lost a race to another init
            raise ConfigError(f"namespace {settings.namespace!r} was concurrently initialised "
                              f"with {applied.value} shards")
        # 3. topics, and a first watermark per shard: "nothing before init is pending"
        created = await ensure_topics(admin, specs, replication)
        await seed_watermarks(settings, shards)
        return InitReport(settings.namespace, shards, created, not existed)
    finally:
        await admin.close()
        cluster.shutdown()


async def seed_watermarks(settings: Settings, shards: int) -> int:
    """Write watermark = now for every shard whose state partition is still empty (owner: none
    yet, so the first takeover fences nobody)."""
    tps = [TopicPartition(settings.state_topic, k) for k in range(shards)]
    consumer = reader(settings)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    empty = [tp.partition for tp in tps if ends[tp] == 0]
    if not empty:
        return 0
    producer = plain_producer(settings)
    await producer.start()
    try:
        now = int(time.time() * 1000)
        # One record per partition, all in flight at once: one after another, they took 3.8 s
        # for 16 shards on the three-broker profile (each acknowledged by three replicas).
        acks = [await producer.send(settings.state_topic, partition=k, key=StateRecord.key(k),
                                    value=StateRecord(shard=k, watermark=now, owner=None,
                                                      node="init", at=now).encode())
                for k in empty]
        failed = [r for r in await asyncio.gather(*acks, return_exceptions=True)
                  if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
    finally:
        await producer.stop()
    return len(empty)
