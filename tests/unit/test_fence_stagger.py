"""A fence starts another fencer every FENCE_STAGGER_MS while none has initialised: librdkafka
asks again for a refused producer id only after a fixed 500 ms, and the first request of a fence
is refused while the coordinator aborts the fenced producer's open transaction. The first fencer
to initialise ends the fence; the others are stopped when their own start ends, never cancelled
half way."""

from __future__ import annotations

import asyncio

import pytest
from chronowheel.bus.ports import BusError
from chronowheel.core.clock import ManualClock
from chronowheel.node.takeover import (
    _STARTING_FENCERS,
    FENCE_STAGGER_MS,
    FENCE_TIMEOUT_S,
    FENCERS_AT_ONCE,
    fence,
)


class Fencer:
    def __init__(self, number: int) -> None:
        self.number = number
        self.transactional_id = "ns-node-gone"
        self.initialised = asyncio.Event()
        self.failure: BaseException | None = None
        self.stopped = False

    async def start(self) -> None:
        await self.initialised.wait()
        if self.failure is not None:
            raise self.failure

    async def stop(self) -> None:
        self.stopped = True


class Bus:
    """Only what a fence uses of a node bus: claimers."""

    def __init__(self) -> None:
        self.fencers: list[Fencer] = []

    def claimer(self, transactional_id: str, group_id: str) -> Fencer:
        fencer = Fencer(len(self.fencers) + 1)
        self.fencers.append(fencer)
        return fencer


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_fencer_started_later_ends_the_fence_and_the_first_is_stopped() -> None:
    bus, clock = Bus(), ManualClock(1_000)
    fencing = asyncio.create_task(fence(bus, "ns-node-gone", "g", 3, clock))  # type: ignore[arg-type]
    await turns()
    assert len(bus.fencers) == 1  # the first fencer's request is refused: it waits 500 ms
    clock.advance(FENCE_STAGGER_MS - 1)
    await turns()
    assert len(bus.fencers) == 1
    clock.advance(1)
    await turns()
    assert len(bus.fencers) == 2
    bus.fencers[1].initialised.set()  # the abort is done: the second one's first request
    await fencing
    assert bus.fencers[1].stopped and not bus.fencers[0].stopped
    assert len(_STARTING_FENCERS) == 1  # the first one, still starting
    bus.fencers[0].initialised.set()  # its retry succeeds later: then it is stopped too
    await turns()
    assert bus.fencers[0].stopped and not _STARTING_FENCERS


async def test_no_more_than_fencers_at_once_start_per_attempt() -> None:
    bus, clock = Bus(), ManualClock(1_000)
    fencing = asyncio.create_task(fence(bus, "ns-node-gone", "g", 3, clock))  # type: ignore[arg-type]
    for _ in range(3 * FENCERS_AT_ONCE):
        await turns()
        clock.advance(FENCE_STAGGER_MS)
    await turns()
    assert len(bus.fencers) == FENCERS_AT_ONCE
    clock.advance(FENCE_TIMEOUT_S * 1000)  # none initialised: the next attempt starts anew
    await turns()
    assert len(bus.fencers) == FENCERS_AT_ONCE + 1
    bus.fencers[-1].initialised.set()
    await fencing
    for fencer in bus.fencers:
        fencer.initialised.set()
    await turns()
    assert all(f.stopped for f in bus.fencers) and not _STARTING_FENCERS


async def test_a_fencer_that_fails_fails_the_fence() -> None:
    bus, clock = Bus(), ManualClock(1_000)
    fencing = asyncio.create_task(fence(bus, "ns-node-gone", "g", 3, clock))  # type: ignore[arg-type]
    await turns()
    bus.fencers[0].failure = BusError("ns-node-gone: not authorised")
    bus.fencers[0].initialised.set()
    with pytest.raises(BusError, match="not authorised"):
        await fencing
    assert bus.fencers[0].stopped and len(bus.fencers) == 1
