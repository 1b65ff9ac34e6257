"""The librdkafka claimer on the real brokers: a claimer's start fences the claimers that
started before it with the same id, and fences an aiokafka producer with that id (a previous
owner's node producer), whose open transaction is aborted; a claim it commits is what a settled
read of the state partition finds."""

from __future__ import annotations

from typing import Any

import pytest
from chronowheel.bus.kafka_claimer import RdKafkaClaimer
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.bus.ports import BusError, Fenced
from chronowheel.core.wire import StateRecord, claimer_transactional_id
from chronowheel.node.takeover import commit_alone

from tests.integration.harness import make_namespace

pytestmark = pytest.mark.integration


def record(shard: int, watermark: int, owner: str) -> StateRecord:
    return StateRecord(shard=shard, watermark=watermark, owner=owner, node="test", claim=True)


async def test_a_claimer_fences_the_one_before_it_and_its_claim_is_read_back(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    bus = KafkaNodeBus(settings)
    claimer_id = claimer_transactional_id(namespace, 1)
    first, second = bus.claimer(claimer_id, "g"), bus.claimer(claimer_id, "g")
    assert isinstance(first, RdKafkaClaimer) and first.transactional_id == claimer_id
    try:
        await first.start()
        await commit_alone(first, settings, record(1, 1_000, "first"))
        await second.start()  # InitProducerId: `first` may commit nothing more
        with pytest.raises(Fenced):
            await commit_alone(first, settings, record(1, 2_000, "first"))
        await commit_alone(second, settings, record(1, 3_000, "second"))
        value = await bus.read_last(settings.state_topic, 1, StateRecord.key(1), 30_000,
                                    settled=True)
        assert value is not None
        found = StateRecord.parse(value, shard=1)
        assert (found.watermark, found.owner) == (3_000, "second")
        with pytest.raises(BusError):  # a claim carries no submit offsets
            txn = await second.begin()
            try:
                await txn.commit({1: 5})
            finally:
                await txn.abort()
    finally:
        await first.stop()
        await second.stop()
        await bus.close()


async def test_a_fencer_aborts_an_aiokafka_producers_open_transaction(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    bus = KafkaNodeBus(settings)
    owner_id = f"{namespace}-node-old"
    owner = bus.producer(owner_id, f"{namespace}-nodes")
    fencer = bus.claimer(owner_id, f"{namespace}-nodes")
    try:
        await owner.start()
        open_txn = await owner.begin()
        await open_txn.publish(settings.state_topic, 0, StateRecord.key(0),
                              record(0, 9_000, owner_id).encode(), [])
        await fencer.start()  # bumps the epoch: the open transaction is aborted
        with pytest.raises(Fenced):
            await open_txn.commit({})
        # The settled read returns once that transaction is resolved: aborted, so what it
        # finds is the record `chronowheel init` wrote.
        value = await bus.read_last(settings.state_topic, 0, StateRecord.key(0), 30_000,
                                    settled=True)
        assert value is not None
        assert StateRecord.parse(value, shard=0).node == "init"
    finally:
        await fencer.stop()
        await owner.stop()
        await bus.close()


async def test_a_claimer_not_started_refuses_to_begin(stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1)
    claimer = KafkaNodeBus(settings).claimer(claimer_transactional_id(namespace, 0), "g")
    with pytest.raises(BusError, match="not started"):
        await claimer.begin()
