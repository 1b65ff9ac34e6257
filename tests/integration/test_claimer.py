"""The librdkafka claimer on the real brokers: a claimer's start fences the claimers that
started before it with the same id, and fences an aiokafka producer with that id (a previous
owner's node producer), whose open transaction is aborted; a claim it commits is what a settled
read of the state partition finds."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from chronowheel.bus.kafka_claimer import RdKafkaClaimer
from chronowheel.bus.kafka_consumer_group import librdkafka_config
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.bus.ports import BusError, Fenced
from chronowheel.core.clock import SystemClock
from chronowheel.core.wire import StateRecord, claimer_transactional_id
from chronowheel.node.takeover import _STARTING_FENCERS, commit_alone, fence

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


async def test_a_fence_of_an_owner_mid_transaction_aborts_it_and_stops_every_fencer(
        stack: Any, namespace: str) -> None:
    """The coordinator refuses the first InitProducerId of a fence while it aborts the owner's
    open transaction, and librdkafka asks again only after 500 ms: `fence` starts more fencers
    meanwhile. The owner's transaction is aborted, and every fencer is stopped in the end."""
    from confluent_kafka import KafkaException, Producer

    settings = await make_namespace(stack, namespace, shards=1)
    bus = KafkaNodeBus(settings)
    owner_id = f"{namespace}-node-crashed"
    owner = Producer({**librdkafka_config(settings), "transactional.id": owner_id})

    def open_a_transaction() -> None:
        owner.init_transactions(30)
        owner.begin_transaction()
        owner.produce(settings.state_topic, record(0, 9_000, owner_id).encode(),
                      StateRecord.key(0), partition=0)
        assert owner.flush(30) == 0  # sent and acknowledged: the partition is in the txn

    started: list[str] = []
    make_claimer = bus.claimer

    def counted(transactional_id: str, group_id: str) -> Any:
        started.append(transactional_id)
        return make_claimer(transactional_id, group_id)

    bus.claimer = counted  # type: ignore[method-assign]
    try:
        await asyncio.to_thread(open_a_transaction)
        await fence(bus, owner_id, f"{namespace}-nodes", 0, SystemClock())
        assert len(started) >= 2 and set(started) == {owner_id}
        with pytest.raises(KafkaException, match="fenced"):
            await asyncio.to_thread(owner.commit_transaction, 30)
        value = await bus.read_last(settings.state_topic, 0, StateRecord.key(0), 30_000,
                                    settled=True)
        assert value is not None and StateRecord.parse(value, shard=0).node == "init"
        # The fencers that lost stop their producer once their own start ends.
        if _STARTING_FENCERS:
            await asyncio.wait(set(_STARTING_FENCERS), timeout=30)
        assert not _STARTING_FENCERS
    finally:
        with contextlib.suppress(KafkaException):
            await asyncio.to_thread(owner.close)
        await bus.close()


async def test_a_claimer_not_started_refuses_to_begin(stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1)
    claimer = KafkaNodeBus(settings).claimer(claimer_transactional_id(namespace, 0), "g")
    with pytest.raises(BusError, match="not started"):
        await claimer.begin()
