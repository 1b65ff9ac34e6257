"""The node group's membership check against the real broker, with either group protocol: it
commits the probe offset on the state topic (`core/wire.py`), never a submit offset, and the
coordinator accepts it from a current member; a classic member whose session expired while its
group loop stood still is told it is no longer one."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiokafka import TopicPartition
from chronowheel.bus.kafka import open_admin
from chronowheel.bus.kafka_node import KafkaNodeBus, KafkaSubmitGroup
from chronowheel.core import wire
from chronowheel.ops.cluster import describe_group

from testkit.fleet import until
from tests.conftest import Stack
from tests.integration.harness import make_namespace, nodes_group_offsets

pytestmark = pytest.mark.integration


async def _nothing(shards: list[int]) -> None:
    del shards


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_a_member_passes_the_probe_which_leaves_the_submit_offsets_alone(
        stack: Stack, namespace: str, protocol: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2, node_group_protocol=protocol)
    group_id = f"{namespace}-nodes"
    member = KafkaNodeBus(settings).submit_group(
        group_id=group_id, client_id="t1", session_timeout_ms=settings.node_session_timeout_ms,
        on_assigned=_nothing, on_revoked=_nothing)
    await member.start()
    try:
        await until(lambda: member.assigned() == {0, 1}, 60, "both shards assigned")
        assert await member.check_membership() is True
    finally:
        await member.stop()
    probe_tp = TopicPartition(settings.state_topic, wire.MEMBERSHIP_PROBE_PARTITION)
    offsets = await nodes_group_offsets(
        settings, [probe_tp, *(TopicPartition(settings.submit_topic, k) for k in range(2))])
    assert list(offsets) == [probe_tp]
    [probe] = offsets.values()
    assert probe.offset == wire.MEMBERSHIP_PROBE_OFFSET
    # (the Python binding of librdkafka sends the metadata with its C string's final NUL)
    assert probe.metadata.rstrip("\x00") == wire.MEMBERSHIP_PROBE_METADATA


async def test_a_classic_member_whose_session_expired_fails_the_probe(
        stack: Stack, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2, node_group_protocol="classic")
    member = KafkaSubmitGroup(settings, group_id=f"{namespace}-nodes", client_id="t1",
                              session_timeout_ms=1_500, on_assigned=_nothing,
                              on_revoked=_nothing)
    await member.start()
    try:
        await until(lambda: member.assigned() == {0, 1}, 60, "both shards assigned")
        assert await member.check_membership() is True

        released = threading.Event()

        async def checked_after_a_stall() -> bool:
            # The group loop stands still (no heartbeat goes out) until the coordinator has
            # dropped the member; then the probe is sent before anything else runs there.
            released.wait(60)
            return await member._check_membership_on_group()

        checked = asyncio.ensure_future(member._on_group(checked_after_a_stall()))
        admin = await open_admin(settings)
        try:
            async def dropped() -> bool:
                group = await describe_group(admin, f"{namespace}-nodes",
                                             settings.submit_topic, settings=settings)
                return not group.members

            await until(dropped, 30, "the coordinator to drop the stalled member")
        finally:
            released.set()
            await admin.close()
        assert await checked is False
    finally:
        await member.stop()
