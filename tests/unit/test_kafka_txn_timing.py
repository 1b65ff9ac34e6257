"""The node's transactional producer does not wait where it need not: aiokafka's fixed pause
before asking again for a transaction's partitions (CONCURRENT_TRANSACTIONS, while the previous
transaction's markers are written) is 2 ms instead of 20, and no linger delays a transaction's
produce request (see chronowheel.bus.kafka)."""

from __future__ import annotations

import inspect

import pytest
from aiokafka.producer import sender
from chronowheel.bus import kafka
from chronowheel.settings import Settings


def test_the_concurrent_transactions_retry_waits_2_ms() -> None:
    assert kafka.CONCURRENT_TRANSACTIONS_RETRY_S == 0.002
    assert sender.BACKOFF_OVERRIDE == kafka.CONCURRENT_TRANSACTIONS_RETRY_S
    # aiokafka still reads that module global where it answers CONCURRENT_TRANSACTIONS: if a
    # new release renames it, setting it would change nothing and this fails.
    source = inspect.getsource(sender.AddPartitionsToTxnHandler.handle_response)
    assert "CONCURRENT_TRANSACTIONS" in source or "ConcurrentTransactions" in source
    assert "return BACKOFF_OVERRIDE" in source


@pytest.mark.asyncio
async def test_the_transactional_producer_does_not_linger() -> None:
    producer = kafka.transactional_producer(Settings(kafka="127.0.0.1:1"), "t-linger")
    try:
        assert producer._message_accumulator._linger_time == 0
    finally:
        await producer.stop()  # never started: nothing to stop but its internals
