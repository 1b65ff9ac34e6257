"""The shard's publisher: its part of the node transaction, one per dispatch step.

A part carries the fired occurrences, ingest's outbox (forwarded and rejected commands), the
dead-lettered occurrences of unknown topics, the shard's state record (its watermark and its
owner, the node's transactional id) and the submit offset after the last fully applied ingest
batch: all of it or none of it, in the same transaction as the other shards' parts
(`node/transactions.py`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable

import orjson

from chronowheel.bus.ports import Prepared, Transaction, TxnProducer
from chronowheel.core import wire
from chronowheel.core.clock import Clock
from chronowheel.core.shard import shard_of
from chronowheel.node.metrics import NodeMetrics, observe_many
from chronowheel.node.pending import Pending
from chronowheel.node.state import Outgoing, ShardState
from chronowheel.node.transactions import NodeTransactions
from chronowheel.observe import tracing
from chronowheel.settings import Settings

log = logging.getLogger(__name__)


def state_key(shard: int) -> bytes:
    """Key of a shard's record in the compacted `<ns>.state` topic."""
    return f"shard-{shard}".encode()


def decode_watermark(value: bytes) -> int:
    return int(orjson.loads(value)["watermark"])


def legacy_transactional_id(namespace: str, shard: int) -> str:
    """The per-shard transactional id: the producer that wrote a shard's records before the
    node-level transactions, and the one a takeover's claim is committed with now."""
    return f"{namespace}-shard-{shard}"


def recorded_owner(value: bytes | None, namespace: str, shard: int) -> str | None:
    """The transactional id that may still publish for the shard according to its last
    committed state record: its `owner`; a record without one was written by a per-shard
    producer (before node transactions); None when the shard was released or never owned."""
    if value is None:
        return None
    record = orjson.loads(value)
    if "owner" not in record:
        return legacy_transactional_id(namespace, shard)
    owner = record["owner"]
    return None if owner is None else str(owner)


def state_record(*, shard: int, watermark: int, state: ShardState | None, node_id: str,
                 owner: str | None, at: int, claim: bool = False,
                 clock: tuple[int | None, bool] | None = None) -> bytes:
    """A shard's record in `<ns>.state`: its committed watermark and its owner (the
    transactional id that may publish for it from this record on; None: released).
    `clock` is the node's last measured skew to Cassandra and whether it blocks dispatch."""
    record: dict[str, object] = {"shard": shard, "watermark": watermark, "node": node_id,
                                 "owner": owner, "at": at}
    if state is not None:
        record["horizon"] = state.horizon_ms
        record["wheel"] = len(state.wheel)
    if clock is not None:
        record["skew"], record["blocked"] = clock
    if claim:
        record["claim"] = True
    return orjson.dumps(record)


