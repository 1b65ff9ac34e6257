"""Partition leases of real workers on the in-memory rig: a killed worker's partitions wait for
its lease to expire and nothing it recorded runs again; a worker paused past its lease starts
no handler after it wakes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from chronowheel.worker import Occurrence

from tests.unit.worker_rig import T0, WorkerRig


@pytest.fixture
async def rig() -> AsyncIterator[WorkerRig]:
    async with WorkerRig(partitions=1) as r:
        yield r


async def test_a_killed_worker_loses_nothing_and_its_lease_is_honoured_until_it_expires(
        rig: WorkerRig) -> None:
    started: list[str] = []

    async def hang(occ: Occurrence) -> None:
        started.append(occ.occurrence)
        await asyncio.Event().wait()

    await rig.start(hang, group_id="unit-crash", worker_id="a", lease_s=15)
    msg = rig.fire("survivor")
    await rig.until("A to start the handler", lambda: bool(started))
    await rig.advance(4_000)  # A renewed its lease meanwhile (every 5 s)
    await rig.kill(rig.workers[0])  # mid-handler: not marked, not committed
    killed_at = rig.clock.now_ms()
    seen: list[tuple[Occurrence, int]] = []

    async def handler(occ: Occurrence) -> None:
        seen.append((occ, rig.clock.now_ms()))

    heir = await rig.start(handler, group_id="unit-crash", worker_id="b", lease_s=15)
    await rig.until("the redelivery to be handled", lambda: bool(seen), limit_ms=30_000)
    [(occ, handled_at)] = seen
    assert (occ.job_id, occ.offset, occ.attempt) == ("survivor", msg.offset, 1)
    # The dead worker's lease was honoured until it expired: renewed last at most 5 s before
    # the kill, it lived on at least 10 s after it.
    assert handled_at - killed_at >= 10_000
    await rig.until("the commit", lambda: rig.committed(heir) == {0: msg.offset + 1})
    marks = rig.marks_of(heir.group_id, 0)
    assert [(m.offset, m.state) for m in marks.values()] == [(msg.offset, "done")]


async def test_a_kill_mid_batch_reruns_only_what_was_not_recorded_as_handled(
        rig: WorkerRig) -> None:
    ids = [f"batch-{i}" for i in range(400)]
    for jid in ids:
        rig.fire(jid)
    first_started: set[str] = set()
    first_done: set[str] = set()
    killed = False

    async def timed(occ: Occurrence) -> None:
        first_started.add(occ.occurrence)
        await rig.clock.sleep_until(rig.clock.now_ms() + 20)
        if not killed:
            first_done.add(occ.occurrence)

    first = await rig.start(timed, group_id="unit-kill", worker_id="a", lease_s=6,
                            concurrency=16)
    await rig.until("A well into the batch", lambda: len(first_done) >= 100, step_ms=10)
    killed = True
    await rig.kill(first)
    recorded = {m.occurrence for m in rig.marks_of("unit-kill", 0).values()}
    assert recorded <= first_done and len(first_done) < len(ids)

    again: list[str] = []

    async def handler(occ: Occurrence) -> None:
        again.append(occ.occurrence)

    second = await rig.start(handler, group_id="unit-kill", worker_id="b", lease_s=6)
    await rig.until("every occurrence handled", lambda: len(
        {o.split("@")[0] for o in first_done | set(again)}) == len(ids))
    await rig.until("the second worker to settle", lambda: second.holding() == 0)
    assert len(again) == len(set(again)), "the second worker ran one twice"
    assert not recorded & set(again)  # nothing recorded as handled ran again
    assert len(first_done & set(again)) <= 2 * 16  # at most what was in flight at the kill
    assert first_started - first_done <= set(again)


async def test_a_worker_paused_past_its_lease_starts_no_handler_after_it_wakes(
        rig: WorkerRig) -> None:
    for i in range(5):
        rig.fire(f"z-{i}")
    release = asyncio.Event()
    zombie_started: list[tuple[str, int]] = []

    async def slow(occ: Occurrence) -> None:
        zombie_started.append((occ.occurrence, rig.clock.now_ms()))
        await release.wait()

    zombie = await rig.start(slow, group_id="unit-zombie", worker_id="a", lease_s=6,
                             concurrency=1, session_timeout_ms=20_000)
    await rig.until("the zombie to be handling", lambda: bool(zombie_started))
    assert zombie.holding() == 5  # one running, four ready for its only slot
    rig.pause(zombie)  # SIGSTOP: its renewals wait
    paused_at = rig.clock.now_ms()
    # Past its lease but within its group session: only the lease fences it. Another group
    # sharing its scope takes the partition over once the lease expired.
    heir_handled: list[str] = []

    async def record(occ: Occurrence) -> None:
        heir_handled.append(occ.occurrence)

    heir = await rig.start(record, group_id="unit-heir", idempotency_scope="unit-zombie",
                           worker_id="b", lease_s=6)
    await rig.until("the heir to handle every record", lambda: len(heir_handled) == 5)
    assert rig.clock.now_ms() - paused_at >= 6_000
    # SIGCONT: the running handler ends, with four ready records behind it; the zombie's slot
    # looks at the next one before any answer from the store (a round trip away) arrives.
    release.set()
    await rig.settle()
    rig.resume(zombie)
    await rig.advance(10_000)
    assert [o for o, _ in zombie_started] == [f"z-0@{T0}"]
    assert zombie_started[0][1] <= paused_at  # the one it started before the pause
    assert heir.failure is None and zombie.failure is None
    assert len(set(heir_handled)) == 5
    assert zombie.assignment()  # still in its group: the lease alone stopped it
