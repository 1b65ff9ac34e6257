"""Shards a node gave up as claimed elsewhere, and when to look at each again.

A takeover whose claim is fenced by another claimer of the shard (`node/takeover.py`) gives the
shard up, expecting the group to move it: the other claimer should belong to the member the
group gave the shard to. When that is not so (a takeover of this node's own that was stopped
and went on, a process whose session expired but that still claims), the group goes on
assigning the shard to this node and nobody serves it: nothing moves it before the next
rebalance, however long that takes. So a node looks again after a while: if the group still
gives it the shard and it is still a current member, it takes the shard over again (and fences
whoever claimed it, as any takeover does).

The same goes for the shards a fence's recovery or a later look did not take because the group
coordinator did not confirm the node as a current member: that answer can be a passing one (a
new assignment's epoch the node has not seen yet), and a node that really left the group is
told so by its group member, which revokes its shards.

This is the bookkeeping, without I/O: each loss (or look that took nothing) pushes the shard's
next look further away (`retry_ms`, doubled each time, at most `MAX_RETRY_MS`), so two
processes that both believe they own a shard do not take it from each other in a tight loop;
one more than `QUIET_MS` after the previous starts again from `retry_ms`, and a look that took
the shard does not reset the count. A shard the group revokes or assigns again is forgotten:
the group has decided about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_RETRY_MS = 30_000
QUIET_MS = 300_000


@dataclass
class _Losses:
    in_row: int
    last_ms: int


@dataclass
class LostShards:
    retry_ms: int
    """The first wait after a loss (0: never look again)."""
    _due: dict[int, int] = field(default_factory=dict)
    _losses: dict[int, _Losses] = field(default_factory=dict)

    def lost(self, shard: int, now_ms: int) -> int | None:
        """Note a loss of `shard` at `now_ms`; returns how long until the shard is looked at
        again, or None when the node never looks again (`retry_ms` 0)."""
        if self.retry_ms <= 0:
            return None
        before = self._losses.get(shard)
        in_row = 1 if before is None or now_ms - before.last_ms > QUIET_MS else before.in_row + 1
        self._losses[shard] = _Losses(in_row, now_ms)
        wait = min(self.retry_ms * 2 ** min(in_row - 1, 30), max(MAX_RETRY_MS, self.retry_ms))
        self._due[shard] = now_ms + wait
        return wait

    def forget(self, shards: list[int]) -> None:
        """The group revoked or assigned these shards: its decision replaces ours."""
        for k in shards:
            self._due.pop(k, None)
            self._losses.pop(k, None)

    def next_due_ms(self) -> int | None:
        return min(self._due.values(), default=None)

    def take_due(self, now_ms: int) -> list[int]:
        """The shards whose time to be looked at again has come (no longer pending; their
        losses are remembered for the next one)."""
        due = sorted(k for k, at in self._due.items() if at <= now_ms)
        for k in due:
            del self._due[k]
        return due

    def pending(self) -> list[int]:
        return sorted(self._due)