class Publisher:
    """A shard's side of the node transaction: what one commit of this shard carries."""

    def __init__(self, *, state: ShardState, transactions: NodeTransactions,
                 settings: Settings, clock: Clock, metrics: NodeMetrics, node_id: str,
                 shards: int | None = None,
                 clock_state: Callable[[], tuple[int | None, bool]] | None = None) -> None:
        self.state = state
        self.shard = state.shard
        self.shards = shards
        """The namespace's shard count: a target topic with as many partitions takes every
        occurrence of this shard on partition `shard` (see `_prepare`)."""
        self.transactions = transactions
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.node_id = node_id
        self.clock_state = clock_state
        self.session: int | None = None
        """The coordinator's session in force before this shard's claim began (set by the
        takeover); commits of another session are refused."""
        self._partitions: dict[str, int] = {}

    async def commit(self, fired: list[Pending], *, release: bool = False) -> None:
        """Publish `fired` with everything pending in the next node transaction; `release`
        (the last commit of a graceful stop) records the shard as owned by nobody, so the next
        owner need not fence this node. Raises ShardLost when fenced, ChronowheelError on any
        other failure (the shard then restarts from its committed watermark and offset:
        crash-only recovery)."""
        state = self.state
        assert self.session is not None, f"shard {self.shard}: commit before the takeover"
        started = self.clock.now_ms()
        watermark = state.watermark
        # Ingest keeps appending while the transaction is open: take what is there now.
        outbox, state.outbox = state.outbox, []
        offset, state.offset_to_commit = state.offset_to_commit, None
        # Encoded here, while the node's current transaction commits; the transaction that
        # takes this part only ships the batches and adds the state record.
        prepared = await self._prepare(fired, outbox)
        owner = None if release else self.transactions.transactional_id
        record = state_record(shard=self.shard, watermark=watermark, state=state,
                              node_id=self.node_id, owner=owner, at=started,
                              clock=None if self.clock_state is None else self.clock_state())

        async def fill(txn: Transaction) -> int:
            await txn.send(prepared)
            await txn.publish(self.settings.state_topic, self.shard, state_key(self.shard),
                              record, [])
            return count + 1

        count = len(prepared)
        await self.transactions.commit(self.shard, self.session, fill, offset,
                                       messages=count + 1)
        done = self.clock.now_ms()
        per_slot = Counter(p.slot_ms for p in fired)
        lateness = self.metrics.lateness
        for slot_ms, n in per_slot.items():
            observe_many(lateness, max(0, done - slot_ms) / 1000, n)
        self.metrics.fired.inc(len(fired))
        if tracing.tracer() is not None:
            for p in fired:
                if p.user_headers:
                    tracing.record_fire(p.job_id, wire.occurrence_id(p.job_id, p.scheduled_ms),
                                        self.shard, p.user_headers, p.scheduled_ms, done)
        state.committed_watermark = watermark
        state.last_commit_ms = done

    async def _prepare(self, fired: list[Pending], outbox: list[Outgoing]) -> Prepared:
        prepared = self.transactions.producer.prepare()
        fired_at = str(self.clock.now_ms()).encode()
        dead: list[Outgoing] = []
        known = self._partitions
        add = prepared.add
        own, shards = self.shard, self.shards
        for p in fired:
            # Hot path (a herd is thousands of messages): dict lookups and a batch append;
            # awaits only for an unknown topic.
            parts = known.get(p.topic) or await self._partition_count(p.topic)
            if parts is None:
                dead.append(self._undeliverable(p, fired_at))
                continue
            key = p.key
            # The partition Kafka's default partitioner gives the job id. A job lives in shard
            # shard_of(job_id, shards), so with as many partitions that is our own shard: no
            # murmur2 per message (it was a sixth of the node's time in a herd).
            partition = own if parts == shards else shard_of(p.job_id, parts)
            add(p.topic, partition, key, p.payload, p.headers(key, (wire.FIRED_AT, fired_at)))
        for out in (*outbox, *dead):
            target = out.partition
            if target is None:
                n = await self._partition_count(out.topic) or 1
                target = shard_of(out.key.decode("utf-8", "replace"), n) if out.key else 0
            add(out.topic, target, out.key, out.value, out.headers)
        return prepared

    async def _partition_count(self, topic: str) -> int | None:
        n = self._partitions.get(topic)
        if n is not None:
            return n
        n = await self.transactions.producer.partition_count(topic)
        if n is not None:
            self._partitions[topic] = n
        return n

    def _undeliverable(self, p: Pending, fired_at: bytes) -> Outgoing:
        log.error("shard %d: target topic %s unavailable; %s dead-lettered", self.shard,
                  p.topic, p.job_id, extra={"shard": self.shard, "job_id": p.job_id,
                                            "occurrence": f"{p.job_id}@{p.scheduled_ms}"})
        key = p.key
        return Outgoing(self.settings.dead_topic, None, key, p.payload,
                        p.headers(key, (wire.FIRED_AT, fired_at),
                                  (wire.TARGET_TOPIC, p.topic.encode()),
                                  (wire.ERROR, f"target topic {p.topic} is unavailable".encode())))


async def stop_quietly(producer: TxnProducer | None) -> None:
    if producer is not None:
        with contextlib.suppress(Exception):
            await producer.stop()
