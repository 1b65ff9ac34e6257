"""The worker's storage (`store/base.py`, "the worker's storage") in memory, for tests that run
workers without Cassandra.

`MemoryMarks` has Cassandra's semantics for partition leases (TTL'd conditional writes) and
outcome marks; claims and run leases are `MemoryStore`'s (`store/memory.py`). Expiry follows
an injected time source (seconds), the wall clock by default. One event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from chronowheel.core.clock import Clock
from chronowheel.store.base import Mark, MarkRow, WorkerStores, block_of
from chronowheel.store.memory import MemoryStore


class MemoryMarks:
    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self.leases: dict[tuple[str, str, int], tuple[str, float]] = {}
        self.marks: dict[tuple[str, str, int], dict[int, Mark]] = {}
        self.writes = 0
        """Mark rows written so far (a row per partition and block in each write)."""
        self.requests = 0
        """`write_marks` calls so far."""
        self.calls = 0
        """Calls made so far (a test reads it to see whether the store is still being used)."""

    def _holder(self, key: tuple[str, str, int]) -> str | None:
        hit = self.leases.get(key)
        if hit is None or hit[1] <= self._now():
            self.leases.pop(key, None)
            return None
        return hit[0]

    async def acquire_lease(self, scope: str, topic: str, partition: int, owner: str,
                            ttl_s: int) -> str | None:
        self.calls += 1
        key = (scope, topic, partition)
        holder = self._holder(key)
        if holder is not None:
            return holder
        self.leases[key] = (owner, self._now() + max(1, ttl_s))
        return None

    async def renew_lease(self, scope: str, topic: str, partition: int, owner: str,
                          ttl_s: int) -> str | None:
        self.calls += 1
        key = (scope, topic, partition)
        holder = self._holder(key)
        if holder != owner:
            return holder or ""
        self.leases[key] = (owner, self._now() + max(1, ttl_s))
        return None

    async def release_lease(self, scope: str, topic: str, partition: int, owner: str) -> None:
        self.calls += 1
        key = (scope, topic, partition)
        if self._holder(key) == owner:
            del self.leases[key]

    async def write_marks(self, scope: str, rows: Sequence[MarkRow], ttl_s: int) -> int:
        self.calls += 1
        self.requests += 1
        for row in rows:
            offsets = [m.offset for m in row.marks]
            if offsets != sorted(offsets) or len({block_of(o) for o in offsets}) > 1:
                raise ValueError(f"marks of {row.topic}[{row.partition}] not ascending in one "
                                 f"block: {offsets}")
            self.writes += 1
            stored = self.marks.setdefault((scope, row.topic, row.partition), {})
            for mark in row.marks:
                stored[mark.offset] = mark
        return 1 if rows else 0

    async def read_marks(self, scope: str, topic: str, partition: int, from_offset: int,
                         to_offset: int) -> list[Mark]:
        self.calls += 1
        stored = self.marks.get((scope, topic, partition), {})
        return [m for o, m in stored.items() if o >= from_offset]


def memory_worker_stores(clock: Clock | None = None) -> WorkerStores:
    """Marks, claims and run leases in memory, expiring by `clock` (the wall clock if None).
    Workers given the same stores share their leases, marks and claims, as workers of one
    idempotency scope share Cassandra's tables."""
    store = MemoryStore(clock=clock)
    now = time.time if clock is None else (lambda: clock.now_ms() / 1000)
    return WorkerStores(marks=MemoryMarks(now), claims=store, runs=store)
