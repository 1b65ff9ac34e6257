"""The shard actor: supervises one owned shard's tasks around their shared `ShardState`.

After the takeover and claim (`node/takeover.py`) four tasks share the shard's state on one
event loop: dispatch (`node/dispatch.py`, run by the actor itself) fires due occurrences and
commits them, with ingest's outbox, the new watermark and the submit offsets of fully applied
commands, as one part of the node's next Kafka transaction (`node/publisher.py`,
`node/transactions.py`: all of a shard's part or none of it); ingest (`node/ingest.py`) applies
submit commands, durable Cassandra writes first; the loader (`node/loader.py`) keeps the wheel
filled from Cassandra's minute buckets ahead of time; the backfill task (`node/backfill.py`)
hands backfill requests to the due table a paced chunk at a time. Ingest and dispatch run
concurrently so a burst of submissions does not delay firing; a per-job lock orders what both
do to one job. The invariants they keep (watermark, horizon, offsets, ingest slots) are stated
in `node/state.py`; the design behind them in docs/design.md.

An actor can run more than once: one whose run ended cleanly on a revocation (its shard
released, nothing in flight) is kept warm by the registry, and if the group gives the shard
back to this node it runs again with its wheel as it was, after `resume_warm` proved that
nobody took the shard meanwhile (`node/takeover.py`); otherwise it starts from fresh state and
takes the shard over in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from chronowheel.bus.ports import Claimer, NodeBus, SubmitPositions, SubmitRecord
from chronowheel.core.clock import Clock
from chronowheel.core.model import ValidationPolicy
from chronowheel.errors import ChronowheelError
from chronowheel.node.backfill import Backfiller
from chronowheel.node.calendars import Calendars
from chronowheel.node.dispatch import Dispatcher
from chronowheel.node.ingest import Ingest
from chronowheel.node.loader import Loader
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.publisher import Publisher, stop_quietly
from chronowheel.node.state import Arrivals, ShardState
from chronowheel.node.takeover import Resume, Warm, release_half_way, resume_warm, take_over
from chronowheel.node.transactions import NodeTransactions, ShardLost, ShardUnavailable
from chronowheel.node.write_permits import NodeWritePermits
from chronowheel.node.writes import RowWriter
from chronowheel.settings import Settings
from chronowheel.store.base import JobStore, RunHistoryStore

if TYPE_CHECKING:
    from prometheus_client import Gauge

__all__ = ["ShardActor", "ShardLost"]

log = logging.getLogger(__name__)

# While draining on a stop, look at the wheel at least this often.
DRAIN_POLL_MS = 50


class ShardActor:
    def __init__(self, *, shard: int, shards: int, settings: Settings, store: JobStore,
                 bus: NodeBus, transactions: NodeTransactions, submit: SubmitPositions,
                 clock: Clock, metrics: NodeMetrics, policy: ValidationPolicy, group_id: str,
                 node_id: str, dispatch_blocked: Callable[[], bool],
                 clock_state: Callable[[], tuple[int | None, bool]] | None = None,
                 node_writes: NodeWritePermits | None = None,
                 arrivals: Arrivals | None = None) -> None:
        self.shard = shard
        self.arrivals = Arrivals() if arrivals is None else arrivals
        """The node's shards being taken over (`node/state.py`): this one from the start of
        each run to its first commit."""
        self.node_writes = node_writes
        self.shards = shards
        self.settings = settings
        self.store = store
        self.policy = policy
        self.clock_state = clock_state
        self.bus = bus
        self.transactions = transactions
        self.group_id = group_id
        self.submit = submit
        self.clock = clock
        self.metrics = metrics
        self.node_id = node_id
        self.dispatch_blocked = dispatch_blocked
        self.label = str(shard)
        self._gauges: tuple[Gauge, ...] | None = None
        """This shard's series of the per-shard gauges, bound at its first step after a
        (re)start (`_update_gauges`)."""
        self._upcoming_gauge: Gauge | None = None
        self.ready = False
        """True from the end of the takeover until the actor stops: records fetched for the
        shard before that are dropped by the pump (they are read again after the seek)."""

        self.claimer: Claimer | None = None
        """The shard's claimer, kept from the takeover while the actor (or its warm state)
        lives: a warm resume commits its claim with it (`node/takeover.py`)."""
        self.warm: Warm | None = None
        """Set by the registry before a run of an actor kept warm: resume without a reload if
        `resume_warm` proves nobody took the shard since."""
        self.clean = False
        """True when the last run ended with the shard released by its final commit and
        nothing in flight: its state may be kept warm (`warm_state`)."""
        self.resumed_warm = False
        """Whether the last takeover kept the wheel (a warm resume) rather than reloading."""
        self._build()
        self._stopped = asyncio.Event()

    def _history_store(self) -> RunHistoryStore | None:
        """The node's run history store, while it records runs."""
        recorder = self.transactions.history
        return None if recorder is None else recorder.store

    def _build(self) -> None:
        """Fresh state and the tasks' parts around it (a new actor, or a warm one that could
        not be resumed)."""
        settings, store, clock, shard = self.settings, self.store, self.clock, self.shard
        metrics, policy = self.metrics, self.policy
        self.state = ShardState(shard=shard, start_ms=clock.now_ms(), tick_ms=settings.tick_ms,
                                ingest_slack_ms=settings.ingest_slack_ms,
                                arrivals=self.arrivals)
        writer = RowWriter(store, shard, settings.retention_ms, settings.store_batch_fail_bytes)
        calendars = Calendars(store=store, clock=clock, refresh_ms=settings.calendar_refresh_ms)
        self.ingest = Ingest(state=self.state, shards=self.shards, settings=settings,
                             store=store, writer=writer, clock=clock, metrics=metrics,
                             policy=policy, calendars=calendars,
                             history=self._history_store, node_writes=self.node_writes)
        self.ingest.reread = self._reread
        self.loader = Loader(state=self.state, settings=settings, store=store, clock=clock)
        self.publisher = Publisher(state=self.state, transactions=self.transactions,
                                   settings=settings, clock=clock, metrics=metrics,
                                   node_id=self.node_id, shards=self.shards,
                                   clock_state=self.clock_state)
        self.dispatcher = Dispatcher(state=self.state, settings=settings, store=store,
                                     writer=writer, publisher=self.publisher, clock=clock,
                                     metrics=metrics, policy=policy,
                                     dispatch_blocked=self.dispatch_blocked,
                                     calendars=calendars)
        self.backfiller = Backfiller(state=self.state, settings=settings, store=store,
                                     writer=writer, clock=clock, policy=policy)

    # --- what the node sees ---------------------------------------------------------------
    @property
    def wake(self) -> asyncio.Event:
        """Set it to make dispatch look at the wheel again (e.g. when a skew block lifts)."""
        return self.state.wake

    @property
    def queued(self) -> int:
        """Submit records waiting for ingest."""
        return len(self.ingest.queue)

    def fetch_wanted(self, paused: bool) -> bool:
        """The pump's backpressure: whether to fetch the shard's partition now."""
        return self.ingest.fetch_wanted(paused)

    def enqueue(self, records: Iterable[SubmitRecord]) -> None:
        self.ingest.enqueue(records)

    async def _reread(self, offset: int) -> int:
        """Read the shard's partition from `offset` next (the urgent lane's look-ahead)."""
        expired = await self.submit.seek(self.shard, offset)
        self.submit.deliver(self.shard)
        return expired

    def dispatch_lag_ms(self) -> int:
        return self.state.dispatch_lag_ms(self.clock.now_ms())

    async def stop(self) -> None:
        state = self.state
        state.stopping = True
        state.wake.set()
        state.ingest_wake.set()
        state.loader_wake.set()
        state.backfill_wake.set()
        await self._stopped.wait()

    # --- warm state -----------------------------------------------------------------------
    def warm_state(self) -> Warm | None:
        """After a run that ended cleanly: what a warm resume must find unchanged."""
        p = self.publisher
        if not self.clean or self.claimer is None or p.last_record is None:
            return None
        return Warm(claimer=self.claimer, record=p.last_record,
                    watermark=self.state.committed_watermark, submit_offset=p.committed_offset)

    def rearm(self) -> bool:
        """Before running a warm actor again (the registry calls it before spawning the run):
        False when it holds nothing to resume from."""
        warm = self.warm_state()
        if warm is None:
            return False
        self.warm = warm
        self.clean = False
        self.state.stopping = False
        self._stopped = asyncio.Event()
        return True

    async def close(self) -> None:
        """The actor is given up for good (not kept warm, or its warm state dropped)."""
        self.clean = False
        self.warm = None
        claimer, self.claimer = self.claimer, None
        await stop_quietly(claimer)

    # --- supervision ----------------------------------------------------------------------
    async def run(self) -> None:
        helpers: list[asyncio.Task[None]] = []
        clean = False
        failure: BaseException | None = None
        self.arrivals.arrive(self.shard, self.clock.now_ms())
        try:
            await self._takeover()
            state, dispatcher = self.state, self.dispatcher  # fresh ones after a full takeover
            helpers = [
                asyncio.create_task(self.loader.run(), name=f"loader-{self.shard}"),
                asyncio.create_task(self.ingest.run(), name=f"ingest-{self.shard}"),
                asyncio.create_task(self.backfiller.run(), name=f"backfill-{self.shard}"),
            ]
            for task in helpers:  # a helper that ends wakes the loop below, which fails loudly
                task.add_done_callback(lambda _task: state.wake.set())
            while not state.stopping:
                state.wake.clear()
                for task in helpers:
                    if task.done():
                        task.result()  # a failed helper fails the shard loudly
                        raise RuntimeError(f"shard {self.shard}: {task.get_name()} stopped")
                await dispatcher.step()
                self._update_gauges()
                await dispatcher.wait()
            await self._drain(helpers[1])
            # Warm only if the final part released the shard and nothing is half done: no row
            # write in flight (a backfill chunk holds its slot until its rows are in the
            # wheel), everything taken from the wheel committed, every applied command's
            # offset committed.
            clean = (self.publisher.released and not state.ingest_slots
                     and state.watermark == state.committed_watermark
                     and not state.outbox and state.offset_to_commit is None
                     and self.ingest.next_offset == self.publisher.committed_offset)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.ready = False
            self.arrivals.settled(self.shard)
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.clean = clean
            if not clean:
                # (ShardUnavailable: its takeover released the claim already.)
                if self.claimer is not None \
                        and not isinstance(failure, ShardLost | ShardUnavailable) \
                        and self.session == self.transactions.session:
                    # Claimed, and neither taken by another node nor fenced with the node's
                    # producer (its recovery takes the shards again): not left to be fenced.
                    why = "stopped past its deadline" if isinstance(
                        failure, asyncio.CancelledError) else repr(failure) if failure \
                        else "ended with work in flight"
                    try:
                        await release_half_way(shard=self.shard, claimer=self.claimer,
                                               transactions=self.transactions, bus=self.bus,
                                               settings=self.settings, clock=self.clock,
                                               node_id=self.node_id, why=why)
                    finally:
                        await self.close()
                else:
                    await self.close()
            # A shard that moved on must not leave frozen per-shard series behind: its new
            # owner exports them, and a stale lag or watermark here would mislead alerts.
            self.metrics.forget_shard(self.label)
            self._gauges = self._upcoming_gauge = None  # removed: a warm rerun binds anew
            self._stopped.set()

    @property
    def session(self) -> int | None:
        """The node transactions' session this actor belongs to (None before its takeover)."""
        return self.publisher.session

    async def _takeover(self) -> None:
        # The session is taken BEFORE the claim: a fence found after this moment may have been
        # made by a node that read our claim, so it must end this actor (`node/transactions.py`).
        session = self.transactions.session
        warm, self.warm = self.warm, None
        resume: Resume | None = None
        if warm is not None:
            self.claimer = warm.claimer  # the actor's to stop if it is given up meanwhile
            resume = await resume_warm(shard=self.shard, warm=warm,
                                       transactions=self.transactions, bus=self.bus,
                                       submit=self.submit, settings=self.settings,
                                       clock=self.clock, node_id=self.node_id)
            if resume is None:
                stopping = self.state.stopping  # a stop that came during the attempt holds
                await self.close()
                self._build()
                self.state.stopping = stopping
        self.resumed_warm = resume is not None
        self.publisher.session = session
        self.dispatcher.gap = True  # what came due while the shard was away is caught up
        state = self.state
        if resume is None:
            resume = await take_over(shard=self.shard, transactions=self.transactions,
                                     bus=self.bus, submit=self.submit, settings=self.settings,
                                     clock=self.clock, group_id=self.group_id,
                                     node_id=self.node_id)
            state.watermark = state.committed_watermark = resume.watermark
            state.horizon_ms = state.reading_upto = resume.watermark
            if resume.ahead is not None:
                # The previous owner was catching up: its late rows are loaded again into the
                # catch-up queue, and what it published after its cuts is not (node/loader.py).
                # What came due since its last range is late too: dispatch cuts again
                # (`Dispatcher._take_late`).
                state.behind_from = resume.watermark
                *closed, (state.late_cut, state.watermark) = resume.ahead
                state.ahead = list(closed)
        else:
            # The wheel, the horizon and the watermark stay. A pre-warm read that the stop
            # cut short is done again; backfills are read again from their stored requests.
            state.loaded_minutes &= state.prewarmed
            state.backfills.clear()
        self.claimer = resume.claimer
        self.metrics.takeovers.labels("warm" if self.resumed_warm else "full").inc()
        read_from = resume.submit_offset
        if resume.submit_expired:
            # Kafka's retention of <ns>.submit ran past a backlog no node had applied: those
            # commands are gone. Nothing else would tell: the partition is read from its
            # log start as if nothing were missing. The next transaction commits the log
            # start, so that the next owner does not report the same loss again.
            read_from = (resume.submit_offset or 0) + resume.submit_expired
            state.offset_to_commit = read_from
            self.metrics.submit_expired.inc(resume.submit_expired)
            log.warning("shard %d: up to %d submitted commands (offsets %s to %d) were "
                        "deleted by %s's retention before any node applied them: raise the "
                        "topic's retention.ms or add nodes so that ingest keeps up",
                        self.shard, resume.submit_expired, resume.submit_offset,
                        read_from - 1, self.settings.submit_topic,
                        extra={"shard": self.shard, "node": self.node_id})
        state.last_commit_ms = self.clock.now_ms()
        self.publisher.committed_offset = resume.submit_offset
        self.publisher.released = False
        self.ingest.reset(read_from)
        self.ready = True
        self.submit.deliver(self.shard)  # records read since the seek: ours from now
        log.info("shard %d: taken over (watermark %d, submit offset %s%s)", self.shard,
                 resume.watermark, resume.submit_offset,
                 ", warm: wheel kept" if self.resumed_warm else "",
                 extra={"shard": self.shard, "node": self.node_id})

    async def _drain(self, ingest: asyncio.Task[None]) -> None:
        """Graceful stop: let ingest finish its batch, still dispatching what comes due
        meanwhile (the shard is ours until the stop returns), then commit what is done."""
        give_up = self.clock.now_ms() + self.settings.stop_drain_ms
        while not ingest.done():
            if self.clock.now_ms() > give_up:
                raise ChronowheelError(f"shard {self.shard}: ingest did not finish its batch "
                                       f"within {self.settings.stop_drain_ms} ms of the stop")
            await self.dispatcher.step()
            self._update_gauges()
            nd = self.state.wheel.next_deadline()
            pause_ms = DRAIN_POLL_MS if nd is None or self.dispatch_blocked() else \
                min(DRAIN_POLL_MS, max(1, nd - self.clock.now_ms()))
            await asyncio.wait({ingest}, timeout=pause_ms / 1000)
        ingest.result()
        await self.dispatcher.step(final=True)

    def _update_gauges(self) -> None:
        gauges = self._gauges
        if gauges is None:
            # Bound once per run, not at every step: `labels()` costs about as much as the
            # seven sets together, and this runs after every step of every shard.
            m, label = self.metrics, self.label
            gauges = self._gauges = (
                m.wheel_entries.labels(label), m.catch_up_queue.labels(label),
                m.loaded_horizon.labels(label), m.watermark.labels(label),
                m.prewarmed_buckets.labels(label), m.dispatch_lag.labels(label))
        state = self.state
        wheel_entries, catch_up_queue, loaded_horizon, watermark, prewarmed, lag = gauges
        wheel_entries.set(len(state.wheel))
        catch_up_queue.set(len(state.late))
        loaded_horizon.set(state.horizon_ms / 1000)
        watermark.set(state.committed_watermark / 1000)
        prewarmed.set(len(state.prewarmed))
        lag.set(self.dispatch_lag_ms() / 1000)
        if state.upcoming_rows is not None:  # no series before it is known (not a false 0)
            upcoming = self._upcoming_gauge
            if upcoming is None:
                upcoming = self._upcoming_gauge = self.metrics.upcoming_rows.labels(self.label)
            upcoming.set(state.upcoming_rows)
