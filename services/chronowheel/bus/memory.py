"""The node's bus ports (`bus/ports.py`) in memory, for tests that run a node without Kafka.

Topics are lists of partition logs. Transactions buffer their messages and append them (and the
group offset) only on commit, so every log holds committed messages only, as a read_committed
consumer sees them; an open transaction is tracked by transactional id, so a settled read waits
for it. Starting a producer fences the previous one with the same transactional id and aborts
its open transaction, as `init_transactions` does. One event loop only.

Like a broker, a topic may refuse records: over its `max.message.bytes` (`topic_limits`, the
producer's batches never grow past it) or for everyone (`refused_topics`, as a missing ACL);
a commit of a transaction with such a prepared record raises RecordsRefused naming it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chronowheel.bus.ports import (
    BusError,
    Fenced,
    FetchedRecord,
    Headers,
    Prepared,
    RecordsRefused,
    Refusal,
    ShardsChanged,
    SubmitRecord,
)
from chronowheel.core import limits
from chronowheel.core.clock import Clock
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.timeouts import wait_event, within


@dataclass(frozen=True, slots=True)
class Message(FetchedRecord):
    committed_ms: int
    """The bus clock's time when the message became visible (its transaction committed)."""
    seq: int = 0
    """Order of visibility across all topics."""

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


@dataclass
class _Pending:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


