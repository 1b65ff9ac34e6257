"""The node's ingest write permits (`node/write_permits.py`): the wide bound while nothing is
due soon, the narrow one while something is (taking effect as writes in flight complete),
FIFO hand-over, cancellation that neither leaks nor loses a permit; and the registry's
`firing_soon`, which decides between them, on an in-memory node with a manual clock."""

from __future__ import annotations

import asyncio

import pytest
from chronowheel.node.write_permits import NodeWritePermits

from tests.unit.node_rig import T0, NodeRig
from tests.unit.test_node_warm import job_on


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def permits(wide: int = 4, narrow: int = 2) -> tuple[NodeWritePermits, list[bool], Clock]:
    soon = [False]
    clock = Clock()
    return NodeWritePermits(wide, narrow, lambda: soon[0], clock), soon, clock


async def started(n: int, p: NodeWritePermits) -> list[asyncio.Task[None]]:
    tasks = [asyncio.ensure_future(p.acquire()) for _ in range(n)]
    await asyncio.sleep(0)
    return tasks


async def test_the_wide_bound_while_nothing_is_due_soon() -> None:
    p, _, _ = permits()
    tasks = await started(5, p)
    assert [t.done() for t in tasks] == [True] * 4 + [False]
    assert p.in_flight == 4
    p.release()
    await asyncio.sleep(0)
    assert tasks[4].done() and p.in_flight == 4


async def test_the_narrow_bound_takes_effect_as_writes_in_flight_complete() -> None:
    p, soon, clock = permits()
    await started(4, p)
    soon[0] = True
    clock.ms += 1
    waiting = await started(2, p)
    assert not any(t.done() for t in waiting)
    for _ in range(2):  # 4 -> 2 in flight: still not under the narrow bound of 2
        p.release()
    await asyncio.sleep(0)
    assert not any(t.done() for t in waiting) and p.in_flight == 2
    p.release()
    await asyncio.sleep(0)
    assert [t.done() for t in waiting] == [True, False]  # first come, first served
    assert p.in_flight == 2
    soon[0] = False  # nothing due soon any more: the next release widens again
    clock.ms += 1
    p.release()
    await asyncio.sleep(0)
    assert waiting[1].done() and p.in_flight == 2


async def test_firing_soon_is_asked_at_most_once_per_millisecond() -> None:
    asked = []
    clock = Clock()
    p = NodeWritePermits(4, 2, lambda: asked.append(clock.ms) or False, clock)
    for _ in range(3):
        p.limit()
    clock.ms = 7
    p.limit()
    assert asked == [0, 7]


async def test_a_cancelled_waiter_neither_leaks_nor_loses_a_permit() -> None:
    p, _, _ = permits(wide=1, narrow=1)
    await started(1, p)
    first, second = await started(2, p)
    first.cancel()  # cancelled while waiting: leaves the queue
    await asyncio.sleep(0)
    assert first.cancelled() and not second.done()
    p.release()  # handed to `second`, which is cancelled before it runs: the permit comes back
    second.cancel()
    await asyncio.sleep(0)
    assert second.cancelled()
    assert p.in_flight == 0
    [third] = await started(1, p)
    assert third.done() and p.in_flight == 1


def test_bad_bounds_and_a_release_too_many_are_refused() -> None:
    with pytest.raises(ValueError, match="narrow"):
        NodeWritePermits(4, 5, lambda: False, Clock())
    with pytest.raises(ValueError, match="narrow"):
        NodeWritePermits(4, 0, lambda: False, Clock())
    p, _, _ = permits()
    with pytest.raises(RuntimeError, match="released more often"):
        p.release()


async def test_the_registry_is_firing_soon_before_an_instant_and_right_after_it(
        rig: NodeRig) -> None:
    node = await rig.start("me")
    near = rig.settings.ingest_due_soon_ms
    rig.upsert(job_on(0, "a"), at=T0 + 5_000)
    await rig.advance(1_000)
    registry = node.registry
    assert registry.node_writes is not None
    assert not registry.firing_soon()
    assert registry.node_writes.limit() == rig.settings.ingest_writes_in_flight
    await rig.advance(5_000 - 1_000 - near)  # exactly `near` before the instant
    assert registry.firing_soon()
    assert registry.node_writes.limit() == rig.settings.ingest_writes_in_flight_due_soon
    assert node.metrics.registry.get_sample_value("chronowheel_ingest_writes_bound") == \
        rig.settings.ingest_writes_in_flight_due_soon
    assert node.metrics.registry.get_sample_value("chronowheel_ingest_writes_in_flight") == 0
    await rig.advance(near)  # it fires; its commit is under way for a while after
    assert [m.key for m in rig.fired()] == [job_on(0, "a").encode()]
    assert registry.firing_soon()
    await rig.advance(near)
    assert not registry.firing_soon()


async def test_a_waiter_cancelled_and_passed_over_before_it_ran_is_no_error() -> None:
    """A release between a waiter's cancellation and its task's turn drops the cancelled
    waiter from the queue itself; the task's own clean-up then finds it gone."""
    p, _, _ = permits(wide=1, narrow=1)
    await started(1, p)
    first, second = await started(2, p)
    first.cancel()
    p.release()  # before `first` ran: passes it over, hands the permit to `second`
    await asyncio.sleep(0)
    assert first.cancelled()
    assert second.done() and second.exception() is None
    assert p.in_flight == 1
