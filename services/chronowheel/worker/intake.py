"""Records between the fetch loop and the handler slots, per partition.

A received record is `ready` when its partition needs no fence (idempotency off) or its lease is
held and the outcomes already recorded past its starting offset are known; until then it is
`held` by its partition. Handled records leave an outcome: with idempotency a mark, and only
once it is written is the record's ticket finished (its offset may be committed); without, the
ticket is finished at once.

Marks are written in rounds for the whole worker, not per partition: a round takes the queued
marks of every partition (a row each) and writes them together, a request per ten rows of the
same replicas (`MarkStore.write_marks`); outcomes that come while a round is under way go in
the next one. A round first waits up to `marks_wait_s` for more outcomes to join it, unless
`hurry_marks` of them are queued or a revoke or stop waits for them. Why: Cassandra's CPU at an
ordinary rate follows the number of requests far more than the rows they carry (a write a
partition per handled record kept a third of a core busy at 1,000 records a second;
loadtest/RESULTS.md, "The worker's marks in rounds"). What it costs: a crash can make run
again, besides the handlers running at that moment, the records of the round under way and
those queued for the next (at most `marks_wait_s` of them at a steady rate).

One owner: the worker's event loop. The counters here (`holding`, per-partition `running` and
`unmarked`) are what the fetch loop sizes its next read by and what a revoke waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from chronowheel.bus.ports import SubmitRecord, TopicPartition
from chronowheel.store.base import MarkStore
from chronowheel.worker.offsets import OffsetTracker, Ticket
from chronowheel.worker.partitions import LeaseLost, PartitionGuard, window_bounds
from chronowheel.worker.timing import Timer

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Part:
    """One assigned partition: its guard (with idempotency) and the records waiting for it."""

    tp: TopicPartition
    guard: PartitionGuard | None
    held: deque[Item] = field(default_factory=deque)
    """Received, waiting for the lease (with idempotency) before they may start."""
    deferred: dict[str, list[Item]] = field(default_factory=dict)
    """Copies of an occurrence whose handling is still running: decided when it ends."""
    running: int = 0
    """Records of this partition a handler slot is working on."""
    unmarked: int = 0
    """Handled, with the mark queued or being written (their tickets are not finished yet)."""
    acquiring: asyncio.Task[None] | None = None
    flushing: bool = False
    gone: bool = False
    """Revoked: nothing more of it starts; what is running finishes or is cancelled."""

    @property
    def ready(self) -> bool:
        return self.guard is None or self.guard.holds()


class Item(NamedTuple):
    """One received record on its way through the worker."""

    part: Part
    record: SubmitRecord
    ticket: Ticket[TopicPartition]

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class Intake:
    def __init__(self, tracker: OffsetTracker[TopicPartition], marks: MarkStore | None, *,
                 scope: str, worker_id: str, lease_s: int, keep_s: int, poll_s: float,
                 spawn: Spawn, end_offset: Callable[[TopicPartition], int | None],
                 timer: Timer, marks_wait_s: float = 0.0, hurry_marks: int = 1) -> None:
        self.tracker = tracker
        self.marks = marks
        self.scope = scope
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.keep_s = keep_s
        self.poll_s = poll_s
        self._spawn = spawn
        self._end_offset = end_offset
        self.timer = timer
        self.marks_wait_s = marks_wait_s
        self.hurry_marks = hurry_marks
        """Queued marks at which a round is written without waiting `marks_wait_s`."""
        self.parts: dict[TopicPartition, Part] = {}
        self.ready: deque[Item] = deque()
        self.work = asyncio.Event()
        """Set when `ready` gets records (or the worker is stopping)."""
        self.room = asyncio.Event()
        """Set when a record is handled or finished: the fetch loop may read more."""
        self.holding = 0
        """Records received and not yet finished (handled and marked) nor dropped."""
        self.queued_marks = 0
        """Marks waiting for the next round."""
        self.writing = False
        """The round writer runs (waiting for its round to fill, or writing it)."""
        self.rounds = 0
        """Rounds of marks written (`chronowheel_worker_mark_rounds_total`)."""
        self.mark_requests = 0
        """Cassandra requests those rounds took (`chronowheel_worker_mark_requests_total`)."""
        self._hurry = asyncio.Event()
        """Set when the round must not wait: enough marks queued, or someone waits for them."""
        self._settling = 0
        self.draining = False

    # --- in ---------------------------------------------------------------------------------
    def receive(self, tp: TopicPartition, records: list[SubmitRecord]) -> None:
        part = self.parts.get(tp)
        if part is None:
            guard = None
            if self.marks is not None:
                guard = PartitionGuard(self.marks, self.scope, tp.topic, tp.partition,
                                       self.worker_id, lease_s=self.lease_s,
                                       keep_s=self.keep_s, monotonic=self.timer.monotonic)
            part = self.parts[tp] = Part(tp, guard)
        if part.guard is not None:
            part.guard.touched = True
        items = [Item(part, rec, self.tracker.begin(tp, rec.offset)) for rec in records]
        self.holding += len(items)
        if part.ready and not part.held:
            self.ready.extend(items)
            self.work.set()
        else:
            part.held.extend(items)
            self.need_lease(part)

    def unhandled(self) -> int:
        """Received records not yet handled (waiting or running)."""
        return self.holding - sum(p.unmarked for p in self.parts.values())

    async def next(self) -> Item | None:
        """The next ready record, waiting for one; None when the worker is stopping."""
        while not self.ready:
            if self.draining:
                return None
            self.work.clear()
            await self.work.wait()
        return None if self.draining else self.ready.popleft()

    def take_more(self, share: int, most: int) -> list[Item]:
        """Up to `most` more ready records for a slot, at most its fair share of those
        waiting (one in `share`), without waiting for any."""
        want = min(most, len(self.ready) // share)
        return [self.ready.popleft() for _ in range(min(want, len(self.ready)))]

    def hold_again(self, item: Item) -> None:
        """A record that may not start yet after all (its lease is no longer valid)."""
        part = item.part
        part.held.appendleft(item)
        self.need_lease(part)

    def defer(self, item: Item, occurrence: str) -> None:
        item.part.deferred.setdefault(occurrence, []).append(item)

    def stop(self) -> None:
        """Shutdown: nothing more starts; records not begun stay uncommitted (fetched again by
        whoever owns their partitions next); idle slots wake up and end."""
        self.draining = True
        self.ready.clear()
        self.work.set()

    def stop_acquiring(self) -> list[Part]:
        """Shutdown, once the slots are done: cancel lease acquisitions under way; returns
        every partition, for the last marks, commit and release."""
        parts = list(self.parts.values())
        for part in parts:
            if part.acquiring is not None:
                part.acquiring.cancel()
        return parts

    def committed(self, points: dict[TopicPartition, int]) -> None:
        """Offsets were committed: what lies below them is not delivered again in this
        holding, so their known outcomes can be forgotten."""
        for tp, offset in points.items():
            part = self.parts.get(tp)
            if part is not None and part.guard is not None:
                part.guard.prune(offset)

    def release_running(self, part: Part, occurrence: str) -> None:
        """A handling of `occurrence` ended: its copies that waited are decided now."""
        if part.guard is None:
            return
        part.guard.running.discard(occurrence)
        copies = part.deferred.pop(occurrence, None)
        if copies and not part.gone:
            self.ready.extendleft(reversed(copies))
            self.work.set()

    # --- leases -----------------------------------------------------------------------------
    def need_lease(self, part: Part) -> None:
        if part.acquiring is None and not part.gone and not self.draining:
            part.acquiring = self._spawn(self._acquire(part), f"lease-{part.tp.partition}")

    async def _acquire(self, part: Part) -> None:
        guard = part.guard
        assert guard is not None
        try:
            if guard.owner is not None:  # held, but not renewed in time: try that first
                with contextlib.suppress(LeaseLost):
                    await guard.renew()
            waited_for: str | None = None
            while not guard.holds():
                holder = await guard.acquire()
                if holder is None:
                    break
                if holder != waited_for:
                    log.info("%s[%d]: waiting for the lease held by %s", part.tp.topic,
                             part.tp.partition, holder or "nobody (it is expiring)")
                    waited_for = holder
                await self.timer.sleep(self.poll_s)
            if part.gone:
                await guard.release()
                return
            guard.forget_window()
            if part.held:
                low, high = window_bounds((item.record.offset for item in part.held),
                                          self._end_offset(part.tp))
                found = await guard.load_window(low, high)
                if found:
                    log.info("%s[%d]: %d record(s) from offset %d on were handled before; "
                             "they will be skipped", part.tp.topic, part.tp.partition, found,
                             low)
        finally:
            part.acquiring = None
        if not part.gone and part.held:
            self.ready.extend(part.held)
            part.held.clear()
            self.work.set()

    async def renew_leases(self) -> None:
        """One renewal round: renew each held lease, or release it when its partition was idle
        since the last round (another group sharing the scope may be waiting for it)."""
        await asyncio.gather(*(self._renew(part) for part in list(self.parts.values())))

    async def _renew(self, part: Part) -> None:
        guard = part.guard
        if guard is None or guard.owner is None or part.gone:
            return
        idle = (not guard.touched and not part.held and part.running == 0
                and not guard.pending and not part.flushing)
        guard.touched = False
        try:
            if idle:
                await guard.release()
            else:
                await guard.renew()
        except LeaseLost as lost:
            log.warning("%s[%d]: lease lost to %s; this worker starts no handler of it until "
                        "it holds the lease again", part.tp.topic, part.tp.partition,
                        lost.holder)
        except Exception as exc:  # Cassandra unreachable: handlers stop when valid_until passes
            log.warning("%s[%d]: renewing the lease failed: %r", part.tp.topic,
                        part.tp.partition, exc)

    async def release_leases(self, parts: Iterable[Part]) -> None:
        await asyncio.gather(*(p.guard.release() for p in parts if p.guard is not None),
                             return_exceptions=True)

    # --- out --------------------------------------------------------------------------------
    def outcome(self, part: Part, offset: int, state: str, occurrence: str,
                ticket: Ticket[TopicPartition]) -> None:
        if part.guard is None:
            self.finish(ticket)
            return
        part.guard.mark(offset, state, occurrence, ticket)
        part.unmarked += 1
        self.queued_marks += 1
        if not self.room.is_set():
            self.room.set()
        if self.queued_marks >= self.hurry_marks:
            self._hurry.set()
        self._write_marks_soon()

    def _write_marks_soon(self) -> None:
        if not self.writing:
            self.writing = True
            self._spawn(self._write_rounds(), "marks")

    async def _write_rounds(self) -> None:
        """Write rounds of marks until none are queued (see the module's docstring)."""
        try:
            while True:
                if self.marks_wait_s > 0 and not self._hurry.is_set():
                    await self.timer.wait_event(self._hurry, self.marks_wait_s)
                self._hurry.clear()
                if self._settling:
                    self._hurry.set()
                taken: list[tuple[Part, list[object]]] = []
                rows = []
                for part in self.parts.values():
                    guard = part.guard
                    if guard is not None and guard.pending:
                        marks, tickets = guard.take_pending()
                        rows += guard.rows(marks)
                        taken.append((part, tickets))
                        part.flushing = True
                if not taken:
                    return
                self.queued_marks = 0  # every partition's queue was taken
                store = self.marks
                assert store is not None
                try:
                    self.mark_requests += await store.write_marks(self.scope, rows,
                                                                  self.keep_s)
                finally:
                    for part, _ in taken:
                        part.flushing = False
                self.rounds += 1
                for part, tickets in taken:
                    part.unmarked -= len(tickets)
                    for ticket in tickets:
                        self.finish(cast(Ticket[TopicPartition], ticket))
        finally:
            self.writing = False

    async def settle_marks(self, parts: list[Part], timeout_s: float = 10.0) -> None:
        """Wait (bounded) for the marks of `parts` to be written, before a final commit; the
        rounds meanwhile do not wait for more outcomes."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        self._settling += 1
        self._hurry.set()
        try:
            while loop.time() < end:
                busy = [p for p in parts
                        if p.guard is not None and (p.flushing or p.guard.pending)]
                if not busy:
                    return
                if any(p.guard is not None and p.guard.pending for p in busy):
                    self._write_marks_soon()
                await asyncio.sleep(0.01)
        finally:
            self._settling -= 1

    def finish(self, ticket: Ticket[TopicPartition]) -> None:
        if self.tracker.finish(ticket):
            self.holding -= 1
            if not self.room.is_set():
                self.room.set()

    # --- revoking ---------------------------------------------------------------------------
    def take(self, gone: set[TopicPartition]) -> list[Part]:
        """Revoked partitions: nothing of theirs starts any more."""
        parts = [p for tp, p in self.parts.items() if tp in gone]
        for part in parts:
            part.gone = True
            if part.acquiring is not None:
                part.acquiring.cancel()
            part.held.clear()
            part.deferred.clear()
        self.ready = deque(it for it in self.ready if it.part.tp not in gone)
        return parts

    def forget(self, parts: list[Part]) -> None:
        """After their last commit: tickets never finished (waiting, cancelled, unmarked)
        leave with their partitions."""
        for part in parts:
            self.holding -= self.tracker.in_flight(part.tp)
            if part.guard is not None:
                self.queued_marks -= len(part.guard.pending)
            self.parts.pop(part.tp, None)
        self.tracker.drop(p.tp for p in parts)
        self.room.set()
