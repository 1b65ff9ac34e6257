"""Named calendars as a shard sees them: read from the store, cached, applied to schedules.

A job that names a calendar (`calendar`) does not fire on its dates, read in the job's zone.
The dates come from the store and are kept for `calendar_refresh_ms`, so a change made through
another node is seen within that time; a change this shard applies itself is seen at once.

A calendar that does not exist (never put, or deleted) excludes nothing: commands on different
partitions are not ordered, so a job may be applied before the put of its calendar, and
rejecting it then would depend on timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import date

from chronowheel.core.clock import Clock
from chronowheel.core.model import JobSpec
from chronowheel.core.recurrence import Schedule, excluding
from chronowheel.node.writes import schedule_of
from chronowheel.store.base import JobStore


class Calendars:
    def __init__(self, *, store: JobStore, clock: Clock, refresh_ms: int) -> None:
        self.store = store
        self.clock = clock
        self.refresh_ms = refresh_ms
        self._cached: dict[str, tuple[frozenset[date] | None, int]] = {}

    async def refresh(self, names: Iterable[str | None]) -> None:
        """Read the calendars among `names` that are not cached or are older than the refresh
        period (None entries, jobs without a calendar, are ignored)."""
        now = self.clock.now_ms()
        stale = {n for n in names if n is not None
                 and (n not in self._cached or now - self._cached[n][1] >= self.refresh_ms)}
        if not stale:
            return
        ordered = sorted(stale)
        found = await asyncio.gather(*(self.store.get_calendar(n) for n in ordered))
        for name, dates in zip(ordered, found, strict=True):
            self._cached[name] = (dates, now)

    def applied(self, name: str, dates: frozenset[date] | None) -> None:
        """This shard wrote (or, with None, deleted) the calendar: use it from now on."""
        self._cached[name] = (dates, self.clock.now_ms())

    def exists(self, name: str) -> bool:
        hit = self._cached.get(name)
        return hit is not None and hit[0] is not None

    def dates(self, name: str) -> frozenset[date]:
        """The cached dates; empty for a calendar that does not exist or was never read."""
        hit = self._cached.get(name)
        return frozenset() if hit is None or hit[0] is None else hit[0]

    def schedule(self, job: JobSpec, base: Schedule | None = None) -> Schedule:
        """The job's schedule with its calendar's dates excluded too (call `refresh` first)."""
        s = schedule_of(job) if base is None else base
        if job.calendar is None:
            return s
        return excluding(s, self.dates(job.calendar))
