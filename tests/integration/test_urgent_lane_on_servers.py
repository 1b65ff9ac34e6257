"""The urgent lane against the real servers: a one-shot due in a few seconds, sent behind a
backlog far larger than the node queues, is found by the look-ahead (read from Kafka, then
the partition sought back) and fires on time, once; every backlog command is stored once and
the committed offset reaches the end."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from chronowheel.testing import Collector

from testkit.fleet import until
from tests.integration.harness import (
    applied,
    make_namespace,
    now_ms,
    produce,
    running_node,
    stored_jobs,
    upsert,
)

pytestmark = pytest.mark.integration


async def test_a_one_shot_due_soon_jumps_a_backlog_the_node_reads_ahead_of(
        stack: Any, namespace: str) -> None:
    base = await make_namespace(stack, namespace, shards=1)
    # A small queue and few writes in flight: the backlog lies mostly in Kafka, beyond what
    # the node holds, and the in-order pass takes seconds over it.
    settings = dataclasses.replace(base, pump_pause_rows=100, pump_resume_rows=50,
                                   ingest_batch=50, ingest_writes_in_flight=2,
                                   urgent_lookahead_records=10_000)
    n = 4_000
    far = now_ms() + 86_400_000
    await produce(settings, [upsert(f"b{i:05d}", at=far + i) for i in range(n)])
    due = now_ms() + 5_000
    await produce(settings, [upsert("soon", at=due, payload="now")])
    collector = Collector(settings, (settings.fired_topic,))
    await collector.start()
    try:
        async with running_node(settings) as node:
            await until(lambda: len(collector.messages) >= 1, 60, "the urgent one-shot to fire")
            # Applied out of turn: the in-order pass had not reached it (it skips it later).
            assert node.metrics.urgent._value.get() == 1
            await until(lambda: node.metrics.ingested.labels("upsert", "stored")._value.get()
                        >= n + 1, 180, f"the node to apply the backlog of {n} jobs")
            await applied(settings, timeout_s=60)
            assert node.metrics.ingested.labels("upsert", "stored")._value.get() == n + 1
        [fired] = collector.messages
        assert fired.key == b"soon" and fired.scheduled_ms == due
        assert fired.received_ms >= due and fired.fired_ms >= due  # never early
    finally:
        await collector.stop()
    rows = await stored_jobs(settings)
    assert rows == n + 1
