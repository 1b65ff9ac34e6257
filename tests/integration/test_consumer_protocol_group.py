"""The node's member of Kafka 4's consumer group protocol (`bus/kafka_consumer_group.py`)
against the real broker: every record of every shard is handed over once and in order through
seeks and the pump's pauses, the group takes the node's session and heartbeat, and a session
the brokers would refuse stops the member with a ConfigError that names their limit, and the
group's owners are described as `chronowheel status` shows them. (Its
rebalances under load, with node processes: tests/integration/test_scale_out.py.)"""

from __future__ import annotations

import asyncio
import random

import pytest
from chronowheel.bus.kafka import open_admin
from chronowheel.bus.kafka_consumer_group import (
    GROUP_HEARTBEAT,
    GROUP_SESSION,
    ConsumerProtocolGroup,
    librdkafka_config,
)
from chronowheel.errors import ConfigError
from chronowheel.ops.cluster import describe_group
from chronowheel.settings import Settings

from testkit.fleet import until
from tests.conftest import Stack
from tests.integration.harness import make_namespace, produce

pytestmark = pytest.mark.integration
SHARDS = 4
PER_SHARD = 3_000


def _group_configs(settings: Settings, group_id: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(librdkafka_config(settings))
    [future] = admin.describe_configs([ConfigResource(ResourceType.GROUP, group_id)]).values()
    return {name: entry.value for name, entry in future.result(timeout=10).items()}


async def test_every_record_arrives_once_in_order_through_seeks_and_pauses(
        stack: Stack, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=SHARDS, node_group_protocol="consumer")
    await produce(settings, [(f"k{i}".encode(), b"v" * 200) for i in range(SHARDS * PER_SHARD)],
                  partition=lambda key: int((key or b"k0")[1:]) % SHARDS)
    changes: list[tuple[str, list[int]]] = []

    async def assigned(shards: list[int]) -> None:
        changes.append(("assigned", shards))

    async def revoked(shards: list[int]) -> None:
        changes.append(("revoked", shards))

    group_id = f"{namespace}-nodes"
    member = ConsumerProtocolGroup(settings, group_id=group_id, client_id="t1",
                                   session_timeout_ms=settings.node_session_timeout_ms,
                                   on_assigned=assigned, on_revoked=revoked)
    await member.start()
    try:
        # The member's set is updated before the node's callback runs on this loop (the
        # callback seeks shards already assigned): wait for the callback, then check both.
        await until(lambda: bool(changes), 60, "the assignment's callback")
        assert changes == [("assigned", list(range(SHARDS)))]
        assert member.assigned() == set(range(SHARDS))
        assert member.partition_count() == SHARDS
        # `chronowheel status` and the console see who holds what (the classic API shows
        # such a group as Dead and empty).
        admin = await open_admin(settings)
        try:
            group = await describe_group(admin, group_id, settings.submit_topic,
                                         settings=settings)
        finally:
            await admin.close()
        assert group.state == "Stable"
        assert [m.client_id for m in group.members] == ["t1"]
        assert {k: m.client_id for k, m in group.owners.items()} == dict.fromkeys(
            range(SHARDS), "t1")
        configs = await asyncio.to_thread(_group_configs, settings, group_id)
        assert configs[GROUP_SESSION] == str(settings.node_session_timeout_ms)
        assert configs[GROUP_HEARTBEAT] == str(settings.node_heartbeat_interval_ms)
        # Shard 0 from the beginning, the others from offsets in the middle, as takeovers do.
        starts = {0: 0, 1: 1_000, 2: 2_999, 3: PER_SHARD}
        skipped = await asyncio.gather(*[member.seek(k, None if k == 0 else at)
                                         for k, at in starts.items()])
        assert skipped == [0] * SHARDS
        for k in range(SHARDS):
            member.deliver(k)
        got: dict[int, list[int]] = {k: [] for k in range(SHARDS)}
        want = sum(PER_SHARD - at for at in starts.values())
        rng = random.Random(7)
        paused: set[int] = set()
        while sum(map(len, got.values())) < want:
            for k, records in (await member.fetch(200, 500)).items():
                got[k].extend(r.offset for r in records)
                assert all(r.value == b"v" * 200 for r in records)
            for k in range(SHARDS):  # the pump's backpressure, at random
                if rng.random() < 0.3:
                    (member.resume if k in paused else member.pause)(k)
                    paused ^= {k}
        for k in paused:
            member.resume(k)
        assert await member.fetch(300, 500) == {}
        for k, at in starts.items():
            assert got[k] == list(range(at, PER_SHARD)), f"shard {k}"
        assert await member.committed(0) is None
        assert await member.check_membership() is True  # the probe, from a current member
    finally:
        await member.stop()
    assert changes[-1] == ("revoked", list(range(SHARDS)))


async def test_a_session_under_the_brokers_minimum_is_refused_with_its_name(
        stack: Stack, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1, node_group_protocol="consumer",
                                    node_heartbeat_interval_ms=100)

    async def nothing(shards: list[int]) -> None:
        del shards

    # The local stack's brokers accept sessions from 1 s (deploy/local/kafka/server.properties).
    member = ConsumerProtocolGroup(settings, group_id=f"{namespace}-nodes", client_id="t1",
                                   session_timeout_ms=500, on_assigned=nothing,
                                   on_revoked=nothing)
    with pytest.raises(ConfigError) as refused:
        await member.start()
    why = str(refused.value)
    assert "consumer.session.timeout.ms 500" in why
    assert "group.consumer.min.session.timeout.ms" in why
