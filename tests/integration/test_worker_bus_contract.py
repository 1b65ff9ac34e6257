"""The worker's bus contract (tests/contract/worker_bus.py) against Kafka."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
from chronowheel.bus.kafka import TopicSpec, ensure_topics, open_admin, plain_producer
from chronowheel.bus.kafka_worker import KafkaWorkerBus
from chronowheel.bus.reading import TopicReader
from chronowheel.settings import Settings

from tests.conftest import Stack
from tests.contract.worker_bus import Stored, WorkerBusContract
from tests.namespace_pool import keyspace_of

pytestmark = pytest.mark.integration


class KafkaEnv:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bus = KafkaWorkerBus(settings)

    async def new_topic(self, partitions: int) -> str:
        name = f"{self.settings.namespace}.t-{secrets.token_hex(4)}"
        admin = await open_admin(self.settings)
        try:
            await ensure_topics(admin, [TopicSpec(name, partitions)], 1)
        finally:
            await admin.close()
        return name

    async def put(self, topic: str, partition: int, key: bytes | None, value: bytes,
                  headers: list[tuple[str, bytes]]) -> None:
        p = plain_producer(self.settings)
        await p.start()
        try:
            await p.send_and_wait(topic, value, key=key, partition=partition,
                                  headers=headers or None)
        finally:
            await p.stop()

    async def read(self, topic: str) -> list[Stored]:
        """Every message of `topic` (the tests read topics they wrote a few messages to)."""
        topic_reader = TopicReader(self.settings, [topic])
        await topic_reader.start()
        out: list[Stored] = []
        try:
            for _ in range(20):
                got = await topic_reader.fetch(500)
                out += [(r.partition, r.key, r.value, list(r.headers)) for r in got]
                if out and not got:
                    break
        finally:
            await topic_reader.stop()
        return sorted(out, key=lambda s: s[0])

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        admin = await open_admin(self.settings)
        try:
            raw = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        return {tp.partition: meta.offset for tp, meta in raw.items()
                if tp.topic == topic and meta.offset >= 0}


class TestKafkaWorkerBusContract(WorkerBusContract):
    @pytest.fixture
    async def env(self, stack: Stack, namespace: str) -> AsyncIterator[KafkaEnv]:
        yield KafkaEnv(Settings(namespace=namespace, cassandra_keyspace=keyspace_of(namespace),
                                cassandra=stack.cassandra, kafka=stack.kafka))
