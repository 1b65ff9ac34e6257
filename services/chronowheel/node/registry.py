"""The node's shard registry: which shards this node owns, and their actors.

Shard ownership is the group assignment (no membership protocol of our own): the group's
callbacks start an actor per assigned shard (`node/shard.py`, which claims it: see
`node/takeover.py`) and stop those revoked. When the node's producer is fenced, every actor of
an older session is stopped and, if the node is still a member of the group, its shards are
taken over again (`recover`).

The callbacks are incremental: with the consumer group protocol (the default) a node is
revoked and assigned only the shards that change owner, and the others go on untouched.

Warm shards: the classic protocol (eager) revokes every shard of every node at each rebalance.
A shard whose actor ended cleanly on its revocation (released, nothing in flight) is kept warm,
its actor and wheel in memory: if the next assignment gives it back to this node, the same
actor runs again and resumes without reloading when `resume_warm` proves nobody took the shard
meanwhile (`node/takeover.py`). Warm shards the assignment does not give back have moved and
are dropped, as are all of them when `warm_grace_ms` passes on the node's clock without an
assignment (0: nothing is kept warm).

Lost shards: a takeover whose claim another claimer fenced gives the shard up; if the group
still assigns it to this node after `lost_shard_retry_ms` and the node is still a current
member, the node takes it over again (`node/lost_shards.py` says why and how often).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chronowheel.bus.ports import NodeBus, SubmitGroup
from chronowheel.core.clock import Clock, sleep_until_or_event
from chronowheel.core.model import ValidationPolicy
from chronowheel.errors import ChronowheelError
from chronowheel.node.lost_shards import LostShards
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.shard import ShardActor
from chronowheel.node.state import Arrivals
from chronowheel.node.transactions import (
    NodeFenced,
    NodeTransactions,
    ShardLost,
    ShardUnavailable,
)
from chronowheel.node.write_permits import NodeWritePermits
from chronowheel.settings import Settings
from chronowheel.store.base import JobStore
from chronowheel.supervise import Supervisor

log = logging.getLogger(__name__)

# Attempts to ask the group coordinator whether we are still a member, after a fence.
MEMBERSHIP_CHECKS = 5


@dataclass
class Owned:
    actor: ShardActor
    task: asyncio.Task[None]


class ShardRegistry:
    def __init__(self, *, settings: Settings, clock: Clock, metrics: NodeMetrics,
                 policy: ValidationPolicy, group_id: str, node_id: str, supervisor: Supervisor,
                 dispatch_blocked: Callable[[], bool],
                 clock_state: Callable[[], tuple[int | None, bool]]) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.policy = policy
        self.group_id = group_id
        self.node_id = node_id
        self.supervisor = supervisor
        self.dispatch_blocked = dispatch_blocked
        self.clock_state = clock_state
        wide = settings.ingest_writes_in_flight
        narrow = settings.ingest_writes_in_flight_due_soon
        self.node_writes = (NodeWritePermits(wide, narrow if 0 < narrow < wide else wide,
                                             self.firing_soon, clock.now_ms)
                            if wide > 0 else None)
        """Every shard's in-order ingest writes share these permits (`node/ingest.py`), fewer
        while firing is near (`node/write_permits.py`)."""
        permits = self.node_writes
        if permits is not None:  # read at scrape time: nothing on the writes' path
            metrics.ingest_writes_in_flight.set_function(lambda: permits.in_flight)
            metrics.ingest_writes_bound.set_function(lambda: permits.current)
        self.arrivals = Arrivals()
        """The shards being taken over: their loaders read the rest of their look-ahead only
        once none is (`node/loader.py`, `first_load`)."""
        self.owned: dict[int, Owned] = {}
        self.warm: dict[int, ShardActor] = {}
        """Shards revoked from this node whose actors ended cleanly, kept for the next
        assignment (see the module's docstring)."""
        self._warm_expiry: asyncio.Task[None] | None = None
        # Set by the node once it has them (`attach`), before the group can assign anything.
        self.shards = 0
        self.store: JobStore | None = None
        self.bus: NodeBus | None = None
        self.transactions: NodeTransactions | None = None
        self.group: SubmitGroup | None = None
        self._recovering: asyncio.Task[None] | None = None
        self.lost = LostShards(settings.lost_shard_retry_ms)
        """Shards given up as claimed elsewhere, to be looked at again (`_retake_lost`)."""
        self._retaking: asyncio.Task[None] | None = None
        self._lost_changed = asyncio.Event()

    def attach(self, *, shards: int, store: JobStore, bus: NodeBus,
               transactions: NodeTransactions, group: SubmitGroup | None) -> None:
        self.shards = shards
        self.store = store
        self.bus = bus
        self.transactions = transactions
        self.group = group

    def wake_all(self) -> None:
        """Wake every actor's dispatch (the clock guard let dispatch run again)."""
        for o in self.owned.values():
            o.actor.wake.set()

    async def stop_recovery(self) -> None:
        """On the node's shutdown: end a fence recovery under way (it would take shards), and
        drop the warm shards (nothing will be resumed; the shards stopped from here on are not
        kept warm: the supervisor is stopping)."""
        ending = [t for t in (self._recovering, self._retaking) if t is not None]
        if ending:
            await self.supervisor.cancel_and_wait(ending)
        await self.drop_warm()

    # --- supervision ----------------------------------------------------------------------
    def firing_soon(self) -> bool:
        """Whether a shard of this node has an occurrence due within `ingest_due_soon_ms`
        (the wheel's bound: never later than the earliest due), one queued to catch up, or
        fired one that recently."""
        now = self.clock.now_ms()
        near = self.settings.ingest_due_soon_ms
        for owned in self.owned.values():
            state = owned.actor.state
            if state.late or now - state.last_fired_ms < near:
                return True
            due = state.wheel.next_deadline()
            if due is not None and due <= now + near:
                return True
        return False

    def shard_ended(self, task: asyncio.Task[Any], exc: BaseException | None) -> bool:
        """Whether a shard actor's end is no failure: it was stopped on purpose (revoked or
        shut down: `stop_shards` delists it first), lost to a newer owner (fenced), or its
        takeover could not seek its partition and released it (`ShardUnavailable`)."""
        shard = next((k for k, o in self.owned.items() if o.task is task), None)
        if shard is None:
            return True
        if isinstance(exc, ShardLost):
            log.warning("%s", exc)
            # Not ours any more (the group will revoke it too), or the node's producer was
            # fenced: then `recover` takes it again if the group still gives it to us.
            del self.owned[shard]
            self.metrics.owned_shards.set(len(self.owned))
            if not isinstance(exc, NodeFenced):  # a fence's recovery takes it again (or not)
                self._note_lost(shard)
            return True
        if isinstance(exc, ShardUnavailable) and self.settings.lost_shard_retry_ms > 0:
            # (With 0 nothing would take it again before a rebalance, which a consumer-protocol
            # group may never make for this partition: the node stops, and the shard moves.)
            log.warning("%s", exc)
            self.metrics.shards_unavailable.inc()
            del self.owned[shard]
            self.metrics.owned_shards.set(len(self.owned))
            self._look_again([shard], "not taken over (its submit partition could not be "
                                      "sought)")
            return True
        return False

    # --- shards given up as claimed elsewhere ---------------------------------------------
    def _note_lost(self, shard: int) -> None:
        self.metrics.claims_lost.inc()
        self._look_again([shard], "given up as claimed elsewhere")

    def _look_again(self, shards: list[int], why: str) -> None:
        """Look at `shards` again later (`_retake_lost`), each after its wait."""
        if not shards or self.supervisor.stopping:
            return
        now = self.clock.now_ms()
        waits = {k: self.lost.lost(k, now) for k in sorted(shards)}
        if any(wait is None for wait in waits.values()):
            return  # lost_shard_retry_ms 0: left to the next rebalance
        log.warning("node %s: shards %s %s; taken over again if the group still assigns them "
                    "to this node, in %s ms", self.node_id, sorted(waits), why,
                    "/".join(str(w) for w in waits.values()))
        self._lost_changed.set()
        if self._retaking is None or self._retaking.done():
            self._retaking = self.supervisor.job(self._retake_lost(), "lost-shards")

    async def _retake_lost(self) -> None:
        """Take over again the lost shards the group still gives this node, each at its time,
        once the coordinator confirms the node is a current member (else look again later);
        forget those the group no longer gives it."""
        assert self.group is not None
        while (due_ms := self.lost.next_due_ms()) is not None:
            self._lost_changed.clear()
            if self.clock.now_ms() < due_ms:
                # Woken early by a new loss: its time may come first.
                await sleep_until_or_event(self.clock, due_ms, self._lost_changed)
                continue
            due = self.lost.take_due(self.clock.now_ms())
            unserved = [k for k in due if k in self.group.assigned() and k not in self.owned]
            if not unserved or self._fence_recovery_running():
                continue  # a fence's recovery takes every assigned shard not served
            try:
                member = await self._check_membership(f"looking again at shards {unserved}")
            except ChronowheelError as exc:
                # This node's other shards go on: the coordinator is asked again later.
                self._look_again(unserved, f"not taken again: {exc}")
                continue
            if self.supervisor.stopping:
                return
            if self._fence_recovery_running():
                continue
            if not member:
                # Perhaps for a moment (a new assignment's epoch not yet seen): looked at
                # again, until the group revokes or assigns them (it forgets them then).
                self._look_again(unserved, f"not taken again: group {self.group_id} did not "
                                           f"confirm this node as a current member")
                continue
            again = [k for k in unserved if k in self.group.assigned() and k not in self.owned]
            log.warning("node %s: still a member of group %s, which still assigns it shards "
                        "%s: taking them over again", self.node_id, self.group_id, again)
            await self.start_shards(again)

    def _fence_recovery_running(self) -> bool:
        return self._recovering is not None and not self._recovering.done()

    # --- fencing of the node's producer ---------------------------------------------------
    def on_fenced(self, session: int) -> None:
        """The coordinator found our producer fenced: every actor of an older session can no
        longer commit. Take the shards again (or not) in one recovery at a time."""
        if not self._fence_recovery_running():
            self._recovering = self.supervisor.job(self.recover(), "fence-recovery")

    async def recover(self) -> None:
        """Stop every shard claimed before the fence; then, if this process is still a
        current member of the group (a paused process whose session expired is not, and must
        not take anything again by itself), take over again the shards the group gives it.
        Shards that moved are dropped; the group's callbacks bring new ones as usual."""
        assert self.transactions is not None and self.group is not None
        while True:
            session = self.transactions.session
            stale = [k for k, o in self.owned.items()
                     if o.actor.session is None or o.actor.session < session]
            log.warning("node %s: producer fenced; stopping shards %s to take them over again",
                        self.node_id, sorted(stale))
            await self.abort_shards(stale)
            member = await self._check_membership("its producer was fenced")
            if self.transactions.session != session:
                continue  # fenced again meanwhile: stop what was claimed since, check again
            if not member:
                log.warning("node %s: no longer a current member of group %s: taking "
                            "nothing again until the group assigns shards", self.node_id,
                            self.group_id)
                # Unless the answer was a passing one: the shards the group still gives this
                # node are looked at again later (the group forgets them when it revokes them).
                self._look_again(sorted(self.group.assigned() - set(self.owned)),
                                 "not taken again after the fence")
                return
            again = sorted(self.group.assigned() - set(self.owned))
            log.warning("node %s: still a member of group %s; taking shards %s over again",
                        self.node_id, self.group_id, again)
            await self.start_shards(again)
            return

    async def _check_membership(self, why: str) -> bool:
        """Ask the group coordinator, retrying a few times: a node that cannot tell must not
        sit on shards it may still be assigned without serving them, so it fails loudly."""
        assert self.group is not None
        for attempt in range(1, MEMBERSHIP_CHECKS + 1):
            try:
                return await self.group.check_membership()
            except ChronowheelError as exc:
                log.warning("node %s: group membership check %d of %d failed: %s",
                            self.node_id, attempt, MEMBERSHIP_CHECKS, exc)
                if attempt < MEMBERSHIP_CHECKS:
                    await self.clock.sleep_until(self.clock.now_ms() + attempt * 1_000)
        raise ChronowheelError(f"node {self.node_id}: group {self.group_id} could not tell "
                               f"whether it is still a member ({MEMBERSHIP_CHECKS} attempts; "
                               f"asked because {why})")

    async def abort_shards(self, shards: list[int]) -> None:
        """Stop actors that cannot commit anything any more: no drain (it would only fail)."""
        owned = [self.owned.pop(k) for k in shards if k in self.owned]
        for o in owned:
            o.task.cancel()
        for o in owned:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await o.task
        self.metrics.owned_shards.set(len(self.owned))

    # --- shards ---------------------------------------------------------------------------
    async def start_shards(self, partitions: list[int]) -> None:
        assert self.group is not None and self.bus is not None and self.store is not None
        for k in partitions:
            if k in self.owned:
                continue
            assert self.transactions is not None
            warm = self.warm.pop(k, None)
            if warm is not None:
                if warm.rearm():
                    task = self.supervisor.spawn(warm.run(), f"shard-{k}",
                                                 expected=self.shard_ended)
                    self.owned[k] = Owned(warm, task)
                    continue
                await warm.close()
                if k in self.owned:
                    continue  # taken meanwhile (a recovery, the group's callback)
            actor = ShardActor(
                shard=k, shards=self.shards, settings=self.settings, store=self.store,
                bus=self.bus, transactions=self.transactions, submit=self.group,
                clock=self.clock, metrics=self.metrics,
                policy=self.policy, group_id=self.group_id, node_id=self.node_id,
                dispatch_blocked=self.dispatch_blocked, clock_state=self.clock_state,
                node_writes=self.node_writes, arrivals=self.arrivals)
            task = self.supervisor.spawn(actor.run(), f"shard-{k}", expected=self.shard_ended)
            self.owned[k] = Owned(actor, task)
        self.metrics.owned_shards.set(len(self.owned))
        log.info("node %s owns shards %s", self.node_id, sorted(self.owned))

    async def stop_shards(self, partitions: list[int], *, keep_warm: bool = False) -> None:
        """Stop the actors of `partitions` (each releases its shard); `keep_warm`: keep those
        that ended cleanly for the next assignment (a revocation), else close them."""
        # Delisted first: their ends are then expected (`shard_ended`), not failures.
        owned = [self.owned.pop(k) for k in partitions if k in self.owned]
        stops = [asyncio.ensure_future(o.actor.stop()) for o in owned]
        if stops:
            await asyncio.wait(stops, timeout=self.settings.stop_deadline_ms / 1000)
            for o in owned:
                if not o.task.done():
                    o.task.cancel()  # past the deadline: abort (its transaction aborts too)
            # Not bounded like the side loops (Supervisor.cancel_and_wait), on purpose: an actor
            # still running could still publish for its shard, and the group must not hand the
            # shard on (nor this node start a new actor for it) before the old one has ended.
            for o in owned:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await o.task
        keep_warm = keep_warm and self.settings.warm_grace_ms > 0
        for o in owned:
            if keep_warm and o.actor.clean and not self.supervisor.stopping:
                self.warm[o.actor.shard] = o.actor
            else:
                await o.actor.close()
        if self.warm and keep_warm:
            if self._warm_expiry is not None:
                self._warm_expiry.cancel()
            self._warm_expiry = asyncio.ensure_future(self._expire_warm())
        self.metrics.owned_shards.set(len(self.owned))

    async def drop_warm(self, shards: set[int] | None = None) -> None:
        """Forget warm shards (`None`: all): they moved, or the node stops."""
        for k in sorted(self.warm if shards is None else shards & set(self.warm)):
            actor = self.warm.pop(k, None)  # an assignment may have taken it meanwhile
            if actor is not None:
                await actor.close()
        if not self.warm and self._warm_expiry is not None:
            if self._warm_expiry is not asyncio.current_task():
                self._warm_expiry.cancel()
            self._warm_expiry = None

    async def _expire_warm(self) -> None:
        # On the node's clock, as its other timers: a rebalance that takes longer than the
        # grace reloads the shards it gives back, and a node left without an assignment (it
        # left its group) frees their memory.
        grace = self.settings.warm_grace_ms
        deadline = self.clock.now_ms() + grace
        while self.clock.now_ms() < deadline:
            await self.clock.sleep_until(deadline)  # may return early: checked again
        if self.warm:
            log.info("node %s: no assignment within warm_grace_ms (%d ms): shards %s are no "
                     "longer kept warm", self.node_id, grace, sorted(self.warm))
        await self.drop_warm()

    # --- group assignment -----------------------------------------------------------------
    # The Kafka client logs and swallows a rebalance callback's exception; a node that silently
    # owns nothing would be worse than one that stops, so failures here stop the node loudly.
    async def on_revoked(self, shards: list[int]) -> None:
        log.info("node %s: group revoked shards %s", self.node_id, sorted(shards))
        self.lost.forget(shards)
        began = self.clock.now_ms()
        try:
            await self.stop_shards(shards, keep_warm=True)
        except Exception as exc:
            self.supervisor.fail("revoking shards", exc)
            return
        # The group hands the shards on only after this: how long it took is part of their
        # pause (a slow rebalance shows here or in the next owner's `claimed ... in` line).
        log.info("node %s: revoked shards %s stopped and released in %d ms", self.node_id,
                 sorted(shards), self.clock.now_ms() - began)

    async def on_assigned(self, shards: list[int]) -> None:
        log.info("node %s: group assigned shards %s", self.node_id, sorted(shards))
        self.lost.forget(shards)
        try:
            # Warm shards not given back have moved to another node: free their memory.
            await self.drop_warm(set(self.warm) - set(shards))
            await self.start_shards(shards)
        except Exception as exc:
            self.supervisor.fail("taking over shards", exc)
