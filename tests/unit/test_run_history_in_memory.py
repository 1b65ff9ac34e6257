"""Run history and per-job counters without servers: the storage contract in memory, the
outcome vocabulary, the recorder's batches, bounded queue and drop counting, and a node and a
worker recording each run (a one-shot then reads as finished)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from chronowheel.cli.job import describe, render, render_history
from chronowheel.cli.jobs import view as jobs_view
from chronowheel.core import runs
from chronowheel.core.clock import ManualClock
from chronowheel.core.runs import RunCounters, RunRecord, counter_deltas, shown_status
from chronowheel.errors import ConfigError, RetriableError
from chronowheel.history import RunRecorder, run_groups
from chronowheel.node.service import Node
from chronowheel.ops.runs import read_job_history
from chronowheel.settings import Settings
from chronowheel.store.base import JobPage, JobRow, JobSummary, Permits
from chronowheel.store.memory_history import MemoryRunHistory
from chronowheel.worker import Occurrence, Worker
from prometheus_client import CollectorRegistry

from tests.contract.run_history import PassTime, RunHistoryContract
from tests.unit.node_rig import T0, NodeRig
from tests.unit.worker_rig import WorkerRig


def alone(key: bytes) -> list[str]:
    """A token map of a large cluster: every job's partition has replicas of its own."""
    return [key.decode()]


class TestMemoryRunHistoryContract(RunHistoryContract):
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(T0)

    @pytest.fixture
    def history(self, clock: ManualClock) -> MemoryRunHistory:
        return MemoryRunHistory(clock=clock)

    @pytest.fixture
    def pass_time(self, clock: ManualClock) -> PassTime:
        async def advance(seconds: float) -> None:
            clock.advance(int(seconds * 1000))
        return advance


class TestMemoryRunHistoryContractOnALargeCluster(TestMemoryRunHistoryContract):
    """The same with a token map where every job has replicas of its own: a write of several
    jobs is a request each."""

    @pytest.fixture
    def history(self, clock: ManualClock) -> MemoryRunHistory:
        return MemoryRunHistory(clock=clock, replicas_of=alone)


# --- the vocabulary ---------------------------------------------------------------------------
def test_each_outcome_adds_to_its_counters() -> None:
    fired = RunRecord("j", T0, fired_ms=T0 + 3, lateness_ms=3, node_id="n")
    assert counter_deltas(fired) == {"fired": 1}
    expected = {runs.SUCCEEDED: {"succeeded": 1}, runs.RETRIED: {"failed": 1},
                runs.FAILED: {"failed": 1},
                runs.DEAD_LETTERED: {"failed": 1, "dead_lettered": 1},
                runs.SKIPPED: {"skipped": 1}, runs.MISSED: {"missed": 1},
                runs.CANCELLED: {}}
    assert set(expected) == set(runs.OUTCOMES)
    for outcome, deltas in expected.items():
        assert counter_deltas(RunRecord("j", T0, outcome=outcome)) == deltas, outcome
    with pytest.raises(ValueError, match="not one of"):
        RunRecord("j", T0, outcome="exploded")


def test_a_run_reads_pending_then_fired_then_its_outcome() -> None:
    r = RunRecord("j", T0)
    assert r.state == "pending" and r.occurrence == f"j@{T0}"
    r = r.merged(RunRecord("j", T0, fired_ms=T0 + 1))
    assert r.state == runs.FIRED
    r = r.merged(RunRecord("j", T0, started_ms=T0 + 5, ended_ms=T0 + 9,
                           outcome=runs.SUCCEEDED))
    assert (r.state, r.fired_ms, r.duration_ms) == (runs.SUCCEEDED, T0 + 1, 4)
    with pytest.raises(ValueError, match="cannot merge"):
        r.merged(RunRecord("j", T0, 2))


