"""What the node needs from Kafka, as interfaces: no driver here.

`bus/kafka_node.py` implements them over aiokafka, `bus/memory.py` in memory for tests. The
node (`node/`) sees only these names, so it can run without a broker.

Partitions of `<ns>.submit` and `<ns>.state` are shards: a shard is named by its number.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from chronowheel.errors import ChronowheelError

Headers = Sequence[tuple[str, bytes]]


class BusError(ChronowheelError):
    """A Kafka operation failed (not a fencing): the caller restarts from committed state."""


class PartitionUnavailable(BusError):
    """A partition's offsets could not be read within the bus's deadline: no leader answered
    for it (its leader's broker down and no other replica in sync, say). About that partition
    alone, where other failures of the bus may concern every one."""


class Fenced(BusError):
    """A newer producer with the same transactional id exists: this one may not commit."""


class ProducerBroken(BusError):
    """The producer can no longer be used, for a reason other than a fence: its client gave
    up on it (aiokafka's sender task died, e.g. on OutOfOrderSequenceNumber while a partition
    leader moved, and left the producer's transaction state FATAL_ERROR, where every later
    call fails). A new producer of the same transactional id can go on."""


@dataclass(frozen=True, eq=False)
class Refusal:
    """The broker refused the records `indexes` (in the order they were added) of `prepared`:
    sent together in one producer batch, which is all a refusal can name."""

    prepared: Prepared
    indexes: tuple[int, ...]
    topic: str
    reason: str
    """What the broker said, e.g. `RecordTooLarge: ...` (for the dead letter's headers)."""
    kind: str
    """`too_large`, `refused` (not authorised), `unknown_topic` or `invalid`."""
    whole_topic: bool
    """The refusal is about the topic, so every record of the batch earns it (an
    authorisation failure, a topic that does not exist); otherwise only a record refused
    alone in its batch is known to be the culprit."""


class RecordsRefused(BusError):
    """The broker refused some records of a transaction for what they are or where they go,
    not for anything about the producer: permanent for those records, never for the node. The
    transaction must be aborted; the rest is published again without the culprits."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        self.refusals = tuple(refusals)
        super().__init__("; ".join(f"{r.topic}: {len(r.indexes)} record(s) refused: {r.reason}"
                                   for r in self.refusals))


class SubmitRecord(Protocol):
    """One record read from `<ns>.submit` (aiokafka's ConsumerRecord has these attributes)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    """A `SubmitRecord` held as plain fields (librdkafka's messages have methods instead, and
    the in-memory bus keeps its messages so)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


class Prepared(Protocol):
    """Messages encoded into producer batches outside any transaction (so a shard encodes its
    next part while the node's current transaction commits); `Transaction.send` ships them."""

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes,
            headers: Headers, *, alone: bool = False) -> None:
        """Encode a message (no await); `alone`: in a producer batch of its own, so that a
        refusal names it alone. A batch never grows past the topic's largest message
        (`TxnProducer.max_record_bytes`). Raises BusError when the message cannot be encoded
        (nothing is added then)."""
        ...

    def __len__(self) -> int: ...


class Transaction(Protocol):
    """One open Kafka transaction of a transactional producer.

    Messages become visible to read_committed consumers only when `commit` returns; after an
    exception from any method the caller must `abort` (which never raises) and drop the
    transaction. Raises `Fenced` when a newer producer with the same transactional id exists,
    `BusError` on any other failure.
    """

    end_ms: float | None
    """How long the brokers took to end the transaction once everything in it was sent (its
    EndTxn: the coordinator's log writes, about the same whatever the transaction carried),
    in ms; None until `commit` returned."""

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes,
               headers: Headers) -> bool:
        """Buffer a message without awaiting anything; False when it needs `publish` (no
        open batch for that partition yet, or the batch is full). The hot path of a herd."""
        ...

    async def publish(self, topic: str, partition: int, key: bytes | None, value: bytes,
                      headers: Headers) -> None:
        """Add a message, shipping a full batch first when needed. Raises BusError when one
        message does not fit an empty batch."""
        ...

    async def send(self, prepared: Prepared) -> None:
        """Ship prepared messages in this transaction, in the order they were added."""
        ...

    async def commit(self, submit_offsets: Mapping[int, int]) -> None:
        """Send every buffered message and the given next `<ns>.submit` offsets (shard ->
        offset) for the node group, then commit all of it atomically. Raises RecordsRefused
        (before committing anything) when the broker refused records of prepared messages:
        the caller aborts, and publishes again without them."""
        ...

    async def abort(self) -> None:
        """Abort the transaction; never raises."""
        ...


