"""Takeover: make a shard ours and find where its previous owner stopped.

A node publishes through ONE producer for all its shards (`node/transactions.py`), so fencing
is by the owner each shard's state record names (docs/design.md, "Fencing"):

1. Start the shard's own transactional producer `<ns>-shard-<k>`: it serialises claims of the
   shard (a claimer that started before us can no longer commit its claim) and fences an owner
   from before node transactions, which published with that id.
2. Read the shard's last committed state record; fence the producer it names as owner (start
   one with that transactional id: its epoch is bumped and its open transaction aborted),
   unless it is this node or nobody (released on a graceful stop).
3. Read the record again, *settled*: up to the partition's high watermark, so after every
   transaction that wrote to it is resolved. If it names another owner, go back to 2.
4. Commit a claim: a transaction of the shard's producer holding only the state record with
   the watermark unchanged and owner = this node's id. Only then may the node publish for the
   shard, so a later owner always finds, in step 2 or 3, every node that may hold an open
   transaction with this shard's messages.

The shard then resumes from that watermark and reads `<ns>.submit` from the node group's
committed offset: everything after them is redone, and nothing before them was lost, because
both were committed in the same transaction. That offset is settled once the record is (step 3),
so it is read and the partition sought while the claim commits: a takeover waits for the
longer of the two, not their sum (what it fetches reaches the shard only after the claim).

The claimer is kept, not stopped, while the node holds the shard and while it keeps the shard
warm after a revocation (`node/registry.py`). A shard given back to this node is then resumed
warm (`resume_warm`) when nothing can have happened to it since it was released here: its
settled record is still the release this node committed, the group's committed submit offset is
still the one that release carried, and a claim committed with the kept claimer succeeds, which
proves that no node initialised `<ns>-shard-<k>` (the first step of every claim) since this node
did. Its wheel is kept as it was: nothing is read again from Cassandra (docs/design.md, "Warm
shards").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from chronowheel.bus.ports import (
    BusError,
    Claimer,
    Fenced,
    NodeBus,
    PartitionUnavailable,
    SubmitPositions,
)
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.core.wire import Ahead, StateRecord, StateRecordError, claimer_transactional_id
from chronowheel.errors import ChronowheelError
from chronowheel.node.publisher import stop_quietly
from chronowheel.node.transactions import NodeTransactions, ShardLost, ShardUnavailable
from chronowheel.settings import Settings
from chronowheel.timeouts import within

log = logging.getLogger(__name__)
T = TypeVar("T")

STATE_READ_TIMEOUT_MS = 30_000
# A settled read waits for open transactions on the state partition: one of a paused process
# that nobody fenced ends at the latest when the broker aborts it (transaction_timeout_ms, 60 s).
SETTLED_READ_TIMEOUT_MS = 90_000
# Initialising a producer waits while its previous transaction is being aborted; a start that
# hangs longer than this is abandoned and tried again with a new producer.
FENCE_TIMEOUT_S = 30
FENCE_ATTEMPTS = 3
FENCE_STAGGER_MS = 50
"""While no fencer of a fence has initialised, another one starts this often, up to
FENCERS_AT_ONCE. The first InitProducerId of a fence is refused (CONCURRENT_TRANSACTIONS)
while the coordinator aborts the fenced producer's open transaction, which takes tens of
milliseconds, and librdkafka asks again only after a fixed 500 ms (its producer-id timer,
which `retry.backoff.ms` does not shorten): a fencer started later finds the abort done.
Measured: `loadtest/bench/fence_bench.py`."""
FENCERS_AT_ONCE = 6
# Owners that change again and again while we fence them: something is wrong, say so.
MAX_FENCE_ROUNDS = 8
# Releasing a shard whose actor ended half way waits at most this long for the node's
# transactions of the shard to end, and for the settled read (`release_half_way`).
RELEASE_SETTLE_S = 5
RELEASE_READ_S = 10


@dataclass(frozen=True)
class Resume:
    watermark: int
    submit_offset: int | None  # None: the partition is read from its beginning
    claimer: Claimer | None = field(default=None, compare=False)
    """The shard's claimer, kept started (the caller stops it when it gives the shard up for
    good): a later `resume_warm` commits its claim with it."""
    ahead: Ahead | None = None
    """The record's `ahead` ranges: the previous owner was catching up at a paced rate, and
    the slots in each (cut, high] are published too (`node/lateness.py`)."""
    submit_expired: int = 0
    """Offsets from the committed one up to the submit partition's log start: commands that
    retention deleted before any node applied them. Reading starts at the log start."""


@dataclass
class Phases:
    """How long each step of a takeover took (ms, by the node's clock), in order: the log line
    of every claim carries them, so a slow failover shows which step to look at."""

    clock: Clock
    took: dict[str, int] = field(default_factory=dict)
    _mark: int = 0
    _start: int = 0

    def __post_init__(self) -> None:
        self._mark = self._start = self.clock.now_ms()

    def done(self, step: str) -> None:
        now = self.clock.now_ms()
        self.took[step] = self.took.get(step, 0) + now - self._mark
        self._mark = now

    async def timed(self, step: str, work: Awaitable[T]) -> T:
        """Run `work`, recording how long it took as `step` without moving the mark: for
        steps that run alongside others (their times overlap, the total does not add them)."""
        began = self.clock.now_ms()
        try:
            return await work
        finally:
            self.took[step] = self.took.get(step, 0) + self.clock.now_ms() - began

    def __str__(self) -> str:
        total = self._mark - self._start
        return f"{total} ms (" + ", ".join(f"{k} {v}" for k, v in self.took.items()) + ")"


async def take_over(*, shard: int, transactions: NodeTransactions, bus: NodeBus,
                    submit: SubmitPositions, settings: Settings, clock: Clock, group_id: str,
                    node_id: str) -> Resume:
    """Fence whoever may still publish for the shard, claim it, read the watermark and seek
    the submit partition. Raises ShardLost when another node claims the shard at the same time
    (its claimer fenced ours: the group gave it the shard), ShardUnavailable when the submit
    partition could not be sought (the claim released again), BusError when Kafka fails."""
    phases = Phases(clock)
    # Work of an earlier actor of this shard on this node must be over before we read.
    await transactions.settle(shard)
    phases.done("settle")
    me = transactions.transactional_id
    claimer = bus.claimer(claimer_transactional_id(settings.namespace, shard), group_id)
    kept = False
    try:
        # The first read only names whom to fence; every decision rests on the settled read,
        # which follows the claimer's start. So both may run at once.
        started, value = await asyncio.gather(
            phases.timed("claimer init", claimer.start()),
            phases.timed("state read", _read(bus, settings, shard, settled=False)),
            return_exceptions=True)
        for outcome in (started, value):
            if isinstance(outcome, BaseException):
                raise outcome
        assert not isinstance(value, BaseException)
        phases.done("claimer init + state read")
        fenced: set[str] = set()
        for _ in range(MAX_FENCE_ROUNDS):
            owner = _publisher(value, shard, settings)
            # Never before the claimer has started: an owner fenced sooner could initialise
            # again and commit a claim of its own in between, unfenced by us and unaborted by
            # our claimer's start. Fenced after it, the owner can only claim again by starting
            # the shard's claimer, which fences ours: then our claim fails.
            if owner is not None and owner not in (me, claimer.transactional_id, *fenced):
                # Shards of one previous owner are taken over together: one fence serves them.
                await transactions.once(f"fence {owner}",
                                        functools.partial(fence, bus, owner, group_id, shard,
                                                         clock))
                fenced.add(owner)
                phases.done("fence")
            settled = await _read(bus, settings, shard, settled=True)
            phases.done("settled read")
            if _publisher(settled, shard, settings) == owner:
                value = settled
                break
            value = settled
        else:
            raise ChronowheelError(f"shard {shard}: its recorded owner kept changing over "
                                   f"{MAX_FENCE_ROUNDS} fencing rounds (last {owner})")
        watermark, ahead = _position(value, shard, settings, clock)
        # The submit offset that goes with the watermark is settled too: the transaction that
        # committed the record committed it, and no owner can commit another since (the last
        # one is fenced or released). So the shard's partition is sought while the claim
        # commits (records reach the shard only once its actor is ready, after the claim).
        claimed, sought = await asyncio.gather(
            phases.timed("claim", _claim(claimer, settings, shard, watermark, me, node_id,
                                         clock, ahead)),
            phases.timed("offset + seek", _seek(submit, shard)), return_exceptions=True)
        phases.done("claim and seek")
        if isinstance(claimed, BaseException):
            raise claimed
        if isinstance(sought, BaseException):
            # Claimed, nothing published: released again rather than left to be fenced.
            released = await release_half_way(
                shard=shard, claimer=claimer, transactions=transactions, bus=bus,
                settings=settings, clock=clock, node_id=node_id,
                why=f"its takeover's seek failed: {sought!r}")
            if released and isinstance(sought, PartitionUnavailable):
                # About this shard's partition alone: seen when a killed broker led it and
                # no other replica was in sync, so it had no leader until the broker was back.
                raise ShardUnavailable(f"shard {shard}: its submit partition could not be "
                                       f"sought ({sought})") from sought
            raise sought
        committed, expired = sought
        kept = True
    except Fenced as exc:
        raise ShardLost(f"shard {shard}: another node is claiming it ({exc})") from exc
    finally:
        if not kept:
            await stop_quietly(claimer)
            phases.done("claimer stop")
    log.info("shard %d: claimed by %s (previous owner %s%s) in %s", shard, me, owner,
             f", fenced {sorted(fenced)}" if fenced else "", phases,
             extra={"shard": shard, "node": node_id})
    return Resume(watermark, committed, claimer, ahead, expired)


async def _seek(submit: SubmitPositions, shard: int) -> tuple[int | None, int]:
    """Read the group's committed offset of the shard and seek its partition there: the
    offset, and how many commands retention deleted below the log start (`Resume`)."""
    committed = await submit.committed(shard)
    return committed, await submit.seek(shard, committed)


async def _claim(claimer: Claimer, settings: Settings, shard: int, watermark: int, me: str,
                 node_id: str, clock: Clock, ahead: Ahead | None = None) -> None:
    """Commit the claim: the state record with `watermark` (and `ahead`, unchanged) and owner
    `me`, alone in a transaction of the shard's claimer. Raises Fenced when another claimer
    started since."""
    await commit_alone(claimer, settings, StateRecord(
        shard=shard, watermark=watermark, owner=me, node=node_id, at=clock.now_ms(),
        claim=True, ahead=ahead))


async def commit_alone(claimer: Claimer, settings: Settings, record: StateRecord) -> None:
    """Commit `record` alone in a transaction of the shard's claimer (a claim, or a release
    of a shard left half way). Raises Fenced when another claimer started since."""
    txn = await claimer.begin()
    try:
        await txn.publish(settings.state_topic, record.shard, StateRecord.key(record.shard),
                          record.encode(), [])
        await txn.commit({})
    except BaseException:
        await txn.abort()
        raise


@dataclass(frozen=True)
class Warm:
    """What a shard released by this node left to prove that nobody took it since."""

    claimer: Claimer
    """Its claimer, started by this node's last takeover of the shard and kept since."""
    record: bytes
    """The release record this node committed last for the shard (owner null)."""
    watermark: int
    """That record's watermark: the warm wheel holds every due row above it up to its
    horizon."""
    submit_offset: int | None
    """The submit offset that release carried (or the one the shard was taken over at): the
    warm shard has applied every command below it and none at or above it."""


