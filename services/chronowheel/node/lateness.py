"""A shard's lateness bound and paced catch-up (docs/design.md, section "Lateness and
catch-up").

On time and late. Dispatch takes an occurrence from the wheel at some moment `now`; its delay
is `now - slot` (the slot is the instant it was due to go: its scheduled instant, or later for
a spread window or a resumed job). It is *on time* when that delay is at most
`catch_up_lag_ms` (5 s): a node a little behind, not a gap. It is *late* beyond that: the
shard was not running (an outage, a takeover), or a backlog built up.

Pacing. When a shard comes back from a gap in dispatch (a takeover, a clock-skew block) and
finds late occurrences in its wheel, it moves every one due up to
`now - catch_up_lag_ms` (the cut) into its `LateQueue` at once, raises its watermark to the
cut, and from then on publishes on-time occurrences as they come due while the queue drains,
oldest first, at most `catch_up_rate` occurrences per second (`Pacer`). So a recovery cannot
flood consumers and does not hold up on-time work. A shard that merely falls behind (a herd
larger than it can publish within the lag) is not a gap: it goes on in order, at full speed.
The state record says what is published meanwhile: everything up to its `watermark` (the
queue's oldest slot, minus one), and also the range `ahead` (the cut, the shard's watermark],
so a takeover loads the queue's rows again and nothing after the cut twice
(`ShardState.record_watermark`, `node/loader.py`). A shard back from another gap in the middle
of a catch-up (a takeover of such a record, a clock-skew block) cuts again: what came due
since is queued behind what waits, and the record names each published range
(`Dispatcher._cut_again`).

The lateness bound. An occurrence of a job's own schedule (not a retry, not one a trigger or
backfill asked for) that would be published more than `max_lateness` after its *scheduled*
instant is not published: it is recorded as missed (`Missed`): the metric
`chronowheel_occurrences_missed_total`, a log line, and the `sink` that the run history
takes it from. A recurring job goes on with its next occurrence. The bound is checked when
dispatch takes the occurrence, and the occurrence is recorded once the part that covers it
(the step's, which then commits at once) has committed: a part that does not commit ends the
shard's actor, and whoever takes the shard next takes the occurrence again, so it is recorded
once. A one-shot missed that way leaves the catch-up queue at no cost to its rate (a recurring
one costs a turn: its catch-up policy may still fire a later occurrence).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import Counter
from collections.abc import Callable

from chronowheel.core import wire
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, Pending, RequestedPending

log = logging.getLogger(__name__)

LOGGED_PER_STEP = 20
"""Missed occurrences a shard logs one by one per dispatch step; the rest of the step's are
summed up in one line (`Missed.step_done`). After a long outage a namespace-wide bound may
miss a whole herd at once, and a line each would hold the event loop for seconds."""

PACE_TICK_MS = 50
"""A shard paced by its catch-up rate takes its share at most this often (one step per
occurrence at high rates would cost more than the publishing)."""


def lateness_bound(p: Pending, default_ms: int) -> int | None:
    """The lateness bound of occurrence `p` (ms), or None: the job's own `max_lateness`,
    else the namespace's default (`Settings.max_lateness_ms`, 0 for none). A worker's retry
    (its lateness is the backoff asked for) and an occurrence a trigger or a backfill asked
    for (published as asked, however old its instant) have none."""
    d = p.delivery
    if d.attempt != 1 or isinstance(p, RequestedPending):
        return None
    if d.max_lateness_ms is not None:
        return d.max_lateness_ms
    return default_ms or None


MissedSink = Callable[[Pending, int], None]
"""Told of each missed occurrence (the occurrence, with the scheduled instant that was missed,
and its lateness in ms) after the metric and the log line."""


class Missed:
    """Where a shard's missed occurrences go: one call per occurrence, never raising."""

    def __init__(self, *, shard: int, namespace: str, metrics: NodeMetrics,
                 sink: MissedSink | None = None) -> None:
        self.shard = shard
        self.namespace = namespace
        self.counter = metrics.missed.labels(namespace)
        self.sink = sink
        self._in_step = 0
        self._latest = 0

    def record(self, p: Pending, lateness_ms: int, bound_ms: int) -> None:
        self.counter.inc()
        self._in_step += 1
        self._latest = max(self._latest, lateness_ms)
        occurrence = wire.occurrence_id(p.job_id, p.scheduled_ms)
        if self._in_step <= LOGGED_PER_STEP:
            log.info("shard %d: job %s: occurrence %s missed: %d ms late, over its "
                     "max_lateness of %d ms; not published", self.shard, p.job_id, occurrence,
                     lateness_ms, bound_ms,
                     extra={"shard": self.shard, "job_id": p.job_id, "occurrence": occurrence,
                            "outcome": "missed", "lateness_ms": lateness_ms,
                            "max_lateness_ms": bound_ms})
        if self.sink is not None:
            try:
                self.sink(p, lateness_ms)
            except Exception:  # a record of one occurrence must never stop the shard
                log.exception("shard %d: recording the missed occurrence %s failed",
                              self.shard, occurrence, extra={"shard": self.shard})

    def step_done(self) -> None:
        """End of a dispatch step: one line for the missed occurrences not logged singly."""
        more = self._in_step - LOGGED_PER_STEP
        if more > 0:
            log.info("shard %d: %d more occurrences missed in this step (up to %d ms late); "
                     "not published, counted in chronowheel_occurrences_missed_total",
                     self.shard, more, self._latest,
                     extra={"shard": self.shard})
        self._in_step = self._latest = 0


