"""The worker's outcome marks are written in rounds for all its partitions (`worker/intake.py`):
one request carries the rows of many partitions, a round waits (on the injected timer) for
more outcomes unless enough are queued or someone waits for them, and outcomes that come while
a round is being written go in the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest
from chronowheel.bus.ports import TopicPartition
from chronowheel.core.clock import ManualClock
from chronowheel.store.base import MarkRow
from chronowheel.store.memory_worker import MemoryMarks
from chronowheel.worker.intake import Intake, Part
from chronowheel.worker.offsets import OffsetTracker
from chronowheel.worker.timing import ClockTimer

TOPIC = "ns.fired"


class Record:
    def __init__(self, tp: TopicPartition, offset: int) -> None:
        self.topic, self.partition, self.offset = tp.topic, tp.partition, offset
        self.key: bytes | None = None
        self.value = b""
        self.headers: list[tuple[str, bytes]] = []


class GatedMarks(MemoryMarks):
    """Marks whose writes wait until the test opens the gate; each write's rows are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.rounds: list[list[tuple[int, list[int]]]] = []

    async def write_marks(self, scope: str, rows: Sequence[MarkRow], ttl_s: int) -> int:
        self.rounds.append([(r.partition, [m.offset for m in r.marks]) for r in rows])
        await self.gate.wait()
        return await super().write_marks(scope, rows, ttl_s)


@pytest.fixture
async def rigs() -> Any:
    made: list[Rig] = []

    def make(**kw: Any) -> Rig:
        made.append(Rig(**kw))
        return made[-1]

    yield make
    for rig in made:
        await rig.close()


class Rig:
    def __init__(self, *, wait_s: float = 0.0, hurry: int = 1000) -> None:
        self.clock = ManualClock(1_000_000)
        self.store = GatedMarks()
        self.tasks: list[tuple[str, asyncio.Task[None]]] = []
        self.intake = Intake(OffsetTracker(), self.store, scope="s", worker_id="w", lease_s=15,
                             keep_s=3600, poll_s=0.1, spawn=self.spawn,
                             end_offset=lambda tp: None, timer=ClockTimer(self.clock),
                             marks_wait_s=wait_s, hurry_marks=hurry)
        self.next_offset: dict[int, int] = {}

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.append((name, task))
        return task

    def rounds_tasks(self) -> list[asyncio.Task[None]]:
        return [t for name, t in self.tasks if name == "marks"]

    async def close(self) -> None:
        for _, t in self.tasks:
            t.cancel()
        await asyncio.gather(*(t for _, t in self.tasks), return_exceptions=True)

    def handled(self, partition: int) -> Part:
        """One record of `partition` received and handled: its outcome queued."""
        tp = TopicPartition(TOPIC, partition)
        offset = self.next_offset.get(partition, 0)
        self.next_offset[partition] = offset + 1
        self.intake.receive(tp, [Record(tp, offset)])
        part = self.intake.parts[tp]
        item = self.intake.ready.pop() if self.intake.ready else part.held.pop()
        self.intake.outcome(part, offset, "done", f"job-{partition}-{offset}@1", item.ticket)
        return part

    async def until(self, cond: Callable[[], bool], what: str) -> None:
        for _ in range(200):
            if cond():
                return
            await asyncio.sleep(0)
        for _, t in self.tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        raise AssertionError(f"never happened: {what}")

    async def settle(self) -> None:
        """Let every runnable task run (no time passes)."""
        for _ in range(50):
            await asyncio.sleep(0)


async def test_one_round_writes_the_marks_of_every_partition_in_one_request(rigs: Any) -> None:
    rig = rigs()
    for partition in range(6):
        rig.handled(partition)
    rig.handled(2)
    await rig.until(lambda: rig.intake.holding == 0, "every record finished")
    assert rig.store.requests == 1
    assert sorted(rig.store.rounds[0]) == [(0, [0]), (1, [0]), (2, [0, 1]), (3, [0]),
                                           (4, [0]), (5, [0])]
    assert rig.intake.rounds == 1 and rig.intake.mark_requests == 1 and not rig.intake.writing


async def test_outcomes_that_come_during_a_write_go_together_in_the_next_round(rigs: Any) -> None:
    rig = rigs()
    rig.store.gate.clear()
    rig.handled(0)
    await rig.until(lambda: len(rig.store.rounds) == 1, "the first round is under way")
    for partition in (0, 1, 2):
        rig.handled(partition)
    await rig.settle()
    assert len(rig.store.rounds) == 1, "a second round started while the first was written"
    assert rig.intake.holding == 4
    rig.store.gate.set()
    await rig.until(lambda: rig.intake.holding == 0, "every record finished")
    assert rig.store.rounds == [[(0, [0])], [(0, [1]), (1, [0]), (2, [0])]]


async def test_a_round_waits_for_more_outcomes_on_the_injected_timer(rigs: Any) -> None:
    rig = rigs(wait_s=0.02)
    rig.handled(0)
    await rig.settle()
    rig.handled(1)
    await rig.settle()
    assert rig.store.requests == 0 and rig.intake.holding == 2, "written before its wait"
    rig.clock.advance(20)
    await rig.until(lambda: rig.intake.holding == 0, "the round written after its wait")
    assert rig.store.rounds == [[(0, [0]), (1, [0])]]


async def test_enough_queued_marks_write_the_round_without_waiting(rigs: Any) -> None:
    rig = rigs(wait_s=1.0, hurry=3)
    rig.handled(0)
    rig.handled(1)
    await rig.settle()
    assert rig.store.requests == 0
    rig.handled(2)  # the third: no more waiting
    await rig.until(lambda: rig.intake.holding == 0, "the round written at once")
    assert rig.store.requests == 1 and rig.clock.now_ms() == 1_000_000


async def test_a_revoke_waiting_for_its_marks_does_not_wait_for_the_round(rigs: Any) -> None:
    rig = rigs(wait_s=1.0)
    part = rig.handled(4)
    await rig.settle()
    assert rig.store.requests == 0
    await asyncio.wait_for(rig.intake.settle_marks([part]), 5)
    assert rig.store.rounds == [[(4, [0])]] and rig.clock.now_ms() == 1_000_000


async def test_a_failed_round_fails_its_task_and_finishes_none_of_its_records(rigs: Any) -> None:
    rig = rigs()

    async def refuse(scope: str, rows: Sequence[MarkRow], ttl_s: int) -> int:
        raise RuntimeError("Cassandra refused the write")

    rig.store.write_marks = refuse  # type: ignore[method-assign]
    rig.handled(0)
    await rig.until(lambda: any(t.done() for t in rig.rounds_tasks()), "the round to end")
    with pytest.raises(RuntimeError, match="refused"):
        rig.rounds_tasks()[0].result()
    assert rig.intake.holding == 1 and not rig.intake.writing
