"""A shard actor stopped past its deadline releases its shard on the real servers: its row
write never returns, the node's graceful stop cancels it after `stop_deadline_ms`, and the
actor commits its shard's last record with no owner through the shard's claimer. The next node
then takes the shard over without fencing anybody and applies the command the first one never
finished."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.core.shard import shard_of
from chronowheel.core.wire import StateRecord
from chronowheel.node.service import Node
from chronowheel.store.base import DueRow, JobRow
from chronowheel.store.cassandra import CassandraStore
from chronowheel.testing.node_process import wait_owned

from tests.integration.harness import applied, make_namespace, now_ms, produce, running_node, upsert

pytestmark = pytest.mark.integration


async def test_a_shard_stopped_past_its_deadline_is_released_and_nobody_is_fenced(
        stack: Any, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = (await make_namespace(stack, namespace, shards=2)).replace(
        stop_deadline_ms=300, stop_drain_ms=60_000)
    shard = shard_of("stuck", 2)
    first = Node(settings, node_id="first")
    await first.start()
    try:
        await wait_owned(first, 2)
        entered, hold = asyncio.Event(), asyncio.Event()
        store = first.store
        put = store.put_dues_and_jobs

        async def held(rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
            if any(job.job_id == "stuck" for _due, _ttl, job in rows):
                entered.set()
                await hold.wait()  # Cassandra never answers this write
            await put(rows)

        store.put_dues_and_jobs = held  # type: ignore[method-assign]
        await produce(settings, [upsert("stuck", at=now_ms() + 60_000)])
        await asyncio.wait_for(entered.wait(), 30)
    finally:
        with caplog.at_level(logging.INFO, logger="chronowheel"):
            await first.shutdown()  # the shard's drain waits for the write: cancelled
    assert any("released at watermark" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    bus = KafkaNodeBus(settings)
    try:
        value = await bus.read_last(settings.state_topic, shard, StateRecord.key(shard), 30_000,
                                    settled=True)
    finally:
        await bus.close()
    assert value is not None and orjson.loads(value)["owner"] is None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chronowheel"):
        async with running_node(settings, node_id="second"):
            await applied(settings)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "fencing its recorded owner" in m], messages
    check = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        assert await check.get_job("stuck") is not None  # applied by the second node
    finally:
        await asyncio.to_thread(check.close)
