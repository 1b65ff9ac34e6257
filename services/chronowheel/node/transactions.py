"""The node's transaction coordinator: ONE Kafka transaction per dispatch cycle for all shards.

A node runs one transactional producer, `<ns>-node-<node id>`. Every owned shard hands its
part of a commit (fired occurrences, ingest's outbox, its state record, its submit offset) to
`NodeTransactions.commit` and waits; the coordinator puts every part that is waiting into one
transaction, and while that transaction is in flight the next parts accumulate (a natural
linger as long as one commit takes). The count of transactions, not their size, is what limits
a Kafka producer, so a node's 16 shards cost one transaction per cycle instead of 16.

Fencing: a node that takes over a shard whose last recorded owner is this node's producer
fences it (`node/takeover.py`), which aborts our open transaction for ALL our shards. The
coordinator then sees `Fenced`, starts a new *session* and re-initialises the producer. Every
part of an older session is refused with `NodeFenced`: a shard actor binds itself to the
session in force before its claim began (`session`), so an actor whose shard may have been
claimed by another node since can never publish again; the node re-takes its shards through a
fresh takeover and claim (`node/registry.py`).

Refused records: a broker error about some records of a transaction (too large, a topic we
may not write, a record it finds invalid: `RecordsRefused`) is about those records alone. The
transaction is aborted and every part in it fails with `Republish`, naming the refusals: each
shard's publisher notes its culprits in `set_aside` (to go to `<ns>.dead` from then on; those
refused in a batch with others, to go alone, to find which). aiokafka's producer cannot go on
after a refused batch (its sequence numbers no longer match the broker's), and re-initialising
it could undo a fence by another node, so the node recovers as from a fence: a new session,
a new producer, every shard claimed again and published from its committed watermark, the
culprits dead-lettered. Nothing is lost, a read_committed reader sees each occurrence once.

A failed transaction (any other Kafka error, or a producer its client gave up on: aiokafka
leaves a producer whose sender task died in a state where every later call fails) concerns the
shards in it, not the node: it is aborted, and the node recovers as from a fence (a new
session and producer, every shard claimed again from its committed state). Only when more
than MAX_FAILED_IN_ROW transactions fail in a row, over at least FAILING_FOR_MS, each after a
fresh producer and fresh claims, is the trouble taken as lasting: the parts then fail as
errors, which stops the node.

Size: a transaction takes queued parts up to `max_messages` messages (at least one part; the
rest wait for the next). Without that cap a herd (every shard's step full at once) made one
transaction of ~100,000 messages per cycle, and a read_committed reader saw nothing of it
until all of it was written; with it, herd messages become visible a few thousand at a time.

Spacing: the next transaction begins no sooner than the spacing after the last one began
(parts queue meanwhile): `spacing_ms` at least, and up to `spacing_max_ms` while the brokers'
end times say they are short of CPU (`node/spacing.py`). Every transaction costs the brokers
the same fixed work whatever it carries, so on brokers short of CPU fewer, larger transactions
leave them more of it (the same trade as a producer's linger, which Kafka 4 raised from 0 to
5 ms by default: KIP-1030). An urgent part does not wait: a shard's first part after its
takeover (its occurrences have waited for the move already) and the last part of a shard
being released; nor does a full transaction (`max_messages` queued, or parts left over by the
last one), which is as large as spacing could make it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from chronowheel.bus.ports import (
    BusError,
    Fenced,
    RecordsRefused,
    Refusal,
    Transaction,
    TxnProducer,
)
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.errors import ChronowheelError
from chronowheel.history import RunRecorder
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.spacing import Spacing
from chronowheel.retry import RetryPolicy

log = logging.getLogger(__name__)

# Refused occurrences remembered (see NodeTransactions.set_aside).
SET_ASIDE_SIZE = 10_000

# Event loop turns the loop lets pass before it takes the queue (see `run`).
NEXT_PART_TURNS = 3

# Transactions that may fail in a row (each followed by a new producer and a new claim of
# every shard), and for how long, before the node takes the failure as lasting and stops:
# both, so that neither a quick series of renewals during a leader election of a few seconds
# nor one slow failure stops it.
MAX_FAILED_IN_ROW = 5
FAILING_FOR_MS = 30_000
# The wait before the renewal after the n-th failure in a row: none after the first (a passing
# fault costs no more than the renewal), then doubling from the base up to the cap, so a fault
# that persists is not met by a hot loop of renewals.
RENEW_POLICY = RetryPolicy(first_delay_s=0.2, max_delay_s=5.0, jitter=False)


def renew_backoff_ms(failed_in_row: int) -> int:
    if failed_in_row <= 1:
        return 0
    return round(RENEW_POLICY.delay(failed_in_row - 1) * 1000)

Fill = Callable[[Transaction], Awaitable[int]]
"""Writes a shard's messages into the open transaction; returns how many it wrote."""


