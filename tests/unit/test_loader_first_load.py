"""After a takeover the loader reads the next few seconds first and holds the rest of the
look-ahead back while a shard of the node is arriving (its takeover or its first commit since
not done), for at most FIRST_COMMIT_WAIT_MS: reading thousands of rows at once delayed the
first transactions of the shards taken over with it, and with them their first messages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from chronowheel.core.buckets import MINUTE_MS
from chronowheel.core.clock import ManualClock
from chronowheel.node.loader import DUE_PAGE_ROWS, FIRST_COMMIT_WAIT_MS, FIRST_LOAD_AHEAD_MS, Loader
from chronowheel.node.state import Arrivals, ShardState
from chronowheel.settings import Settings

from tests.unit.node_rig import T0, NodeRig
from tests.unit.test_loader_pages import MINUTE, PagedStore, row


def jobs_in(state: ShardState) -> list[str]:
    return sorted(entry.job_id for entry in state.wheel.due_times())  # type: ignore[union-attr]


def arriving_shard(clock: ManualClock, store: PagedStore, arrivals: Arrivals
                   ) -> tuple[ShardState, Loader]:
    settings = Settings(namespace="unit", shards=1, lookahead_ms=30_000)
    state = ShardState(shard=0, start_ms=MINUTE, tick_ms=settings.tick_ms,
                       ingest_slack_ms=settings.ingest_slack_ms, arrivals=arrivals)
    state.watermark = state.committed_watermark = state.horizon_ms = MINUTE - 1
    arrivals.arrive(0, clock.now_ms())
    return state, Loader(state=state, settings=settings, store=store, clock=clock)


async def turns(n: int = 10) -> None:
    """Let the loop run n turns: after a condition held, to show that nothing more happens."""
    for _ in range(n):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_the_first_load_stops_after_the_page_that_passes_the_near_window() -> None:
    clock = ManualClock(MINUTE + 100)
    store = PagedStore(clock)
    store.more.set()  # no page waits
    for i in range(3 * DUE_PAGE_ROWS):  # a row every 10 ms: a page of 500 covers 5 s
        await store.put_due(row(MINUTE + 10 * i, i), ttl_s=86_400)
    arrivals = Arrivals()
    arrivals.arrive(7, clock.now_ms())  # another shard of the node, arriving too
    state, loader = arriving_shard(clock, store, arrivals)
    first = asyncio.create_task(loader.first_load())
    await until(lambda: state.horizon_ms >= MINUTE + 100 + FIRST_LOAD_AHEAD_MS)
    await turns(100)  # holding: nothing more is read while shards are arriving
    # The near window ends at MINUTE + 5,100: the first page (up to MINUTE + 4,990) does not
    # reach it, the second (up to MINUTE + 9,990) does; the third is not read.
    assert len(state.wheel) == 2 * DUE_PAGE_ROWS
    assert state.horizon_ms == MINUTE + 10 * (2 * DUE_PAGE_ROWS - 1) - 1
    assert state.horizon_ms >= MINUTE + 100 + FIRST_LOAD_AHEAD_MS
    arrivals.settled(0)  # this shard's first commit: the other one still arrives
    await turns()
    assert not first.done()
    arrivals.settled(7)
    assert await first == (FIRST_LOAD_AHEAD_MS, 0)
    await loader.load_horizon()  # the rest, as the loader's loop goes on
    assert len(state.wheel) == 3 * DUE_PAGE_ROWS


async def test_without_commits_the_hold_ends_after_its_bound() -> None:
    clock = ManualClock(MINUTE + 100)
    store = PagedStore(clock)
    await store.put_due(row(MINUTE + 50, 0), ttl_s=86_400)  # due: to publish at once
    state, loader = arriving_shard(clock, store, Arrivals())
    first = asyncio.create_task(loader.first_load())
    await until(lambda: state.horizon_ms >= MINUTE + 100 + FIRST_LOAD_AHEAD_MS)
    await turns(100)  # one row in the minute: read whole, then the hold
    assert state.horizon_ms == MINUTE + MINUTE_MS - 1 and not first.done()
    clock.advance(FIRST_COMMIT_WAIT_MS - 1)
    await turns()
    assert not first.done()
    clock.advance(1)
    await until(first.done)
    await first  # its result, or the error it ended with


async def test_nothing_due_holds_nothing() -> None:
    # An idle shard commits only after idle_commit_ms: with nothing to publish at once, its
    # first transaction is nothing to keep clear.
    clock = ManualClock(MINUTE + 100)
    store = PagedStore(clock)
    await store.put_due(row(MINUTE + 200, 0), ttl_s=86_400)  # not due yet
    arrivals = Arrivals()
    state, loader = arriving_shard(clock, store, arrivals)
    assert await loader.first_load() == (FIRST_LOAD_AHEAD_MS, 0)
    assert arrivals.none.is_set() and jobs_in(state) == ["j00000"]


async def test_a_stop_ends_the_hold() -> None:
    clock = ManualClock(MINUTE + 100)
    store = PagedStore(clock)
    await store.put_due(row(MINUTE + 50, 0), ttl_s=86_400)
    state, loader = arriving_shard(clock, store, Arrivals())
    first = asyncio.create_task(loader.first_load())
    await until(lambda: state.horizon_ms >= MINUTE + 100 + FIRST_LOAD_AHEAD_MS)
    await turns(100)
    assert not first.done()
    state.stopping = True
    state.loader_wake.set()  # what the actor's stop does
    await first


async def test_a_taken_over_shard_loads_the_rest_after_its_first_commit() -> None:
    async with NodeRig(shards=1) as rig:
        first = await rig.start("first")
        rig.upsert("late", at=T0 + 100)
        rig.upsert("next-minute", at=T0 + MINUTE_MS + 10_000)
        await rig.settle()
        await first.shutdown()  # releases the shard: the next node takes it over in full
        rig.nodes.remove(first)
        rig.clock.set(T0 + 200)  # "late" is due when the next node takes the shard over
        second = await rig.start("second")
        state = second.owned[0].actor.state
        # The time did not move, so the hold did not end by its bound: "late" was published,
        # and that commit let the loader read the rest of the look-ahead.
        assert [m.key for m in rig.fired()] == [b"late"]
        assert 0 not in state.arrivals
        assert state.horizon_ms >= T0 + 200 + rig.settings.lookahead_ms
        assert jobs_in(state) == ["next-minute"]


async def test_the_shards_of_a_node_share_one_gate() -> None:
    async with NodeRig(shards=2) as rig:
        node = await rig.start()
        arrivals = node.owned[0].actor.arrivals
        assert node.owned[1].actor.arrivals is arrivals
        assert node.owned[0].actor.state.arrivals is arrivals
        # Nothing due on either: neither has committed, and neither holds the other's load.
        assert arrivals.none.is_set()


def test_a_settled_shard_tells_when_its_takeover_began_once() -> None:
    """The publisher logs a shard's first commit after its takeover with the time since it
    began; a later commit (settled already) must not log it again."""
    arrivals = Arrivals()
    arrivals.arrive(3, 1_000)
    arrivals.arrive(4, 1_200)
    assert not arrivals.none.is_set()
    assert arrivals.settled(3) == 1_000
    assert arrivals.settled(3) is None
    assert not arrivals.none.is_set()
    assert arrivals.settled(4) == 1_200
    assert arrivals.none.is_set()
