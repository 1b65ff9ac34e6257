"""A partition's outcome marks: a quiet partition's mark is written at once, a busy one's are
gathered for up to `MARKS_EVERY_S` into one write (worker/intake.py), and the offsets still
wait for them. Time is the rig's manual clock: a write that waits for the interval waits
until the test moves time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from chronowheel.worker import Occurrence, WorkerStats
from chronowheel.worker.intake import MARKS_EVERY_S

from tests.unit.worker_rig import WorkerRig


@pytest.fixture
async def rig() -> AsyncIterator[WorkerRig]:
    async with WorkerRig() as r:
        yield r


async def test_a_busy_partitions_marks_go_in_one_write_per_interval(rig: WorkerRig) -> None:
    seen: list[str] = []

    async def handler(occ: Occurrence) -> None:
        seen.append(occ.job_id)

    worker = await rig.start(handler)
    first = rig.fire("first", partition=0)
    await rig.until("the first handler", lambda: seen == ["first"])
    await rig.settle()
    # Quiet until now: its mark was written without waiting for the clock.
    writes = rig.marks.writes
    assert set(rig.marks_of(worker.group_id, 0)) == {first.offset}

    burst = [rig.fire(f"b{i}", partition=0) for i in range(20)]
    await rig.settle()  # the clock does not move: every handler runs, no mark is written
    assert seen == ["first", *(f"b{i}" for i in range(20))]
    assert rig.marks.writes == writes
    assert set(rig.marks_of(worker.group_id, 0)) == {first.offset}
    assert rig.committed(worker).get(0, 0) <= first.offset + 1  # offsets wait for the marks

    rig.clock.advance(round(MARKS_EVERY_S * 1000))
    await rig.settle()
    assert rig.marks.writes == writes + 1  # the twenty in one write
    assert set(rig.marks_of(worker.group_id, 0)) == {first.offset, *(m.offset for m in burst)}
    await rig.until("the commit past the burst",
                    lambda: rig.committed(worker) == {0: burst[-1].offset + 1})
    assert worker.stats == WorkerStats(succeeded=21)


async def test_a_partition_quiet_for_the_interval_writes_its_next_mark_at_once(
        rig: WorkerRig) -> None:
    seen: list[str] = []

    async def handler(occ: Occurrence) -> None:
        seen.append(occ.job_id)

    worker = await rig.start(handler)
    rig.fire("a", partition=1)
    await rig.until("the first mark", lambda: len(rig.marks_of(worker.group_id, 1)) == 1)
    rig.clock.advance(round(MARKS_EVERY_S * 1000))
    await rig.settle()
    writes = rig.marks.writes
    second = rig.fire("b", partition=1)
    await rig.settle()  # no time passes
    assert seen == ["a", "b"]
    assert rig.marks.writes == writes + 1
    assert second.offset in rig.marks_of(worker.group_id, 1)
