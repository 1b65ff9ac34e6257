"""A takeover's state reads (`NodeBus.read_last`) on librdkafka, each one a single call in a
thread of its own.

A takeover reads its shard's state record twice (`node/takeover.py`) while the node's loop is
at its busiest. On aiokafka every step of a read (the end offset's request, the seek, each
fetch and its position) is a chain of awaits on that loop: with the loop busy 20 ms a turn, a
read by a reader kept from the last one took 320-380 ms and one that started its reader about
1,070 ms, against 2-14 ms on an idle loop (`loadtest/bench/claim_bench.py --reads`). Here the
whole read runs in a thread, on a librdkafka consumer whose requests run on its own threads:
the loop is needed once, when the read is over.

What a read returns is what the aiokafka read returned (docs/design.md, "Fencing"):
- read_committed, to the last stable offset (the end a read_committed ListOffsets gives);
- settled, to the high watermark of its fetches: a read_committed position reaches it only
  once every transaction that wrote below it is resolved (librdkafka moves its position past
  transaction markers and aborted records). Not a read_uncommitted query of it: through one
  client shared by a node's reads, such queries made settled reads take about a second in a
  node's first takeovers (1,008-1,048 ms at 5,000/s on the cluster profile), where the
  fetches' watermark costs no request.
The last record with the key is looked for in the partition's tail first (`TAIL_OFFSETS`),
then further back, to the log start.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from chronowheel.bus.kafka_consumer_group import librdkafka_config, stops_the_member
from chronowheel.bus.ports import BusError
from chronowheel.settings import Settings

POLL_MS = 20
"""How long a read's poll waits for an event before it looks at its deadline again."""
FETCH_WAIT_MS = 5
"""How long the broker holds a read's fetch that has nothing new. A read ends at the partition
EOF event, which librdkafka raises at the fetch after the one that reached the end (a state
partition ends with a transaction marker, past the last record): at 20 ms an idle read took
23 ms, at 2 ms 7 ms. A read that waits for an open transaction fetches this often meanwhile,
and only then (an idle consumer is unassigned). librdkafka's default, 500 ms, made such a read
wait 500 ms however soon the transaction ended."""
TAIL_OFFSETS = 256
"""A read looks at this many offsets before the end first: a node transaction puts one record
and one marker on each state partition it writes to, and a state partition's active segment
(never compacted) holds thousands to a hundred thousand of them at high rates."""
QUERY_TIMEOUT_S = 10.0
"""A watermark query waits at most this long (within the read's own deadline)."""
BATCH = 500

READS = concurrent.futures.ThreadPoolExecutor(max_workers=16,
                                              thread_name_prefix="state-read")
"""State reads run here, not on the claimers' pool (`LIBRDKAFKA_CALLS`): a settled read may
wait for a transaction that a fence aborts, and the fencers' starts must never queue behind
it."""