class MemoryBus:
    def __init__(self, settings: Settings, clock: Clock, *, batch_rows: int = 3,
                 max_message_bytes: int = 1 << 20) -> None:
        """`batch_rows`: messages per producer batch, small so that tests exercise both the
        `append` and the `publish` path of a transaction."""
        self.settings = settings
        self.clock = clock
        self.batch_rows = batch_rows
        self.max_message_bytes = max_message_bytes
        self.topics: dict[str, list[list[Message]]] = {}
        self.group_offsets: dict[tuple[str, str, int], int] = {}
        self.log_start: dict[tuple[str, int], int] = {}
        """(topic, partition) -> the first offset still readable (`delete_records`)."""
        self.epochs: dict[str, int] = {}
        self.open_txns: dict[str, MemoryTransaction] = {}
        """transactional id -> its open transaction (aborted when the id is started again)."""
        self.resolved = asyncio.Event()
        """Set whenever an open transaction ends (commit, abort, fence)."""
        self.held: dict[str, asyncio.Event] = {}
        """transactional id -> commits of it wait for this event (see `hold_commits`)."""
        self.held_starts: dict[str, asyncio.Event] = {}
        """transactional id -> starts of it wait for this event (see `hold_starts`)."""
        self.members: dict[str, list[MemorySubmitGroup]] = {}
        """group id -> members in the order they joined (see `MemorySubmitGroup.start`)."""
        self.starts: list[str] = []
        """Transactional ids in the order producers were started (initialised)."""
        self.topic_limits: dict[str, int] = {}
        """topic -> its `max.message.bytes` (Kafka's default for a topic not named)."""
        self.refused_topics: set[str] = set()
        """Topics that refuse every record (TopicAuthorizationFailed)."""
        self.limits_readable = True
        """False: producers cannot read topics' limits (no DescribeConfigs permission), so
        they assume Kafka's default while the topics enforce their own."""
        self.max_request_bytes = 4 << 20
        """The producers' `max_request_size`."""
        self.commits = 0
        self.end_txn_ms = 0.0
        """What a committed transaction reports as its brokers' end time (`Transaction.end_ms`):
        a test sets it to act out brokers short of CPU."""
        self.fail_commits = 0
        """Make this many next commits fail with BusError (after nothing was applied)."""
        self.fail_commits_of: str | None = None
        """Only commits by the producer of this transactional id fail (None: any)."""
        self._seq = itertools.count(1)
        self._arrived = asyncio.Event()

    # --- test helpers --------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int) -> None:
        self.topics.setdefault(name, [[] for _ in range(partitions)])

    def create_namespace(self, shards: int) -> None:
        s = self.settings
        for name, parts in ((s.submit_topic, shards), (s.state_topic, shards),
                            (s.fired_topic, shards), (s.rejected_topic, 1), (s.dead_topic, 1)):
            self.create_topic(name, parts)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """What retention (or DeleteRecords) does: offsets below `before` are not read again."""
        key = (topic, partition)
        self.log_start[key] = max(self.log_start.get(key, 0), before)

    def produce(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes]] = ()) -> Message:
        """A plain (non-transactional) send, visible at once."""
        return self._append(topic, partition, key, value, list(headers))

    def hold_commits(self, transactional_id: str) -> asyncio.Event:
        """Make commits of `transactional_id` wait (as a process stopped mid-commit, with its
        transaction open) until the returned event is set."""
        return self.held.setdefault(transactional_id, asyncio.Event())

    def hold_starts(self, transactional_id: str) -> asyncio.Event:
        """Make starts of `transactional_id` wait (as an InitProducerId still on its way)
        until the returned event is set; nothing is fenced before that."""
        return self.held_starts.setdefault(transactional_id, asyncio.Event())

    def topic_limit(self, topic: str) -> int:
        return self.topic_limits.get(topic, limits.KAFKA_MAX_MESSAGE_BYTES)

    def producer_limit(self, topic: str) -> int:
        """What a producer takes for the topic's largest record (see `limits_readable`)."""
        known = self.topic_limits.get(topic) if self.limits_readable else None
        return limits.max_record_bytes(known, self.max_request_bytes)

    def messages(self, topic: str) -> list[Message]:
        """Every message of `topic`, in the order they became visible."""
        return sorted((m for log in self.topics.get(topic, []) for m in log),
                      key=lambda m: m.seq)

    def _append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> Message:
        logs = self.topics.get(topic)
        if logs is None or not 0 <= partition < len(logs):
            raise BusError(f"no partition {partition} of topic {topic}")
        log = logs[partition]
        msg = Message(topic, partition, len(log), key, value, tuple(headers),
                      self.clock.now_ms(), next(self._seq))
        log.append(msg)
        self._arrived.set()
        return msg

    # --- NodeBus -------------------------------------------------------------------------
    def submit_group(self, *, group_id: str, client_id: str, session_timeout_ms: int,
                     on_assigned: ShardsChanged, on_revoked: ShardsChanged) -> MemorySubmitGroup:
        del client_id, session_timeout_ms
        return MemorySubmitGroup(self, group_id, on_assigned, on_revoked)

    def producer(self, transactional_id: str, group_id: str) -> MemoryTxnProducer:
        return MemoryTxnProducer(self, transactional_id, group_id)

    def claimer(self, transactional_id: str, group_id: str) -> MemoryTxnProducer:
        return self.producer(transactional_id, group_id)

    async def close(self) -> None:
        """Nothing is kept between calls."""

    async def read_last(self, topic: str, partition: int, key: bytes, timeout_ms: int, *,
                        settled: bool = False) -> bytes | None:
        await asyncio.sleep(0)
        logs = self.topics.get(topic)
        if logs is None or not 0 <= partition < len(logs):
            raise BusError(f"no partition {partition} of topic {topic}")
        if settled:  # wait (in real time) until no open transaction wrote to the partition
            async def resolved() -> None:
                while any(t.writes_to(topic, partition) for t in self.open_txns.values()):
                    self.resolved.clear()
                    await self.resolved.wait()
            try:
                await within(resolved(), timeout_ms / 1000)
            except TimeoutError:
                raise BusError(f"timed out reading {topic}[{partition}] to its high watermark "
                               f"({timeout_ms} ms)") from None
        found: bytes | None = None
        for msg in logs[partition]:
            if msg.key == key and msg.value:
                found = msg.value
        return found


