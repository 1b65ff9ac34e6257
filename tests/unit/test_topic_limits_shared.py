"""A node's producers share what they read of the topics' limits (`max.message.bytes`): the
producer that replaces a fenced or failed one (`node/transactions.py`, `_renew`) needs the
limit of the fired topic for the first part of every shard it takes over again, and reading
it means starting an admin client on the node's loop while it is busiest. The brokers are
never reached here: the read itself is replaced by a counter."""

from __future__ import annotations

import pytest
from chronowheel.bus.kafka_node import KafkaNodeBus, KafkaTxnProducer, TopicLimits
from chronowheel.core import limits
from chronowheel.settings import Settings

CONFIGURED = 200_000


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []

    async def read(self: TopicLimits, topic: str) -> int | None:
        asked.append(topic)
        return CONFIGURED

    monkeypatch.setattr(TopicLimits, "_read_max_message_bytes", read)
    return asked


@pytest.mark.asyncio
async def test_a_renewed_producer_finds_the_limits_its_predecessor_read(
        reads: list[str]) -> None:
    bus = KafkaNodeBus(Settings(kafka="127.0.0.1:1", namespace="lim"))
    first = bus.producer("lim-node-a", "lim-nodes")
    limit = await first.max_record_bytes("lim.fired")
    assert reads == ["lim.fired"]
    max_request = int(first.aiokafka._max_request_size)
    assert limit == limits.max_record_bytes(CONFIGURED, max_request) \
        == first.known_limit("lim.fired")
    await first.stop()  # as `_renew` stops the fenced one

    renewed = bus.producer("lim-node-a", "lim-nodes")
    try:
        assert renewed.known_limit("lim.fired") == limit  # batches are sized by it at once
        assert await renewed.max_record_bytes("lim.fired") == limit
        assert reads == ["lim.fired"]  # not asked again
        # A refusal for size makes every producer of the node read the topic again.
        renewed.forget_limit("lim.fired")
        assert await renewed.max_record_bytes("lim.fired") == limit
        assert reads == ["lim.fired", "lim.fired"]
    finally:
        await renewed.stop()
        await bus.close()


@pytest.mark.asyncio
async def test_a_producer_of_its_own_reads_for_itself(reads: list[str]) -> None:
    settings = Settings(kafka="127.0.0.1:1", namespace="lim")
    one = KafkaTxnProducer(settings, "lim-node-a", "lim-nodes")
    other = KafkaTxnProducer(settings, "lim-node-b", "lim-nodes")
    try:
        # Before any read: Kafka's default, as the batches' size bound.
        max_request = int(one.aiokafka._max_request_size)
        assert one.known_limit("lim.dead") == limits.max_record_bytes(None, max_request)
        assert await one.max_record_bytes("lim.dead") \
            == limits.max_record_bytes(CONFIGURED, max_request) == one.known_limit("lim.dead")
        await other.max_record_bytes("lim.dead")
        assert reads == ["lim.dead", "lim.dead"]
    finally:
        await one.stop()
        await other.stop()