async def resume_warm(*, shard: int, warm: Warm, transactions: NodeTransactions,
                      bus: NodeBus, submit: SubmitPositions, settings: Settings, clock: Clock,
                      node_id: str) -> Resume | None:
    """Take the shard back without reloading it, if nothing happened to it since this node
    released it; None (nothing claimed: the caller takes it over in full) otherwise.

    1. The state record (read_committed, to the last stable offset) must be the very release
       this node committed (nobody claimed the shard since: a claim writes a record before
       anything is published);
    2. the group's committed submit offset must be the one that release carried (nobody
       applied a command of the shard since);
    3. the claim is committed with the claimer this node started at its last takeover and kept:
       the commit fails (Fenced) if any node initialised `<ns>-shard-<k>` since, which every
       claim does first, so its success also proves that no claim is under way that 1. could
       not see yet (a paused claimer that read the release and has not committed).
    After 3 the shard is claimed exactly as by `take_over` (any later owner fences this node),
    and its wheel holds what a reload from the watermark would put there."""
    phases = Phases(clock)
    await transactions.settle(shard)
    phases.done("settle")
    me = transactions.transactional_id
    # Read to the last stable offset (read_committed), not settled: a transaction still open
    # on the state partition can only be a claim under way (this node's own parts are settled
    # above; another owner would have committed a claim first, which the read would show), and
    # a claim under way began by initialising the shard's claimer, so step 3 fails.
    value, committed = await asyncio.gather(_read(bus, settings, shard, settled=False),
                                            submit.committed(shard))
    phases.done("state read + offset")
    why = None
    if value != warm.record:
        why = "its state record changed since this node released it"
    elif committed != warm.submit_offset:
        why = (f"its committed submit offset is {committed}, the warm shard stopped at "
               f"{warm.submit_offset}")
    else:
        try:
            await _claim(warm.claimer, settings, shard, warm.watermark, me, node_id, clock)
        except Fenced:
            why = "another node began claiming it since this node released it"
        except BusError as exc:
            why = f"the claim failed: {exc}"
        phases.done("claim")
    if why is not None:
        log.info("shard %d: not resumed warm (%s): taking it over in full", shard, why,
                 extra={"shard": shard, "node": node_id})
        return None
    try:
        expired = await submit.seek(shard, committed)
    except PartitionUnavailable as exc:  # as in `take_over`: released, and given up
        if await release_half_way(shard=shard, claimer=warm.claimer, transactions=transactions,
                                  bus=bus, settings=settings, clock=clock, node_id=node_id,
                                  why=f"its warm resumption's seek failed: {exc!r}"):
            raise ShardUnavailable(f"shard {shard}: its submit partition could not be sought "
                                   f"({exc})") from exc
        raise
    phases.done("seek")
    log.info("shard %d: resumed warm by %s (watermark %d, submit offset %s, no reload) in %s",
             shard, me, warm.watermark, committed, phases,
             extra={"shard": shard, "node": node_id})
    return Resume(warm.watermark, committed, warm.claimer, submit_expired=expired)


