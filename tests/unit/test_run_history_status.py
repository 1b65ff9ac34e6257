"""The status `job show`, `jobs list` and the console derive from the run history for a
one-shot whose row still says `scheduled` (`core.runs.shown_status`): after it fired, a later
run of it (a trigger) keeps it `finished`, or `retrying` while that run's retry is to come. A
node and a worker on the in-memory rigs, recording runs."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
from chronowheel.cli.job import describe
from chronowheel.cli.jobs import view as jobs_view
from chronowheel.core import runs
from chronowheel.core.model import encode_trigger
from chronowheel.core.runs import RunRecord, shown_status
from chronowheel.node.service import Node
from chronowheel.ops.runs import read_job_history
from chronowheel.store.base import JobPage, JobSummary
from chronowheel.store.memory_history import MemoryRunHistory
from chronowheel.worker import Occurrence, Worker

from tests.unit.node_rig import T0, NodeRig
from tests.unit.worker_rig import WorkerRig


def test_a_later_run_than_the_pending_instant_reads_as_its_state() -> None:
    trig = f"j@{T0 + 5_000}"  # the shape does not matter here: only the instant and state
    later = RunRecord("j", T0 + 5_000, 1, trig, fired_ms=T0 + 5_000, outcome=runs.SUCCEEDED)
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0, last=later) == "finished"
    retrying = RunRecord("j", T0 + 5_000, 1, trig, fired_ms=T0 + 5_000, outcome=runs.RETRIED)
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=retrying) == "retrying"
    # A run before the pending instant (a trigger before the one-shot is due), none at all,
    # or no pending instant: as stored.
    earlier = RunRecord("j", T0 - 1, 1, trig, fired_ms=T0 - 1, outcome=runs.SUCCEEDED)
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=earlier) == "scheduled"
    assert shown_status("scheduled", recurring=False, scheduled_ms=None,
                        last=later) == "scheduled"


@pytest.fixture
async def rigs() -> AsyncIterator[tuple[NodeRig, WorkerRig, MemoryRunHistory]]:
    # No pacing of the writers: it would sleep in real time, and the rigs' time is manual.
    async with NodeRig(history_writes_per_s=0) as nodes, WorkerRig(node=nodes) as workers:
        yield nodes, workers, MemoryRunHistory(clock=nodes.clock)


async def start(nodes: NodeRig, workers: WorkerRig, history: MemoryRunHistory,
                handler: object) -> tuple[Node, Worker]:
    node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                shards=nodes.settings.shards, node_id="n1", history=history)
    nodes.nodes.append(node)
    await node.start()
    await nodes.settle()
    worker = workers.worker(handler, worker_id="w1")  # type: ignore[arg-type]
    # The rig's stores with a run history added (the rig makes them without one).
    worker._stores = dataclasses.replace(worker._stores, history=history)  # type: ignore[arg-type]
    await workers.during(worker.start())
    return node, worker


async def shown(nodes: NodeRig, node: Node, worker: Worker, history: MemoryRunHistory,
                job_id: str) -> tuple[str, str]:
    """(job show's status, jobs list's status) once every run recorded is written."""
    assert worker.history is not None and node.history is not None
    await worker.history.settled()
    await node.history.settled()
    row = await nodes.store.get_job(job_id)
    assert row is not None and row.status == "scheduled"
    h = await read_job_history(history, job_id, 10)
    listed = jobs_view(JobPage([JobSummary(job_id, row.shard, row.status, None,
                                           row.scheduled_ms, row.version)], None),
                       {job_id: h.counters}, {job_id: h.runs[0]} if h.runs else {})
    return (describe(row, 2, None, nodes.clock.now_ms(), h)["status"],
            listed["jobs"][0]["status"])


async def test_a_one_shot_with_a_later_triggered_run_reads_as_finished(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, workers, history = rigs

    async def handler(occ: Occurrence) -> None:
        return None

    node, worker = await start(nodes, workers, history, handler)
    # A recurring job run now by a trigger (a run at the trigger's instant)...
    nodes.upsert("j", every="1h")
    await nodes.advance(200)
    nodes.submit("j", encode_trigger("j", "rerun-1"))
    await workers.until("the triggered run handled", lambda: worker.stats.succeeded == 1)
    assert worker.history is not None
    await worker.history.settled()
    (triggered,) = (await read_job_history(history, "j", 5)).runs
    # ... then edited into a one-shot due before that instant (already past): it fires at
    # once, and its newest run by instant is still the trigger's, later than its own.
    nodes.upsert("j", at=triggered.scheduled_ms - 100)
    await workers.until("the one-shot handled", lambda: worker.stats.succeeded == 2)
    await worker.history.settled()
    h = await read_job_history(history, "j", 5)
    assert [r.scheduled_ms for r in h.runs] == [triggered.scheduled_ms,
                                                 triggered.scheduled_ms - 100]
    # Was: scheduled (the newest run was not of the pending instant).
    assert await shown(nodes, node, worker, history, "j") == ("finished", "finished")
