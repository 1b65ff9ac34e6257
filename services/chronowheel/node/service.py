"""The node: joins the `<ns>.submit` consumer group and runs a shard actor per assigned partition.

Shard ownership is the group assignment: no membership protocol of our own. Side tasks (the
ingest pump, the clock-skew monitor, every shard actor) are supervised (`chronowheel.supervise`):
one that crashes stops the node loudly, except a fenced shard, which is simply given up.

This is the front that wires the parts together: the shard registry (`node/registry.py`: the
owned shards, the group's callbacks, recovery from a fence), the clock guard
(`node/clock_guard.py`: clock skew and stalls of the event loop), the ingest pump
(`node/pump.py`), the node's transactions (`node/transactions.py`) and its HTTP endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.bus.ports import NodeBus, SubmitGroup, TxnProducer
from chronowheel.core.clock import Clock, SystemClock
from chronowheel.core.model import ValidationPolicy
from chronowheel.errors import ChronowheelError, ConfigError
from chronowheel.history import RunRecorder, recorder_for
from chronowheel.node.clock_guard import ClockGuard
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pump import pump
from chronowheel.node.registry import Owned, ShardRegistry
from chronowheel.node.takeover import Phases
from chronowheel.node.transactions import NodeTransactions, node_transactional_id
from chronowheel.observe.http import HttpEndpoint
from chronowheel.settings import Settings
from chronowheel.store.base import JobStore, RunHistoryStore
from chronowheel.store.cassandra import CassandraStore, read_shard_count
from chronowheel.store.cassandra_history import CassandraRunHistory
from chronowheel.supervise import Supervisor
from chronowheel.timeouts import within

log = logging.getLogger(__name__)

# The default of `stop_deadline_ms`, in seconds (what a node started without flags allows).
STOP_DEADLINE_S = Settings.stop_deadline_ms / 1000
HISTORY_FLUSH_S = 5.0
"""At a graceful stop, how long the node writes the run history still queued, at most."""
TOPICS_AHEAD_TIMEOUT_S = 10
"""`_read_topics_ahead` gives up after this long (each read has its own bound too)."""


@dataclass
class NodeStatus:
    shards: list[int] = field(default_factory=list)
    skew_ms: int | None = None
    blocked: bool = False


class Node:
    def __init__(self, settings: Settings, *, clock: Clock | None = None,
                 store: JobStore | None = None, node_id: str | None = None,
                 bus: NodeBus | None = None, shards: int | None = None,
                 history: RunHistoryStore | None = None) -> None:
        """Without `store` / `bus` the node opens Cassandra / Kafka itself; without `shards`
        it reads the namespace's shard count from Cassandra. Runs are recorded in `history`,
        or with a Cassandra store it opened itself in Cassandra's (`run_history` on); given
        a `store` and no `history`, the node records no runs."""
        self.settings = settings
        self.clock = clock or SystemClock()
        self._store = store
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.metrics = NodeMetrics()
        self.policy = ValidationPolicy.from_settings(settings)
        self.group_id = f"{settings.namespace}-nodes"
        self.shards = shards or 0
        self.http: HttpEndpoint | None = None
        self._bus = bus
        self._group: SubmitGroup | None = None
        self.supervisor = Supervisor("node")
        self._side_tasks: list[asyncio.Task[Any]] = []
        self._cassandra: CassandraStore | None = None
        self._history_store = history
        self.history: RunRecorder | None = None
        """The run history writer (None: runs are not recorded)."""
        self._history_task: asyncio.Task[Any] | None = None
        self.transactions: NodeTransactions | None = None
        self.clock_guard = ClockGuard(settings=settings, clock=self.clock, metrics=self.metrics,
                                      node_id=self.node_id, store=lambda: self.store,
                                      on_clear=lambda: self.registry.wake_all())
        self.registry = ShardRegistry(
            settings=settings, clock=self.clock, metrics=self.metrics, policy=self.policy,
            group_id=self.group_id, node_id=self.node_id, supervisor=self.supervisor,
            dispatch_blocked=self.clock_guard.dispatch_blocked,
            clock_state=self.clock_guard.state)

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

    @property
    def owned(self) -> dict[int, Owned]:
        """The shards this node owns now, with their actors."""
        return self.registry.owned

    @property
    def blocked(self) -> bool:
        """Whether dispatch is stopped (clock skew, or a step of the clock)."""
        return self.clock_guard.blocked

    @property
    def skew_ms(self) -> int | None:
        """The last measured skew of this node's clock to Cassandra's."""
        return self.clock_guard.skew_ms

    def request_stop(self) -> None:
        self.supervisor.request_stop()

    async def run(self) -> None:
        """Run until stopped (request_stop / SIGTERM); raise if a supervised task failed."""
        await self.supervisor.run(self.start, self.shutdown, error=ChronowheelError)

    async def start(self) -> None:
        s = self.settings
        # Each step's time goes into the "started" line: a restarted node's shards wait for
        # all of it (with static membership nobody takes them over meanwhile).
        steps = Phases(self.clock)
        # Cassandra (a connection, the shard count, the statements: 0.3-1.8 s on three busy
        # hosts) opens in a thread beside the Kafka steps below.
        opening: asyncio.Future[tuple[CassandraStore, int]] | None = None
        if self._store is None:
            opening = asyncio.ensure_future(steps.timed(
                "cassandra", asyncio.to_thread(CassandraStore.open_counting_shards, s)))
        elif not self.shards:
            self.shards = await asyncio.to_thread(read_shard_count, s)
            steps.done("shard count")
        kafka_side = asyncio.ensure_future(self._start_kafka_side(steps))
        try:
            if opening is not None:
                # A refusal from Cassandra (a namespace never initialised) ends the start at
                # once, without waiting for the Kafka steps.
                await asyncio.wait((kafka_side, opening), return_when=asyncio.FIRST_EXCEPTION)
                if opening.done():
                    opening.result()  # raises its failure, if any
            await kafka_side
        except BaseException:
            kafka_side.cancel()
            with contextlib.suppress(BaseException):
                await kafka_side
            if opening is not None:
                await _close_when_open(opening)
            raise
        if opening is not None:
            self._cassandra, shards = await opening
            self._store = self._cassandra
            self.shards = self.shards or shards
            # chronowheel_store_server_warnings_total: what Cassandra warned about, by kind
            self.metrics.registry.register(self._cassandra.server_warnings)
            steps.done("cassandra wait")
        self.metrics.shards.set(self.shards)
        bus, transactions, registry = self._bus, self.transactions, self.registry
        assert bus is not None and transactions is not None
        if s.run_history:
            hstore = self._history_store
            if hstore is None and self._cassandra is not None:
                try:
                    hstore = await asyncio.to_thread(CassandraRunHistory,
                                                     self._cassandra.session, s.keyspace)
                except ConfigError as exc:
                    # A namespace from before run history (not `init`ed since): history is
                    # an operator's aid, never a reason to stop firing.
                    log.error("run history off: %s", exc)
            if hstore is not None:
                self.history = recorder_for(hstore, s, self.metrics.registry)
                transactions.history = self.history
                self._history_task = self.supervisor.spawn(self.history.run(), "run-history")
            steps.done("history")
        self._side_tasks = [self.supervisor.spawn(transactions.run(), "node-transactions")]
        group = bus.submit_group(
            group_id=self.group_id, client_id=self.node_id,
            session_timeout_ms=s.node_session_timeout_ms,
            on_assigned=registry.on_assigned, on_revoked=registry.on_revoked)
        # Before start(): the first assignment can arrive during it.
        self._group = group
        registry.attach(shards=self.shards, store=self.store, bus=bus,
                        transactions=transactions, group=group)
        await group.start()
        steps.done("group")
        parts = group.partition_count()
        if parts is not None and parts != self.shards:
            await group.stop()
            self._group = None
            raise ConfigError(f"{s.submit_topic} has {parts} partitions but the namespace "
                              f"has {self.shards} shards")
        guard = self.clock_guard
        self._side_tasks += [
            self.supervisor.spawn(pump(group, registry.owned, s), "ingest-pump"),
            self.supervisor.spawn(guard.monitor(), "clock-skew-monitor"),
            self.supervisor.spawn(guard.loop_watch(), "event-loop-watch")]
        log.info("node %s started in %s: namespace %s, %d shards, group %s", self.node_id,
                 steps, s.namespace, self.shards, self.group_id)

    async def _start_kafka_side(self, steps: Phases) -> None:
        """The start's steps that need no Cassandra: the HTTP endpoint, the node's producer
        (fencing an earlier process with the same node id, before any shard can be assigned)
        and the topics' limits read ahead."""
        s = self.settings
        if self._bus is None:
            self._bus = KafkaNodeBus(s)
        self.metrics.dispatch_blocked.set(1)
        self.http = HttpEndpoint(self.metrics.registry, self.health, s.http_port, s.http_host,
                                 token=s.http_token)
        await self.http.start()
        steps.done("http")
        # One transactional producer for every shard of this process.
        bus = self._bus
        txn_id = node_transactional_id(s.namespace, self.node_id)
        self.transactions = NodeTransactions(
            producer=lambda: bus.producer(txn_id, self.group_id), clock=self.clock,
            metrics=self.metrics, on_fenced=self.registry.on_fenced, max_messages=s.max_batch,
            spacing_ms=s.node_transaction_spacing_ms,
            spacing_max_ms=s.node_transaction_spacing_max_ms)
        await self.transactions.start()
        steps.done("producer")
        await self._read_topics_ahead(self.transactions.producer)
        steps.done("topics")

    async def _read_topics_ahead(self, producer: TxnProducer) -> None:
        """Read the largest record and the partition count of the topics a shard's first part
        publishes to (the namespace's fired and dead topics), before the group can assign a
        shard. Read at the first part instead, they came on the path of a new node's first
        transaction: the start of an admin client and three requests, on the node's loop
        while it is busiest (taking shards over). Best effort: what is not read here is read
        at the first use, as before."""
        s = self.settings
        topics = (s.fired_topic, s.dead_topic)
        try:
            await within(asyncio.gather(*(producer.max_record_bytes(t) for t in topics),
                                        *(producer.partition_count(t) for t in topics)),
                         TOPICS_AHEAD_TIMEOUT_S)
        except TimeoutError:
            log.warning("node %s: the limits and partitions of %s were not read within %d s "
                        "of the start; each is read at its first use", self.node_id,
                        ", ".join(topics), TOPICS_AHEAD_TIMEOUT_S)
        except Exception as exc:  # a read ahead must not stop the start: first use reads again
            log.warning("node %s: reading the limits and partitions of %s at the start failed "
                        "(%r); each is read at its first use", self.node_id, ", ".join(topics),
                        exc)

    async def shutdown(self) -> None:
        """Stop taking work, finish open transactions, leave the group."""
        self.supervisor.begin_shutdown()  # from here on, tasks that end are no failures
        # Each step's time goes into the last line: a restarted node's shards wait for all of
        # it (with static membership nobody takes them over meanwhile).
        steps = Phases(self.clock)
        if self.history is not None:
            # The run history's queue (paced, so seconds of runs at a high rate) starts going
            # out now, beside the shards' release, instead of after it: with static membership
            # a restarted node's shards wait for the whole stop.
            self.history.hurry()
            if self.settings.node_instance_id and self.owned and self.failure is None:
                # A static member keeps its shards through its restart (nobody takes them
                # over): they go on firing while what the history had queued goes out, and
                # are released after it, so their pause no longer holds that write.
                with contextlib.suppress(TimeoutError):
                    await within(self.history.caught_up(), HISTORY_FLUSH_S)
                steps.done("history before the release")
        await self.registry.stop_recovery()
        # The transaction loop goes last: the shards' final commits (releases) need it.
        loop_tasks = self._side_tasks[:1]
        await self.supervisor.cancel_and_wait(self._side_tasks[1:])
        steps.done("side tasks")
        await self.registry.stop_shards(list(self.owned))
        steps.done("shards released")
        # Every shard is released now: leave the group at once, so that the others take them
        # over while this node finishes the rest (the run history's flush alone may take
        # HISTORY_FLUSH_S; the others' takeovers waited for it before).
        await self._leave_group()
        steps.done("group left")
        await self.supervisor.cancel_and_wait(loop_tasks)
        self._side_tasks.clear()
        if self.transactions is not None:
            await self.transactions.stop()
        steps.done("transactions")
        if self._history_task is not None and self.history is not None:
            # Last: the shards' final commits are recorded too; within a bound, since
            # history never holds a stop. By the writer task, which keeps its batch in hand.
            with contextlib.suppress(Exception):
                await within(self.history.drain(), HISTORY_FLUSH_S)
            await self.supervisor.cancel_and_wait([self._history_task])
            self._history_task = None
            steps.done("history")
        if self._bus is not None:
            with contextlib.suppress(Exception):
                await self._bus.close()
            steps.done("readers")
        if self.http is not None:
            await self.http.stop()
        if self._cassandra is not None:
            await asyncio.to_thread(self._cassandra.close)
            self._cassandra = None
            steps.done("cassandra")
        await self.supervisor.cancel_all()
        log.info("node %s stopped in %s", self.node_id, steps)

    async def _leave_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            with contextlib.suppress(Exception):
                await group.stop()  # leaves the group: the others are assigned its shards

    def health(self) -> tuple[bool, dict[str, object]]:
        lag = {str(k): o.actor.dispatch_lag_ms() for k, o in self.owned.items()}
        ok = not self.blocked and self.failure is None and all(v < 5_000 for v in lag.values())
        return ok, {"node": self.node_id, "shards": sorted(self.owned), "dispatch_lag_ms": lag,
                    "clock_skew_ms": self.skew_ms, "dispatch_blocked": self.blocked}


async def _close_when_open(opening: asyncio.Future[tuple[CassandraStore, int]]) -> None:
    """A start that failed while Cassandra was still opening: let the open end (it cannot be
    interrupted in its thread), then close what it opened."""
    try:
        store, _ = await asyncio.shield(opening)
    except BaseException:  # its own failure is not the one the start reports
        return
    await asyncio.to_thread(store.close)
