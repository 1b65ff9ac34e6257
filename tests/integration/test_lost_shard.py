"""A shard lost to a stray claimer is taken again, on the real servers: the node's first claim
of a shard is fenced by another claimer of the shard (started right after the node's, then
left, as a stopped takeover whose init landed late), so the node gives the shard up; the group
(the consumer protocol's member) still assigns it to the node, which checks its membership (a
commit of the probe offset on the state topic, which the coordinator accepts from a current
member, and which leaves the shard's submit offset alone), takes the shard over again after
`lost_shard_retry_ms`, fencing the stray claimer, and fires what is due on it."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from chronowheel.bus.kafka_consumer_group import ConsumerProtocolGroup
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.bus.ports import Claimer
from chronowheel.core import wire
from chronowheel.core.shard import shard_of
from chronowheel.core.wire import StateRecord, claimer_transactional_id
from chronowheel.node.service import Node
from chronowheel.node.transactions import node_transactional_id
from chronowheel.testing import Collector
from chronowheel.testing.node_process import wait_owned

from testkit.fleet import until
from tests.integration.harness import (
    applied,
    make_namespace,
    nodes_group_offsets,
    now_ms,
    produce,
    running_node,
    upsert,
)

pytestmark = pytest.mark.integration


async def test_a_shard_lost_to_a_stray_claimer_is_taken_again_and_fires(
        stack: Any, namespace: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = (await make_namespace(stack, namespace, shards=2)).replace(
        lost_shard_retry_ms=500)
    assert settings.node_group_protocol == "consumer"
    on_shard_0 = next(f"far-{i}" for i in range(100) if shard_of(f"far-{i}", 2) == 0)
    # A first node applies a command on shard 0 and stops: the group has an offset committed
    # there, which the membership check must leave alone.
    async with running_node(settings, node_id="first"):
        await produce(settings, [upsert(on_shard_0, at=now_ms() + 86_400_000)])
        await applied(settings)
    submit_0 = TopicPartition(settings.submit_topic, 0)
    probe = TopicPartition(settings.state_topic, wire.MEMBERSHIP_PROBE_PARTITION)
    before = await nodes_group_offsets(settings, [submit_0, probe])
    assert before[submit_0].offset > 0 and probe not in before
    checks: list[bool] = []
    check = ConsumerProtocolGroup._check_membership_on_group

    def recorded(group: ConsumerProtocolGroup, consumer: Any) -> bool:
        member = check(group, consumer)
        checks.append(member)
        return member

    monkeypatch.setattr(ConsumerProtocolGroup, "_check_membership_on_group", recorded)
    bus = KafkaNodeBus(settings)
    stray_id = claimer_transactional_id(settings.namespace, 0)
    real = bus.claimer
    claimers: list[Claimer] = []
    strays: list[Claimer] = []

    def claimer(transactional_id: str, group_id: str) -> Claimer:
        ours = real(transactional_id, group_id)
        if transactional_id == stray_id:
            claimers.append(ours)
            if len(claimers) == 1:
                start = ours.start

                async def start_then_stray() -> None:
                    await start()
                    stray = real(stray_id, group_id)
                    strays.append(stray)
                    await stray.start()  # fences ours: its claim fails

                ours.start = start_then_stray  # type: ignore[method-assign]
        return ours

    bus.claimer = claimer  # type: ignore[method-assign]
    job = next(f"lost-{i}" for i in range(100) if shard_of(f"lost-{i}", 2) == 0)
    due = now_ms() + 3_000
    await produce(settings, [upsert(job, at=due)])
    collector = Collector(settings, (settings.fired_topic,))
    await collector.start()
    node = Node(settings, node_id="me", bus=bus)
    try:
        with caplog.at_level(logging.INFO, logger="chronowheel"):
            await node.start()
            await wait_owned(node, 2, timeout_s=90)
            await until(lambda: len(collector.messages) >= 1, 60, "the lost shard's job to fire")
        messages = [r.getMessage() for r in caplog.records]
        assert any("shards [0] given up as claimed elsewhere" in m for m in messages), messages
        assert any("taking them over again" in m and "[0]" in m for m in messages), messages
        assert len(claimers) == 2  # the lost claim, and the one that took the shard again
        # Asked of the coordinator through the probe; shard 0's submit offset untouched by it.
        assert checks == [True]
        after = await nodes_group_offsets(settings, [submit_0, probe])
        assert after[probe].offset == wire.MEMBERSHIP_PROBE_OFFSET
        # (the Python binding of librdkafka sends the metadata with its C string's final NUL)
        assert after[probe].metadata.rstrip("\x00") == wire.MEMBERSHIP_PROBE_METADATA
        assert after[submit_0].offset >= before[submit_0].offset
        [fired] = collector.messages
        assert fired.key == job.encode() and fired.received_ms >= due  # never early
        value = await bus.read_last(settings.state_topic, 0, StateRecord.key(0), 30_000,
                                    settled=True)
        assert value is not None
        assert orjson.loads(value)["owner"] == node_transactional_id(settings.namespace, "me")
        assert node.failure is None
    finally:
        await node.shutdown()
        await collector.stop()
        for stray in strays:
            await stray.stop()
