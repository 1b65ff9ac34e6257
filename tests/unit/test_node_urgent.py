"""The urgent lane in a whole node (in-memory store and bus, manual clock): a one-shot due soon
fires on time behind a backlog whose writes are held, the committed offset stays behind the
backlog, a takeover applies the job again without firing it twice, and a job's commands keep
their order."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from chronowheel.errors import StoreRefused
from chronowheel.store.base import DueRow, JobRow

from tests.unit.node_rig import T0, NodeRig, scheduled_at

FAR = T0 + 3_600_000


def hold_far_writes(rig: NodeRig) -> asyncio.Event:
    """Every new-job write holding a row due an hour ahead waits until the returned event is
    set: a backlog Cassandra is slow to take."""
    release = asyncio.Event()
    put = rig.store.put_dues_and_jobs

    async def held(rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        if any(due.slot_ms >= FAR for due, _ttl, _job in rows):
            await release.wait()
        await put(rows)

    rig.store.put_dues_and_jobs = held  # type: ignore[method-assign]
    return release


def committed(rig: NodeRig) -> int:
    return rig.bus.group_offsets.get(("unit-nodes", rig.settings.submit_topic, 0), 0)


def urgent_applied(rig: NodeRig) -> float:
    return sum(node.metrics.registry.get_sample_value("chronowheel_ingest_urgent_total") or 0
               for node in rig.nodes)


async def test_a_one_shot_due_soon_fires_on_time_behind_a_held_backlog_and_once_after_a_takeover(
        ) -> None:
    # The held write holds the node's only write permit: the lane needs none.
    rig = NodeRig(shards=1, ingest_batch=4, ingest_writes_in_flight=1)
    release = hold_far_writes(rig)
    try:
        first = await rig.start("first")
        backlog = [f"far-{i:02d}" for i in range(12)]
        for job_id in backlog:
            rig.upsert(job_id, at=FAR)
        rig.upsert("soon", at=T0 + 2_000, payload="now")
        await rig.advance_to(T0 + 2_100)
        [msg] = rig.fired("soon")
        assert scheduled_at(msg) == T0 + 2_000 and msg.committed_ms >= T0 + 2_000
        assert urgent_applied(rig) == 1
        # The backlog's first step is still held: no offset is committed past it.
        assert committed(rig) == 0 and not any(j in rig.store.jobs for j in backlog)
        # A graceful stop lets the step finish: the offsets of that step only are committed...
        stopping = asyncio.create_task(first.shutdown())
        release.set()
        await stopping
        assert 0 < committed(rig) < 13
        # ...so the next owner applies the rest again, "soon" included: a no-op.
        second = await rig.start("second")
        await rig.advance(1_000)
        assert sorted(j for j in backlog if j in rig.store.jobs) == backlog
        assert committed(rig) == 13
        assert second.metrics.registry.get_sample_value(
            "chronowheel_ingested_total", {"op": "upsert", "outcome": "unchanged"}) == 1
        assert len(rig.fired("soon")) == 1
    finally:
        release.set()
        await rig.stop_all()


async def test_a_command_behind_an_unapplied_one_of_its_job_keeps_its_turn() -> None:
    rig = NodeRig(shards=1, ingest_batch=4)
    release = hold_far_writes(rig)
    try:
        await rig.start()
        rig.upsert("edited", at=FAR, payload="v1")
        for i in range(6):
            rig.upsert(f"far-{i}", at=FAR)
        rig.upsert("edited", at=T0 + 5_000, payload="v2")  # due soon, but v1 waits
        rig.upsert("other", at=T0 + 5_000)
        await rig.advance_to(T0 + 1_000)
        assert "edited" not in rig.store.jobs and urgent_applied(rig) == 1
        release.set()
        await rig.advance_to(T0 + 6_000)
        assert [(scheduled_at(m), m.value) for m in rig.fired("edited")] == [(T0 + 5_000,
                                                                               b'"v2"')]
        assert len(rig.fired("other")) == 1 and committed(rig) == 9
    finally:
        release.set()
        await rig.stop_all()


async def test_the_look_ahead_finds_a_one_shot_deep_in_a_backlog_and_nothing_is_lost() -> None:
    # Far more backlog than the node queues: the lane reads ahead (dropping what is not
    # urgent), then the shard's partition is read again from where its queue ended.
    rig = NodeRig(shards=1, ingest_batch=5, pump_pause_rows=10, pump_resume_rows=5,
                  urgent_lookahead_records=100)
    release = hold_far_writes(rig)
    try:
        await rig.start()
        backlog = [f"far-{i:02d}" for i in range(60)]
        for job_id in backlog[:40]:
            rig.upsert(job_id, at=FAR)
        rig.upsert("deep", at=T0 + 2_000)
        for job_id in backlog[40:]:
            rig.upsert(job_id, at=FAR)
        await rig.advance_to(T0 + 2_100)
        assert [scheduled_at(m) for m in rig.fired("deep")] == [T0 + 2_000]
        assert committed(rig) == 0
        release.set()
        await rig.advance(1_000)
        assert sorted(j for j in backlog if j in rig.store.jobs) == backlog
        assert committed(rig) == 61
        node = rig.nodes[0]
        stored = node.metrics.registry.get_sample_value(
            "chronowheel_ingested_total", {"op": "upsert", "outcome": "stored"})
        assert stored == 61  # each applied once: the lane's one is skipped in order
        assert Counter(m.key for m in rig.fired()) == Counter({b"deep": 1})
    finally:
        release.set()
        await rig.stop_all()


async def max_far_writes_in_flight(**settings: int) -> int:
    """The most new-job writes of jobs due an hour ahead in flight at once, four shards
    applying 20 jobs each, one job per write."""
    rig = NodeRig(shards=4, ingest_group_jobs=1, **settings)
    rig.store.pause = lambda: asyncio.sleep(0)  # writes interleave
    put = rig.store.put_dues_and_jobs
    in_flight = most = 0

    async def counting(rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            await put(rows)
        finally:
            in_flight -= 1

    rig.store.put_dues_and_jobs = counting  # type: ignore[method-assign]
    try:
        await rig.start()
        jobs = [f"far-{i:03d}" for i in range(80)]
        for job_id in jobs:
            rig.upsert(job_id, at=FAR)
        await rig.settle()
        assert all(j in rig.store.jobs for j in jobs)
        return most
    finally:
        await rig.stop_all()


async def test_the_node_bounds_its_in_order_writes_in_flight_across_shards() -> None:
    assert await max_far_writes_in_flight(ingest_writes_in_flight=3) == 3
    assert await max_far_writes_in_flight(ingest_writes_in_flight=0) > 3


def hold_writes_of(rig: NodeRig, *job_ids: str) -> asyncio.Event:
    """Writes of these jobs' rows wait until the returned event is set."""
    release = asyncio.Event()
    put = rig.store.put_dues_and_jobs

    async def held(rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        if any(job.job_id in job_ids for _due, _ttl, job in rows):
            await release.wait()
        await put(rows)

    rig.store.put_dues_and_jobs = held  # type: ignore[method-assign]
    return release


async def test_a_command_the_lane_quarantines_is_reported_once_even_if_the_shard_moves(
        ) -> None:
    # "bad" (offset 1) and "soon" (offset 6) go in one lane batch; the store refuses "bad".
    # Its message must go out with the in-order step that passes offset 1, not wait for
    # offset 6: the shard moves in between, and the next owner starts past offset 1.
    rig = NodeRig(shards=1, ingest_batch=2)
    release = hold_writes_of(rig, "far-4")
    put = rig.store.put_dues_and_jobs

    async def refusing(rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        if any(job.job_id == "bad" for _due, _ttl, job in rows):
            raise StoreRefused("the store refuses this job")
        await put(rows)

    rig.store.put_dues_and_jobs = refusing  # type: ignore[method-assign]
    try:
        first = await rig.start("first")
        rig.upsert("far-0", at=FAR)
        rig.upsert("bad", at=T0 + 5_000)
        for i in range(2, 6):
            rig.upsert(f"far-{i}", at=FAR)
        rig.upsert("soon", at=T0 + 5_000)
        rig.upsert("far-7", at=FAR)
        await rig.settle()
        stopping = asyncio.create_task(first.shutdown())
        release.set()
        await stopping
        await rig.start("second")
        await rig.advance(6_000)
        assert [m.key for m in rig.bus.messages(rig.settings.rejected_topic)] == [b"bad"]
        assert len(rig.fired("soon")) == 1 and committed(rig) == 8
    finally:
        release.set()
        await rig.stop_all()


async def test_a_stop_while_the_in_order_step_waits_for_the_lane_ends_cleanly() -> None:
    rig = NodeRig(shards=1, ingest_batch=4)
    release = hold_writes_of(rig, "soon")
    try:
        node = await rig.start()
        rig.upsert("soon", at=T0 + 20_000)
        await rig.settle()  # the lane has it in flight; the in-order step waits for it
        task = node.owned[0].task
        stopping = asyncio.create_task(node.shutdown())
        await rig.settle()
        release.set()
        await stopping
        # The shard ended without an error, its final commit made (the stop's `clean` path).
        assert task.done() and task.exception() is None
        assert committed(rig) == 1 and "soon" in rig.store.jobs
    finally:
        release.set()
        await rig.stop_all()


async def test_the_stop_deadline_ends_a_lane_batch_still_running() -> None:
    rig = NodeRig(shards=1, ingest_batch=1, stop_deadline_ms=50, stop_drain_ms=60_000)
    release = hold_writes_of(rig, "far", "soon")
    try:
        node = await rig.start()
        rig.upsert("far", at=FAR)
        rig.upsert("soon", at=T0 + 20_000)
        await rig.settle()  # both writes held: the in-order step's and the lane's
        stopping = asyncio.create_task(node.shutdown())
        done, _ = await asyncio.wait({stopping}, timeout=30)
        assert done, "the stop waited for the held lane batch past its deadline"
    finally:
        release.set()
        await rig.stop_all()
