"""A transactional producer its Kafka client gave up on is told apart from a fence and from a
passing error: aiokafka's sender task, when it dies (OutOfOrderSequenceNumber after a partition
leader moved, an unexpected error), leaves the producer's transaction state FATAL_ERROR, where
`begin_transaction` fails an assertion. The node must see `ProducerBroken` (and start a new
producer), or `Fenced` when what killed it was a fence, never that assertion."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, OutOfOrderSequenceNumber, ProducerFenced
from chronowheel.bus.kafka_node import KafkaTransaction, KafkaTxnProducer, broken_cause
from chronowheel.bus.ports import BusError, Fenced, ProducerBroken
from chronowheel.settings import Settings


async def _dead(exc: BaseException) -> KafkaTxnProducer:
    """A producer (never connected) whose sender task ended with `exc`, left as aiokafka's
    `Sender._fail_all` leaves it."""
    producer = KafkaTxnProducer(Settings(kafka="127.0.0.1:1"), "t-broken", "g")
    inner = producer.aiokafka
    loop = asyncio.get_running_loop()
    inner._txn_manager._transaction_waiter = loop.create_future()

    async def die() -> None:
        raise exc

    task = inner._sender._sender_task = loop.create_task(die())
    with pytest.raises(type(exc)):
        await task
    inner._sender._fail_all(task)
    inner._txn_manager._transaction_waiter.exception()  # retrieved: nobody waits on it here
    return producer


@pytest.mark.asyncio
async def test_a_usable_producer_is_not_broken() -> None:
    producer = KafkaTxnProducer(Settings(kafka="127.0.0.1:1"), "t-fine", "g")
    try:
        assert broken_cause(producer.aiokafka) is None
    finally:
        await producer.aiokafka.stop()


@pytest.mark.asyncio
async def test_begin_on_a_producer_whose_sender_died_raises_producer_broken() -> None:
    producer = await _dead(OutOfOrderSequenceNumber())
    cause = broken_cause(producer.aiokafka)
    assert isinstance(cause, OutOfOrderSequenceNumber)
    # aiokafka itself would fail an assertion here, which the node took for a bug and stopped.
    with pytest.raises(AssertionError, match="FATAL_ERROR"):
        producer.aiokafka._txn_manager.begin_transaction()
    with pytest.raises(ProducerBroken, match="OutOfOrderSequenceNumber"):
        await producer.begin()
    await producer.stop()


@pytest.mark.asyncio
async def test_a_sender_killed_by_a_fence_is_a_fence() -> None:
    producer = await _dead(ProducerFenced())
    with pytest.raises(Fenced):
        await producer.begin()
    await producer.stop()


@pytest.mark.asyncio
async def test_an_unexpected_sender_error_is_broken_with_its_cause() -> None:
    try:
        raise KafkaError("Unexpected error during batch delivery") from RuntimeError("bug")
    except KafkaError as exc:
        error = exc
    producer = await _dead(error)
    with pytest.raises(ProducerBroken) as raised:
        await producer.begin()
    assert not isinstance(raised.value, Fenced)
    assert "Unexpected error during batch delivery" in str(raised.value)
    await producer.stop()


class _EndedTransactionProducer:
    """An aiokafka producer whose transaction a failed batch has already ended: aiokafka then
    refuses every further batch with IllegalOperation."""

    def __init__(self) -> None:
        self._txn_manager = None

    async def send_batch(self, batch: object, topic: str, partition: int) -> None:
        raise IllegalOperation("Can't send messages while not in transaction")


@pytest.mark.asyncio
async def test_a_batch_refused_after_the_transaction_ended_reports_what_ended_it() -> None:
    # The state record's batch goes after the fired batch failed; what the node must act on
    # is the fired batch's failure (here a fence), not aiokafka's "not in transaction".
    txn = KafkaTransaction(_EndedTransactionProducer(), "t-ended", "ns.submit", "g")  # type: ignore[arg-type]
    failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    failed.set_exception(ProducerFenced())
    txn._sent.append((failed, None, (), "ns.fired"))
    txn._batches[("ns.state", 0)] = object()
    with pytest.raises(Fenced):
        await txn.commit({})


@pytest.mark.asyncio
async def test_a_batch_refused_after_the_transaction_ended_is_a_bus_error_without_a_cause(
        ) -> None:
    txn = KafkaTransaction(_EndedTransactionProducer(), "t-ended", "ns.submit", "g")  # type: ignore[arg-type]
    txn._batches[("ns.state", 0)] = object()
    with pytest.raises(BusError, match="no longer open"):
        await txn.commit({})


def _unread_failures(reports: list[str]) -> list[str]:
    return [message for message in reports if "never retrieved" in message]


@pytest.mark.asyncio
async def test_a_fenced_producers_stop_leaves_no_failure_reported_as_never_retrieved() -> None:
    """aiokafka keeps a fenced transaction's failure on a future that only a commit or an abort
    reads; the node drops a fenced producer with neither, and the collected future used to be
    logged with the fence's whole traceback."""
    import gc

    from aiokafka.producer.transaction_manager import TransactionState

    loop = asyncio.get_running_loop()
    reports: list[str] = []  # the messages only: a context holds the object it is about
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(str(context["message"])))
    try:
        # Unread, the failure is reported once the future is collected (what this test sees).
        unread = KafkaTxnProducer(Settings(kafka="127.0.0.1:1"), "t-unread", "g").aiokafka
        unread._txn_manager.set_pid_and_epoch(1, 0)
        unread._txn_manager.begin_transaction()
        unread._txn_manager.fatal_error(ProducerFenced())
        del unread
        gc.collect()
        assert len(_unread_failures(reports)) == 1
        reports.clear()

        # A fence met by the sender: aiokafka fails every batch queued and the transaction
        # (`Sender._fail_all`). The node reads each batch's delivery; the last batch of each
        # partition also keeps the failure on its drain waiter, which nothing reads.
        fenced = KafkaTxnProducer(Settings(kafka="127.0.0.1:1"), "t-fenced", "g")
        inner = fenced.aiokafka
        inner._txn_manager.set_pid_and_epoch(1, 0)
        inner._txn_manager.begin_transaction()
        delivered = []
        for partition in (0, 1):
            batch = inner.create_batch()
            batch.append(key=None, value=b"x", timestamp=None)
            delivered.append(await inner._message_accumulator.add_batch(
                batch, TopicPartition("t", partition), timeout=1))
        fence = ProducerFenced()
        inner._message_accumulator.fail_all(fence)
        inner._txn_manager.fatal_error(fence)
        results = await asyncio.gather(*delivered, return_exceptions=True)  # as commit does
        assert all(isinstance(r, ProducerFenced) for r in results)
        await fenced.stop()
        # An abortable error: the node's abort reads it before aiokafka's abort replaces it.
        failed = KafkaTxnProducer(Settings(kafka="127.0.0.1:1"), "t-failed", "g").aiokafka
        manager = failed._txn_manager
        manager.set_pid_and_epoch(2, 0)
        manager.begin_transaction()
        manager.error_transaction(KafkaError("a batch failed"))
        aborting = asyncio.create_task(
            KafkaTransaction(failed, "t-failed", "submit", "g").abort())
        while manager.state != TransactionState.ABORTING_TRANSACTION:
            await asyncio.sleep(0)
        manager.complete_transaction()  # what the sender does once the brokers ended it
        await aborting
        del manager, aborting
        del fenced, failed, inner, delivered, results, fence, batch
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert _unread_failures(reports) == []