async def release_half_way(*, shard: int, claimer: Claimer, transactions: NodeTransactions,
                           bus: NodeBus, settings: Settings, clock: Clock, node_id: str,
                           why: str) -> bool:
    """Release a shard whose actor ended half way (a failure after its claim, a stop past
    `stop_deadline_ms`): its last committed record still names this node, so its next owner
    would fence this node's producer, which aborts what the node does for all its other
    shards and makes it take them all over again.

    Once nothing of the shard is queued or in a transaction of this node (`settle`, within
    `RELEASE_SETTLE_S`), the shard's last committed record (a settled read) is the position
    of everything this node published for it, with the submit offset committed beside it:
    that record with no owner is what a final commit would have released. It is committed
    with the shard's claimer, as a claim is: the commit fails if another node has begun
    claiming the shard since (it initialised the claimer first), so a release never lands
    after someone else's claim. True when released; False when there was nothing to release
    (the record names someone else, or nobody) or it could not be done, and then the next
    owner fences this node as before."""
    me = transactions.transactional_id
    try:
        await within(transactions.settle(shard), RELEASE_SETTLE_S)
        value = await within(_read(bus, settings, shard, settled=True), RELEASE_READ_S)
        if value is None or _publisher(value, shard, settings) != me:
            return False
        record = dataclasses.replace(_parse(value, shard, settings), owner=None, claim=False,
                                     without_owner=False, node=node_id, at=clock.now_ms())
        await commit_alone(claimer, settings, record)
    except (TimeoutError, Fenced, ChronowheelError) as exc:
        log.warning("shard %d: its actor ended half way (%s) and the shard could not be "
                    "released (%s): its next owner fences this node", shard, why, exc,
                    extra={"shard": shard, "node": node_id})
        return False
    log.warning("shard %d: its actor ended half way (%s); released at watermark %d, so that "
                "its next owner fences nobody", shard, why, record.watermark,
                extra={"shard": shard, "node": node_id})
    return True


