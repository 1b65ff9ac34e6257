"""The worker's sense of elapsed time, injected: the real one in production, a test's manual
clock in unit tests (so leases, renewals, polls and deadlines move only when the test moves
time). Wall-clock instants (retry due times, dead letters' failure times) come from the
worker's `Clock`; this is only about durations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from chronowheel.core.clock import Clock
from chronowheel.timeouts import wait_event

F = TypeVar("F", bound="asyncio.Future[Any]")


class Timer(Protocol):
    def monotonic(self) -> float:
        """Seconds that never step back (only differences mean anything)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, futures: Iterable[F], timeout_s: float) -> tuple[set[F], set[F]]:
        """`asyncio.wait(futures, timeout=timeout_s)`: (done, pending) once all are done or
        the timeout passed."""
        ...

    async def wait_event(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Whether `event` was set (or got set) within `timeout_s`."""
        ...


class RealTimer:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, futures: Iterable[F], timeout_s: float) -> tuple[set[F], set[F]]:
        return await asyncio.wait(set(futures), timeout=max(0.0, timeout_s))

    async def wait_event(self, event: asyncio.Event, timeout_s: float) -> bool:
        return await wait_event(event, timeout_s)


class ClockTimer:
    """Durations on a `Clock`'s time (with a ManualClock: only when the test moves it)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def monotonic(self) -> float:
        return self.clock.elapsed_ms() / 1000

    async def sleep(self, seconds: float) -> None:
        end = self.clock.now_ms() + max(0, round(seconds * 1000))
        await asyncio.sleep(0)
        while self.clock.now_ms() < end:
            await self.clock.sleep_until(end)

    async def wait(self, futures: Iterable[F], timeout_s: float) -> tuple[set[F], set[F]]:
        everything = set(futures)
        pending = {f for f in everything if not f.done()}
        if not pending:
            return everything, set()
        sleeper: asyncio.Future[Any] = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            while pending and not sleeper.done():
                waited: set[asyncio.Future[Any]] = {*pending, sleeper}
                done, _ = await asyncio.wait(waited,
                                             return_when=asyncio.FIRST_COMPLETED)
                pending = {f for f in pending if f not in done}
        finally:
            sleeper.cancel()
        return everything - pending, pending

    async def wait_event(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        try:
            await self.wait([waiter], timeout_s)
        finally:
            waiter.cancel()
        return event.is_set()
