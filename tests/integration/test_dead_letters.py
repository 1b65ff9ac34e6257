"""Failure isolation on the dispatch side against a real Kafka: an occurrence larger than its
target topic's max.message.bytes goes to <ns>.dead with the reason; the good occurrences of the
same shard and instant fire on time, once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from aiokafka.admin import NewTopic
from chronowheel.bus.kafka import open_admin, partition_counts
from chronowheel.core.shard import shard_of

from testkit.fleet import until
from tests.integration.harness import (
    collecting,
    make_namespace,
    now_ms,
    produce,
    running_node,
    settled,
    upsert,
)

pytestmark = pytest.mark.integration

LIMIT = 2_000


async def test_an_occurrence_over_the_topics_max_message_bytes_is_dead_lettered(
        stack: Any, namespace: str) -> None:
    target = f"{namespace}-small.jobs"
    settings = await make_namespace(stack, namespace, shards=2,
                                    allowed_topics=f"{namespace}-small\\..*")
    admin = await open_admin(settings)
    try:
        await admin.create_topics([NewTopic(target, 2, 1, topic_configs={
            "max.message.bytes": str(LIMIT)})], timeout_ms=30_000)

        async def visible() -> bool:
            return target in await partition_counts(admin, [target])

        # The creation is answered once the controller has it; the broker's metadata, which
        # the collector's reader asks, can follow a moment later (the CI once found it
        # missing there).
        await until(visible, 30, f"topic {target} in the broker's metadata")
    finally:
        await admin.close()
    ids = [f"job-{i}" for i in range(40) if shard_of(f"job-{i}", 2) == 0]
    huge, good = ids[0], ids[1:9]
    t0 = now_ms()
    at = t0 + 6_000  # one instant for all: one shard, one cycle, one transaction
    records = [upsert(huge, at=at, topic=target, payload="x" * 3_000)]
    # Together more than the topic takes in one batch, each well under its limit.
    records += [upsert(j, at=at, topic=target, payload={"n": i, "pad": "y" * 400})
                for i, j in enumerate(good)]
    async with collecting(settings, target, settings.dead_topic) as seen, \
            running_node(settings) as node:
        await produce(settings, records)
        await seen.wait_for(
            lambda ms: len([m for m in ms if m.topic == target]) >= len(good)
            and any(m.topic == settings.dead_topic for m in ms), 40,
            "the good jobs and the dead letter")
        later = f"{good[0]}-later"
        await produce(settings, [upsert(later, at=now_ms() + 1_000, topic=target,
                                        payload="later")])
        await seen.wait_for(lambda ms: any(m.key == later.encode() for m in ms), 30,
                            "a job submitted after the dead letter")
        # Nothing more of these instants can come: every command applied, every shard's
        # watermark committed past the last instant, the collector read to the end.
        await settled(settings, seen)
        dead_total = node.metrics.registry.get_sample_value(
            "chronowheel_dead_lettered_total", {"reason": "too_large"})
    fired = [m for m in seen.on(target) if m.key != later.encode()]
    assert Counter(m.key for m in fired) == Counter(j.encode() for j in good)
    for m in fired:
        assert m.headers["cw-scheduled-at"] == str(at)
        assert int(m.headers["cw-fired-at"]) >= at, "never early"
        assert m.received_ms - at < 5_000, f"{m.key!r} late by {m.received_ms - at} ms"
        assert orjson.loads(m.value)["pad"] == "y" * 400
    [dead] = seen.on(settings.dead_topic)
    assert dead.key == huge.encode()
    reason = dead.headers["cw-reason"]
    assert reason.startswith("too_large: ") and f"over the {LIMIT} bytes" in reason, reason
    assert dead.headers["cw-error"].startswith("RecordTooLarge: ")
    assert dead.headers["cw-target-topic"] == target
    assert dead.value == b'"' + b"x" * 3_000 + b'"'
    assert dead_total == 1
