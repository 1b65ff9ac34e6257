"""The injected clocks and the deadline-or-event wait, driven by a manual clock (no sleeping)."""

from __future__ import annotations

import asyncio

import pytest
from chronowheel.core.clock import ManualClock, OffsetClock, SystemClock, sleep_until_or_event


async def test_manual_clock_wakes_sleepers_only_when_their_deadline_passes() -> None:
    clock = ManualClock(1_000)
    woke: list[int] = []

    async def sleeper(deadline: int) -> None:
        await clock.sleep_until(deadline)
        woke.append(deadline)

    tasks = [asyncio.create_task(sleeper(d)) for d in (1_500, 1_200, 2_000)]
    await asyncio.sleep(0)
    clock.set(1_199)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(1)
    await asyncio.sleep(0)
    assert woke == [1_200]
    clock.set(2_000)
    await asyncio.gather(*tasks)
    assert sorted(woke) == [1_200, 1_500, 2_000]


def test_manual_clock_never_goes_back() -> None:
    clock = ManualClock(10)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(9)


def test_offset_clock_is_the_system_clock_shifted_and_only_jumps_forward() -> None:
    clock = OffsetClock(offset_ms=-5_000)
    assert abs(clock.now_ms() + 5_000 - SystemClock().now_ms()) < 1_000
    clock.jump(5_000)
    assert abs(clock.now_ms() - SystemClock().now_ms()) < 1_000
    with pytest.raises(ValueError):
        clock.jump(-1)


async def test_sleep_until_or_event_returns_on_the_event_before_the_deadline() -> None:
    clock = ManualClock(0)
    event = asyncio.Event()
    task = asyncio.create_task(sleep_until_or_event(clock, 10_000, event))
    await asyncio.sleep(0)
    assert not task.done()
    event.set()
    await asyncio.wait_for(task, 1)
    assert clock.now_ms() == 0


async def test_sleep_until_or_event_returns_at_the_deadline_without_the_event() -> None:
    clock = ManualClock(0)
    event = asyncio.Event()
    task = asyncio.create_task(sleep_until_or_event(clock, 10_000, event))
    await asyncio.sleep(0)
    clock.set(9_999)
    await asyncio.sleep(0)
    assert not task.done()
    clock.set(10_000)
    await asyncio.wait_for(task, 1)
    assert not event.is_set()


@pytest.mark.parametrize("clock", [SystemClock(), OffsetClock(offset_ms=-5_000)])
async def test_the_system_clock_sleeps_to_the_deadline_not_a_floored_millisecond_past_it(
        clock: SystemClock, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[float] = []

    async def sleep(delay: float) -> None:
        asked.append(delay)

    offset_ns = getattr(clock, "offset_ms", 0) * 1_000_000
    # 0.7 ms into a millisecond: now_ms() says 999, the deadline 1,000 is 0.3 ms away.
    monkeypatch.setattr("time.time_ns", lambda: 999_700_000 - offset_ns)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    assert clock.now_ms() == 999
    await clock.sleep_until(1_000)
    await clock.sleep_until(999)  # past: no sleep at all
    assert asked == [pytest.approx(0.0003)]
