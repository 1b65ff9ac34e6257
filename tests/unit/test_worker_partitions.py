"""The per-partition idempotency guard: one holder at a time, a paused holder finds out before it
starts anything, marks past the starting offset are known to the next holder."""

from __future__ import annotations

import pytest
from chronowheel.store.base import BLOCK_BITS, Mark, block_of
from chronowheel.store.memory_worker import MemoryMarks
from chronowheel.worker.partitions import (
    MARK_DONE,
    MARK_FAILED,
    LeaseLost,
    PartitionGuard,
    split_by_block,
    window_bounds,
)


class Clock:
    """Cassandra's clock and each worker's monotonic clock, advanced by hand together."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def guard(store: MemoryMarks, clock: Clock, worker: str, *, partition: int = 3,
          lease_s: int = 15) -> PartitionGuard:
    return PartitionGuard(store, "group", "ns.fired", partition, worker, lease_s=lease_s,
                          keep_s=86_400, monotonic=clock)


async def test_one_holder_at_a_time_and_a_released_lease_passes_on_at_once() -> None:
    clock = Clock()
    store = MemoryMarks(clock)
    a, b = guard(store, clock, "a"), guard(store, clock, "b")
    assert await a.acquire() is None and a.holds()
    holder = await b.acquire()
    assert holder is not None and holder.startswith("a/") and not b.holds()
    await a.release()
    assert not a.holds()
    assert await b.acquire() is None and b.holds()


async def test_a_crashed_holders_lease_expires_and_other_partitions_are_independent() -> None:
    clock = Clock()
    store = MemoryMarks(clock)
    a, b = guard(store, clock, "a"), guard(store, clock, "b")
    other = guard(store, clock, "b", partition=4)
    await a.acquire()
    assert await other.acquire() is None  # another partition: its own lease
    clock.t += 14.9
    assert await b.acquire() is not None
    clock.t += 0.2  # past the TTL: a died without releasing
    assert await b.acquire() is None


async def test_a_paused_holder_stops_before_its_lease_could_have_expired() -> None:
    clock = Clock()
    store = MemoryMarks(clock)
    zombie, heir = guard(store, clock, "zombie"), guard(store, clock, "heir")
    await zombie.acquire()
    clock.t += 15 - 15 / 3 - 0.01
    assert zombie.holds()
    clock.t += 0.02  # the safety margin begins: no new handler without a renewal
    assert not zombie.holds()
    clock.t += 30  # paused long past the lease; the heir takes over
    assert await heir.acquire() is None
    with pytest.raises(LeaseLost) as lost:
        await zombie.renew()
    assert lost.value.holder.startswith("heir/")
    assert not zombie.holds() and zombie.owner is None


async def test_renewing_extends_from_when_the_renewal_was_sent() -> None:
    clock = Clock()
    store = MemoryMarks(clock)
    a = guard(store, clock, "a")
    await a.acquire()
    clock.t += 5
    await a.renew()
    assert a.valid_until == pytest.approx(clock.t + 10)
    clock.t += 9.9
    assert a.holds()


async def test_a_lease_that_expired_while_nobody_took_it_cannot_be_renewed_silently() -> None:
    clock = Clock()
    store = MemoryMarks(clock)
    a = guard(store, clock, "a")
    await a.acquire()
    clock.t += 16
    with pytest.raises(LeaseLost, match="nobody"):
        await a.renew()


async def test_the_next_holder_learns_every_mark_past_its_starting_offset() -> None:
    clock = Clock()
    store = MemoryMarks(clock)
    a, b = guard(store, clock, "a"), guard(store, clock, "b")
    await a.acquire()
    for offset in (10, 11, 13, 70_000):  # 13 and 70,000 out of order, 70,000 in a later block
        a.mark(offset, MARK_DONE, f"job-{offset}@1", ticket=offset)
    a.mark(12, MARK_FAILED, "job-12@1", ticket=12)
    marks, tickets = a.take_pending()
    assert sorted(tickets) == [10, 11, 12, 13, 70_000]  # type: ignore[type-var]
    rows = a.rows(marks)
    assert [[m.offset for m in r.marks] for r in rows] == [[10, 11, 12, 13], [70_000]]
    await store.write_marks(a.scope, rows, a.keep_s)
    assert store.writes == 2  # one row per block
    assert not a.pending
    await a.release()

    await b.acquire()
    assert await b.load_window(11, 20) == 4
    assert b.done_offsets == {11, 12, 13, 70_000}
    assert "job-12@1" in b.recent and "job-10@1" not in b.recent
    b.prune(13)
    assert b.done_offsets == {13, 70_000}


def test_blocks_and_window_bounds() -> None:
    assert block_of((1 << BLOCK_BITS) - 1) == 0 and block_of(1 << BLOCK_BITS) == 1
    marks = [Mark(o, MARK_DONE, "x") for o in (70_000, 3, 65_535, 65_536)]
    assert [[m.offset for m in piece] for piece in split_by_block(marks)] == [
        [3, 65_535], [65_536, 70_000]]
    assert window_bounds([7, 5, 9], None) == (5, 9)
    assert window_bounds([7, 5, 9], 120) == (5, 119)


def test_recent_occurrences_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import chronowheel.worker.partitions as partitions

    monkeypatch.setattr(partitions, "RECENT_OCCURRENCES", 3)
    clock = Clock()
    g = guard(MemoryMarks(clock), clock, "a")
    for i in range(5):
        g.mark(i, MARK_DONE, f"o{i}", ticket=i)
    assert list(g.recent) == ["o2", "o3", "o4"]
