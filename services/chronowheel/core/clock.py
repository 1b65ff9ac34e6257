"""Injected time source: production code asks a Clock, tests drive a ManualClock."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """UTC wall-clock time in epoch milliseconds."""
        ...

    async def sleep_until(self, deadline_ms: int) -> None:
        """Return once now_ms() >= deadline_ms (or earlier if woken; callers re-check)."""
        ...

    def elapsed_ms(self) -> int:
        """A count of milliseconds that never steps (monotonic): compared with now_ms() it
        shows when the wall clock was stepped (`stepped_ms`)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return self.now_ns() // 1_000_000

    def now_ns(self) -> int:
        """UTC wall-clock time in epoch nanoseconds (what now_ms() floors)."""
        return time.time_ns()

    def elapsed_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    async def sleep_until(self, deadline_ms: int) -> None:
        # From the time itself, not from now_ms(): that floors to the millisecond, and a delay
        # counted from it overslept the deadline by the fraction of a millisecond it dropped
        # (half a millisecond on average, on every occurrence's way out of the wheel).
        delay = (deadline_ms * 1_000_000 - self.now_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)


class ManualClock:
    """A clock that only moves when told; sleepers wake when it passes their deadline."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def now_ms(self) -> int:
        return self._now

    def elapsed_ms(self) -> int:
        # Time moves only when told: there is no other time for it to step against.
        return self._now

    def set(self, now_ms: int) -> None:
        if now_ms < self._now:
            raise ValueError(f"ManualClock cannot go backwards: {now_ms} < {self._now}")
        self._now = now_ms
        still: list[tuple[int, asyncio.Future[None]]] = []
        for deadline, fut in self._waiters:
            if deadline <= now_ms:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((deadline, fut))
        self._waiters = still

    def advance(self, delta_ms: int) -> None:
        self.set(self._now + delta_ms)

    async def sleep_until(self, deadline_ms: int) -> None:
        if deadline_ms <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((deadline_ms, fut))
        await fut


class OffsetClock(SystemClock):
    """The system clock shifted by an adjustable offset: lets a test jump a real node ahead.

    Only ever moved forward, so a node driven by it never sees time go back.
    """

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def now_ns(self) -> int:
        return super().now_ns() + self.offset_ms * 1_000_000

    def jump(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise ValueError("OffsetClock only moves forward")
        self.offset_ms += delta_ms


def stepped_ms(clock: Clock, anchor: tuple[int, int]) -> int:
    """How far the clock's wall time moved, beyond the time that elapsed, since `anchor`
    (now_ms(), elapsed_ms()) was taken: positive when it was stepped forward."""
    wall, elapsed = anchor
    return (clock.now_ms() - wall) - (clock.elapsed_ms() - elapsed)


def anchor(clock: Clock) -> tuple[int, int]:
    return clock.now_ms(), clock.elapsed_ms()


async def sleep_until_or_event(clock: Clock, deadline_ms: int, *events: asyncio.Event) -> None:
    """Return at the deadline (by `clock`) or as soon as one of `events` is set, whichever is
    first."""
    sleeper = asyncio.ensure_future(clock.sleep_until(deadline_ms))
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait((sleeper, *waiters), return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        for waiter in waiters:
            waiter.cancel()
