"""The shard's publisher: its part of the node transaction, one per dispatch step.

A part carries the fired occurrences, ingest's outbox (forwarded and rejected commands), the
dead-lettered occurrences, the shard's state record (its watermark and its owner, the node's
transactional id) and the submit offset after the last fully applied ingest batch: all of it or
none of it, in the same transaction as the other shards' parts (`node/transactions.py`).

An occurrence that cannot be published is dead-lettered to `<ns>.dead` instead, with
`cw-reason` and `cw-error` saying why, and never holds its shard or the node back: its target
topic does not exist, its record is larger than the topic takes (checked before producing,
against the topic's `max.message.bytes` read from the brokers), it cannot be encoded, or the
broker refused it in a transaction. A refusal aborts the node's transaction and starts a new
session (`node/transactions.py`): this part is not committed; what the broker refused is
remembered in the node's `set_aside`, and when the shard is claimed again the occurrence is
dead-lettered before it is produced (or, refused among others for what one of them may be,
sent alone to find which). A message of ingest's outbox or a dead letter refused by one of the
namespace's own topics concerns all the work (their limits and rights are the operator's): the
node stops, saying so.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable

from chronowheel.bus.ports import BusError, Claimer, Prepared, Refusal, Transaction
from chronowheel.core import limits, wire
from chronowheel.core.clock import Clock
from chronowheel.core.shard import shard_of
from chronowheel.errors import ConfigError
from chronowheel.node.metrics import NodeMetrics, observe_many
from chronowheel.node.pending import Pending
from chronowheel.node.runs import fired_runs
from chronowheel.node.state import Outgoing, ShardState
from chronowheel.node.transactions import SET_ASIDE_SIZE, NodeTransactions, Republish
from chronowheel.observe import tracing
from chronowheel.settings import Settings

log = logging.getLogger(__name__)

# Times a part is committed again after refusals before its shard gives up and restarts (each
# round sets aside at least one record of the transaction, so this is a safety net).

# Error types named in `cw-error`, by dead-letter reason.
ERROR_NAMES = {"unknown_topic": "UnknownTopic", "too_large": "RecordTooLarge",
               "refused": "TopicAuthorizationFailed", "invalid": "InvalidRecord",
               "unencodable": "SerializationError"}

Item = Pending | Outgoing
"""What a part publishes: a fired occurrence, or a message of ingest's outbox."""