_STARTING_FENCERS: set[asyncio.Task[None]] = set()
"""Fencers whose fence ended before their start did (another fencer initialised first): each
stops its producer once its start ends. They are never cancelled: a librdkafka start abandoned
half way would leave its client to be closed by whichever thread collects it."""


def _forget_fencer(task: asyncio.Task[None]) -> None:
    _STARTING_FENCERS.discard(task)
    if not task.cancelled():
        task.exception()  # a loser's failure is not news: the fence has ended either way


async def _start_and_stop(fencer: Claimer) -> None:
    try:
        await fencer.start()
    finally:
        await stop_quietly(fencer)


async def fence(bus: NodeBus, transactional_id: str, group_id: str, shard: int,
                clock: Clock) -> None:
    """Bump the epoch of `transactional_id`: its open transaction is aborted and it can
    commit nothing more until it initialises again (which a node does only to claim anew)."""
    log.warning("shard %d: fencing its recorded owner %s", shard, transactional_id,
                extra={"shard": shard})
    for attempt in range(1, FENCE_ATTEMPTS + 1):
        winner = await _fence_attempt(bus, transactional_id, group_id, clock)
        if winner is not None:
            log.info("shard %d: fenced %s (by fencer %d of this attempt)", shard,
                     transactional_id, winner, extra={"shard": shard})
            return
        log.warning("shard %d: fencing %s did not finish in %d s (attempt %d of %d)",
                    shard, transactional_id, FENCE_TIMEOUT_S, attempt, FENCE_ATTEMPTS,
                    extra={"shard": shard})
    raise BusError(f"shard {shard}: could not fence {transactional_id} in {FENCE_ATTEMPTS} "
                   f"attempts of {FENCE_TIMEOUT_S} s")


