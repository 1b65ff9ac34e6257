"""Reading whole topics without a consumer group: what tools and tests use to watch what the
nodes publish (a worker reads through its consumer group instead)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from chronowheel.bus.kafka import open_admin, partition_counts, reader
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


class FetchedRecord(Protocol):
    """The fields of a fetched record that readers use (aiokafka's ConsumerRecord has them)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


class TopicReader:
    """Every partition of some topics, assigned (no group, nothing committed), read from the
    beginning or from the end.

    read_committed by default: a record becomes visible only once the node's transaction that
    published it has committed, which is what a user's consumer sees. Fetches wait at most 20 ms
    for data by default, so a receive time stamped when `fetch` returns stays close to when the
    record became visible.
    """

    def __init__(self, settings: Settings, topics: Sequence[str], *,
                 isolation: str = "read_committed", from_end: bool = False,
                 **consumer_options: Any) -> None:
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation: one of {ISOLATION_LEVELS}, got {isolation!r}")
        if not topics:
            raise ValueError("topics: give at least one")
        self.settings = settings
        self.topics = tuple(topics)
        self.isolation = isolation
        self.from_end = from_end
        self.partitions: dict[str, int] = {}
        self._options: dict[str, Any] = {
            "fetch_max_wait_ms": 20, "max_partition_fetch_bytes": 8 << 20,
            "fetch_max_bytes": 64 << 20, **consumer_options}
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        admin = await open_admin(self.settings)
        try:
            counts = await partition_counts(admin, self.topics)
        finally:
            await admin.close()
        missing = [t for t in self.topics if t not in counts]
        if missing:
            raise ConfigError(f"topics {missing} do not exist (run `chronowheel init` first)")
        self.partitions = {t: counts[t] for t in self.topics}
        consumer = reader(self.settings, isolation_level=self.isolation,
                          auto_offset_reset="latest" if self.from_end else "earliest",
                          **self._options)
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t, n in self.partitions.items() for p in range(n)]
            consumer.assign(tps)
            if self.from_end:
                await consumer.seek_to_end(*tps)
                for tp in tps:
                    # Resolve "the end" now: every record published after start() is read.
                    await consumer.position(tp)
            else:
                await consumer.seek_to_beginning(*tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer

    async def fetch(self, timeout_ms: int, max_records: int | None = None,
                    ) -> list[FetchedRecord]:
        """The records fetched within `timeout_ms` (at most `max_records`), in partition order."""
        assert self._consumer is not None, "start() first"
        batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        out: list[FetchedRecord] = []
        for records in batches.values():
            out.extend(records)
        return out

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
