"""The node: joins the `<ns>.submit` consumer group and runs a shard actor per assigned partition.

Shard ownership is the group assignment: no membership protocol of our own. Side tasks (the
ingest pump, the clock-skew monitor, every shard actor) are supervised (`chronowheel.supervise`):
one that crashes stops the node loudly, except a fenced shard, which is simply given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from chronowheel.admin import recorded_shard_count
from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.bus.ports import NodeBus, SubmitGroup
from chronowheel.core.clock import Clock, SystemClock, anchor, stepped_ms
from chronowheel.core.model import ValidationPolicy
from chronowheel.errors import ChronowheelError, ConfigError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.shard import ShardActor
from chronowheel.node.transactions import (
    NodeTransactions,
    ShardLost,
    node_transactional_id,
)
from chronowheel.observe.http import HttpEndpoint
from chronowheel.settings import Settings
from chronowheel.store.base import JobStore
from chronowheel.store.cassandra import CassandraStore
from chronowheel.supervise import Supervisor
from chronowheel.timeouts import wait_event

log = logging.getLogger(__name__)

# The default of `stop_deadline_ms`, in seconds (what a node started without flags allows).
STOP_DEADLINE_S = Settings.stop_deadline_ms / 1000
# Fetches of the ingest pump wait at most this long for records.
PUMP_POLL_MS = 200
# Attempts to ask the group coordinator whether we are still a member, after a fence.
MEMBERSHIP_CHECKS = 5
# The event loop watch sleeps this long and measures how much later it wakes.
LOOP_WATCH_MS = 100


@dataclass
class _Owned:
    actor: ShardActor
    task: asyncio.Task[None]


@dataclass
class NodeStatus:
    shards: list[int] = field(default_factory=list)
    skew_ms: int | None = None
    blocked: bool = False


class Node:
    def __init__(self, settings: Settings, *, clock: Clock | None = None,
                 store: JobStore | None = None, node_id: str | None = None,
                 bus: NodeBus | None = None, shards: int | None = None) -> None:
        """Without `store` / `bus` the node opens Cassandra / Kafka itself; without `shards`
        it reads the namespace's shard count from Cassandra."""
        self.settings = settings
        self.clock = clock or SystemClock()
        self._store = store
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.metrics = NodeMetrics()
        self.policy = ValidationPolicy.from_settings(settings)
        self.group_id = f"{settings.namespace}-nodes"
        self.owned: dict[int, _Owned] = {}
        self.skew_ms: int | None = None
        # Blocked until the first skew check passes: never early includes the first second.
        self.blocked = True
        # Wall and monotonic time at the last skew check: a step of the clock since then is
        # seen at once (`_dispatch_blocked`), not only at the next check.
        self._clock_anchor = anchor(self.clock)
        self._skew_recheck = asyncio.Event()
        self.shards = shards or 0
        self.http: HttpEndpoint | None = None
        self._bus = bus
        self._group: SubmitGroup | None = None
        self.supervisor = Supervisor("node")
        self._side_tasks: list[asyncio.Task[Any]] = []
        self._cassandra: CassandraStore | None = None
        self.transactions: NodeTransactions | None = None
        self._recovering: asyncio.Task[None] | None = None

    # --- public ---------------------------------------------------------------------------
    @property
    def store(self) -> JobStore:
        assert self._store is not None
        return self._store

    @property
    def failure(self) -> BaseException | None:
        """The first failure of a supervised task; None while all is well."""
        return self.supervisor.failure

    _failure = failure  # the name chronowheel.testing and the demo read

    def request_stop(self) -> None:
        self.supervisor.request_stop()

    async def run(self) -> None:
        """Run until stopped (request_stop / SIGTERM); raise if a supervised task failed."""
        await self.supervisor.run(self.start, self.shutdown, error=ChronowheelError)

    async def start(self) -> None:
        s = self.settings
        if not self.shards:
            self.shards = await recorded_shard_count(s)
        self.metrics.shards.set(self.shards)
        if self._bus is None:
            self._bus = KafkaNodeBus(s)
        if self._store is None:
            self._cassandra = await asyncio.to_thread(CassandraStore.open, s)
            self._store = self._cassandra
        self.metrics.dispatch_blocked.set(1)
        self.http = HttpEndpoint(self.metrics.registry, self.health, s.http_port, s.http_host,
                                 token=s.http_token)
        await self.http.start()
        # One transactional producer for every shard of this process; started (fencing an
        # earlier process with the same node id) before any shard can be assigned.
        bus = self._bus
        txn_id = node_transactional_id(s.namespace, self.node_id)
        self.transactions = NodeTransactions(
            producer=lambda: bus.producer(txn_id, self.group_id), clock=self.clock,
            metrics=self.metrics, on_fenced=self._on_fenced, max_messages=s.max_batch)
        await self.transactions.start()
        self._side_tasks = [self.supervisor.spawn(self.transactions.run(), "node-transactions")]
        group = self._bus.submit_group(
            group_id=self.group_id, client_id=self.node_id,
            session_timeout_ms=s.node_session_timeout_ms,
            on_assigned=self._on_assigned, on_revoked=self._on_revoked)
        self._group = group  # before start(): the first assignment can arrive during it
        await group.start()
        parts = group.partition_count()
        if parts is not None and parts != self.shards:
            await group.stop()
            self._group = None
            raise ConfigError(f"{s.submit_topic} has {parts} partitions but the namespace "
                              f"has {self.shards} shards")
        self._side_tasks += [self.supervisor.spawn(self._pump(), "ingest-pump"),
                             self.supervisor.spawn(self._skew_monitor(), "clock-skew-monitor"),
                             self.supervisor.spawn(self._loop_watch(), "event-loop-watch")]
        log.info("node %s started: namespace %s, %d shards, group %s", self.node_id,
                 s.namespace, self.shards, self.group_id)

    async def shutdown(self) -> None:
        """Stop taking work, finish open transactions, leave the group."""
        self.supervisor.begin_shutdown()  # from here on, tasks that end are no failures
        if self._recovering is not None:
            await self.supervisor.cancel_and_wait([self._recovering])
        # The transaction loop goes last: the shards' final commits (releases) need it.
        loop_tasks = self._side_tasks[:1]
        await self.supervisor.cancel_and_wait(self._side_tasks[1:])
        await self._stop_shards(list(self.owned))
        await self.supervisor.cancel_and_wait(loop_tasks)
        self._side_tasks.clear()
        if self.transactions is not None:
            await self.transactions.stop()
        if self._group is not None:
            with contextlib.suppress(Exception):
                await self._group.stop()  # leaves the group: others take over at once
            self._group = None
        if self._bus is not None:
            with contextlib.suppress(Exception):
                await self._bus.close()
        if self.http is not None:
            await self.http.stop()
        if self._cassandra is not None:
            await asyncio.to_thread(self._cassandra.close)
            self._cassandra = None
        await self.supervisor.cancel_all()
        log.info("node %s stopped", self.node_id)

    def health(self) -> tuple[bool, dict[str, object]]:
        lag = {str(k): o.actor.dispatch_lag_ms() for k, o in self.owned.items()}
        ok = not self.blocked and self.failure is None and all(v < 5_000 for v in lag.values())
        return ok, {"node": self.node_id, "shards": sorted(self.owned), "dispatch_lag_ms": lag,
                    "clock_skew_ms": self.skew_ms, "dispatch_blocked": self.blocked}

    # --- supervision ----------------------------------------------------------------------
    def _shard_ended(self, task: asyncio.Task[Any], exc: BaseException | None) -> bool:
        """Whether a shard actor's end is no failure: it was stopped on purpose (revoked or
        shut down: `_stop_shards` delists it first) or lost to a newer owner (fenced)."""
        shard = next((k for k, o in self.owned.items() if o.task is task), None)
        if shard is None:
            return True
        if isinstance(exc, ShardLost):
            log.warning("%s", exc)
            # Not ours any more (the group will revoke it too), or the node's producer was
            # fenced: then `_recover` takes it again if the group still gives it to us.
            del self.owned[shard]
            self.metrics.owned_shards.set(len(self.owned))
            return True
        return False

    # --- fencing of the node's producer ---------------------------------------------------
    def _on_fenced(self, session: int) -> None:
        """The coordinator found our producer fenced: every actor of an older session can no
        longer commit. Take the shards again (or not) in one recovery at a time."""
        if self._recovering is None or self._recovering.done():
            self._recovering = self.supervisor.job(self._recover(), "fence-recovery")

    async def _recover(self) -> None:
        """Stop every shard claimed before the fence; then, if this process is still a
        current member of the group (a paused process whose session expired is not, and must
        not take anything again by itself), take over again the shards the group gives it.
        Shards that moved are dropped; the group's callbacks bring new ones as usual."""
        assert self.transactions is not None and self._group is not None
        while True:
            session = self.transactions.session
            stale = [k for k, o in self.owned.items()
                     if o.actor.session is None or o.actor.session < session]
            log.warning("node %s: producer fenced; stopping shards %s to take them over again",
                        self.node_id, sorted(stale))
            await self._abort_shards(stale)
            member = await self._check_membership()
            if self.transactions.session != session:
                continue  # fenced again meanwhile: stop what was claimed since, check again
            if not member:
                log.warning("node %s: no longer a current member of group %s: taking "
                            "nothing again until the group assigns shards", self.node_id,
                            self.group_id)
                return
            again = sorted(self._group.assigned() - set(self.owned))
            log.warning("node %s: still a member of group %s; taking shards %s over again",
                        self.node_id, self.group_id, again)
            await self._start_shards(again)
            return

    async def _check_membership(self) -> bool:
        """Ask the group coordinator, retrying a few times: a node that cannot tell must not
        sit on shards it may still be assigned without serving them, so it fails loudly."""
        assert self._group is not None
        for attempt in range(1, MEMBERSHIP_CHECKS + 1):
            try:
                return await self._group.check_membership()
            except ChronowheelError as exc:
                log.warning("node %s: group membership check %d of %d failed: %s",
                            self.node_id, attempt, MEMBERSHIP_CHECKS, exc)
                await asyncio.sleep(attempt)
        raise ChronowheelError(f"node {self.node_id}: its producer was fenced and group "
                               f"{self.group_id} could not tell whether it is still a member "
                               f"({MEMBERSHIP_CHECKS} attempts)")

    async def _abort_shards(self, shards: list[int]) -> None:
        """Stop actors that cannot commit anything any more: no drain (it would only fail)."""
        owned = [self.owned.pop(k) for k in shards if k in self.owned]
        for o in owned:
            o.task.cancel()
        for o in owned:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await o.task
        self.metrics.owned_shards.set(len(self.owned))

    def _fail(self, what: str, exc: BaseException) -> None:
        self.supervisor.fail(what, exc)

    # --- shards ---------------------------------------------------------------------------
    async def _start_shards(self, partitions: list[int]) -> None:
        assert self._group is not None and self._bus is not None
        for k in partitions:
            if k in self.owned:
                continue
            assert self.transactions is not None
            actor = ShardActor(
                shard=k, shards=self.shards, settings=self.settings, store=self.store,
                bus=self._bus, transactions=self.transactions, submit=self._group,
                clock=self.clock, metrics=self.metrics,
                policy=self.policy, group_id=self.group_id, node_id=self.node_id,
                dispatch_blocked=self._dispatch_blocked,
                clock_state=lambda: (self.skew_ms, self.blocked))
            task = self.supervisor.spawn(actor.run(), f"shard-{k}", expected=self._shard_ended)
            self.owned[k] = _Owned(actor, task)
        self.metrics.owned_shards.set(len(self.owned))
        log.info("node %s owns shards %s", self.node_id, sorted(self.owned))

    async def _stop_shards(self, partitions: list[int]) -> None:
        # Delisted first: their ends are then expected (`_shard_ended`), not failures.
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
        self.metrics.owned_shards.set(len(self.owned))

    async def _pump(self) -> None:
        """Route fetched submit records to their shard's actor."""
        group = self._group
        assert group is not None
        s = self.settings
        paused: set[int] = set()
        while True:
            batches = await group.fetch(PUMP_POLL_MS, s.pump_fetch_records)
            for shard, records in batches.items():
                owned = self.owned.get(shard)
                if owned is not None and owned.actor.ready:
                    owned.actor.enqueue(records)
                # Records of a shard still taking over are dropped: it seeks to its committed
                # offset when ready, so they are read again.
            for shard, o in self.owned.items():  # backpressure per shard
                queued = o.actor.queued
                if queued > s.pump_pause_rows and shard not in paused:
                    group.pause(shard)
                    paused.add(shard)
                elif queued < s.pump_resume_rows and shard in paused:
                    group.resume(shard)
                    paused.discard(shard)
            paused &= group.assigned()

    async def _measure_skew(self) -> tuple[int, int]:
        """(skew, uncertainty) in ms from the tightest of a few round trips: the server's
        clock was read somewhere between send and answer, so the error is at most half the
        round trip."""
        best: tuple[int, int] | None = None
        for _ in range(3):
            server, sent, received = await self.store.clock_sample()
            # Local times come from the system clock; express them on the node's clock.
            offset = self.clock.now_ms() - time.time_ns() // 1_000_000
            half = (received - sent + 1) // 2
            skew = (sent + received) // 2 + offset - server
            if best is None or half < best[1]:
                best = (skew, half)
        assert best is not None
        return best

    def _dispatch_blocked(self) -> bool:
        """Whether dispatch must wait: the last skew check failed, or the clock was stepped
        since (by more than max_clock_skew_ms; a clock stepped forward would fire jobs early
        until the next check). A step stops dispatch until a skew check passes again."""
        if self.blocked:
            return True
        step = stepped_ms(self.clock, self._clock_anchor)
        if abs(step) <= self.settings.max_clock_skew_ms:
            return False
        log.error("node %s: the clock stepped %+d ms since the last skew check (limit %d ms): "
                  "dispatch STOPPED until a skew check passes", self.node_id, step,
                  self.settings.max_clock_skew_ms)
        self.blocked = True
        self.metrics.dispatch_blocked.set(1)
        self._skew_recheck.set()
        return True

    async def _skew_monitor(self) -> None:
        limit = self.settings.max_clock_skew_ms
        while True:
            self._skew_recheck.clear()
            before = anchor(self.clock)
            try:
                self.skew_ms, uncertainty = await self._measure_skew()
            except (ChronowheelError, TimeoutError) as exc:
                log.warning("clock skew check failed (dispatch stays %s): %s",
                            "stopped" if self.blocked else "on", exc)
            else:
                self.metrics.clock_skew.set(self.skew_ms / 1000)
                # Stop only on a skew that is certain; an uncertain reading of a first check
                # keeps dispatch stopped until a tighter one comes.
                certain_over = abs(self.skew_ms) - uncertainty > limit
                certain_under = abs(self.skew_ms) + uncertainty <= limit
                blocked = certain_over or (self.blocked and not certain_under)
                if blocked != self.blocked:
                    if blocked:
                        log.error("clock skew %d ms exceeds max_clock_skew %d ms: dispatch "
                                  "STOPPED until the clocks agree", self.skew_ms, limit)
                    else:
                        log.info("clock skew %d ms is within max_clock_skew %d ms: "
                                 "dispatching", self.skew_ms, limit)
                self.blocked = blocked
                self._clock_anchor = before
                self.metrics.dispatch_blocked.set(1 if blocked else 0)
                if not blocked:
                    for o in self.owned.values():
                        o.actor.wake.set()
            await wait_event(self._skew_recheck, self.settings.skew_check_interval_ms / 1000)

    async def _loop_watch(self) -> None:
        """Measure how long the event loop stays blocked. The group's heartbeats do not depend
        on it (the group member runs on a thread of its own), but a loop that answers nothing
        for node_loop_stall_limit_ms makes the group drop this node (its shards move and it
        must take what it gets again): report stalls well before that. Measured on the
        monotonic clock: this is about elapsed time, not about the time of day."""
        limit_ms = self.settings.node_loop_stall_limit_ms
        warn_ms = limit_ms / 3
        worst_ms = 0.0
        while True:
            started = time.monotonic()
            await asyncio.sleep(LOOP_WATCH_MS / 1000)
            stall_ms = (time.monotonic() - started) * 1000 - LOOP_WATCH_MS
            if stall_ms > worst_ms:
                worst_ms = stall_ms
                self.metrics.loop_stall_max.set(worst_ms / 1000)
            if stall_ms > warn_ms:
                log.warning("node %s: the event loop was blocked for %.0f ms "
                            "(node_loop_stall_limit_ms is %d: a stall that long loses the "
                            "node its shards)", self.node_id, stall_ms, limit_ms)

    # --- group assignment -----------------------------------------------------------------
    # The Kafka client logs and swallows a rebalance callback's exception; a node that silently
    # owns nothing would be worse than one that stops, so failures here stop the node loudly.
    async def _on_revoked(self, shards: list[int]) -> None:
        log.info("node %s: group revoked shards %s", self.node_id, sorted(shards))
        try:
            await self._stop_shards(shards)
        except Exception as exc:
            self._fail("revoking shards", exc)

    async def _on_assigned(self, shards: list[int]) -> None:
        log.info("node %s: group assigned shards %s", self.node_id, sorted(shards))
        try:
            await self._start_shards(shards)
        except Exception as exc:
            self._fail("taking over shards", exc)