class MemoryPrepared:
    def __init__(self, bus: MemoryBus) -> None:
        self._bus = bus
        self.messages: list[_Pending] = []
        self.batches: list[list[int]] = []
        """Indexes into `messages`, as a producer would have batched them."""
        self._open: dict[tuple[str, int], tuple[list[int], int]] = {}  # batch, its bytes

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes,
            headers: Headers, *, alone: bool = False) -> None:
        if len(value) > self._bus.max_message_bytes:
            raise BusError(f"message for {topic} too large for one batch")
        if not all(isinstance(v, bytes) for _, v in headers):
            raise BusError(f"message for {topic}: a header value is not bytes")
        pending = _Pending(topic, partition, key, value, list(headers))
        size = limits.record_bytes(key, value, pending.headers)
        index = len(self.messages)
        self.messages.append(pending)
        # As a producer's batches: at most batch_rows, never past the topic's largest message
        # unless one message alone; `alone` closes the batch around the message.
        where = (topic, partition)
        batch, used = self._open.pop(where, ([], 0))
        if not batch or len(batch) >= self._bus.batch_rows or alone \
                or used + size > self._bus.producer_limit(topic):
            batch, used = [], 0
            self.batches.append(batch)
        batch.append(index)
        if not alone:
            self._open[where] = (batch, used + size)

    def __len__(self) -> int:
        return len(self.messages)


class MemoryTransaction:
    def __init__(self, producer: MemoryTxnProducer) -> None:
        self._producer = producer
        self._bus = producer.bus
        self._pending: list[_Pending] = []
        self._open: dict[tuple[str, int], int] = {}  # messages in the current batch
        self.refusals: list[Refusal] = []
        self.aborted = False
        self.end_ms: float | None = None

    def writes_to(self, topic: str, partition: int) -> bool:
        """Whether this open transaction has a message for that partition (in Kafka: holds
        its last stable offset back until the transaction is resolved)."""
        return any(p.topic == topic and p.partition == partition for p in self._pending)

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes,
               headers: Headers) -> bool:
        n = self._open.get((topic, partition))
        if n is None or n >= self._bus.batch_rows or len(value) > self._bus.max_message_bytes:
            return False
        self._open[(topic, partition)] = n + 1
        self._pending.append(_Pending(topic, partition, key, value, list(headers)))
        return True

    async def publish(self, topic: str, partition: int, key: bytes | None, value: bytes,
                      headers: Headers) -> None:
        self._producer.check_epoch()
        await asyncio.sleep(0)
        self._producer.check_epoch()
        if len(value) > self._bus.max_message_bytes:
            raise BusError(f"message for {topic} too large for one batch")
        if not self.append(topic, partition, key, value, headers):
            self._open[(topic, partition)] = 1  # a new batch
            self._pending.append(_Pending(topic, partition, key, value, list(headers)))

    async def send(self, prepared: Prepared) -> None:
        assert isinstance(prepared, MemoryPrepared)
        self._producer.check_epoch()
        await asyncio.sleep(0)
        self._producer.check_epoch()
        for batch in prepared.batches:
            messages = [prepared.messages[i] for i in batch]
            topic = messages[0].topic
            refusal = self._refusal(prepared, tuple(batch), topic, messages)
            if refusal is not None:  # as a produce response's error: the commit raises it
                self.refusals.append(refusal)
            else:
                self._pending.extend(messages)
        self._open.clear()  # later messages start new batches
        prepared.messages = []
        prepared.batches = []

    def _refusal(self, prepared: Prepared, indexes: tuple[int, ...], topic: str,
                 messages: list[_Pending]) -> Refusal | None:
        bus = self._bus
        if topic not in bus.topics:
            return Refusal(prepared, indexes, topic, "UnknownTopicOrPartitionError",
                           "unknown_topic", whole_topic=True)
        if topic in bus.refused_topics:
            s = bus.settings
            if topic in (s.submit_topic, s.state_topic, s.fired_topic, s.rejected_topic,
                         s.dead_topic):
                # As the Kafka bus: the namespace's own topic concerns every job.
                raise ConfigError(f"this client may not write topic {topic} "
                                       f"(TopicAuthorizationFailedError); see `chronowheel acl`")
            return Refusal(prepared, indexes, topic, f"TopicAuthorizationFailedError: {topic}",
                           "refused", whole_topic=True)
        size = sum(limits.record_bytes(m.key, m.value, m.headers) for m in messages)
        limit = bus.topic_limit(topic)
        if size > limit:
            return Refusal(prepared, indexes, topic,
                           f"MessageSizeTooLargeError: a batch of {size} bytes, over "
                           f"max.message.bytes {limit}", "too_large", whole_topic=False)
        return None

    async def commit(self, submit_offsets: Mapping[int, int]) -> None:
        bus = self._bus
        producer = self._producer
        producer.check_epoch()
        await asyncio.sleep(0)
        held = bus.held.get(producer.transactional_id)
        if held is not None:  # a test pauses this producer mid-commit (a stopped process)
            await held.wait()
        producer.check_epoch()
        if self.aborted:
            raise Fenced(f"producer {producer.transactional_id}: transaction aborted")
        if bus.fail_commits and bus.fail_commits_of in (None, producer.transactional_id):
            bus.fail_commits -= 1
            raise BusError("commit failed (injected)")
        if self.refusals:
            raise RecordsRefused(self.refusals)
        for p in self._pending:  # before anything is applied: all or nothing
            logs = bus.topics.get(p.topic)
            if logs is None or not 0 <= p.partition < len(logs):
                raise BusError(f"no partition {p.partition} of topic {p.topic}")
        for p in self._pending:
            bus._append(p.topic, p.partition, p.key, p.value, p.headers)
        for shard, offset in submit_offsets.items():
            bus.group_offsets[(producer.group_id, bus.settings.submit_topic, shard)] = offset
        bus.commits += 1
        self.end_ms = bus.end_txn_ms
        self._end()

    async def abort(self) -> None:
        self._end()

    def _end(self) -> None:
        self._pending.clear()
        self.refusals.clear()
        producer = self._producer
        producer.in_transaction = False
        if self._bus.open_txns.get(producer.transactional_id) is self:
            del self._bus.open_txns[producer.transactional_id]
        self._bus.resolved.set()


