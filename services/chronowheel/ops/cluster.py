"""Read-only views of a running namespace: the store, the shard count, the shard owners (the
`<ns>-nodes` consumer group), each shard's newest state record (`<ns>.state`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from chronowheel.bus.kafka import reader
from chronowheel.core.wire import StateRecord
from chronowheel.errors import ChronowheelError, ConfigError
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore

# The newest state record of a shard is near the end of its partition: each transaction adds
# one record and one commit marker. Read this many offsets back first, all of it if that
# window holds no record (aborted transactions only, or a partition compacted to a few).
STATE_TAIL_WINDOW = 200


def quiet_kafka_logs() -> None:
    """aiokafka logs every assignment and subscription at INFO: noise for a one-shot command."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("aiokafka").setLevel(logging.WARNING)


def nodes_group(settings: Settings) -> str:
    return f"{settings.namespace}-nodes"


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str

    @property
    def label(self) -> str:
        return f"{self.client_id}@{self.host}"


@dataclass(frozen=True)
class Group:
    state: str  # Stable, PreparingRebalance, CompletingRebalance, Empty, Dead
    members: tuple[Member, ...]
    owners: dict[int, Member]  # partition of <ns>.submit -> member holding it


async def recorded_shards(store: CassandraStore, settings: Settings) -> int:
    value = await store.get_meta("shards")
    if value is None:
        raise ConfigError(f"namespace {settings.namespace!r} is not initialised (no shard "
                          f"count in keyspace {settings.keyspace})")
    return int(value)


async def open_store(settings: Settings) -> CassandraStore:
    # The driver logs a traceback for every statement it cannot prepare (a missing keyspace
    # fails them all); the error below says it once, plainly.
    driver_log = logging.getLogger("cassandra.cluster")
    level = driver_log.level
    driver_log.setLevel(logging.CRITICAL)
    try:
        return await asyncio.to_thread(CassandraStore.open, settings)
    except Exception as exc:
        if isinstance(exc, ChronowheelError):
            raise
        # Mostly "keyspace does not exist": the driver's own message names it.
        raise ConfigError(f"cannot open keyspace {settings.keyspace} at {settings.cassandra} "
                          f"(is the namespace initialised?): {exc}") from exc
    finally:
        driver_log.setLevel(level)


def decode_assignment(raw: bytes, topic: str) -> list[int]:
    """Partitions of `topic` in a member's assignment (empty while a rebalance is running)."""
    if not raw:
        return []
    assignment = ConsumerProtocolMemberAssignment.decode(raw)
    return sorted(p for t, parts in assignment.assignment if t == topic for p in parts)


def describe_modern_group(settings: Settings, group_id: str, topic: str) -> Group:
    """A group as librdkafka describes it (blocking: run it on a thread). It speaks Kafka 4's
    ConsumerGroupDescribe, which a group of the consumer protocol (node_group_protocol=consumer)
    needs: the classic DescribeGroups shows such a group as Dead with no members."""
    from confluent_kafka.admin import AdminClient

    from chronowheel.bus.kafka_consumer_group import ADMIN_TIMEOUT_S, admin_config

    admin = AdminClient(admin_config(settings))
    try:
        found = admin.describe_consumer_groups(
            [group_id], request_timeout=ADMIN_TIMEOUT_S)[group_id].result(
                timeout=ADMIN_TIMEOUT_S + 5)
    except Exception as exc:
        raise ChronowheelError(f"describing consumer group {group_id}: {exc}") from exc
    members = []
    owners: dict[int, Member] = {}
    for m in found.members:
        member = Member(m.member_id, m.client_id, m.host.lstrip("/"))
        members.append(member)
        parts = m.assignment.topic_partitions if m.assignment is not None else []
        for tp in parts:
            if tp.topic == topic:
                owners[tp.partition] = member
    state = "".join(word.capitalize() for word in found.state.name.split("_"))
    return Group(state, tuple(members), owners)


async def describe_group(admin: AIOKafkaAdminClient, group_id: str, topic: str, *,
                         settings: Settings | None = None) -> Group:
    """The group with its members and who holds which partition of `topic`. With `settings`,
    a group the classic API shows as Dead and empty is described again through librdkafka:
    it may be a group of the consumer protocol (`describe_modern_group`)."""
    # One group per request: aiokafka 0.14 sends DescribeGroups v3 but parses the answer with
    # the v2 layout, which happens to work for one group and breaks the connection for two.
    responses = await admin.describe_consumer_groups([group_id])
    groups = [g for r in responses for g in r.to_object()["groups"]]
    if settings is not None and (not groups or (groups[0]["state"] == "Dead"
                                                and not groups[0]["members"])):
        return await asyncio.to_thread(describe_modern_group, settings, group_id, topic)
    if not groups:
        return Group("Dead", (), {})
    g: dict[str, Any] = groups[0]
    if g["error_code"] != 0:
        raise ChronowheelError(f"describing consumer group {group_id}: Kafka error code "
                               f"{g['error_code']}")
    members = []
    owners: dict[int, Member] = {}
    for m in g["members"]:
        member = Member(m["member_id"], m["client_id"], m["client_host"].lstrip("/"))
        members.append(member)
        for p in decode_assignment(m["member_assignment"], topic):
            owners[p] = member
    return Group(g["state"], tuple(members), owners)


async def read_state_records(settings: Settings, shards: int,
                             timeout_s: float = 15.0) -> dict[int, StateRecord]:
    """The newest committed (read_committed) state record of each shard that has one."""
    found = await read_state_positions(settings, shards, timeout_s)
    return {k: record for k, (_, record) in found.items()}


async def read_state_positions(settings: Settings, shards: int, timeout_s: float = 15.0
                               ) -> dict[int, tuple[int, StateRecord]]:
    """(offset, record) of the newest committed state record of each shard that has one."""
    tps = [TopicPartition(settings.state_topic, k) for k in range(shards)]
    consumer = reader(settings)
    await consumer.start()
    try:
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        found: dict[int, tuple[int, StateRecord]] = {}
        for window in (STATE_TAIL_WINDOW, None):
            todo = [tp for tp in tps if tp.partition not in found and ends[tp] > begins[tp]]
            if not todo:
                break
            for tp in todo:
                start = begins[tp] if window is None else max(begins[tp], ends[tp] - window)
                consumer.seek(tp, start)
            await _read_until(consumer, todo, ends, found, timeout_s)
        return found
    finally:
        await consumer.stop()


async def _read_until(consumer: Any, tps: list[TopicPartition], ends: dict[TopicPartition, int],
                      found: dict[int, tuple[int, StateRecord]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    remaining = set(tps)
    while remaining:
        if time.monotonic() > deadline:
            raise ChronowheelError(f"timed out reading {tps[0].topic} after {timeout_s:.0f}s")
        batches = await consumer.getmany(*remaining, timeout_ms=200)
        for tp, msgs in batches.items():
            for m in msgs:
                if m.key == StateRecord.key(tp.partition) and m.value:
                    found[tp.partition] = (m.offset, StateRecord.parse(m.value,
                                                                       shard=tp.partition))
        for tp in list(remaining):
            if await consumer.position(tp) >= ends[tp]:
                remaining.discard(tp)