class ShardLost(ChronowheelError):
    """This node may no longer publish for a shard (another node claimed it, or the node's
    producer was fenced): the shard actor stops; the node decides whether to take it again."""


class ShardUnavailable(ChronowheelError):
    """A takeover could not read the log start of the shard's submit partition within the
    bus's deadline (`PartitionUnavailable`: no leader answered for it), and released its
    claim again: the one shard is given up and taken over again later while the group still
    assigns it to the node (`lost_shard_retry_ms`); the node's other shards go on. Kafka
    unreachable as a whole stops the node through what all its shards need (its transactions,
    its group)."""

    retriable = True


class NodeFenced(ShardLost):
    """The node's producer was fenced (or a part belongs to a session before a fence): its
    open transaction was aborted for every shard in it."""


class Republish(ChronowheelError):
    """The broker refused some records of the transaction this part was in, which was aborted:
    nothing of it is visible. The node starts a new session; the part's publisher notes its
    records named in `refusals` (those of other parts are theirs) for the shard's next claim."""

    retriable = True

    def __init__(self, refusals: tuple[Refusal, ...], shards: list[int]) -> None:
        self.refusals = refusals
        super().__init__(f"node transaction of shards {shards} aborted: "
                         f"{RecordsRefused(refusals)}")


def node_transactional_id(namespace: str, node_id: str) -> str:
    return f"{namespace}-node-{node_id}"


@dataclass(eq=False)
class _Part:
    shard: int
    session: int
    fill: Fill
    submit_offset: int | None
    done: asyncio.Future[None]
    messages: int
    urgent: bool = False


