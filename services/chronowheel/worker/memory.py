"""An in-memory MarkStore with Cassandra's semantics for leases (TTL'd conditional writes) and
marks, on an injected clock: the worker's idempotency logic unit-tested without a server."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chronowheel.worker.partitions import Mark


class MemoryMarks:
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.leases: dict[tuple[str, str, int], tuple[str, float]] = {}
        self.marks: dict[tuple[str, str, int], dict[int, Mark]] = {}
        self.writes = 0

    def _holder(self, key: tuple[str, str, int]) -> str | None:
        hit = self.leases.get(key)
        if hit is None or hit[1] <= self._now():
            self.leases.pop(key, None)
            return None
        return hit[0]

    async def acquire_lease(self, scope: str, topic: str, partition: int, owner: str,
                            ttl_s: int) -> str | None:
        key = (scope, topic, partition)
        holder = self._holder(key)
        if holder is not None:
            return holder
        self.leases[key] = (owner, self._now() + ttl_s)
        return None

    async def renew_lease(self, scope: str, topic: str, partition: int, owner: str,
                          ttl_s: int) -> str | None:
        key = (scope, topic, partition)
        holder = self._holder(key)
        if holder != owner:
            return holder or ""
        self.leases[key] = (owner, self._now() + ttl_s)
        return None

    async def release_lease(self, scope: str, topic: str, partition: int, owner: str) -> None:
        key = (scope, topic, partition)
        if self._holder(key) == owner:
            del self.leases[key]

    async def write_marks(self, scope: str, topic: str, partition: int, marks: Sequence[Mark],
                          ttl_s: int) -> None:
        self.writes += 1
        stored = self.marks.setdefault((scope, topic, partition), {})
        for mark in marks:
            stored[mark.offset] = mark

    async def read_marks(self, scope: str, topic: str, partition: int, from_offset: int,
                         to_offset: int) -> list[Mark]:
        stored = self.marks.get((scope, topic, partition), {})
        return [m for o, m in stored.items() if o >= from_offset]
