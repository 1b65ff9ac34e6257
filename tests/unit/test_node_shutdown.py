"""A graceful stop leaves the node group as soon as its shards are released, before the slow
parts of the stop (the run history's flush), so the other nodes take the shards over at once;
and the run history it writes last loses nothing, not even the batch its writer holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from chronowheel.core import runs
from chronowheel.core.runs import RunRecord
from chronowheel.history import RunRecorder
from chronowheel.node.service import Node
from chronowheel.store.memory_history import MemoryRunHistory
from prometheus_client import CollectorRegistry

from tests.unit.node_rig import T0, NodeRig
from tests.unit.test_node_fencing import state_records


@pytest.fixture
async def nodes() -> AsyncIterator[NodeRig]:
    async with NodeRig(history_writes_per_s=0) as rig:
        yield rig


async def test_the_group_is_left_before_the_history_flush_ends(nodes: NodeRig) -> None:
    gate = asyncio.Event()

    async def stuck() -> None:  # Cassandra not answering the run history's writes
        await gate.wait()

    history = MemoryRunHistory(clock=nodes.clock, delay=stuck)
    node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                shards=nodes.settings.shards, node_id="n1", history=history)
    await node.start()
    await nodes.settle()
    member = nodes.bus.members[node.group_id][-1]
    assert member.assigned() == set(range(nodes.settings.shards))
    for i in range(10):
        nodes.upsert(f"job-{i}", at=T0 + 1_000 + i)
    await nodes.advance(2_000)
    assert len(nodes.fired()) == 10
    recorder = node.history
    assert recorder is not None and recorder.queued > 0  # runs wait for the stuck store

    stopping = asyncio.create_task(node.shutdown())
    await nodes.settle()
    # The shards were released (the final commit names no owner) and the group left, while
    # the stop still waits for the history flush.
    assert not stopping.done()
    assert member.assigned() == set()
    assert node.owned == {}
    for k in range(nodes.settings.shards):
        assert state_records(nodes, k)[-1]["owner"] is None
    gate.set()
    await stopping
    assert (recorder.written, recorder.dropped, recorder.queued) == (10, 0, 0)


async def test_drain_writes_the_batch_the_writer_holds() -> None:
    """A stop drains the run history with its writer task running: cancelling the writer and
    then flushing lost the batch the writer held (the node's and the worker's stops did)."""
    gate = asyncio.Event()

    async def stuck() -> None:
        await gate.wait()

    store = MemoryRunHistory(delay=stuck)
    rec = RunRecorder(store, registry=CollectorRegistry(), ttl_s=3600, queue_rows=100,
                      batch_rows=2, in_flight=1, writes_per_s=1)
    writer = asyncio.create_task(rec.run())
    for i in range(5):
        rec.add(RunRecord(f"j{i}", T0, outcome=runs.SUCCEEDED))
    while store.in_flight == 0:  # the writer took its first batch and waits for the store
        await asyncio.sleep(0)
    draining = asyncio.create_task(rec.drain())
    await asyncio.sleep(0)
    assert not draining.done()
    gate.set()
    await draining
    assert (rec.written, rec.queued, rec.dropped) == (5, 0, 0)
    assert rec.writes_per_s == 0  # drained unpaced
    writer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await writer


async def test_the_history_queue_starts_going_out_before_the_shards_are_released(
        nodes: NodeRig) -> None:
    node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                shards=nodes.settings.shards, node_id="n1", history=MemoryRunHistory())
    await node.start()
    await nodes.settle()
    recorder = node.history
    assert recorder is not None
    order: list[str] = []
    hurry, stop_shards = recorder.hurry, node.registry.stop_shards

    def hurried() -> None:
        order.append("history hurried")
        hurry()

    async def stopping(*args: Any, **kwargs: Any) -> None:
        order.append("shards released")
        await stop_shards(*args, **kwargs)

    recorder.hurry = hurried  # type: ignore[method-assign]
    node.registry.stop_shards = stopping  # type: ignore[method-assign]
    await node.shutdown()
    assert order[:2] == ["history hurried", "shards released"]


async def test_a_static_member_fires_on_while_its_history_goes_out_and_releases_after() -> None:
    """With static membership nobody takes a stopping node's shards over until it is back, so
    they wait for its whole restart: the history queued so far goes out while they still fire,
    and they are released after it, instead of waiting for that write."""
    gate = asyncio.Event()

    async def held() -> None:  # Cassandra answering the history's writes only when let
        await gate.wait()

    async with NodeRig(history_writes_per_s=0, node_instance_id="node-0") as rig:
        history = MemoryRunHistory(clock=rig.clock, delay=held)
        node = Node(rig.settings, clock=rig.clock, store=rig.store, bus=rig.bus,
                    shards=rig.settings.shards, node_id="n1", history=history)
        await node.start()
        await rig.settle()
        for i in range(10):
            rig.upsert(f"job-{i}", at=T0 + 1_000 + i)
        await rig.advance(2_000)
        assert len(rig.fired()) == 10
        member = rig.bus.members[node.group_id][-1]

        stopping = asyncio.create_task(node.shutdown())
        await rig.settle()
        # The history's writes are held: the shards are still owned, and they still fire.
        assert not stopping.done()
        assert sorted(node.owned) == list(range(rig.settings.shards))
        assert member.assigned() == set(range(rig.settings.shards))
        rig.upsert("during-the-stop", at=T0 + 2_500)
        await rig.advance(1_000)
        assert len(rig.fired()) == 11
        gate.set()
        await stopping
        assert node.owned == {}
        for k in range(rig.settings.shards):
            assert state_records(rig, k)[-1]["owner"] is None
        # Every run reached the history: those queued before the stop, and the one during it.
        assert len(await history.job_runs("during-the-stop", 10)) == 1
        assert all([len(await history.job_runs(f"job-{i}", 10)) == 1 for i in range(10)])


async def test_a_static_member_releases_its_shards_when_the_history_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def never() -> None:  # Cassandra not answering the history at all
        await asyncio.Event().wait()

    monkeypatch.setattr("chronowheel.node.service.HISTORY_FLUSH_S", 0)  # its bound, at once
    async with NodeRig(history_writes_per_s=0, node_instance_id="node-0") as rig:
        node = Node(rig.settings, clock=rig.clock, store=rig.store, bus=rig.bus,
                    shards=rig.settings.shards, node_id="n1",
                    history=MemoryRunHistory(clock=rig.clock, delay=never))
        await node.start()
        await rig.settle()
        rig.upsert("job", at=T0 + 1_000)
        await rig.advance(2_000)
        await asyncio.wait_for(node.shutdown(), 5)
        assert node.owned == {}
        for k in range(rig.settings.shards):
            assert state_records(rig, k)[-1]["owner"] is None