def state_record(*, shard: int, watermark: int, state: ShardState, node_id: str,
                 owner: str | None, at: int,
                 clock: tuple[int | None, bool] | None = None,
                 ahead: wire.Ahead | None = None) -> bytes:
    """The shard's record in `<ns>.state` for a commit of this part: its watermark and its
    owner (the transactional id that may publish for it from this record on; None: released),
    with the wheel's horizon and size. `clock` is the node's last measured skew to Cassandra and
    whether it blocks dispatch; `ahead` the ranges published beyond the watermark while the
    shard catches up (`ShardState.record_watermark`)."""
    skew, blocked = (None, None) if clock is None else clock
    return wire.StateRecord(shard=shard, watermark=watermark, owner=owner, node=node_id, at=at,
                            horizon=state.horizon_ms, wheel=len(state.wheel), skew_ms=skew,
                            blocked=blocked, ahead=ahead).encode()


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
        self.last_record: bytes | None = None
        """The state record of this shard's last committed part (None before the first)."""
        self.released = False
        """Whether that part released the shard (the last commit of a graceful stop)."""
        self.committed_offset: int | None = None
        """The submit offset the shard last committed (set by the takeover to the one it
        resumed at): a warm shard has applied every command below it, none above."""
        self._partitions: dict[str, int] = {}

    async def commit(self, fired: list[Pending], *, release: bool = False) -> None:
        """Publish `fired` with everything pending in the next node transaction; `release`
        (the last commit of a graceful stop) records the shard as owned by nobody, so the next
        owner need not fence this node. An occurrence that cannot be published goes to
        `<ns>.dead` in its place. Raises ShardLost when fenced, ChronowheelError on any
        other failure (the shard then restarts from its committed watermark and offset:
        crash-only recovery)."""
        state = self.state
        assert self.session is not None, f"shard {self.shard}: commit before the takeover"
        started = self.clock.now_ms()
        watermark, ahead = state.record_watermark()
        # Ingest keeps appending while the transaction is open: take what is there now.
        outbox, state.outbox = state.outbox, []
        offset, state.offset_to_commit = state.offset_to_commit, None
        items: list[Item] = [*fired, *outbox]
        dead: list[tuple[Outgoing, str]] = []  # dead letters made here, and their reason
        # Encoded here, while the node's current transaction commits; the transaction that
        # takes this part only ships the batches and adds the state record.
        prepared, sent = await self._prepare(items, dead)
        owner = None if release else self.transactions.transactional_id
        record = state_record(shard=self.shard, watermark=watermark, state=state,
                              node_id=self.node_id, owner=owner, at=started,
                              clock=None if self.clock_state is None else self.clock_state(),
                              ahead=ahead)

        async def fill(txn: Transaction) -> int:
            await txn.send(prepared)
            await txn.publish(self.settings.state_topic, self.shard,
                              wire.StateRecord.key(self.shard), record, [])
            return len(sent) + 1

        try:
            # The first part after a takeover and a release go without the spacing between
            # node transactions: the first one's occurrences have waited for the move.
            await self.transactions.commit(self.shard, self.session, fill, offset,
                                           messages=len(sent) + 1,
                                           urgent=release or self.shard in state.arrivals)
        except Republish as again:
            # The transaction was aborted (nothing of this part is visible) and the node
            # starts a new session, which ends this actor: remember what the broker refused,
            # for the shard's next claim to dead-letter or isolate it.
            self._remember([r for r in again.refusals if r.prepared is prepared], sent)
            raise
        done = self.clock.now_ms()
        published = [p for p in items if isinstance(p, Pending)] if dead else fired
        per_slot = Counter(p.slot_ms for p in published)
        lateness = self.metrics.lateness
        for slot_ms, n in per_slot.items():
            observe_many(lateness, max(0, done - slot_ms) / 1000, n)
        self.metrics.fired.inc(len(published))
        history = self.transactions.history
        if history is not None:  # one queue append; the records are built off this path
            # It keeps the occurrences, payloads too, until written: their bytes count
            # against the queue's byte bound.
            history.add_lazy(published, fired_runs(done, self.node_id),
                             sum(len(p.payload) + len(p.job_id) for p in published))
        for reason, n in Counter(reason for _, reason in dead if reason).items():
            self.metrics.dead_lettered.labels(reason).inc(n)
        if tracing.tracer() is not None:
            for p in published:
                if p.user_headers:
                    tracing.record_fire(p.job_id, wire.occurrence_id(p.job_id, p.scheduled_ms),
                                        self.shard, p.user_headers, p.scheduled_ms, done)
        state.committed_watermark = watermark
        state.last_commit_ms = done
        arrived = state.arrivals.settled(self.shard)
        if arrived is not None:
            # How long the shard published nothing here after its takeover began: with the
            # claim's line, it tells a slow move's takeover from its first transaction, and
            # the split tells waiting for rows and dispatch from waiting for the transaction.
            log.info("shard %d: first commit %d ms after its takeover began (%d fired, the "
                     "latest %d ms late; its part came %d ms after the takeover began and "
                     "took %d ms to commit)", self.shard, done - arrived, len(published),
                     max(0, done - min(per_slot)) if per_slot else 0, started - arrived,
                     done - started, extra={"shard": self.shard, "node": self.node_id})
        self.last_record, self.released = record, release
        if offset is not None:
            self.committed_offset = offset

    async def _prepare(self, items: list[Item],
                       dead: list[tuple[Outgoing, str]]) -> tuple[Prepared, list[Item]]:
        """Encode `items` then `dead`; return the prepared messages and what each one is, in
        order. A fired occurrence that cannot go to its topic is moved from `items` to
        `dead` instead."""
        prepared = self.transactions.producer.prepare()
        fired_at = str(self.clock.now_ms()).encode()
        sent: list[Item] = []
        kept: list[Item] = []
        outbox: list[Outgoing] = []
        known = self._partitions
        aside = self.transactions.set_aside
        largest: dict[str, int] = {}  # topic -> its largest record, read once per part
        add = prepared.add
        own, shards = self.shard, self.shards
        for p in items:
            # Hot path (a herd is thousands of messages): dict lookups and a batch append;
            # awaits only for a topic met for the first time in this part.
            if not isinstance(p, Pending):
                outbox.append(p)
                continue
            topic = p.topic
            parts = known.get(topic) or await self._partition_count(topic)
            if parts is None:
                dead.append(self._dead_letter(p, fired_at, "unknown_topic",
                                              f"target topic {topic} is unavailable"))
                continue
            limit = largest.get(topic) or await self._largest(topic, largest)
            key = p.key
            alone = False
            if aside:  # refused before (node/transactions.py): dead-letter it, or alone
                noted_key = (topic, key, p.scheduled_ms)
                if noted_key in aside:
                    noted = aside[noted_key]
                    if noted is None:
                        alone = True
                    else:
                        dead.append(self._dead_letter(p, fired_at, *noted))
                        continue
            headers = p.headers(key, (wire.FIRED_AT, fired_at))
            size = limits.record_bytes(key, p.payload, headers)
            if size > limit:
                dead.append(self._dead_letter(
                    p, fired_at, "too_large",
                    f"the fired record is {size} bytes, over the {limit} bytes topic {topic} "
                    f"takes (its max.message.bytes, within the producer's max_request_size)"))
                continue
            # The partition Kafka's default partitioner gives the job id. A job lives in shard
            # shard_of(job_id, shards), so with as many partitions that is our own shard: no
            # murmur2 per message (it was a sixth of the node's time in a herd).
            partition = own if parts == shards else shard_of(p.job_id, parts)
            try:
                add(topic, partition, key, p.payload, headers, alone=alone)
            except BusError as exc:
                dead.append(self._dead_letter(p, fired_at, "unencodable", str(exc)))
                continue
            kept.append(p)
            sent.append(p)
        if dead:
            limit = largest.get(self.settings.dead_topic) \
                or await self._largest(self.settings.dead_topic, largest)
            dead[:] = [(_fit(out, limit), reason) for out, reason in dead]
        for out in (*outbox, *(out for out, _ in dead)):
            target = out.partition
            if target is None:
                n = await self._partition_count(out.topic) or 1
                target = shard_of(out.key.decode("utf-8", "replace"), n) if out.key else 0
            add(out.topic, target, out.key, out.value, out.headers, alone=False)
            sent.append(out)
        items[:] = [*kept, *outbox]
        return prepared, sent

    def _remember(self, refusals: list[Refusal], sent: list[Item]) -> None:
        """Note each refused occurrence for the shard's next claim: dead-letter it with the
        broker's reason, or, refused in a batch of several for what one of them may be, send
        each alone to find which. A refused message for one of the namespace's own topics
        (a rejection, a forward, a dead letter) is no job's fault: raised as a ConfigError."""
        for r in refusals:
            if r.kind == "too_large":  # the topic's limit may have changed: read it again
                self.transactions.producer.forget_limit(r.topic)
            for i in r.indexes:
                item = sent[i]
                if not isinstance(item, Pending):
                    raise ConfigError(
                        f"shard {self.shard}: the broker refused a message for {item.topic}, "
                        f"one of the namespace's own topics ({r.kind}: {r.reason}); its "
                        f"max.message.bytes must be at least Kafka's default "
                        f"({limits.KAFKA_MAX_MESSAGE_BYTES}) and the node must be allowed to "
                        f"write it (`chronowheel acl`)")
                multiple = not r.whole_topic and len(r.indexes) > 1
                self._note(item, None if multiple
                           else (r.kind, f"the broker refused the record: {r.reason}"))

    def _note(self, item: Item, outcome: tuple[str, str] | None) -> None:
        """Remember a refused occurrence for the node's next attempts (a refusal starts a
        new session: the shard is claimed and published again, see node/transactions.py)."""
        if not isinstance(item, Pending):
            return
        aside = self.transactions.set_aside
        aside[(item.topic, item.key, item.scheduled_ms)] = outcome
        while len(aside) > SET_ASIDE_SIZE:
            aside.popitem(last=False)

    async def _partition_count(self, topic: str) -> int | None:
        n = self._partitions.get(topic)
        if n is not None:
            return n
        n = await self.transactions.producer.partition_count(topic)
        if n is not None:
            self._partitions[topic] = n
        return n

    async def _largest(self, topic: str, largest: dict[str, int]) -> int:
        limit = largest[topic] = await self.transactions.producer.max_record_bytes(topic)
        return limit

    def _dead_letter(self, p: Pending, fired_at: bytes, reason: str,
                     detail: str) -> tuple[Outgoing, str]:
        log.error("shard %d: %s dead-lettered (%s): %s", self.shard, p.job_id, reason, detail,
                  extra={"shard": self.shard, "job_id": p.job_id,
                         "occurrence": f"{p.job_id}@{p.scheduled_ms}"})
        key = p.key
        return Outgoing(self.settings.dead_topic, None, key, p.payload,
                        p.headers(key, (wire.FIRED_AT, fired_at),
                                  (wire.TARGET_TOPIC, p.topic.encode()),
                                  (wire.ERROR, _error(reason, detail)),
                                  (wire.REASON,
                                   limits.cut_reason(f"{reason}: {detail}").encode()))), reason


def _error(reason: str, detail: str) -> bytes:
    return limits.cut_reason(f"{ERROR_NAMES.get(reason, reason)}: {detail}").encode()


def _fit(out: Outgoing, limit: int) -> Outgoing:
    """A dead letter within `<ns>.dead`'s largest record: its payload replaced by a note of
    its size and SHA-256 if needed, then its headers cut to chronowheel's own."""
    if limits.record_bytes(out.key, out.value, out.headers) <= limit:
        return out
    out = Outgoing(out.topic, out.partition, out.key, limits.oversize_note(out.value),
                   out.headers)
    if limits.record_bytes(out.key, out.value, out.headers) <= limit:
        return out
    return Outgoing(out.topic, out.partition, out.key, out.value,
                    [(k, v) for k, v in out.headers if k.startswith("cw-")])


async def stop_quietly(producer: Claimer | None) -> None:
    if producer is not None:
        with contextlib.suppress(Exception):
            await producer.stop()