class TxnProducer(Protocol):
    """A transactional producer: the node's (`<ns>-node-<node id>`, every dispatch cycle of
    every owned shard), a shard's (`<ns>-shard-<k>`, only to commit a takeover's claim), or
    one started only to fence a previous owner."""

    @property
    def transactional_id(self) -> str: ...

    async def start(self) -> None:
        """Initialise transactions: from here on any other producer with the same id is
        fenced and its open transaction is aborted. Retries transient failures; raises
        BusError after that."""
        ...

    async def stop(self) -> None:
        """Release the producer; an open transaction is aborted by the broker."""
        ...

    async def begin(self) -> Transaction:
        """Open a transaction (at most one at a time). Raises Fenced or BusError."""
        ...

    def prepare(self) -> Prepared:
        """An empty set of messages to encode for a later transaction of this producer."""
        ...

    async def partition_count(self, topic: str) -> int | None:
        """Partitions of `topic`; None when it does not exist or cannot be read within 10 s."""
        ...

    async def max_record_bytes(self, topic: str) -> int:
        """The largest record `topic` takes from this producer, counted as
        `limits.record_bytes` counts: the topic's `max.message.bytes`, read from the brokers
        (refreshed now and then; `limits.KAFKA_MAX_MESSAGE_BYTES` when it cannot be read),
        and never more than the producer's own largest request."""
        ...

    def forget_limit(self, topic: str) -> None:
        """Read `topic`'s limit from the brokers again at its next use (a record under the
        known limit was refused as too large: the topic's configuration changed)."""
        ...


class SubmitPositions(Protocol):
    """Where the node group reads a shard's partition of `<ns>.submit`."""

    async def committed(self, shard: int) -> int | None:
        """The offset committed for the node group (None when never committed)."""
        ...

    async def seek(self, shard: int, offset: int | None) -> int:
        """Read the shard's partition from `offset` next (None: from its beginning). From the
        call on, `fetch` hands over none of the shard's records until `deliver(shard)`: the
        ones read before the seek are dropped, the ones read after it are kept for then.

        Returns how many offsets below the partition's log start `offset` lay: records that
        retention deleted before this group applied them (0 normally). Reading then starts at
        the log start; the caller says so loudly, as those commands are gone."""
        ...

    def deliver(self, shard: int) -> None:
        """Hand over the shard's records again, starting with those read since its last
        seek. The shard's actor calls it once it takes records: anything `fetch` handed over
        between a seek and this moment would otherwise be dropped as meant for an actor not
        ready yet, and never read again."""
        ...


ShardsChanged = Callable[[list[int]], Awaitable[None]]


class SubmitGroup(SubmitPositions, Protocol):
    """The node's member of the `<ns>-nodes` consumer group over `<ns>.submit`.

    The group assignment is shard ownership: `on_assigned` / `on_revoked` (given when the group
    is made) run inside `start` and `fetch` whenever the assignment changes; `on_revoked` of
    a shard completes before any other member is given it.
    """

    async def start(self) -> None:
        """Join the group (the first assignment may arrive before this returns)."""
        ...

    async def stop(self) -> None:
        """Leave the group: other members take the shards over at once."""
        ...

    def partition_count(self) -> int | None:
        """Partitions of `<ns>.submit` as known after `start` (None when unknown)."""
        ...

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[int, list[SubmitRecord]]:
        """Committed records of assigned, unpaused shards, in offset order per shard."""
        ...

    def pause(self, shard: int) -> None:
        """Stop fetching this shard's records until `resume` (backpressure)."""
        ...

    def resume(self, shard: int) -> None: ...

    def assigned(self) -> set[int]:
        """Shards currently assigned to this member."""
        ...

    async def check_membership(self) -> bool:
        """Whether this member is still in the group's current generation, asked of the
        group coordinator (a synchronous commit of the membership probe, `core/wire.py`,
        which the coordinator accepts only from a current member): False when the group has
        moved on without it (a paused member whose session expired) or is rebalancing.
        Raises BusError when the coordinator cannot be asked."""
        ...


class ClaimTransaction(Protocol):
    """The transaction of a claim or a release: one record, then commit or abort (the
    errors as `Transaction`'s)."""

    async def publish(self, topic: str, partition: int, key: bytes | None, value: bytes,
                      headers: Headers) -> None: ...

    async def commit(self, submit_offsets: Mapping[int, int]) -> None: ...

    async def abort(self) -> None: ...


class Claimer(Protocol):
    """A transactional producer that only initialises, fencing every other producer with its
    id (a shard's claimer `<ns>-shard-<k>`, or one started to fence a previous owner), and
    commits single records alone in transactions (a claim, a release). `TxnProducer` is one;
    `NodeBus.claimer` may give a lighter one."""

    @property
    def transactional_id(self) -> str: ...

    async def start(self) -> None:
        """As `TxnProducer.start`."""
        ...

    async def stop(self) -> None: ...

    async def begin(self) -> ClaimTransaction:
        """Open a transaction. Raises Fenced or BusError."""
        ...