async def _fence_attempt(bus: NodeBus, transactional_id: str, group_id: str,
                         clock: Clock) -> int | None:
    """Start a fencer, and another every FENCE_STAGGER_MS while none has initialised (at most
    FENCERS_AT_ONCE), until one has: returns its number (1 = the first), or None when none
    had after FENCE_TIMEOUT_S. A fencer that fails raises its error here."""
    deadline = clock.now_ms() + FENCE_TIMEOUT_S * 1000
    ended = asyncio.Event()
    fencers: list[asyncio.Task[None]] = []
    while clock.now_ms() < deadline:
        if len(fencers) < FENCERS_AT_ONCE:
            task = asyncio.create_task(_start_and_stop(bus.claimer(transactional_id, group_id)),
                                       name=f"fence {transactional_id}")
            _STARTING_FENCERS.add(task)
            task.add_done_callback(_forget_fencer)
            task.add_done_callback(lambda _task: ended.set())
            fencers.append(task)
            wake = min(deadline, clock.now_ms() + FENCE_STAGGER_MS)
        else:
            wake = deadline
        await sleep_until_or_event(clock, wake, ended)
        done = [(number, task) for number, task in enumerate(fencers, 1) if task.done()]
        for number, task in done:
            if not task.cancelled() and task.exception() is None:
                return number
        if done:
            done[0][1].result()  # every fencer that ended failed: the first one's error
    return None


async def _read(bus: NodeBus, settings: Settings, shard: int, *, settled: bool) -> bytes | None:
    return await bus.read_last(settings.state_topic, shard, StateRecord.key(shard),
                               SETTLED_READ_TIMEOUT_MS if settled else STATE_READ_TIMEOUT_MS,
                               settled=settled)


def _parse(value: bytes, shard: int, settings: Settings) -> StateRecord:
    try:
        return StateRecord.parse(value, shard=shard)
    except StateRecordError as exc:
        raise ChronowheelError(f"shard {shard}: unreadable record in "
                               f"{settings.state_topic}: {value[:200]!r}") from exc


def _publisher(value: bytes | None, shard: int, settings: Settings) -> str | None:
    """Whom the shard's last committed record says may still publish for it."""
    return None if value is None else _parse(value, shard, settings).publisher(
        settings.namespace)


def _position(value: bytes | None, shard: int, settings: Settings,
              clock: Clock) -> tuple[int, Ahead | None]:
    """Where the shard resumes: its record's watermark and `ahead` ranges."""
    if value is not None:
        record = _parse(value, shard, settings)
        return record.watermark, record.ahead
    # Never initialised, or the state topic lost it: reload a fixed period back.
    lookback = settings.missing_watermark_lookback_ms
    found = clock.now_ms() - lookback
    log.warning("shard %d: no watermark in %s; loading from %d (%d s back)", shard,
                settings.state_topic, found, lookback // 1000)
    return found, None