def test_a_one_shot_with_a_run_at_its_instant_reads_as_finished() -> None:
    done = RunRecord("j", T0, fired_ms=T0, outcome=runs.SUCCEEDED)
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0, last=done) == "finished"
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=RunRecord("j", T0, fired_ms=T0)) == "finished"
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=RunRecord("j", T0, outcome=runs.MISSED)) == "finished"
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=RunRecord("j", T0, outcome=runs.RETRIED)) == "retrying"
    # Attempt 2 published, not yet handled: still retrying; handled: finished.
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=RunRecord("j", T0, 2, fired_ms=T0 + 900)) == "retrying"
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0,
                        last=RunRecord("j", T0, 2, fired_ms=T0 + 900,
                                       outcome=runs.SUCCEEDED)) == "finished"
    # Not yet run, an earlier instant (re-armed since), a recurring job, a paused one: as stored.
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0, last=None) == "scheduled"
    assert shown_status("scheduled", recurring=False, scheduled_ms=T0 + 1,
                        last=done) == "scheduled"
    assert shown_status("scheduled", recurring=True, scheduled_ms=T0, last=done) == "scheduled"
    assert shown_status("paused", recurring=False, scheduled_ms=T0, last=done) == "paused"


# --- the recorder -----------------------------------------------------------------------------
def recorder(store: MemoryRunHistory, registry: CollectorRegistry | None = None,
             **kw: int) -> RunRecorder:
    opts = dict(ttl_s=3600, queue_rows=100, batch_rows=10, in_flight=4)
    opts.update(kw)
    return RunRecorder(store, registry=registry or CollectorRegistry(), **opts)


async def test_a_batch_writes_its_jobs_runs_in_one_request_and_their_counters_in_another() -> None:
    store = MemoryRunHistory()
    rec = recorder(store, batch_rows=5)
    for i in range(3):
        rec.add(RunRecord("a", T0 + i, fired_ms=T0 + i))
    rec.add_lazy([("b", T0), ("b", T0 + 1), ("c", T0)],
                 lambda item: RunRecord(item[0], item[1], outcome=runs.SUCCEEDED))
    assert rec.queued == 6 and store.writes == 0  # nothing written on the caller's path
    await rec.write_batch()  # five rows: a a a b b
    assert rec.queued == 1 and rec.written == 5
    assert store.writes == 2  # runs of a and b, counters of a and b
    assert store.counts == {"a": {"fired": 3}, "b": {"succeeded": 2}}
    await rec.flush()
    assert rec.queued == 0 and rec.written == 6 and store.counts["c"] == {"succeeded": 1}
    assert [r.scheduled_ms for r in await store.job_runs("a", 10)] == [T0 + 2, T0 + 1, T0]


async def test_a_request_writes_at_most_ten_jobs_and_about_4000_bytes() -> None:
    store = MemoryRunHistory()
    rec = recorder(store, batch_rows=100)
    for i in range(25):  # 25 jobs, a run each: three requests of runs, three of counters
        rec.add(RunRecord(f"j{i}", T0, fired_ms=T0))
    await rec.write_batch()
    assert store.writes == 6 and rec.written == 25
    assert all(store.counts[f"j{i}"] == {"fired": 1} for i in range(25))
    # One job's runs over the bytes of a request go in several: 30 runs with 300-byte errors
    # (about 460 bytes a row as Cassandra sizes a batch) in four requests, and one of counters.
    big = [RunRecord("k", T0 + i, outcome=runs.FAILED, error="e" * 300) for i in range(30)]
    groups = run_groups({"k": big})
    assert [len(g["k"]) for g in groups] == [8, 8, 8, 6]
    for r in big:
        rec.add(r)
    await rec.write_batch()
    assert store.writes == 6 + 5 and len(await store.job_runs("k", 100)) == 30