class RdKafkaStateReads:
    """Reads of a partition's last record with a key; the consumers are kept, unassigned (they
    fetch nothing), for the next read: starting one costs a bootstrap and a metadata request."""

    def __init__(self, settings: Settings, client_id: str = "chronowheel-state-reads", *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._monotonic = monotonic
        self._client_id = client_id
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._closed = False

    def _config(self) -> dict[str, Any]:
        return {**librdkafka_config(self._settings),
                # Never subscribed and never commits: a group id only because librdkafka's
                # consumer asks for one.
                "group.id": f"{self._client_id}-unused",
                "client.id": self._client_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                # A start below the log start (retention) begins at the log start.
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": FETCH_WAIT_MS,
                # Where its fetches reached the end: past markers and aborted records.
                "enable.partition.eof": True,
                # Connected to every broker from the start: its first request does not wait
                # for a connection.
                "enable.sparse.connections": False}

    def _take(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        from confluent_kafka import Consumer

        return Consumer(self._config())

    def _give_back(self, consumer: Any, reusable: bool) -> None:
        if reusable:
            with contextlib.suppress(Exception):
                consumer.unassign()
            with self._lock:
                if not self._closed:
                    self._idle.append(consumer)
                    return
        with contextlib.suppress(Exception):
            consumer.close()

    @property
    def idle(self) -> int:
        """How many consumers are kept for the next read."""
        with self._lock:
            return len(self._idle)

    async def read_last(self, topic: str, partition: int, key: bytes, timeout_ms: int, *,
                        settled: bool = False) -> bytes | None:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(
            READS, self.read_last_blocking, topic, partition, key, timeout_ms, settled)

    def read_last_blocking(self, topic: str, partition: int, key: bytes, timeout_ms: int,
                           settled: bool) -> bytes | None:
        """The read itself, in the calling thread. A read whose caller gave up runs on to its
        end or deadline and then gives its consumer back: a consumer is never shared."""
        from confluent_kafka import KafkaException, TopicPartition

        deadline = self._monotonic() + timeout_ms / 1000
        where = f"{topic}[{partition}]"
        reusable = False
        try:
            consumer = self._take()
        except KafkaException as exc:
            raise BusError(f"state read of {where}: starting a consumer: {exc}") from exc
        try:
            tp = TopicPartition(topic, partition)
            # The end: the last stable offset (what a read_committed query gives); settled, the
            # fetches' high watermark too (`_scan`).
            begin, end = self._watermarks(consumer, tp, deadline, where)
            back = TAIL_OFFSETS
            start = max(begin, end - back)
            while True:
                found = self._scan(consumer, topic, partition, key, start, end, deadline,
                                   timeout_ms, settled)
                if found is not None or start <= begin:
                    break
                back *= 16
                begin = self._watermarks(consumer, tp, deadline, where)[0]
                start = max(begin, end - back)
            reusable = True
            return found
        except KafkaException as exc:
            raise BusError(f"state read of {where}: {exc}") from exc
        finally:
            self._give_back(consumer, reusable)

    def _watermarks(self, consumer: Any, tp: Any, deadline: float,
                    where: str) -> tuple[int, int]:
        """The log start and the last stable offset (a read_committed consumer's query gives
        the last stable offset as the end)."""
        left = deadline - self._monotonic()
        if left <= 0:
            raise BusError(f"timed out reading {where}: no time left for its end offset")
        begin, end = consumer.get_watermark_offsets(tp, timeout=min(QUERY_TIMEOUT_S, left),
                                                    cached=False)
        return int(begin), int(end)

    def _scan(self, consumer: Any, topic: str, partition: int, key: bytes, start: int,
              end: int, deadline: float, timeout_ms: int, settled: bool) -> bytes | None:
        """The last record with `key` from offset `start` until the read_committed position
        reaches `end` (settled: the high watermark of the fetches too, which a read_committed
        position passes only once every transaction that wrote below it is resolved); None if
        there is none.

        The position is this read's own: the offset after the last record it was handed, or
        where librdkafka says its fetches reached the partition's end (a partition-EOF
        event), which is past transaction markers and aborted records too. (The consumer's
        `position()` may still hold the last read's until the first fetch of this one.)"""
        from confluent_kafka import KafkaError, TopicPartition

        tp = TopicPartition(topic, partition)
        consumer.assign([TopicPartition(topic, partition, start)])
        found: bytes | None = None
        position = start
        heard = False  # an event of this read's fetches came (its watermarks are fresh)
        while True:
            if settled and heard:
                # The high watermark of the last fetch response (a read_committed query gives
                # the last stable offset). Trusted only once this read has heard from its own
                # fetches: until then it may be a past read's of the partition, lower.
                end = max(end, consumer.get_watermark_offsets(tp, cached=True)[1])
            if position >= end and (heard or not settled):
                return found
            if self._monotonic() > deadline:
                raise BusError(f"timed out reading {topic}[{partition}] to its "
                               f"{'high watermark' if settled else 'end'} {end} "
                               f"({timeout_ms} ms, at {position})")
            # poll returns at the first event (consume would wait out its timeout for a full
            # batch), then what the same fetches brought is taken without waiting.
            first = consumer.poll(POLL_MS / 1000)
            for msg in [] if first is None else [first, *consumer.consume(BATCH, 0)]:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        heard = True
                        position = max(position, msg.offset())
                    elif stops_the_member(err):  # this node's access refused, or fatal
                        raise BusError(f"state read of {topic}[{partition}]: {err.str()}")
                    # else passing (a broker down, a leader moving): librdkafka retries
                    continue
                heard = True
                position = max(position, msg.offset() + 1)
                if msg.key() == key and msg.value():
                    found = msg.value()

    def close(self) -> None:
        """Close the kept consumers; one still reading is closed when its read ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for consumer in idle:
            with contextlib.suppress(Exception):
                consumer.close()
