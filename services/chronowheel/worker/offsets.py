"""Which offsets may be committed while records of one partition finish out of order.

Kafka stores one committed offset per partition: "everything below this is done". With many
handlers in flight, record 7 may finish before record 5, so the committable offset is the
lowest offset still in flight, or one past the highest offset received when none is.

Pure bookkeeping: no Kafka client here.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


@dataclass(eq=False)
class _Partition:
    in_flight: set[int] = field(default_factory=set)
    next_offset: int | None = None  # one past the highest offset received
    committed: int | None = None


@dataclass(frozen=True, eq=False)
class Ticket(Generic[P]):
    """One received record. Finishing it counts only while its partition is still tracked as
    it was then: after a revoke (and maybe a re-assignment) an old handling must not move the
    new owner's commit point."""

    partition: P
    offset: int
    _state: _Partition


class OffsetTracker(Generic[P]):
    def __init__(self) -> None:
        self._parts: dict[P, _Partition] = {}

    def begin(self, partition: P, offset: int) -> Ticket[P]:
        """A record was received; it holds the commit point back until finished."""
        state = self._parts.get(partition)
        if state is None:
            state = self._parts[partition] = _Partition()
        state.in_flight.add(offset)
        if state.next_offset is None or offset + 1 > state.next_offset:
            state.next_offset = offset + 1
        return Ticket(partition, offset, state)

    def finish(self, ticket: Ticket[P]) -> bool:
        """The record is fully handled (also when that meant a retry or a dead letter)."""
        if self._parts.get(ticket.partition) is not ticket._state:
            return False  # the partition was dropped since: not ours to commit any more
        ticket._state.in_flight.discard(ticket.offset)
        return True

    def in_flight(self, partition: P) -> int:
        state = self._parts.get(partition)
        return 0 if state is None else len(state.in_flight)

    def commit_point(self, partition: P) -> int | None:
        """The offset to commit now (next record to read), or None when nothing new is done."""
        state = self._parts.get(partition)
        if state is None or state.next_offset is None:
            return None
        point = min(state.in_flight) if state.in_flight else state.next_offset
        if state.committed is not None and point <= state.committed:
            return None
        return point

    def commit_points(self, partitions: Iterable[P] | None = None) -> dict[P, int]:
        wanted = self._parts.keys() if partitions is None else partitions
        out: dict[P, int] = {}
        for p in wanted:
            point = self.commit_point(p)
            if point is not None:
                out[p] = point
        return out

    def committed(self, points: dict[P, int]) -> None:
        """Record a successful commit of `points` (as returned by commit_points)."""
        for p, offset in points.items():
            state = self._parts.get(p)
            if state is not None and (state.committed is None or offset > state.committed):
                state.committed = offset

    def drop(self, partitions: Iterable[P]) -> None:
        """Forget revoked partitions; tickets issued for them no longer count."""
        for p in partitions:
            self._parts.pop(p, None)

    def last_committed(self, partition: P) -> int | None:
        state = self._parts.get(partition)
        return None if state is None else state.committed

    def partitions(self) -> list[P]:
        return list(self._parts)
