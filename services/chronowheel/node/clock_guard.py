"""The node's clock guard: dispatch runs only while the node's clock agrees with Cassandra's.

A skew monitor measures the offset to Cassandra's clock every `skew_check_interval_ms` and
stops dispatch on a skew over `max_clock_skew_ms` that is certain; a step of the clock since the
last check stops it at once (`dispatch_blocked`), not only at the next check. Beside it, the
loop watch reports how long the event loop stays blocked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from chronowheel.core.clock import Clock, anchor, stepped_ms
from chronowheel.errors import ChronowheelError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.settings import Settings
from chronowheel.store.base import JobStore
from chronowheel.timeouts import wait_event

log = logging.getLogger(__name__)

# The event loop watch sleeps this long and measures how much later it wakes.
LOOP_WATCH_MS = 100


async def measure_skew(store: JobStore, clock: Clock, rounds: int = 3) -> tuple[int, int]:
    """(skew, uncertainty) in ms of `clock` to Cassandra's (positive: `clock` is ahead), from
    the tightest of a few round trips: the server's clock was read somewhere between send and
    answer, so the error is at most half the round trip. The node's skew check; also how a
    load generator on another machine puts its receive times on Cassandra's clock."""
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        server, sent, received = await store.clock_sample()
        # Local times come from the system clock; express them on `clock`.
        offset = clock.now_ms() - time.time_ns() // 1_000_000
        half = (received - sent + 1) // 2
        skew = (sent + received) // 2 + offset - server
        if best is None or half < best[1]:
            best = (skew, half)
    assert best is not None
    return best


class ClockGuard:
    def __init__(self, *, settings: Settings, clock: Clock, metrics: NodeMetrics, node_id: str,
                 store: Callable[[], JobStore], on_clear: Callable[[], None]) -> None:
        """`store` gives the store to read Cassandra's clock from (opened after this is
        made); `on_clear` is called after every check that lets dispatch run."""
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.node_id = node_id
        self.store = store
        self.on_clear = on_clear
        self.skew_ms: int | None = None
        # Blocked until the first skew check passes: never early includes the first second.
        self.blocked = True
        # Wall and monotonic time at the last skew check: a step of the clock since then is
        # seen at once (`dispatch_blocked`), not only at the next check.
        self._anchor = anchor(clock)
        self.recheck = asyncio.Event()
        """Set: the monitor checks again now instead of at the end of its interval."""

    def state(self) -> tuple[int | None, bool]:
        """The last measured skew and whether dispatch is blocked (for the state records)."""
        return self.skew_ms, self.blocked

    def dispatch_blocked(self) -> bool:
        """Whether dispatch must wait: the last skew check failed, or the clock was stepped
        since (by more than max_clock_skew_ms; a clock stepped forward would fire jobs early
        until the next check). A step stops dispatch until a skew check passes again."""
        if self.blocked:
            return True
        step = stepped_ms(self.clock, self._anchor)
        if abs(step) <= self.settings.max_clock_skew_ms:
            return False
        log.error("node %s: the clock stepped %+d ms since the last skew check (limit %d ms): "
                  "dispatch STOPPED until a skew check passes", self.node_id, step,
                  self.settings.max_clock_skew_ms)
        self.blocked = True
        self.metrics.dispatch_blocked.set(1)
        self.recheck.set()
        return True

    async def measure_skew(self) -> tuple[int, int]:
        """(skew, uncertainty) in ms: see `measure_skew`."""
        return await measure_skew(self.store(), self.clock)

    async def monitor(self) -> None:
        limit = self.settings.max_clock_skew_ms
        while True:
            self.recheck.clear()
            before = anchor(self.clock)
            try:
                self.skew_ms, uncertainty = await self.measure_skew()
            except (ChronowheelError, TimeoutError) as exc:
                log.warning("clock skew check failed (dispatch stays %s): %s",
                            "stopped" if self.blocked else "on", exc)
            else:
                self.metrics.clock_skew.set(self.skew_ms / 1000)
                # Stop only on a skew that is certain; an uncertain reading of a first check
                # keeps dispatch stopped until a tighter one comes.
                certain_over = abs(self.skew_ms) - uncertainty > limit
                certain_under = abs(self.skew_ms) + uncertainty <= limit
                blocked = certain_over or (self.blocked and not certain_under)
                if blocked != self.blocked:
                    if blocked:
                        log.error("clock skew %d ms exceeds max_clock_skew %d ms: dispatch "
                                  "STOPPED until the clocks agree", self.skew_ms, limit)
                    else:
                        log.info("clock skew %d ms is within max_clock_skew %d ms: "
                                 "dispatching", self.skew_ms, limit)
                self.blocked = blocked
                self._anchor = before
                self.metrics.dispatch_blocked.set(1 if blocked else 0)
                if not blocked:
                    self.on_clear()
            await wait_event(self.recheck, self.settings.skew_check_interval_ms / 1000)

    async def loop_watch(self) -> None:
        """Measure how long the event loop stays blocked. The group's heartbeats do not depend
        on it (the group member runs on a thread of its own), but a loop that answers nothing
        for node_loop_stall_limit_ms makes the group drop this node (its shards move and it
        must take what it gets again): report stalls well before that. Measured on the
        monotonic clock: this is about elapsed time, not about the time of day."""
        limit_ms = self.settings.node_loop_stall_limit_ms
        warn_ms = limit_ms / 3
        worst_ms = 0.0
        while True:
            started = time.monotonic()
            await asyncio.sleep(LOOP_WATCH_MS / 1000)
            stall_ms = (time.monotonic() - started) * 1000 - LOOP_WATCH_MS
            if stall_ms > worst_ms:
                worst_ms = stall_ms
                self.metrics.loop_stall_max.set(worst_ms / 1000)
            if stall_ms > warn_ms:
                log.warning("node %s: the event loop was blocked for %.0f ms "
                            "(node_loop_stall_limit_ms is %d: a stall that long loses the "
                            "node its shards)", self.node_id, stall_ms, limit_ms)