class NodeBus(Protocol):
    """Everything a node needs from Kafka."""

    def submit_group(self, *, group_id: str, client_id: str, session_timeout_ms: int,
                     on_assigned: ShardsChanged, on_revoked: ShardsChanged) -> SubmitGroup: ...

    def producer(self, transactional_id: str, group_id: str) -> TxnProducer:
        """A (not yet started) transactional producer; `group_id` is the group whose submit
        offsets its transactions commit."""
        ...

    def claimer(self, transactional_id: str, group_id: str) -> Claimer:
        """A (not yet started) claimer or fencer (`Claimer`) with this transactional id."""
        ...

    async def read_last(self, topic: str, partition: int, key: bytes, timeout_ms: int, *,
                        settled: bool = False) -> bytes | None:
        """The value of the last committed record with `key` in one partition of a compacted
        topic (None when there is none). `settled`: read up to the partition's high
        watermark, so wait until every transaction that wrote to it is committed or aborted
        (without it, up to the last stable offset: open transactions are not waited for).
        Raises BusError when the end is not reached in `timeout_ms`."""
        ...

    async def close(self) -> None:
        """Release what the bus keeps between calls (e.g. started readers)."""
        ...


# --- the worker's bus ------------------------------------------------------------------------
# What a worker (`worker/`) needs from Kafka: a member of its consumer group over the topics it
# handles, and a plain producer for retry commands and dead letters. `bus/kafka_worker.py`
# implements them over aiokafka, `bus/memory_worker.py` in memory.


class TopicPartition(NamedTuple):
    """One partition of a topic (equal to aiokafka's TopicPartition of the same values)."""

    topic: str
    partition: int


PartitionsChanged = Callable[[list[TopicPartition]], Awaitable[None]]


class WorkerConsumer(Protocol):
    """A worker's member of its consumer group: read_committed, offsets committed only by
    `commit`, a partition the group never committed read from its beginning.

    `on_assigned` / `on_revoked` (given when it is made) run inside `start`, `fetch` and `stop`
    whenever the assignment changes. `on_revoked` of a partition completes before any other
    member is given it, so a commit made in it is what the next owner starts from.
    """

    async def start(self) -> None:
        """Join the group (the first assignment may arrive before this returns)."""
        ...

    async def stop(self) -> None:
        """Leave the group: its partitions move to the other members at once."""
        ...

    async def fetch(self, timeout_ms: int, max_records: int,
                    ) -> dict[TopicPartition, list[SubmitRecord]]:
        """At most `max_records` committed records of assigned partitions, in offset order per
        partition; waits up to `timeout_ms` when there are none."""
        ...

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit the next offset to read of each partition for the group. Raises BusError
        when the group does not take it (a rebalance went on without this member)."""
        ...

    def assignment(self) -> set[TopicPartition]:
        """Partitions currently assigned to this member."""
        ...

    def end_offset(self, tp: TopicPartition) -> int | None:
        """The partition's high watermark as last seen by a fetch (None: not fetched yet)."""
        ...

    async def unfetched(self, tp: TopicPartition) -> int | None:
        """Records of an assigned partition not fetched yet, up to its last stable offset
        (None when that is not known yet, e.g. its position is being reset)."""
        ...


class RecordRefused(BusError):
    """The broker refused one record of the worker's producer for what the record is, not for
    anything about the producer, the topic or the cluster: permanent for that record (sending
    it again changes nothing), never a reason to stop the worker (docs/worker.md, "When the
    broker refuses a retry or a dead letter")."""

    def __init__(self, topic: str, kind: str, reason: str) -> None:
        self.topic = topic
        self.kind = kind
        """`too_large` (over the topic's `max.message.bytes` or the producer's largest
        request, sent alone) or `invalid` (INVALID_RECORD, INVALID_TIMESTAMP)."""
        self.reason = reason
        """What the broker said, e.g. `MessageSizeTooLargeError: ...`."""
        super().__init__(f"{topic}: record refused ({kind}): {reason}")


class WorkerProducer(Protocol):
    """A plain (not transactional) producer, acks from every in-sync replica."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic: str, key: bytes | None, value: bytes,
                   headers: Headers = ()) -> None:
        """Publish one message, returning once it is acknowledged; the partition is chosen by
        the key as Kafka's default partitioner does.

        Raises RecordRefused when the broker refused this record sent alone (a refusal of a
        producer batch holding other records too is tried again with the record alone, so
        that a neighbour's refusal never condemns it). Raises BusError for anything that is
        not about the record: not acknowledged within the delivery deadline (brokers
        unreachable, no leader), a topic that does not exist; the authorizer's refusal to
        write the topic is a `KafkaAccessError` (both the worker's topics are the
        namespace's own, so it would refuse every record)."""
        ...


class WorkerBus(Protocol):
    """Everything a worker needs from Kafka."""

    def consumer(self, *, group_id: str, topics: Sequence[str], session_timeout_ms: int,
                 on_assigned: PartitionsChanged,
                 on_revoked: PartitionsChanged) -> WorkerConsumer:
        """A (not yet started) member of `group_id` subscribed to `topics`."""
        ...

    def producer(self) -> WorkerProducer:
        """A (not yet started) producer."""
        ...
