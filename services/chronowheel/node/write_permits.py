"""The node's permits for in-order ingest writes: a bound that narrows while firing is near.

Every shard's in-order ingest pass takes one of these permits per write to Cassandra
(`node/ingest.py`, `Permits`). Few writes in flight keep Cassandra's queue short and the
node's event-loop turns short: a herd's completions arrive a few at a time instead of dozens
per turn. That matters only when something is about to fire. While no shard has an occurrence
due soon, the wide bound (`ingest_writes_in_flight`) lets a herd in at full speed; while one
does, or fired one a moment ago (its transaction still under way), the narrow bound
(`ingest_writes_in_flight_due_soon`) holds new writes back until those in flight drop under it.
Writes already in flight are never cancelled: the narrow bound takes effect as they complete.

`firing_soon` is asked at each acquire and release (at most once per millisecond of the
node's clock); a false "soon" costs ingest speed only, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable


class NodeWritePermits:
    """A semaphore whose size is `wide`, or `narrow` while `firing_soon()`: FIFO, and a waiter
    cancelled after it was handed a permit gives it back."""

    def __init__(self, wide: int, narrow: int, firing_soon: Callable[[], bool],
                 now_ms: Callable[[], int]) -> None:
        if wide < 1 or not 1 <= narrow <= wide:
            raise ValueError(f"need 1 <= narrow ({narrow}) <= wide ({wide})")
        self.wide = wide
        self.narrow = narrow
        self._firing_soon = firing_soon
        self._now_ms = now_ms
        self._asked_at: int | None = None
        self._soon = False
        self.current = wide
        """The bound as last decided (exported as a gauge)."""
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def limit(self) -> int:
        """The bound now: `narrow` while firing is near, else `wide`."""
        now = self._now_ms()
        if now != self._asked_at:
            self._asked_at = now
            self._soon = self._firing_soon()
            self.current = self.narrow if self._soon else self.wide
        return self.current

    async def acquire(self) -> None:
        if not self._waiters and self.in_flight < self.limit():
            self.in_flight += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a permit, then cancelled before it ran: give it back
            else:
                # A release may have passed it over (and dropped it) before this task ran.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                self._wake()  # a waiter behind it may fit now
            raise

    def release(self) -> None:
        if self.in_flight <= 0:
            raise RuntimeError("NodeWritePermits released more often than acquired")
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        if not self._waiters:
            return
        limit = self.limit()
        while self._waiters and self.in_flight < limit:
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self.in_flight += 1
            waiter.set_result(None)