async def test_a_full_queue_drops_and_counts_and_never_waits() -> None:
    gate = asyncio.Event()

    async def stuck() -> None:  # Cassandra not answering
        await gate.wait()

    store = MemoryRunHistory(delay=stuck)
    registry = CollectorRegistry()
    rec = recorder(store, registry, queue_rows=5, batch_rows=2)
    task = asyncio.ensure_future(rec.run())
    try:
        for i in range(4):
            rec.add(RunRecord("a", T0 + i, fired_ms=T0))
        await asyncio.sleep(0)  # the writer takes two rows and waits on the store
        assert rec.queued == 2
        rec.add_lazy(list(range(4)), lambda i: RunRecord("b", T0 + i, fired_ms=T0))
        rec.add(RunRecord("c", T0, fired_ms=T0))
        assert rec.queued == 5 and rec.dropped == 2  # b's last one and c's
        metrics = {s.name + str(s.labels): s.value
                   for fam in registry.collect() for s in fam.samples}
        assert metrics["chronowheel_history_rows_total{'outcome': 'dropped'}"] == 2
        assert metrics["chronowheel_history_queue_rows{}"] == 5
        gate.set()
        await rec.settled()
        assert rec.written == 7 and rec.queued == 0
        assert sorted(r.scheduled_ms for r in await store.job_runs("b", 10)) == [
            T0, T0 + 1, T0 + 2]
    finally:
        task.cancel()


async def test_a_failed_write_is_counted_and_the_writer_goes_on() -> None:
    class Flaky(MemoryRunHistory):
        async def write_runs_of_jobs(self, runs_: Any, ttl_s: int,
                                     permits: Permits | None = None) -> int:
            if "bad" in runs_:
                raise RetriableError("write a run: WriteTimeout")
            return await super().write_runs_of_jobs(runs_, ttl_s, permits)

    store = Flaky()
    rec = recorder(store, batch_rows=1)
    rec.add(RunRecord("bad", T0, fired_ms=T0))
    rec.add(RunRecord("good", T0, fired_ms=T0))
    await rec.flush()
    assert (rec.failed, rec.written) == (1, 1)
    assert [r.job_id for r in await store.job_runs("good", 5)] == ["good"]
    rec.add(RunRecord("good", T0 + 1, fired_ms=T0))
    await rec.flush()
    assert rec.written == 2
    # A request of several jobs fails as a whole: each of its rows is counted.
    rec.batch_rows = 10
    rec.add(RunRecord("bad", T0 + 1, fired_ms=T0))
    rec.add(RunRecord("other", T0, fired_ms=T0))
    await rec.flush()
    assert (rec.failed, rec.written) == (3, 2)


@asynccontextmanager
async def paced_writer(store: MemoryRunHistory, writes_per_s: int, jobs: int,
                       pauses: int = 1, round_s: float = 0.0
                       ) -> AsyncIterator[tuple[RunRecorder, list[float]]]:
    """A writer paced at `writes_per_s` on a clock that stands still, with a run each of
    `jobs` jobs queued, held in its `pauses`-th pause (the ones before it return at once):
    yields it and the pauses it asked for (seconds), and ends it on leaving."""
    slept: list[float] = []
    held = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == pauses:
            held.set()
            await asyncio.Event().wait()  # the test ends the writer here

    rec = RunRecorder(store, ttl_s=60, queue_rows=100, batch_rows=100, in_flight=4,
                      writes_per_s=writes_per_s, round_s=round_s, monotonic=lambda: 0.0,
                      sleep=sleep)
    for job in range(jobs):
        rec.add(RunRecord(f"j{job}", T0, fired_ms=T0))
    task = asyncio.ensure_future(rec.run())
    try:
        await asyncio.wait_for(held.wait(), 5)
        yield rec, slept
    finally:
        task.cancel()


async def test_the_writer_keeps_to_its_request_rate() -> None:
    store = MemoryRunHistory()
    async with paced_writer(store, writes_per_s=4, jobs=12) as (_rec, slept):
        # Twelve jobs: two requests of runs (ten jobs and two) and two of counters, at four
        # a second.
        assert slept == [1.0] and store.writes == 4


async def test_a_paced_writer_takes_about_a_second_of_requests_at_a_time() -> None:
    store = MemoryRunHistory()
    async with paced_writer(store, writes_per_s=2, jobs=25, pauses=2) as (rec, slept):
        # Two requests a second: ten rows (one request of runs, one of counters) a batch and
        # a second's pause after each, not 25 rows (six requests) and three seconds.
        assert slept == [1.0, 1.0] and store.writes == 4 and rec.queued == 5


