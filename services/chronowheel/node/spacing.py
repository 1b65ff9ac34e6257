"""How long a node's next transaction waits after the last one began: the spacing.

Every Kafka transaction costs the brokers the same fixed work whatever it carries
(AddPartitionsToTxn, EndTxn, the coordinator's log writes and a marker on every partition
written, each replicated). While the brokers have CPU to spare, transactions back to back are
the fastest way out for every occurrence; once they are short of it, each transaction queues
behind the others and spacing them leaves the brokers the CPU for the messages themselves.

`node_transaction_spacing_ms` is a fixed least spacing (0 by default). Above it the spacing
*adapts*, up to `node_transaction_spacing_max_ms` (0 turns adapting off), following one signal:
how long the brokers take to end a transaction once everything in it was sent (its EndTxn,
`Transaction.end_ms`). That time does not grow with what the transaction carries, only with
how busy the coordinator and its transaction log's replicas are, so it tells a loaded cluster
from a large transaction. The rule is a delay-based one, as in LEDBAT (RFC 6817) or TCP Vegas:

- the *floor* is the shortest end time of the last `FLOOR_WINDOW_MS`, kept as the minima of
  `FLOOR_BUCKETS` slices of it (so it follows a cluster that became slower for good, a minute
  later);
- the *recent* end time is an average over about the last eight transactions (each weighs
  `RECENT_WEIGHT`), each taken at most `CLIP_TARGETS` targets over the floor: one end held up
  by a pause of the node's own loop (a collection, a CPU taken by another process) must not
  space the next transactions, only end times that stay high;
- their difference is the brokers' *queueing*. At each transaction the spacing moves by
  `GAIN` times the queueing's distance from `QUEUEING_TARGET_MS`: up while it is over, down
  while it is under; well under (below half the target) it falls to `DECAY` of itself at each,
  so that brokers that recovered get transactions back to back within some twenty of them.

Measured on the cluster profile (three brokers on two shared cores, `loadtest/RESULTS.md`,
"Spacing that follows the brokers"): idle, the end times were 1.2-2.4 ms; at 5,000
occurrences a second with transactions back to back, 6-17 ms on average second by second; with
150 ms of spacing, 2-8 ms. A worked example with the defaults and a floor of 2 ms: back to
back at 2-5 ms (queueing under 3 ms) the spacing stays 0. Load grows and the end times average
12 ms: the queueing, 10 ms, is 5 over the target, and the spacing grows 5 ms a transaction:
5, 10, 15 ... As it passes the time one transaction takes, fewer of them are made, each larger,
and their end times fall; it settles where the queueing is about the target. When the load is
gone (end times at 2-3 ms), once their average is back under 4.5 ms it falls by a quarter a
transaction: 120, 90, 68 ... 0.

An urgent part (a shard's first after its takeover, a released shard's last) ends the wait
whatever the spacing, and so does a full transaction (`node/transactions.py`).
"""

from __future__ import annotations

from collections import deque

FLOOR_WINDOW_MS = 60_000
FLOOR_BUCKETS = 6
RECENT_WEIGHT = 1 / 8
QUEUEING_TARGET_MS = 5.0
GAIN = 1.0
DECAY = 0.75
CLIP_TARGETS = 4


class Spacing:
    """The spacing between a node's transactions: a fixed least one, and above it, up to
    `most_ms`, one that follows the brokers' end times (see the module's docstring)."""

    def __init__(self, *, least_ms: int = 0, most_ms: int = 0) -> None:
        if least_ms < 0 or most_ms < 0:
            raise ValueError(f"spacing bounds must be >= 0, got {least_ms} and {most_ms}")
        self.least_ms = least_ms
        self.most_ms = most_ms
        self._adapted = 0.0
        self._recent: float | None = None
        # (slice number, the least end time seen in it), oldest first
        self._floors: deque[tuple[int, float]] = deque()

    @property
    def adapts(self) -> bool:
        return self.most_ms > self.least_ms

    @property
    def ms(self) -> int:
        """The least time from one transaction's begin to the next one's, now."""
        return max(self.least_ms, round(self._adapted))

    @property
    def floor_ms(self) -> float | None:
        return min(f for _, f in self._floors) if self._floors else None

    @property
    def queueing_ms(self) -> float:
        floor = self.floor_ms
        if floor is None or self._recent is None:
            return 0.0
        return self._recent - floor

    def ended(self, end_ms: float, now_ms: int) -> None:
        """A transaction committed at `now_ms`, its EndTxn having taken `end_ms`."""
        if not self.adapts:
            return
        end_ms = max(0.0, end_ms)
        slice_ms = FLOOR_WINDOW_MS // FLOOR_BUCKETS
        current = now_ms // slice_ms
        floors = self._floors
        while floors and floors[0][0] <= current - FLOOR_BUCKETS:
            floors.popleft()
        if floors and floors[-1][0] == current:
            if end_ms < floors[-1][1]:
                floors[-1] = (current, end_ms)
        else:
            floors.append((current, end_ms))
        floor = min(f for _, f in floors)
        end_ms = min(end_ms, floor + CLIP_TARGETS * QUEUEING_TARGET_MS)
        recent = self._recent
        self._recent = end_ms if recent is None else recent + RECENT_WEIGHT * (end_ms - recent)
        queueing = self.queueing_ms
        if queueing < QUEUEING_TARGET_MS / 2:
            adapted = self._adapted * DECAY
        else:
            adapted = max(self._adapted, float(self.least_ms)) \
                + GAIN * (queueing - QUEUEING_TARGET_MS)
        adapted = min(float(self.most_ms), adapted)
        self._adapted = adapted if adapted >= 1.0 else 0.0