class MemoryTxnProducer:
    def __init__(self, bus: MemoryBus, transactional_id: str, group_id: str) -> None:
        self.bus = bus
        self._id = transactional_id
        self.group_id = group_id
        self.epoch: int | None = None
        self.in_transaction = False

    @property
    def transactional_id(self) -> str:
        return self._id

    def check_epoch(self) -> None:
        if self.epoch is None:
            raise BusError(f"producer {self._id} not started")
        if self.bus.epochs[self._id] != self.epoch:
            raise Fenced(f"producer {self._id} epoch {self.epoch} is fenced by "
                         f"epoch {self.bus.epochs[self._id]}")

    async def start(self) -> None:
        await asyncio.sleep(0)
        bus = self.bus
        held = bus.held_starts.get(self._id)
        if held is not None:
            await held.wait()
        self.epoch = bus.epochs.get(self._id, 0) + 1
        bus.epochs[self._id] = self.epoch
        # As InitProducerId: the open transaction of an earlier producer of this id aborts.
        open_txn = bus.open_txns.pop(self._id, None)
        if open_txn is not None:
            open_txn.aborted = True
            open_txn._pending.clear()
            bus.resolved.set()
        bus.starts.append(self._id)

    async def stop(self) -> None:
        self.in_transaction = False

    async def begin(self) -> MemoryTransaction:
        self.check_epoch()
        if self.in_transaction:
            raise BusError(f"producer {self._id}: a transaction is already open")
        self.in_transaction = True
        txn = MemoryTransaction(self)
        self.bus.open_txns[self._id] = txn
        return txn

    def prepare(self) -> MemoryPrepared:
        return MemoryPrepared(self.bus)

    async def partition_count(self, topic: str) -> int | None:
        await asyncio.sleep(0)
        logs = self.bus.topics.get(topic)
        return len(logs) if logs else None

    async def max_record_bytes(self, topic: str) -> int:
        await asyncio.sleep(0)
        return self.bus.producer_limit(topic)

    def forget_limit(self, topic: str) -> None:
        """Nothing is cached: every read asks the bus."""