async def test_the_rate_counts_each_request_a_write_splits_into_by_replicas() -> None:
    store = MemoryRunHistory(replicas_of=alone)
    async with paced_writer(store, writes_per_s=4, jobs=12) as (_rec, slept):
        # Twelve jobs of twelve replica sets: four writes (runs of ten jobs and of two, their
        # counters likewise) are 24 requests to Cassandra, six seconds at four a second.
        assert store.writes == 24 and slept == [6.0]


async def test_a_paced_batch_is_sized_by_the_requests_a_row_took() -> None:
    store = MemoryRunHistory(replicas_of=alone)
    async with paced_writer(store, writes_per_s=10, jobs=70, pauses=2) as (rec, slept):
        # At first two requests per ten rows (one node): 50 rows, which took 100 requests
        # here (ten seconds). Two a row from then on: the next batch is ten rows (its floor),
        # 20 requests, not another 50.
        assert slept == [10.0, 2.0] and store.writes == 120 and rec.queued == 10


async def test_batches_start_a_round_apart_when_the_rate_allows_more() -> None:
    store = MemoryRunHistory()
    async with paced_writer(store, writes_per_s=0, jobs=3, round_s=0.5) as (_rec, slept):
        # No cap on the rate: without rounds the writer would go on at once; with them it
        # waits out the rest of the round before its next batch.
        assert slept == [0.5] and store.writes == 2


async def test_the_pace_wins_over_a_shorter_round() -> None:
    store = MemoryRunHistory()
    async with paced_writer(store, writes_per_s=1, jobs=3, round_s=0.5) as (_rec, slept):
        # Two requests at one a second: two seconds, longer than the round.
        assert slept == [2.0] and store.writes == 2


@pytest.mark.parametrize("round_ms", [-1, 10_001])
def test_a_round_out_of_range_is_refused_with_its_name_and_bounds(round_ms: int) -> None:
    with pytest.raises(ConfigError, match=rf"history_round_ms: must be 0 to 10000 .*{round_ms}"):
        Settings(namespace="unit", history_round_ms=round_ms)
    with pytest.raises(ValueError, match="round_s"):
        RunRecorder(MemoryRunHistory(), ttl_s=60, queue_rows=10, batch_rows=10, in_flight=1,
                    round_s=-0.001)


async def test_a_drain_writes_everything_without_waiting_for_rounds() -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:  # a round would hold the writer here for good
        pauses.append(seconds)
        await asyncio.Event().wait()

    store = MemoryRunHistory()
    rec = RunRecorder(store, ttl_s=60, queue_rows=100, batch_rows=2, in_flight=4,
                      round_s=0.5, monotonic=lambda: 0.0, sleep=sleep)
    for job in range(6):
        rec.add(RunRecord(f"j{job}", T0, fired_ms=T0))
    task = asyncio.ensure_future(rec.run())
    try:
        # Three batches of two: at a stop they go one after the other, no round between.
        await asyncio.wait_for(rec.drain(), 5)
    finally:
        task.cancel()
    assert (rec.written, rec.queued, pauses) == (6, 0, [])


async def test_a_drain_ends_the_pause_the_writer_is_in() -> None:
    store = MemoryRunHistory()
    async with paced_writer(store, writes_per_s=0, jobs=12, round_s=0.5) as (rec, slept):
        rec.batch_rows = 10
        rec.add(RunRecord("late", T0, fired_ms=T0))
        # Held in its round's pause (a sleep that never ends here): a stop does not wait it
        # out.
        await asyncio.wait_for(rec.drain(), 5)
        assert slept == [0.5] and rec.written == 13 and rec.queued == 0


async def test_hurry_ends_the_pause_and_drops_the_pace_without_waiting() -> None:
    store = MemoryRunHistory()
    async with paced_writer(store, writes_per_s=1, jobs=12, round_s=0.5) as (rec, slept):
        rec.batch_rows = 10
        rec.add(RunRecord("late", T0, fired_ms=T0))
        assert slept == [2.0] and rec.queued > 0  # held in a pause that never ends here
        rec.hurry()  # returns at once: a stop goes on with its other steps meanwhile
        assert rec.writes_per_s == 0 and rec.round_s == 0.0
        await asyncio.wait_for(rec.settled(), 5)
        assert (rec.written, rec.queued, slept) == (13, 0, [2.0])