class NodeTransactions:
    def __init__(self, *, producer: Callable[[], TxnProducer], clock: Clock,
                 metrics: NodeMetrics, on_fenced: Callable[[int], None],
                 max_messages: int | None = None, spacing_ms: int = 0,
                 spacing_max_ms: int = 0) -> None:
        """`producer` makes a new (unstarted) producer of the node's transactional id;
        `on_fenced(session)` is told the new session when a fence is found; `max_messages`
        caps the messages one transaction gathers (None: every queued part); `spacing_ms` is
        the least time from one transaction's begin to the next one's (urgent parts excepted),
        and up to `spacing_max_ms` it adapts to the brokers' end times (`node/spacing.py`)."""
        if max_messages is not None and max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        self.spacing = Spacing(least_ms=spacing_ms, most_ms=spacing_max_ms)
        metrics.txn_spacing_seconds.set(spacing_ms / 1000)
        self._urgent = asyncio.Event()
        self._new_producer = producer
        self._max_messages = max_messages
        self.clock = clock
        self.metrics = metrics
        self._on_fenced = on_fenced
        self.session = 0
        self._producer: TxnProducer | None = None
        self._queue: list[_Part] = []
        self._busy: Counter[int] = Counter()  # shard -> parts queued or in a transaction
        self._idle = asyncio.Event()
        self._kick = asyncio.Event()
        self._running = False
        self._once: dict[str, asyncio.Future[None]] = {}
        self._failed_in_row = 0
        self._failing_since: int | None = None
        self.history: RunRecorder | None = None
        """The node's run history writer, told by each shard's publisher what a committed
        part published (None: runs are not recorded)."""
        self.set_aside: OrderedDict[tuple[str, bytes, int], tuple[str, str] | None] = \
            OrderedDict()
        """Occurrences (target topic, job id, scheduled instant) the broker refused: the
        reason and detail to dead-letter them with, or None to publish them alone in their
        producer batch. Kept across sessions (the shards' actors are not), the oldest
        forgotten past SET_ASIDE_SIZE."""

    @property
    def transactional_id(self) -> str:
        assert self._producer is not None, "the node's producer is not started"
        return self._producer.transactional_id

    @property
    def producer(self) -> TxnProducer:
        assert self._producer is not None, "the node's producer is not started"
        return self._producer

    async def start(self) -> None:
        """Initialise the node's producer (fencing an earlier process with the same node id);
        then `run` must be running for commits to go anywhere."""
        self._producer = self._new_producer()
        await self._producer.start()

    async def stop(self) -> None:
        """After `run` was cancelled: fail what is left and release the producer."""
        self._fail(self._queue, ChronowheelError("the node is stopping"))
        self._release(self._queue)
        self._queue = []
        self._running = False
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()

    async def commit(self, shard: int, session: int, fill: Fill,
                     submit_offset: int | None, *, messages: int = 1,
                     urgent: bool = False) -> None:
        """Have `fill` (about `messages` messages) and `submit_offset` committed in the next
        node transaction with room for it; return when it committed. An `urgent` part ends
        the spacing between transactions: the next one begins as soon as the one in flight
        has ended. Raises NodeFenced when `session` is over (the producer was fenced since
        the shard was claimed), ChronowheelError when the transaction failed otherwise."""
        if session != self.session:
            raise NodeFenced(f"shard {shard}: the node's producer was fenced since the shard "
                             f"was claimed (session {session}, now {self.session})")
        if not self._running:
            raise ChronowheelError(f"shard {shard}: the node's transaction loop is not running")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Part(shard, session, fill, submit_offset, done, messages, urgent))
        self._busy[shard] += 1
        if urgent or (self.spacing.ms and self._full()):
            self._urgent.set()  # urgent, or a full transaction is waiting: no spacing
        self._kick.set()
        await done

    async def once(self, what: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run `action`, or join the run of the same `what` already under way (concurrent
        takeovers of one previous owner's shards fence it once, not once per shard)."""
        running = self._once.get(what)
        if running is None:
            running = self._once[what] = asyncio.ensure_future(action())
            running.add_done_callback(lambda _t: self._once.pop(what, None))
        await asyncio.shield(running)

    async def settle(self, shard: int) -> None:
        """Wait until no part of `shard` is queued or in a transaction (a takeover on this
        node must not read the shard's watermark below a commit of ours still under way)."""
        while self._busy[shard]:
            self._idle.clear()
            await self._idle.wait()

    def _release(self, parts: list[_Part]) -> None:
        """The coordinator is done with these parts (committed, aborted or dropped). Not the
        waiting actor's business: an actor cancelled while its part is in a transaction must
        not make `settle` return before that transaction is over."""
        for p in parts:
            self._busy[p.shard] -= 1
            if self._busy[p.shard] <= 0:
                del self._busy[p.shard]
        self._idle.set()

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """The transaction loop (a supervised task of the node): one transaction at a time,
        with every part queued when the previous one ended."""
        self._running = True
        began: int | None = None
        try:
            while True:
                await self._kick.wait()
                if began is not None and not self._urgent.is_set():
                    resume = began + self.spacing.ms
                    if resume > self.clock.now_ms():
                        await sleep_until_or_event(self.clock, resume, self._urgent)
                # Let the shards woken by the last commit take what came due meanwhile and
                # queue it (a few loop turns): otherwise they always miss the next transaction
                # and wait for the one after it.
                for _ in range(NEXT_PART_TURNS):
                    await asyncio.sleep(0)
                self._kick.clear()
                self._urgent.clear()
                # A part whose actor was cancelled before its transaction began is dropped:
                # the actor is gone, and its shard is taken over again from committed state.
                self._release([p for p in self._queue if p.done.done()])
                self._queue = [p for p in self._queue if not p.done.done()]
                parts = self._take()
                if self._queue:
                    # What did not fit goes in the next transaction, without the spacing: a
                    # full transaction is as large as spacing could make it, and waiting would
                    # cap the node at `max_messages` a spacing (a herd would fall behind).
                    self._kick.set()
                    self._urgent.set()
                if parts:
                    began = self.clock.now_ms()
                    try:
                        await self._transaction(parts)
                    finally:
                        self._release(parts)
        finally:
            self._running = False
            self._fail(self._queue, ChronowheelError("the node's transaction loop ended"))
            self._release(self._queue)
            self._queue = []

    def _full(self) -> bool:
        """Whether the queued parts fill a transaction (only asked while there is a spacing
        to end: back to back, nothing waits anyway)."""
        cap = self._max_messages
        return cap is not None and sum(p.messages for p in self._queue) >= cap

    def _take(self) -> list[_Part]:
        """The parts of the next transaction: queued ones in order while they fit in
        `max_messages`, at least one."""
        queue = self._queue
        cap = self._max_messages
        if cap is None:
            self._queue = []
            return queue
        total = 0
        n = 0
        for p in queue:
            if n and total + p.messages > cap:
                break
            total += p.messages
            n += 1
        taken, self._queue = queue[:n], queue[n:]
        return taken

    async def _transaction(self, parts: list[_Part]) -> None:
        stale = [p for p in parts if p.session != self.session]
        for p in stale:
            p.done.set_exception(NodeFenced(f"shard {p.shard}: claimed in session {p.session}, "
                                            f"the node's producer is in session {self.session}"))
        parts = [p for p in parts if p.session == self.session]
        if not parts:
            return
        producer = self.producer
        started = self.clock.now_ms()
        offsets = {p.shard: p.submit_offset for p in parts if p.submit_offset is not None}
        messages = 0
        try:
            txn = await producer.begin()
            try:
                for p in parts:
                    messages += await p.fill(txn)
                await txn.commit(offsets)
            except BaseException:
                await txn.abort()
                raise
        except Fenced as exc:
            await self._fenced(parts, exc)
            return
        except RecordsRefused as exc:  # about some records only: every part goes again
            shards = sorted({p.shard for p in parts})
            log.warning("node transaction of shards %s aborted, to be committed again without "
                        "what the broker refused: %s", shards, exc)
            self.metrics.txn_refused.inc()
            self._fail(parts, Republish(exc.refusals, shards))
            await self._new_session(f"the broker refused records of a transaction ({exc})")
            return
        except BusError as exc:  # Kafka trouble, or a producer its client gave up on
            await self._failed(parts, exc)
            return
        except ChronowheelError as exc:  # e.g. a refused ACL on our own topic: the node's to fix
            self._fail(parts, ChronowheelError(
                f"node transaction of shards {sorted({p.shard for p in parts})} failed: {exc}"))
            return
        except Exception as exc:  # a fill bug: every part's shard fails loudly
            self._fail(parts, exc)
            return
        self._failed_in_row = 0
        self._failing_since = None
        m = self.metrics
        m.txn_seconds.observe((self.clock.now_ms() - started) / 1000)
        if txn.end_ms is not None:
            m.txn_end_seconds.observe(txn.end_ms / 1000)
            if self.spacing.adapts:
                self.spacing.ended(txn.end_ms, self.clock.now_ms())
                m.txn_spacing_seconds.set(self.spacing.ms / 1000)
        m.txn_messages.inc(messages)
        m.txn_shards.inc(len(parts))
        for p in parts:
            if not p.done.done():
                p.done.set_result(None)

    def _fail(self, parts: list[_Part], exc: BaseException) -> None:
        for p in parts:
            if not p.done.done():
                p.done.set_exception(exc)

    async def _failed(self, parts: list[_Part], exc: BaseException) -> None:
        """The transaction failed (not fenced, nothing refused): see the module's docstring."""
        shards = sorted({p.shard for p in parts})
        now = self.clock.now_ms()
        self._failed_in_row += 1
        if self._failing_since is None:
            self._failing_since = now
        self.metrics.txn_failed.inc()
        failing_ms = now - self._failing_since
        if self._failed_in_row > MAX_FAILED_IN_ROW and failing_ms >= FAILING_FOR_MS:
            self._fail(parts, ChronowheelError(
                f"node transaction of shards {shards} failed, the {self._failed_in_row}th in a "
                f"row over {failing_ms / 1000:.0f} s, each after a new producer and new claims: "
                f"{exc}"))
            return
        self._fail(parts, NodeFenced(f"node transaction of shards {shards} failed ({exc}); "
                                     f"the node takes its shards again with a new producer"))
        backoff = renew_backoff_ms(self._failed_in_row)
        if backoff:
            await self.clock.sleep_until(now + backoff)
        await self._new_session(f"a transaction of shards {shards} failed ({exc}), "
                                f"{self._failed_in_row} in a row")

    async def _fenced(self, parts: list[_Part], exc: Fenced) -> None:
        """Our open transaction was aborted by a newer producer of our id: end the session
        (every part of it fails), then re-initialise the producer for the next one."""
        self.session += 1
        self.metrics.fenced.inc()
        log.warning("node producer %s FENCED (%s): its transaction of shards %s is aborted; "
                    "session %d begins, every shard is taken over again", self.transactional_id,
                    exc, sorted({p.shard for p in parts}), self.session)
        self._on_fenced(self.session)
        err = NodeFenced(f"the node's producer {self.transactional_id} was fenced: {exc}")
        self._fail(parts, err)
        await self._renew(err)

    async def _new_session(self, why: str) -> None:
        """Start a new session and producer as after a fence (see the module's docstring)."""
        self.session += 1
        log.warning("node producer %s: %s; session %d begins, every shard is taken over "
                    "again", self.transactional_id, why, self.session)
        self._on_fenced(self.session)
        await self._renew(NodeFenced(f"the node's producer {self.transactional_id} is "
                                     f"re-initialised: {why}"))

    async def _renew(self, err: NodeFenced) -> None:
        for p in self._queue:  # queued meanwhile by actors of the old session
            if p.session != self.session and not p.done.done():
                p.done.set_exception(err)
        old = self._producer
        self._producer = self._new_producer()
        if old is not None:
            with contextlib.suppress(Exception):
                await old.stop()
        # Re-initialising bumps our epoch and fences nobody else: publishing for a shard still
        # needs a claim (`node/takeover.py`), which the node makes only for shards it holds.
        await self._producer.start()