class MemorySubmitGroup:
    """One member of the node group. `start` assigns it every shard (a group of one) and makes
    the earlier members stale; tests move shards with `assign` and `revoke`."""

    def __init__(self, bus: MemoryBus, group_id: str, on_assigned: ShardsChanged,
                 on_revoked: ShardsChanged) -> None:
        self.bus = bus
        self.group_id = group_id
        self.topic = bus.settings.submit_topic
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._assigned: set[int] = set()
        self.stale = False
        """Set by a test: this member's generation is over (its session expired)."""
        self.membership_checks = 0
        self.coordinator_unreachable = False
        """Set by a test: `check_membership` cannot ask the coordinator (BusError)."""
        self._paused: set[int] = set()
        self._withheld: set[int] = set()  # sought, not delivered yet (SubmitPositions.seek)
        self.seeks: list[tuple[int, int | None]] = []
        """(shard, offset) of every `seek`, in order (for tests)."""
        self._position: dict[int, int] = {}

    async def start(self) -> None:
        # The group moves to a new generation without the earlier members, which are not told
        # (as a paused process whose session expired): they find out by `check_membership`.
        for member in self.bus.members.setdefault(self.group_id, []):
            member.stale = True
        self.bus.members[self.group_id].append(self)
        count = self.partition_count()
        if count:
            await self.assign(list(range(count)))

    async def stop(self) -> None:
        await self.revoke(sorted(self._assigned))

    async def assign(self, shards: list[int]) -> None:
        for k in shards:
            self._assigned.add(k)
            self._position[k] = await self.committed(k) or 0
        await self._on_assigned(shards)

    async def revoke(self, shards: list[int]) -> None:
        await self._on_revoked(shards)
        self._assigned.difference_update(shards)
        self._withheld.difference_update(shards)

    def partition_count(self) -> int | None:
        logs = self.bus.topics.get(self.topic)
        return None if logs is None else len(logs)

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[int, list[SubmitRecord]]:
        out = self._take(max_records)
        if not out:
            self.bus._arrived.clear()
            if not await wait_event(self.bus._arrived, timeout_ms / 1000):
                return {}
            out = self._take(max_records)
        return out

    def _take(self, max_records: int) -> dict[int, list[SubmitRecord]]:
        out: dict[int, list[SubmitRecord]] = {}
        logs = self.bus.topics.get(self.topic, [])
        for k in sorted(self._assigned - self._paused - self._withheld):
            start = max(self._position.get(k, 0), self.bus.log_start.get((self.topic, k), 0))
            records = logs[k][start:start + max_records]
            if records:
                out[k] = list(records)
                self._position[k] = start + len(records)
                max_records -= len(records)
            if max_records <= 0:
                break
        return out

    def pause(self, shard: int) -> None:
        self._paused.add(shard)

    def resume(self, shard: int) -> None:
        self._paused.discard(shard)

    def assigned(self) -> set[int]:
        return set(self._assigned)

    async def check_membership(self) -> bool:
        await asyncio.sleep(0)
        self.membership_checks += 1
        if self.coordinator_unreachable:
            raise BusError(f"group {self.group_id}: the coordinator cannot be reached")
        return not self.stale

    async def committed(self, shard: int) -> int | None:
        return self.bus.group_offsets.get((self.group_id, self.topic, shard))

    async def seek(self, shard: int, offset: int | None) -> int:
        self.seeks.append((shard, offset))
        self._withheld.add(shard)
        start = self.bus.log_start.get((self.topic, shard), 0)
        self._position[shard] = max(offset or 0, start)
        return max(0, start - offset) if offset is not None else 0

    def deliver(self, shard: int) -> None:
        self._withheld.discard(shard)
        self.bus._arrived.set()