async def test_caught_up_waits_for_the_rows_queued_before_it_not_for_later_ones() -> None:
    store = MemoryRunHistory()
    rec = RunRecorder(store, ttl_s=60, queue_rows=10_000, batch_rows=2, in_flight=1)
    for job in range(5):
        rec.add(RunRecord(f"before{job}", T0, fired_ms=T0))

    async def firing() -> None:  # the node goes on firing: a run at every turn of the loop
        n = 0
        while True:
            rec.add(RunRecord(f"after{n}", T0, fired_ms=T0))
            n += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(rec.run())
    feeder = asyncio.ensure_future(firing())
    try:
        # Never idle while rows keep coming, so `settled` would not return; this does.
        await asyncio.wait_for(rec.caught_up(), 5)
        for job in range(5):
            assert len(await store.job_runs(f"before{job}", 10)) == 1
        assert rec.queued > 0  # later runs still wait
    finally:
        feeder.cancel()
        task.cancel()


async def test_caught_up_is_not_fooled_by_two_batches_in_flight_at_once() -> None:
    # A flush beside the writer task: the second batch takes its rows while the first one
    # waits on the store; the first one ending does not put the second's rows through.
    gates = [asyncio.Event() for _ in range(4)]  # each batch: its runs' request, its counters'
    waiting = list(gates)

    async def held() -> None:
        await waiting.pop(0).wait()

    store = MemoryRunHistory(delay=held)
    rec = RunRecorder(store, ttl_s=60, queue_rows=100, batch_rows=2, in_flight=4)
    for job in range(4):
        rec.add(RunRecord("j", T0 + job, fired_ms=T0))  # one job: a request of runs a batch
    catching_up = asyncio.ensure_future(rec.caught_up())
    first = asyncio.ensure_future(rec.write_batch())
    while store.in_flight < 2:  # the first batch took two rows and waits on the store
        await asyncio.sleep(0)
    second = asyncio.ensure_future(rec.write_batch())
    while store.in_flight < 4:  # the second took the other two and waits too
        await asyncio.sleep(0)
    gates[0].set()
    gates[1].set()
    await first
    await asyncio.sleep(0)
    assert not catching_up.done()  # the second batch's rows are still on their way
    gates[2].set()
    gates[3].set()
    await second
    await asyncio.wait_for(catching_up, 5)
    assert rec.written == 4


async def test_caught_up_counts_a_failed_batch_as_through() -> None:
    async def refused() -> None:
        raise RetriableError("Cassandra timed out")

    store = MemoryRunHistory(delay=refused)
    rec = RunRecorder(store, ttl_s=60, queue_rows=100, batch_rows=2, in_flight=1)
    for job in range(3):
        rec.add(RunRecord(f"j{job}", T0, fired_ms=T0))
    task = asyncio.ensure_future(rec.run())
    try:
        await asyncio.wait_for(rec.caught_up(), 5)  # a stop is not held by a failing store
        assert (rec.failed, rec.written, rec.queued) == (3, 0, 0)
    finally:
        task.cancel()


async def test_the_requests_in_flight_are_bounded_however_the_writes_split() -> None:
    gate = asyncio.Event()
    full = asyncio.Event()

    async def slow() -> None:  # Cassandra answering once the test says so
        if store.in_flight >= 4:
            full.set()
        await gate.wait()

    store = MemoryRunHistory(replicas_of=alone, delay=slow)
    rec = recorder(store, batch_rows=100, in_flight=4)
    for job in range(40):
        rec.add(RunRecord(f"j{job}", T0, fired_ms=T0))
    flushed = asyncio.ensure_future(rec.flush())
    try:
        await asyncio.wait_for(full.wait(), 5)
        gate.set()
        await asyncio.wait_for(flushed, 5)
    finally:
        flushed.cancel()
    # Forty jobs of forty replica sets: four writes of runs and four of counters, ten
    # requests each. Four in flight at most, not four writes (40 requests).
    assert store.writes == 80 and rec.written == 40
    assert store.most_in_flight == 4 and store.in_flight == 0


