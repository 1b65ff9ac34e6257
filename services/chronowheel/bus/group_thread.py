"""What the node's two group members share: a thread of their own, and records handed over.

Both members (`bus/kafka_node.KafkaSubmitGroup`, the classic protocol, and
`bus/kafka_consumer_group.ConsumerProtocolGroup`, Kafka 4's) fetch `<ns>.submit` on a thread of
their own and share this half: their settings and callbacks, the liveness pings of the node
loop, what the group thread has fetched and the node has not taken yet (per shard, under a
lock), the shards the node paused (backpressure) or has not taken over yet (withheld: sought,
its actor not ready), and the wake-up of the node's pump.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from chronowheel.bus.ports import ShardsChanged, SubmitRecord
from chronowheel.settings import Settings
from chronowheel.timeouts import wait_event

log = logging.getLogger(__name__)

# The group thread pings the node loop this often.
LIVENESS_PING_MS = 100


class LoopLiveness:
    """Whether the node's event loop still answers, as seen from the group thread.

    The group thread pings the node loop; the loop answers (`answered`) when it gets to run the
    ping. A loop that is busy (a herd, a large page) answers late but answers; a hung one never
    does. The group keeps polling Kafka only while the loop answered within `POLL_GRACE_MS`, so
    a loop hung for longer than the grace plus `limit_ms` (the consumer's max.poll.interval)
    makes the member leave the group: its shards move although its heartbeats still go out.
    The clock is injected (monotonic seconds): this is about elapsed time only.
    """

    POLL_GRACE_MS = 1_000

    def __init__(self, limit_ms: int, clock: Callable[[], float] = time.monotonic, *,
                 what: str = "node") -> None:
        self.limit_ms = limit_ms
        self._clock = clock
        self._what = what
        self._answered_at = clock()
        self._warned = False
        self._expelled = False

    def answered(self) -> None:
        """Called on the node loop when it runs a ping."""
        now = self._clock()
        if self._warned:
            log.warning("%s: the event loop answers again after %.0f ms", self._what,
                        (now - self._answered_at) * 1000)
        self.start()

    def start(self) -> None:
        """Count from now: when the pings begin (until then nothing asked the loop, and a
        join that took long, a static member's predecessor waited out, is no stall) and at
        each answer."""
        self._answered_at = self._clock()
        self._warned = self._expelled = False

    def stalled_ms(self) -> float:
        return max(0.0, (self._clock() - self._answered_at) * 1000)

    def may_poll(self) -> bool:
        """Whether the loop answered recently enough for the group to poll for it."""
        return self.stalled_ms() <= self.POLL_GRACE_MS

    def check(self) -> None:
        """Warn (once per stall) at a third of the limit, and log an error when the member is
        being dropped (the limit plus the grace without an answer)."""
        stalled = self.stalled_ms()
        if stalled >= self.limit_ms / 3 and not self._warned:
            self._warned = True
            log.warning("%s: the event loop has not answered for %.0f ms; at "
                        "node_loop_stall_limit_ms (%d) the node leaves its group and its shards "
                        "move", self._what, stalled, self.limit_ms)
        if stalled >= self.limit_ms + self.POLL_GRACE_MS and not self._expelled:
            self._expelled = True
            log.error("%s: the event loop has not answered for %.0f ms (over "
                      "node_loop_stall_limit_ms %d): not polling, the group drops this member",
                      self._what, stalled, self.limit_ms)



class GroupThreadMember:
    """The node's side of `SubmitGroup.fetch`, `pause`, `resume`, `assigned` and `deliver`;
    the group thread fills `_ready` (of assigned shards only) and calls `_notify_node`."""

    def __init__(self, settings: Settings, *, group_id: str, client_id: str,
                 session_timeout_ms: int, on_assigned: ShardsChanged,
                 on_revoked: ShardsChanged, clock: Callable[[], float] = time.monotonic) -> None:
        self._topic = settings.submit_topic
        self._settings = settings
        self._group_id = group_id
        self._client_id = client_id
        self._session_timeout_ms = session_timeout_ms
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._liveness = LoopLiveness(settings.node_loop_stall_limit_ms, clock,
                                      what=f"node {client_id}")
        self._partitions: int | None = None
        self._ping_pending = False
        self._lock = threading.Lock()  # guards the fields shared by both threads below
        self._ready: dict[int, list[SubmitRecord]] = {}  # fetched, not yet taken by the node
        self._paused_by_node: set[int] = set()
        # Sought shards whose actor does not take records yet: fetch leaves them in _ready.
        self._withheld: set[int] = set()
        # Per shard, the offset the node reads next: the target of its last seek, then one past
        # the last record handed over. A record below it was handed over already, or lies
        # before where the node asked to start (`_hand_over`).
        self._next_offset: dict[int, int] = {}
        self._rewound: set[int] = set()  # shards whose fetch went back, warned of once
        self._assigned: set[int] = set()
        self._failure: BaseException | None = None
        self._node_loop: asyncio.AbstractEventLoop | None = None
        self._arrived: asyncio.Event | None = None  # node loop: records or a failure came

    def partition_count(self) -> int | None:
        return self._partitions

    def _answer(self) -> None:
        """On the node loop: it ran a liveness ping."""
        self._ping_pending = False
        self._liveness.answered()

    def _raise_failure(self) -> None:
        """Raise what stopped the group thread, if anything did (the members say it their
        own way)."""
        raise NotImplementedError

    def _notify_node(self) -> None:
        """From the group thread: records or a failure came."""
        loop = self._node_loop
        if loop is not None and self._arrived is not None:
            with contextlib.suppress(RuntimeError):  # the node loop is closed: nobody waits
                loop.call_soon_threadsafe(self._arrived.set)

    def _moved(self, shard: int, target: int) -> None:
        """From the group thread, as it seeks `shard` to `target`: records fetched from the
        old position are not handed over, and from now on none below `target`. (A shard
        revoked meanwhile keeps nothing: it is sought again when assigned again.)"""
        with self._lock:
            if shard not in self._assigned:
                return
            self._ready.pop(shard, None)
            self._rewound.discard(shard)
            self._next_offset[shard] = target

    def _forget(self, shards: list[int]) -> None:
        """Under the lock, for revoked shards: what was fetched for them, and where they
        were."""
        for k in shards:
            self._ready.pop(k, None)
            self._next_offset.pop(k, None)
            self._rewound.discard(k)

    def _log_end(self, shard: int) -> int | None:
        """From the group thread: the end of the shard's log as the consumer last heard it
        from a fetch (no request), or None if it has not."""
        return None

    def _hand_over(self, batches: dict[int, list[SubmitRecord]]) -> None:
        """From the group thread: fetched records, kept for shards still assigned, from the
        offset the node reads next on.

        A consumer can go back behind a seek: librdkafka answers a seek made while its own
        look-up of the partition's start is under way, then (the look-up's late answer
        outdated, 500 ms later) looks the start up again and fetches from there, under the
        seek's version, so nothing of its own drops those records, which can follow the
        sought ones in one batch. Handed over, they were commands the node had applied
        already, or commands before the position it asked for. They are dropped here, record
        by record, and the fetch catches up with the position by itself.

        One going back is told apart: a log that ends below that position (as the last fetch
        told its end) was cut short, by an unclean leader election, and the consumer went
        back to its start. What lies below the new end was read before the cut; what comes
        from the new end on is new. The position moves back to the end, with an error
        logged. (A topic deleted and made anew revokes its partitions first: a shard
        assigned again has no position until the node seeks it.)"""
        with self._lock:
            for shard, records in batches.items():
                if shard not in self._assigned or not records:
                    continue
                following = self._next_offset.get(shard)
                if following is not None and records[0].offset < following:
                    following = self._cut_short(shard, following)
                kept: list[SubmitRecord] = []
                for record in records:
                    if following is not None and record.offset < following:
                        if shard not in self._rewound:
                            self._rewound.add(shard)
                            log.warning(
                                "group %s: %s[%d] was fetched from offset %d again, behind "
                                "offset %d, the next one the node reads: the records before "
                                "it are dropped until the fetch is back there",
                                self._group_id, self._topic, shard, record.offset, following)
                        continue
                    self._rewound.discard(shard)
                    kept.append(record)
                    following = record.offset + 1
                if following is not None:
                    self._next_offset[shard] = following
                if kept:
                    self._ready.setdefault(shard, []).extend(kept)
        self._notify_node()

    def _cut_short(self, shard: int, following: int) -> int:
        """Under the lock, for a batch that starts behind the position: the position, or the
        log's end if the log now ends below it (see `_hand_over`). Once per batch: a going
        back within a batch comes from a seek, and the log's end is read per fetch."""
        end = self._log_end(shard)
        if end is None or not 0 <= end < following:
            return following
        log.error("group %s: %s[%d] ends at offset %d, below offset %d, the next one the node "
                  "reads: the log was cut short (an unclean leader election); the records from "
                  "offset %d on are new and handed over, those below it were read before",
                  self._group_id, self._topic, shard, end, following, end)
        return end

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[int, list[SubmitRecord]]:
        self._raise_failure()
        arrived = self._arrived
        assert arrived is not None, "start() first"
        arrived.clear()  # before looking: a hand-over from now on sets it again
        with self._lock:
            empty = not any(k not in self._withheld for k in self._ready)
        if empty:
            await wait_event(arrived, timeout_ms / 1000)
            self._raise_failure()
        out: dict[int, list[SubmitRecord]] = {}
        taken = 0
        with self._lock:
            for shard in list(self._ready):
                if taken >= max_records:
                    break
                if shard in self._withheld:
                    continue
                out[shard] = records = self._ready.pop(shard)
                taken += len(records)
        return out

    def pause(self, shard: int) -> None:
        with self._lock:
            self._paused_by_node.add(shard)

    def resume(self, shard: int) -> None:
        with self._lock:
            self._paused_by_node.discard(shard)

    def assigned(self) -> set[int]:
        with self._lock:
            return set(self._assigned)

    def deliver(self, shard: int) -> None:
        """The shard's actor is ready: records fetched since its seek are its own."""
        with self._lock:
            self._withheld.discard(shard)
            waiting = shard in self._ready
        if waiting and self._arrived is not None:
            self._arrived.set()
