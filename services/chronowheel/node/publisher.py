"""The transaction publisher: one Kafka transaction per dispatch step.

It carries the fired occurrences, ingest's outbox (forwarded and rejected commands), the
dead-lettered occurrences of unknown topics, the shard's state record (its watermark) and the
submit offset after the last fully applied ingest batch: all of it or none of it.
"""

from __future__ import annotations

import contextlib
import logging

import orjson

from chronowheel.bus.ports import BusError, Fenced, ShardProducer, ShardTransaction
from chronowheel.core.clock import Clock
from chronowheel.core.shard import shard_of
from chronowheel.errors import ChronowheelError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import Pending
from chronowheel.node.state import Outgoing, ShardState
from chronowheel.settings import Settings

log = logging.getLogger(__name__)


class ShardLost(ChronowheelError):
    """Another node owns this shard now (our producer was fenced)."""


def state_key(shard: int) -> bytes:
    """Key of a shard's record in the compacted `<ns>.state` topic."""
    return f"shard-{shard}".encode()


def decode_watermark(value: bytes) -> int:
    return int(orjson.loads(value)["watermark"])


class Publisher:
    def __init__(self, *, state: ShardState, producer: ShardProducer, settings: Settings,
                 clock: Clock, metrics: NodeMetrics, node_id: str) -> None:
        self.state = state
        self.shard = state.shard
        self.producer = producer
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.node_id = node_id
        self._partitions: dict[str, int] = {}

    async def commit(self, fired: list[Pending]) -> None:
        """Publish `fired` with everything pending in one transaction; raise ShardLost when
        fenced, ChronowheelError on any other failure (the shard then restarts from its
        committed watermark and offset: crash-only recovery)."""
        state = self.state
        started = self.clock.now_ms()
        watermark = state.watermark
        # Ingest keeps appending while the transaction is open: take what is there now.
        outbox, state.outbox = state.outbox, []
        offset, state.offset_to_commit = state.offset_to_commit, None
        try:
            txn = await self.producer.begin()
            try:
                await self._fill(txn, fired, outbox, watermark, started)
                await txn.commit(offset)
            except BaseException:
                await txn.abort()
                raise
        except Fenced as exc:
            raise ShardLost(f"shard {self.shard}: fenced by a newer owner ({exc})") from exc
        except BusError as exc:
            raise ChronowheelError(f"shard {self.shard}: transaction failed: {exc}") from exc
        done = self.clock.now_ms()
        self.metrics.txn_seconds.observe((done - started) / 1000)
        observe = self.metrics.lateness.observe
        for p in fired:
            observe(max(0, done - p.slot_ms) / 1000)
        self.metrics.fired.inc(len(fired))
        state.committed_watermark = watermark
        state.last_commit_ms = done

    async def _fill(self, txn: ShardTransaction, fired: list[Pending], outbox: list[Outgoing],
                    watermark: int, started: int) -> None:
        fired_at = str(self.clock.now_ms()).encode()
        dead: list[Outgoing] = []
        known = self._partitions
        append = txn.append
        for p in fired:
            # Hot path (a herd is thousands of messages): dict lookups and a batch append;
            # awaits only for an unknown topic or a full batch.
            parts = known.get(p.topic) or await self._partition_count(p.topic)
            if parts is None:
                dead.append(self._undeliverable(p, fired_at))
                continue
            part = shard_of(p.job_id, parts)
            headers = [*p.headers, ("cw-fired-at", fired_at)]
            if not append(p.topic, part, p.key, p.payload, headers):
                await txn.publish(p.topic, part, p.key, p.payload, headers)
        for out in (*outbox, *dead):
            target = out.partition
            if target is None:
                n = await self._partition_count(out.topic) or 1
                target = shard_of(out.key.decode("utf-8", "replace"), n) if out.key else 0
            await txn.publish(out.topic, target, out.key, out.value, out.headers)
        state = self.state
        record = orjson.dumps({"shard": self.shard, "watermark": watermark,
                               "horizon": state.horizon_ms, "wheel": len(state.wheel),
                               "node": self.node_id, "at": started})
        await txn.publish(self.settings.state_topic, self.shard, state_key(self.shard), record,
                          [])

    async def _partition_count(self, topic: str) -> int | None:
        n = self._partitions.get(topic)
        if n is not None:
            return n
        n = await self.producer.partition_count(topic)
        if n is not None:
            self._partitions[topic] = n
        return n

    def _undeliverable(self, p: Pending, fired_at: bytes) -> Outgoing:
        log.error("shard %d: target topic %s unavailable; %s dead-lettered", self.shard,
                  p.topic, p.job_id, extra={"shard": self.shard, "job_id": p.job_id,
                                            "occurrence": f"{p.job_id}@{p.scheduled_ms}"})
        return Outgoing(self.settings.dead_topic, None, p.key, p.payload,
                        [*p.headers, ("cw-fired-at", fired_at), ("cw-target-topic",
                                                                 p.topic.encode()),
                         ("cw-error", f"target topic {p.topic} is unavailable".encode())])


async def stop_quietly(producer: ShardProducer | None) -> None:
    if producer is not None:
        with contextlib.suppress(Exception):
            await producer.stop()
