"""The librdkafka claimer's own logic, without brokers: librdkafka's errors as the port's
(`Fenced` for a newer producer of the id, `BusError` otherwise), what a claim may carry, and a
stop that does not wait for the client's close (the real brokers: tests/integration/
test_claimer.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from chronowheel.bus.kafka_claimer import RdKafkaClaimer, RdKafkaClaimTransaction
from chronowheel.bus.ports import BusError, Fenced
from chronowheel.settings import Settings
from confluent_kafka import KafkaError, KafkaException


class FakeProducer:
    """Stands in for a started confluent_kafka.Producer."""

    def __init__(self, fail_commit: int | None = None) -> None:
        self.fail_commit = fail_commit
        self.produced: list[tuple[str, int, bytes | None, bytes]] = []
        self.closing = threading.Event()
        self.may_close = threading.Event()

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, *, value: bytes, key: bytes | None, partition: int,
                headers: Any) -> None:
        self.produced.append((topic, partition, key, value))

    def commit_transaction(self, timeout: float) -> None:
        if self.fail_commit is not None:
            raise KafkaException(KafkaError(self.fail_commit))

    def abort_transaction(self, timeout: float) -> None:
        pass

    def purge(self) -> None:
        pass

    def close(self) -> None:
        self.closing.set()
        self.may_close.wait(30)


def started(producer: FakeProducer) -> RdKafkaClaimer:
    claimer = RdKafkaClaimer(Settings(namespace="unit"), "unit-shard-0")
    claimer._producer = producer  # what start() sets once init_transactions returned
    return claimer


@pytest.mark.parametrize("code", [KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                  KafkaError.INVALID_PRODUCER_EPOCH])
async def test_a_newer_producer_of_the_id_is_fenced(code: int) -> None:
    txn = await started(FakeProducer(fail_commit=code)).begin()
    await txn.publish("unit.state", 0, b"k", b"v", [])
    with pytest.raises(Fenced, match="unit-shard-0: committing"):
        await txn.commit({})


async def test_any_other_failure_is_a_bus_error_not_a_fence() -> None:
    txn = await started(FakeProducer(fail_commit=KafkaError._TIMED_OUT)).begin()
    with pytest.raises(BusError) as raised:
        await txn.commit({})
    assert not isinstance(raised.value, Fenced)


async def test_a_claim_commits_its_record_and_no_submit_offsets() -> None:
    producer = FakeProducer()
    txn = await started(producer).begin()
    assert isinstance(txn, RdKafkaClaimTransaction)
    await txn.publish("unit.state", 3, b"k", b"v", [])
    await txn.commit({})
    assert producer.produced == [("unit.state", 3, b"k", b"v")]
    with pytest.raises(BusError, match="no submit offsets"):
        await txn.commit({3: 10})


async def test_begin_before_start_is_refused() -> None:
    with pytest.raises(BusError, match="not started"):
        await RdKafkaClaimer(Settings(namespace="unit"), "unit-shard-0").begin()


async def test_stop_does_not_wait_for_the_close() -> None:
    producer = FakeProducer()
    claimer = started(producer)
    try:
        # Returns while the close is still running (which waits for may_close): a stop that
        # waited for it would time out here.
        await asyncio.wait_for(claimer.stop(), 5)
        assert await asyncio.to_thread(producer.closing.wait, 10)
    finally:
        producer.may_close.set()
    with pytest.raises(BusError, match="not started"):
        await claimer.begin()
