"""The librdkafka claimer's own logic, without brokers: librdkafka's errors as the port's
(`Fenced` for a newer producer of the id, `BusError` otherwise), what a claim may carry, and a
stop that does not wait for the client's close (the real brokers: tests/integration/
test_claimer.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

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


class SlowInit(FakeProducer):
    """A producer whose `init_transactions` (InitProducerId, which fences every earlier
    producer of the id) runs until the test lets it finish."""

    made: ClassVar[list[SlowInit]] = []
    created: ClassVar[threading.Event] = threading.Event()

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.may_close.set()
        self.initialising = threading.Event()
        self.may_finish = threading.Event()
        self.initialised = threading.Event()
        SlowInit.made.append(self)
        SlowInit.created.set()

    def init_transactions(self, timeout: float) -> None:
        self.initialising.set()
        self.may_finish.wait(30)
        self.initialised.set()


async def test_a_cancelled_start_ends_only_once_its_init_did_and_closes_its_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka

    SlowInit.made.clear()
    SlowInit.created.clear()
    monkeypatch.setattr(confluent_kafka, "Producer", SlowInit)
    claimer = RdKafkaClaimer(Settings(namespace="unit"), "unit-shard-1")
    start = asyncio.ensure_future(claimer.start())
    assert await asyncio.to_thread(SlowInit.created.wait, 10)
    producer = SlowInit.made[0]
    assert await asyncio.to_thread(producer.initialising.wait, 10)
    start.cancel()  # a revocation or a fence recovery stopping the takeover
    # Until its init is over the start goes on: the node's next claimer of the shard would
    # otherwise initialise first and then be fenced by this one's InitProducerId. (A start
    # that gives up at the cancellation ends at the loop's next turn.)
    await _turns(10)
    assert not start.done()
    start.cancel()  # cancelled again meanwhile: still waits
    await _turns(10)
    assert not start.done()
    producer.may_finish.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(start, 10)
    assert producer.initialised.is_set()
    # What the init made is closed, not left with its threads to nobody.
    assert await asyncio.to_thread(producer.closing.wait, 10)
    with pytest.raises(BusError, match="not started"):
        await claimer.begin()



async def _turns(n: int) -> None:
    """Let the event loop run `n` times round (no time passes for anything to wait on)."""
    for _ in range(n):
        await asyncio.sleep(0)