# --- a node and a worker recording runs --------------------------------------------------------
@pytest.fixture
async def rigs() -> AsyncIterator[tuple[NodeRig, WorkerRig, MemoryRunHistory]]:
    # No pacing of the writers: it would sleep in real time, and the rigs' time is manual.
    async with NodeRig(history_writes_per_s=0) as nodes, WorkerRig(node=nodes) as workers:
        yield nodes, workers, MemoryRunHistory(clock=nodes.clock)


async def start_node(nodes: NodeRig, history: MemoryRunHistory) -> Node:
    node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                shards=nodes.settings.shards, node_id="n1", history=history)
    nodes.nodes.append(node)
    await node.start()
    await nodes.settle()
    return node


async def start_worker(workers: WorkerRig, history: MemoryRunHistory,
                       handler: object) -> Worker:
    worker = workers.worker(handler, worker_id="w1")  # type: ignore[arg-type]
    # The rig's stores with a run history added (the rig makes them without one).
    worker._stores = dataclasses.replace(worker._stores, history=history)  # type: ignore[arg-type]
    await workers.during(worker.start())
    return worker


async def test_a_one_shot_and_a_failing_job_are_recorded_with_their_outcomes(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, workers, history = rigs

    async def handler(occ: Occurrence) -> None:
        if occ.job_id.startswith("bad"):
            raise RuntimeError(f"no such account (attempt {occ.attempt})")

    await start_node(nodes, history)
    worker = await start_worker(workers, history, handler)
    nodes.upsert("good-1", at=T0 + 1_000)
    nodes.upsert("bad-1", at=T0 + 1_000, max_attempts=2, backoff="1s")
    await workers.until("bad-1's last attempt", lambda: worker.stats.dead == 1)
    assert worker.history is not None
    await worker.history.settled()
    await nodes.nodes[0].history.settled()  # type: ignore[union-attr]

    good = await read_job_history(history, "good-1", 10)
    (run,) = good.runs
    assert (run.state, run.attempt, run.node_id, run.worker_id) == (runs.SUCCEEDED, 1, "n1",
                                                                    "w1")
    assert run.fired_ms is not None and run.fired_ms >= T0 + 1_000
    assert run.lateness_ms == run.fired_ms - (T0 + 1_000)
    assert run.started_ms is not None and run.ended_ms is not None
    assert run.fired_ms <= run.started_ms <= run.ended_ms
    assert good.counters == RunCounters(fired=1, succeeded=1, last_outcome=runs.SUCCEEDED)

    bad = await read_job_history(history, "bad-1", 10)
    assert [(r.attempt, r.state) for r in bad.runs] == [(2, runs.DEAD_LETTERED),
                                                         (1, runs.RETRIED)]
    assert bad.runs[0].error == "RuntimeError: no such account (attempt 2)"
    assert bad.counters == RunCounters(fired=2, failed=2, dead_lettered=1,
                                       last_outcome=runs.DEAD_LETTERED)

    # `job show` and `jobs list`: the fired one-shot reads as finished, with its counters.
    row = await nodes.store.get_job("good-1")
    assert row is not None and row.status == "scheduled"
    shown = describe(row, 2, None, nodes.clock.now_ms(), good)
    assert (shown["status"], shown["stored_status"]) == ("finished", "scheduled")
    assert shown["counters"]["succeeded"] == 1 and shown["last_run"]["state"] == "succeeded"
    assert "finished (stored: scheduled" in render(shown, nodes.clock.now_ms())
    listed = jobs_view(JobPage([JobSummary("good-1", row.shard, row.status, None,
                                           row.scheduled_ms, row.version)], None),
                       {"good-1": good.counters}, {"good-1": good.runs[0]})
    assert listed["jobs"][0]["status"] == "finished"
    assert listed["jobs"][0]["counters"]["fired"] == 1
    table = render_history(bad)
    assert "dead-lettered" in table and "retried" in table and "RuntimeError" in table


async def test_history_that_cannot_be_written_does_not_hold_firing_back(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, _, _ = rigs
    gate = asyncio.Event()

    async def stuck() -> None:
        await gate.wait()

    history = MemoryRunHistory(clock=nodes.clock, delay=stuck)
    nodes.settings = nodes.settings.replace(history_queue_rows=3, history_batch_rows=1)
    node = await start_node(nodes, history)
    for i in range(6):
        nodes.upsert(f"tick-{i}", at=T0 + 1_000 + i)
    await nodes.advance(2_000)
    assert len(nodes.fired()) == 6  # every occurrence published, on time
    recorder_ = node.history
    assert recorder_ is not None
    # At most one row in the writer's hands (waiting on the store) and three queued: the
    # rest was dropped and counted.
    assert recorder_.written == 0 and recorder_.queued <= 3 and recorder_.dropped >= 2
    assert recorder_.queued + recorder_.dropped == 5
    gate.set()
    await recorder_.settled()
    assert recorder_.written + recorder_.dropped == 6 and recorder_.written >= 1


def test_a_job_without_runs_shows_empty_history() -> None:
    from chronowheel.core.runs import JobHistory

    text = render_history(JobHistory("j", [], RunCounters()))
    assert "no runs recorded" in text and "fired 0" in text
    shown = describe(JobRow("j", 0, b'{"id":"j","at":1}', 1, "scheduled", T0, T0), 2, None, T0,
                     JobHistory("j", [], RunCounters()))
    assert shown["status"] == "scheduled" and shown["last_run"] is None


async def test_counts_without_a_run_go_with_the_next_batch() -> None:
    store = MemoryRunHistory()
    rec = recorder(store)
    rec.count("j", "skipped", 3)
    rec.count("j", "skipped", 2)
    rec.add(RunRecord("j", T0, fired_ms=T0))
    await rec.flush()
    assert store.counts == {"j": {"skipped": 5, "fired": 1}}
    assert len(await store.job_runs("j", 10)) == 1


def test_a_catch_up_counts_what_it_left_out() -> None:
    from chronowheel.core.recurrence import compile_schedule
    from chronowheel.node.runs import skipped_count

    every_2s = compile_schedule(cron=None, every_ms=2_000, tz="UTC", start_ms=None,
                                end_ms=None, dst="skip")
    # Paused 24 s: 13 occurrences from T0 to T0 + 24 s; coalesce fired the latest, the
    # schedule goes on at T0 + 26 s: twelve left out.
    assert skipped_count(every_2s, T0, T0 + 26_000, (T0 + 24_000,)) == 12
    # `all` fired every one of them: none left out.
    fired_all = tuple(range(T0, T0 + 26_000, 2_000))
    assert skipped_count(every_2s, T0, T0 + 26_000, fired_all) == 0
    # An interval's count is exact without a walk, however long the gap: a day of 2 s.
    assert skipped_count(every_2s, T0, T0 + 86_400_000, ()) == 43_200
    # A cron schedule is walked, at most `cap` steps (a job every second paused for a day).
    every_second = compile_schedule(cron="* * * * * *", every_ms=None, tz="UTC",
                                    start_ms=None, end_ms=None, dst="skip")
    assert skipped_count(every_second, T0, T0 + 26_000, (T0 + 24_000,)) == 25
    assert skipped_count(every_second, T0, T0 + 86_400_000, (), cap=100) == 100


async def test_an_occurrence_beyond_its_lateness_bound_is_recorded_as_missed(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, _, history = rigs
    node = await start_node(nodes, history)
    nodes.upsert("stale", at=T0 - 60_000, max_lateness="10s")  # a minute late on arrival
    nodes.upsert("fresh", at=T0 + 500, max_lateness="10s")
    await nodes.advance(2_000)
    assert [m.key for m in nodes.fired()] == [b"fresh"]
    assert node.history is not None
    await node.history.settled()
    stale = await read_job_history(history, "stale", 5)
    (run,) = stale.runs
    assert (run.state, run.node_id, run.fired_ms) == (runs.MISSED, "n1", None)
    assert run.lateness_ms is not None and run.lateness_ms >= 60_000
    assert stale.counters == RunCounters(missed=1, last_outcome=runs.MISSED)
    row = await nodes.store.get_job("stale")
    assert row is not None
    assert describe(row, 2, None, nodes.clock.now_ms(), stale)["status"] == "finished"
