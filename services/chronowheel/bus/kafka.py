"""Kafka access: topic administration and producer/consumer factories over aiokafka.

aiokafka marks its transient errors with `retriable = True`, which the shared retry policy reads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from chronowheel.errors import ConfigError, RetriableError
from chronowheel.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


def namespace_topics(settings: Settings, shards: int, replication: int) -> list[TopicSpec]:
    del replication  # same for all; passed to create_topics
    return [
        TopicSpec(settings.submit_topic, shards),
        # Compacted, with short segments so a takeover reads little more than the latest
        # watermark of its partition even after months of commits.
        TopicSpec(settings.state_topic, shards, {
            "cleanup.policy": "compact", "segment.ms": "600000",
            "min.cleanable.dirty.ratio": "0.1", "delete.retention.ms": "3600000"}),
        TopicSpec(settings.fired_topic, shards),
        TopicSpec(settings.rejected_topic, 1),
        TopicSpec(settings.dead_topic, 1),
    ]


async def open_admin(settings: Settings) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka, request_timeout_ms=15000)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        await admin.close()
        raise RetriableError(f"cannot reach Kafka at {settings.kafka}: {exc}") from exc
    return admin


async def partition_counts(admin: AIOKafkaAdminClient, names: Iterable[str]) -> dict[str, int]:
    """Partition count of each named topic that exists."""
    wanted = set(names)
    existing = set(await admin.list_topics()) & wanted
    if not existing:
        return {}
    out: dict[str, int] = {}
    for desc in await admin.describe_topics(sorted(existing)):
        if desc.get("error_code", 0) == 0:
            out[desc["topic"]] = len(desc["partitions"])
    return out


async def ensure_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec],
                        replication: int) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    counts = await partition_counts(admin, (s.name for s in specs))
    missing = [s for s in specs if s.name not in counts]
    for s in specs:
        if s.name in counts and counts[s.name] != s.partitions:
            raise ConfigError(f"topic {s.name} has {counts[s.name]} partitions, "
                              f"expected {s.partitions}")
    if not missing:
        return []
    new = [NewTopic(s.name, s.partitions, replication, topic_configs=dict(s.config))
           for s in missing]
    # A concurrent init may win the race: fine, creation is idempotent.
    with contextlib.suppress(TopicAlreadyExistsError):
        await admin.create_topics(new, timeout_ms=30000)
    return [s.name for s in missing]


def transactional_producer(settings: Settings, transactional_id: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka,
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        linger_ms=2,
        max_batch_size=1 << 20,
        max_request_size=4 << 20,
        request_timeout_ms=30000,
        transaction_timeout_ms=60000,
    )


def plain_producer(settings: Settings, *, linger_ms: int = 5) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka,
        enable_idempotence=True,
        acks="all",
        linger_ms=linger_ms,
        max_batch_size=1 << 20,
        max_request_size=4 << 20,
    )


def group_consumer(settings: Settings, group_id: str, *topics: str,
                   session_timeout_ms: int = 10000, **kw: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka,
        group_id=group_id,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(500, session_timeout_ms // 5),
        max_poll_interval_ms=300000,
        **kw,
    )


def reader(settings: Settings, **kw: Any) -> AIOKafkaConsumer:
    """A group-less read_committed consumer for assigned partitions (state, tail)."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka,
        group_id=None,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **kw,
    )
