"""A background reader of what the nodes published, each message stamped when it arrived."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from chronowheel.bus.reading import FetchedRecord, TopicReader
from chronowheel.core import wire
from chronowheel.settings import Settings

POLL_MS = 100
"""How long one fetch waits for records: the longest a stop request waits for the reader."""
BATCH_RECORDS = 500
"""Records taken per fetch: each batch is stamped when its fetch returns, so a herd is not
stamped only after all of it was decoded."""


def wall_ms() -> float:
    return time.time_ns() / 1e6


class _Reader(TopicReader):
    """A TopicReader that also says where it stands: the end of each partition now (the last
    stable offset when read_committed) and the offset it will read next."""

    def _tps(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, n in self.partitions.items() for p in range(n)]

    async def end_offsets(self) -> dict[TopicPartition, int]:
        assert self._consumer is not None, "start() first"
        ends: dict[TopicPartition, int] = await self._consumer.end_offsets(self._tps())
        return ends

    async def position(self, tp: TopicPartition) -> int:
        assert self._consumer is not None, "start() first"
        return int(await self._consumer.position(tp))

    async def behind(self, ends: dict[TopicPartition, int]) -> list[TopicPartition]:
        """The partitions whose next offset to read is still before `ends`."""
        assert self._consumer is not None, "start() first"
        return [tp for tp, end in ends.items() if await self._consumer.position(tp) < end]


@dataclass(slots=True)
class Fired:
    """One message read from a topic. The `cw-*` properties raise KeyError on a message that
    is not a fired occurrence (e.g. one on <ns>.rejected)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    received_ms: float = 0.0
    """this machine's wall clock when the fetch that returned it came back"""
    timestamp_ms: int = 0
    """the record's Kafka timestamp (set when the node's producer appended it)"""

    @classmethod
    def from_record(cls, record: FetchedRecord, received_ms: float) -> Fired:
        return cls(record.topic, record.partition, record.offset, record.key, record.value or b"",
                   {k: (v or b"").decode() for k, v in (record.headers or ())}, received_ms,
                   record.timestamp)

    @property
    def occurrence(self) -> str:
        return self.headers[wire.OCCURRENCE]

    @property
    def job_id(self) -> str:
        return self.headers[wire.JOB_ID]

    @property
    def scheduled_ms(self) -> int:
        return int(self.headers[wire.SCHEDULED_AT])

    @property
    def fired_ms(self) -> int:
        return int(self.headers[wire.FIRED_AT])


@dataclass
class Collector:
    """Reads topics in the background (every partition, read_committed unless told) and keeps
    what it read in `messages`; `on_fired` (or a subclass's `on_message`) sees each message as
    it arrives, which is how a tally is kept without keeping the messages."""

    settings: Settings
    topics: tuple[str, ...] = ()
    """default: the namespace's <ns>.fired"""
    isolation: str = "read_committed"
    messages: list[Fired] = field(default_factory=list)
    keep_messages: bool = True
    from_end: bool = False
    """read only what is published after start() (default: from the beginning)"""
    key_prefix: bytes | None = None
    """only messages whose key starts so (others are skipped before decoding)"""
    on_fired: Callable[[Fired], None] | None = None
    received: int = 0
    """messages read (and not skipped by key_prefix)"""
    _reader: _Reader | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def start(self) -> Collector:
        topics = self.topics or (self.settings.fired_topic,)
        reader = _Reader(self.settings, topics, isolation=self.isolation,
                         from_end=self.from_end)
        await reader.start()
        self._reader = reader
        self._task = asyncio.create_task(self._run(reader), name="collector")
        return self

    async def _run(self, reader: TopicReader) -> None:
        prefix = self.key_prefix
        while True:
            records = await reader.fetch(POLL_MS, BATCH_RECORDS)
            arrived = wall_ms()
            for record in records:
                if prefix is not None and not (record.key or b"").startswith(prefix):
                    continue
                fired = Fired.from_record(record, arrived)
                self.received += 1
                if self.keep_messages:
                    self.messages.append(fired)
                if self.on_fired is not None:
                    self.on_fired(fired)
                self.on_message(record, int(arrived))

    async def standing(self) -> dict[TopicPartition, tuple[int, int]]:
        """(next offset to read, end) of each partition: the end is the last stable offset
        when read_committed. A partition whose position stays below its end is not being
        read; one whose end stays still is not being written (or its transactions are open)."""
        assert self._reader is not None, "start() first"
        ends = await self._reader.end_offsets()
        return {tp: (await self._reader.position(tp), end) for tp, end in ends.items()}

    def on_message(self, record: FetchedRecord, arrived_ms: int) -> None:
        """Hook for subclasses that note more per message (called after it is kept)."""

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (known once started)."""
        assert self._reader is not None, "start() first"
        return self._reader.partitions[topic]

    def check_alive(self) -> None:
        """Raise what stopped the background reader, if it stopped."""
        if self._task is not None and self._task.done():
            self._task.result()
            raise RuntimeError("the collector stopped")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    async def read_to_end(self, timeout_s: float = 30) -> None:
        """Return once every record its topics held when called is in `messages` (read_committed:
        every transaction committed by then; control records and aborted ones count as read).
        The background reader hands each fetch over whole before it awaits again, so a
        position at the end means its records are kept."""
        assert self._reader is not None, "start() first"
        ends = await self._reader.end_offsets()
        deadline = time.monotonic() + timeout_s
        while behind := await self._reader.behind(ends):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s}s reading to the end of "
                                   f"{behind}; have {len(self.messages)} messages")
            await asyncio.sleep(0.02)

    def on(self, topic: str) -> list[Fired]:
        return [m for m in self.messages if m.topic == topic]

    async def wait_for(self, predicate: Callable[[list[Fired]], bool], timeout_s: float,
                       what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.messages):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; "
                                   f"have {len(self.messages)} messages")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def collecting(settings: Settings, *topics: str) -> AsyncIterator[Collector]:
    """A started Collector of the topics (default <ns>.fired), stopped on the way out."""
    c = await Collector(settings, tuple(topics)).start()
    try:
        yield c
    finally:
        await c.stop()


async def committed_past(settings: Settings, t_ms: int, timeout_s: float = 30) -> dict[int, int]:
    """Return once every shard's committed watermark (its last record in <ns>.state, read
    read_committed) is at or past `t_ms` (the nodes' clock): every occurrence of every shard
    due up to then has been published in a committed transaction, since a shard's state record
    commits together with what it fired, and no later owner can publish one again. With a
    collector read to its end afterwards (`Collector.read_to_end`), a check that nothing more
    arrives for those instants is exact. Returns the watermarks, by shard."""
    marks: dict[int, int] = {}
    state = TopicReader(settings, (settings.state_topic,))
    await state.start()
    try:
        deadline = time.monotonic() + timeout_s
        while len(marks) < settings.shards or min(marks.values()) < t_ms:
            if time.monotonic() > deadline:
                raise AssertionError(f"watermarks not past {t_ms} after {timeout_s}s: {marks}")
            for record in await state.fetch(100):
                shard = wire.StateRecord.shard_of_key(record.key)
                if shard is not None and record.value:
                    marks[shard] = wire.StateRecord.parse(record.value, shard=shard).watermark
        return marks
    finally:
        await state.stop()
