"""Idempotency per partition: one fenced lease per (scope, topic, partition), batched done marks.

Why not a compare-and-set per record: two Paxos rounds per occurrence (claim, then done) cap a
worker at a few hundred records a second. Fencing is paid here once per partition holding
instead, and outcomes are plain writes grouped per partition:

- **Lease.** Before it starts any handler of a partition, a worker takes the partition's lease
  with one conditional write (`owner = null -> mine`, TTL `lease_s`) and renews it every
  `lease_s / 3` while it holds the partition. A crashed worker's lease expires; a stopping or
  revoked one releases it at once. A second holder is impossible: the new owner waits for
  expiry, and the old one stops starting handlers `lease_s / 3` before its lease could have
  expired (`valid_until`, measured from when the renewal was *sent*, on the monotonic clock), so
  a worker paused past its lease (a zombie) finds that out before it runs anything.
- **Marks.** Each handled record's outcome (`done`, `failed` after its retry or dead letter was
  produced, `skipped`) is queued and written with the others of its partition in one row, the
  rows of every partition of the worker together (`intake.py`, a round); a record's offset may
  be committed only once its mark is durable (or, without idempotency, once it is handled).
- **Window.** On taking the lease a worker reads the marks from the lowest offset it is about to
  handle up to the partition's end, so a record that was handled but not committed (a crash, a
  rebalance, a zombie's last handlings) is skipped when delivered again. Copies of an
  occurrence at other offsets are recognised within that window and among the last
  `RECENT_OCCURRENCES` occurrences handled on the partition; retries (`cw-attempt` > 1), which a
  crash can duplicate anywhere, keep the per-occurrence ledger of `ledger.py`.
- **Idle release.** A lease whose partition saw no record for a whole renewal period is released
  rather than renewed, so groups sharing one scope take turns instead of one starving the other.

Pure logic over a `MarkStore` (`store/base.py`); no driver here.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chronowheel.store.base import Mark, MarkRow, MarkStore, block_of

log = logging.getLogger(__name__)

MARK_DONE, MARK_FAILED, MARK_SKIPPED, MARK_DEAD = "done", "failed", "skipped", "dead"
RECENT_OCCURRENCES = 20_000
"""Occurrences remembered per partition to recognise copies outside the window."""


def split_by_block(marks: Sequence[Mark]) -> list[list[Mark]]:
    """Marks sorted by offset, cut where the block changes (one stored row per piece)."""
    out: list[list[Mark]] = []
    for mark in sorted(marks):
        if out and block_of(out[-1][-1].offset) == block_of(mark.offset):
            out[-1].append(mark)
        else:
            out.append([mark])
    return out


@dataclass
class LeaseLost(Exception):
    """Another worker holds the partition's lease (we were paused, or it was taken over)."""

    partition: int
    holder: str


class PartitionGuard:
    """The lease, the window of known outcomes and the queued marks of one partition.

    One guard per (topic, partition) a worker handles; the worker's event loop is its only
    user (no locks). `holds()` is also read from handler threads before each sync call.
    """

    def __init__(self, store: MarkStore, scope: str, topic: str, partition: int,
                 worker_id: str, *, lease_s: int, keep_s: int,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.scope = scope
        self.topic = topic
        self.partition = partition
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.keep_s = keep_s
        self._monotonic = monotonic
        self.owner: str | None = None
        self.valid_until = 0.0
        """Monotonic instant after which no handler may start without a renewal."""
        self.done_offsets: set[int] = set()
        self.recent: OrderedDict[str, None] = OrderedDict()
        self.running: set[str] = set()
        self.pending: list[tuple[Mark, object]] = []
        self.touched = False
        """A record was received or started since the last renewal (else the lease is idle)."""

    # --- the lease ------------------------------------------------------------------------
    @property
    def margin_s(self) -> float:
        return self.lease_s / 3

    def holds(self) -> bool:
        return self.owner is not None and self._monotonic() < self.valid_until

    async def acquire(self) -> str | None:
        """Try once to take the lease: None when taken, else who holds it."""
        owner = f"{self.worker_id}/{secrets.token_hex(6)}"
        sent = self._monotonic()
        holder = await self.store.acquire_lease(self.scope, self.topic, self.partition, owner,
                                                self.lease_s)
        if holder is not None and holder != owner:
            return holder
        self.owner = owner
        self.valid_until = sent + self.lease_s - self.margin_s
        return None

    async def load_window(self, from_offset: int, to_offset: int) -> int:
        """Read the marks of [from_offset, to_offset]; returns how many were found."""
        marks = await self.store.read_marks(self.scope, self.topic, self.partition,
                                            from_offset, to_offset)
        for mark in marks:
            self.done_offsets.add(mark.offset)
            self._remember(mark.occurrence)
        return len(marks)

    async def renew(self) -> None:
        """Extend the lease; raises LeaseLost when someone else holds it now."""
        if self.owner is None:
            return
        sent = self._monotonic()
        holder = await self.store.renew_lease(self.scope, self.topic, self.partition,
                                              self.owner, self.lease_s)
        if holder is not None and holder != self.owner:
            self.owner = None
            self.valid_until = 0.0
            raise LeaseLost(self.partition, holder or "nobody (it expired)")
        self.valid_until = sent + self.lease_s - self.margin_s

    async def release(self) -> None:
        owner, self.owner, self.valid_until = self.owner, None, 0.0
        if owner is not None:
            await self.store.release_lease(self.scope, self.topic, self.partition, owner)

    def forget_window(self) -> None:
        """Before taking the lease again: whatever we knew may be stale."""
        self.done_offsets.clear()

    # --- outcomes -------------------------------------------------------------------------
    def mark(self, offset: int, state: str, occurrence: str, ticket: object) -> None:
        """Queue an outcome; `ticket` is handed back by `take_pending` once it is written."""
        self._remember(occurrence)
        self.pending.append((Mark(offset, state, occurrence), ticket))

    def take_pending(self) -> tuple[list[Mark], list[object]]:
        batch, self.pending = self.pending, []
        return [m for m, _ in batch], [t for _, t in batch]

    def rows(self, marks: Sequence[Mark]) -> list[MarkRow]:
        """`marks` as the rows that store them: one per block they span."""
        return [MarkRow(self.topic, self.partition, piece) for piece in split_by_block(marks)]

    def prune(self, below_offset: int) -> None:
        """Offsets below the committed point will not be delivered again in this holding."""
        if self.done_offsets:
            self.done_offsets = {o for o in self.done_offsets if o >= below_offset}

    def _remember(self, occurrence: str) -> None:
        recent = self.recent
        recent[occurrence] = None
        recent.move_to_end(occurrence)
        if len(recent) > RECENT_OCCURRENCES:
            recent.popitem(last=False)


def window_bounds(offsets: Iterable[int], end_offset: int | None) -> tuple[int, int]:
    """The offsets whose marks a new holder must know: from the lowest record it holds up to
    the end of the partition (records past what it holds may have been handled out of order)."""
    held = list(offsets)
    low = min(held)
    high = max([*held, (end_offset or 0) - 1])
    return low, high
