"""The run-history queue is bounded by bytes as well as rows (`history_queue_bytes`): what an
append holds (a row's strings and, for a node's committed occurrences, their payloads, kept
until written) counts against it, so a burst of large payloads while Cassandra is slow drops
rows (counted) instead of holding them all in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from chronowheel.core import runs
from chronowheel.core.runs import RunRecord
from chronowheel.history import ROW_BYTES, RunRecorder, record_bytes
from chronowheel.node.service import Node
from chronowheel.store.memory_history import MemoryRunHistory
from prometheus_client import CollectorRegistry

from tests.unit.node_rig import T0, NodeRig


def recorder(store: MemoryRunHistory, **kw: int) -> RunRecorder:
    opts = dict(ttl_s=3600, queue_rows=1_000, batch_rows=10, in_flight=4)
    opts.update(kw)
    return RunRecorder(store, registry=CollectorRegistry(), **opts)


def done(item: int) -> RunRecord:
    return RunRecord("j", T0 + item, outcome=runs.SUCCEEDED)


async def test_items_past_the_byte_bound_are_dropped_and_counted() -> None:
    store = MemoryRunHistory()
    rec = recorder(store, queue_bytes=10 * ROW_BYTES)
    for i in range(4):
        rec.add_item(i, done, 2 * ROW_BYTES)  # four of two rows' worth: 8 of 10
    rec.add_item(4, done, 3 * ROW_BYTES)  # would be 11: dropped
    rec.add_item(5, done, 2 * ROW_BYTES)  # 10: fits
    assert (rec.queued, rec.queued_bytes, rec.dropped) == (5, 10 * ROW_BYTES, 1)
    rec.add(RunRecord("k", T0, outcome=runs.SUCCEEDED))  # full by bytes, not by rows
    assert rec.dropped == 2
    await rec.flush()
    assert (rec.queued, rec.queued_bytes, rec.written) == (0, 0, 5)
    rec.add(RunRecord("k", T0, outcome=runs.SUCCEEDED))  # room again
    assert rec.queued == 1 and rec.queued_bytes == record_bytes(
        RunRecord("k", T0, outcome=runs.SUCCEEDED))


async def test_a_part_keeps_the_rows_its_payloads_leave_room_for() -> None:
    store = MemoryRunHistory()
    rec = recorder(store, queue_bytes=100 * ROW_BYTES, batch_rows=7)
    # 30 rows whose payloads hold 9 rows' worth each: 10 fit in the bound, 20 are dropped.
    rec.add_lazy(list(range(30)), done, 30 * 9 * ROW_BYTES)
    assert (rec.queued, rec.dropped, rec.queued_bytes) == (10, 20, 100 * ROW_BYTES)
    # The writer takes them a batch at a time (splitting the part): the bytes go with them.
    await rec.write_batch()
    assert rec.queued == 3 and rec.queued_bytes == 30 * ROW_BYTES
    rec.add_lazy(list(range(30, 40)), done)  # ten small ones: room for them now
    assert rec.queued == 13 and rec.dropped == 20
    await rec.flush()
    assert (rec.queued, rec.queued_bytes, rec.written) == (0, 0, 20)


def test_the_byte_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="queue_bytes"):
        recorder(MemoryRunHistory(), queue_bytes=ROW_BYTES - 1)


@pytest.fixture
async def nodes() -> AsyncIterator[NodeRig]:
    async with NodeRig(history_writes_per_s=0) as rig:
        yield rig


async def test_a_burst_of_large_payloads_is_held_within_the_bound_while_history_is_stuck(
        nodes: NodeRig) -> None:
    gate = asyncio.Event()

    async def stuck() -> None:  # Cassandra not answering
        await gate.wait()

    history = MemoryRunHistory(clock=nodes.clock, delay=stuck)
    bound = 64 << 10
    nodes.settings = nodes.settings.replace(history_queue_bytes=bound, history_batch_rows=1)
    node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                shards=nodes.settings.shards, node_id="n1", history=history)
    nodes.nodes.append(node)
    await node.start()
    await nodes.settle()
    blob = "x" * 10_000
    for i in range(20):
        nodes.upsert(f"big-{i}", at=T0 + 1_000 + i, payload={"blob": blob})
    await nodes.advance(2_000)
    assert len(nodes.fired()) == 20  # every occurrence published, on time
    rec = node.history
    assert rec is not None
    # 20 payloads of 10 kB: about six fit in 64 kB; at most one more in the writer's hands.
    assert rec.queued_bytes <= bound
    assert rec.written == 0 and 4 <= rec.queued <= 7 and rec.dropped >= 12
    assert 19 <= rec.queued + rec.dropped <= 20
    gate.set()
    await rec.settled()
    assert rec.written + rec.dropped == 20 and rec.queued_bytes == 0