class LateQueue:
    """Late occurrences taken from the wheel, waiting for their turn, oldest slot first.

    They are not published yet: a cancel, an edit or a pause that arrives meanwhile takes the
    job's occurrence out of the queue (`remove`), as it takes it out of the wheel, and deletes
    its due row, so a later owner does not load it back (`ShardState.unpublished`)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Pending]] = []
        self._seq = itertools.count()
        # What is queued, by occurrence key (Pending hashes and compares by it), with the
        # sequence number of its heap entry: the loader reads a millisecond again after it
        # stopped inside it at the memory cap, and a row queued twice would be published
        # twice. A removed occurrence leaves its heap entry behind, dead (its sequence number
        # is no longer the one recorded here), skipped when it comes up.
        self._queued: dict[Pending | OccurrenceKey, int] = {}
        # Occurrences a command is changing (`ShardState.holding`): the queue gives nothing
        # from the first of them on until they are released, as the wheel stays below them.
        self._held: Counter[Pending | OccurrenceKey] = Counter()

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, key: Pending | OccurrenceKey) -> bool:
        return key in self._queued

    def push(self, p: Pending) -> None:
        """Queue `p` unless the same occurrence is queued already."""
        if p in self._queued:
            return
        seq = next(self._seq)
        self._queued[p] = seq
        heapq.heappush(self._heap, (p.slot_ms, seq, p))

    def hold(self, keys: list[OccurrenceKey]) -> None:
        """Give nothing from any of `keys` on (queued now or later) until `release`."""
        self._held.update(keys)

    def release(self, keys: list[OccurrenceKey]) -> None:
        self._held.subtract(keys)
        for key in keys:
            if self._held[key] <= 0:
                self._held.pop(key, None)

    def head_held(self) -> bool:
        """Whether the oldest queued occurrence is held (`pop` gives nothing until release,
        which wakes dispatch)."""
        if not self._held:
            return False
        self._drop_dead()
        return bool(self._heap) and self._heap[0][2] in self._held

    def remove(self, key: OccurrenceKey) -> bool:
        """Take the occurrence `key` out of the queue (its job was cancelled, paused or
        edited); False when it is not queued."""
        return self._queued.pop(key, None) is not None

    def _drop_dead(self) -> None:
        heap, queued = self._heap, self._queued
        while heap and queued.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)

    def oldest(self) -> int | None:
        """The smallest slot held, None when empty."""
        self._drop_dead()
        return self._heap[0][0] if self._heap else None

    def pop(self, budget: int, free: Callable[[Pending], bool],
            upto: int | None = None) -> list[Pending]:
        """Up to `budget` occurrences, oldest first, plus every one met on the way that `free`
        says will not be published (missed: those cost nothing), finishing the last
        millisecond taken: the state record's watermark is the queue's oldest slot minus one,
        so a millisecond is never left half taken. Nothing after `upto` (the loaded horizon:
        a minute being read may still add rows to its last millisecond)."""
        heap, queued = self._heap, self._queued
        out: list[Pending] = []
        left = budget
        last: int | None = None
        while heap:
            slot, seq, p = heap[0]
            if queued.get(p) != seq:  # removed (a cancel, an edit, a pause)
                heapq.heappop(heap)
                continue
            if upto is not None and slot > upto:
                break
            if self._held and p in self._held:
                # A command is changing its job: nothing from here on (the state record's
                # watermark is the oldest queued slot minus one, so none after it either).
                break
            paid = not free(p)
            if left <= 0 and slot != last and paid:
                break
            heapq.heappop(heap)
            del queued[p]
            out.append(p)
            last = slot
            if paid:
                left -= 1
        return out


class Pacer:
    """A token bucket of `rate` per second holding at most a second's worth (so a pause in
    dispatch does not turn into a burst), starting full."""

    def __init__(self, rate: int, now_ms: int) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.at = now_ms

    def available(self, now_ms: int) -> int:
        if now_ms > self.at:
            self.tokens = min(float(self.rate), self.tokens + (now_ms - self.at) * self.rate / 1000)
            self.at = now_ms
        return max(0, int(self.tokens))

    def spend(self, n: int) -> None:
        self.tokens -= n

    def next_ms(self, now_ms: int) -> int:
        """When the next step should take its share: a whole token, PACE_TICK_MS at least."""
        need = max(0.0, 1 - self.tokens)
        return now_ms + max(PACE_TICK_MS, int(need * 1000 / self.rate) + 1)
