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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from chronowheel.bus.ports import NodeBus, SubmitPositions, SubmitRecord
from chronowheel.core.clock import Clock
from chronowheel.core.model import ValidationPolicy
from chronowheel.errors import ChronowheelError
from chronowheel.node.backfill import Backfiller
from chronowheel.node.calendars import Calendars
from chronowheel.node.dispatch import Dispatcher
from chronowheel.node.ingest import Ingest
from chronowheel.node.loader import Loader
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.publisher import Publisher
from chronowheel.node.state import ShardState
from chronowheel.node.takeover import take_over
from chronowheel.node.transactions import NodeTransactions, ShardLost
from chronowheel.node.writes import RowWriter
from chronowheel.settings import Settings
from chronowheel.store.base import JobStore

__all__ = ["ShardActor", "ShardLost"]

log = logging.getLogger(__name__)

# While draining on a stop, look at the wheel at least this often.
DRAIN_POLL_MS = 50


class ShardActor:
    def __init__(self, *, shard: int, shards: int, settings: Settings, store: JobStore,
                 bus: NodeBus, transactions: NodeTransactions, submit: SubmitPositions,
                 clock: Clock, metrics: NodeMetrics, policy: ValidationPolicy, group_id: str,
                 node_id: str, dispatch_blocked: Callable[[], bool],
                 clock_state: Callable[[], tuple[int | None, bool]] | None = None) -> None:
        self.shard = shard
        self.settings = settings
        self.bus = bus
        self.transactions = transactions
        self.group_id = group_id
        self.submit = submit
        self.clock = clock
        self.metrics = metrics
        self.node_id = node_id
        self.dispatch_blocked = dispatch_blocked
        self.label = str(shard)
        self.ready = False
        """True from the end of the takeover until the actor stops: records fetched for the
        shard before that are dropped by the pump (they are read again after the seek)."""

        self.state = ShardState(shard=shard, start_ms=clock.now_ms(), tick_ms=settings.tick_ms,
                                ingest_slack_ms=settings.ingest_slack_ms)
        writer = RowWriter(store, shard, settings.retention_ms, settings.store_batch_fail_bytes)
        calendars = Calendars(store=store, clock=clock, refresh_ms=settings.calendar_refresh_ms)
        self.ingest = Ingest(state=self.state, shards=shards, settings=settings, store=store,
                             writer=writer, clock=clock, metrics=metrics, policy=policy,
                             calendars=calendars)
        self.loader = Loader(state=self.state, settings=settings, store=store, clock=clock)
        self.publisher = Publisher(state=self.state, transactions=transactions,
                                   settings=settings, clock=clock, metrics=metrics,
                                   node_id=node_id, shards=shards, clock_state=clock_state)
        self.dispatcher = Dispatcher(state=self.state, settings=settings, store=store,
                                     writer=writer, publisher=self.publisher, clock=clock,
                                     metrics=metrics, policy=policy,
                                     dispatch_blocked=dispatch_blocked, calendars=calendars)
        self.backfiller = Backfiller(state=self.state, settings=settings, store=store,
                                     writer=writer, clock=clock, policy=policy)
        self._stopped = asyncio.Event()

    # --- what the node sees ---------------------------------------------------------------
    @property
    def wake(self) -> asyncio.Event:
        """Set it to make dispatch look at the wheel again (e.g. when a skew block lifts)."""
        return self.state.wake

    @property
    def queued(self) -> int:
        """Submit records waiting for ingest (the pump's backpressure reads it)."""
        return len(self.ingest.queue)

    def enqueue(self, records: Iterable[SubmitRecord]) -> None:
        self.ingest.enqueue(records)

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

    # --- supervision ----------------------------------------------------------------------
    async def run(self) -> None:
        helpers: list[asyncio.Task[None]] = []
        state, dispatcher = self.state, self.dispatcher
        try:
            await self._takeover()
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
        finally:
            self.ready = False
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            # A shard that moved on must not leave frozen per-shard series behind: its new
            # owner exports them, and a stale lag or watermark here would mislead alerts.
            self.metrics.forget_shard(self.label)
            self._stopped.set()

    @property
    def session(self) -> int | None:
        """The node transactions' session this actor belongs to (None before its takeover)."""
        return self.publisher.session

    async def _takeover(self) -> None:
        # The session is taken BEFORE the claim: a fence found after this moment may have been
        # made by a node that read our claim, so it must end this actor (`node/transactions.py`).
        self.publisher.session = self.transactions.session
        resume = await take_over(shard=self.shard, transactions=self.transactions, bus=self.bus,
                                 submit=self.submit, settings=self.settings, clock=self.clock,
                                 group_id=self.group_id, node_id=self.node_id)
        state = self.state
        state.watermark = state.committed_watermark = resume.watermark
        state.horizon_ms = state.reading_upto = resume.watermark
        state.last_commit_ms = self.clock.now_ms()
        self.ingest.reset(resume.submit_offset)
        self.ready = True
        self.submit.deliver(self.shard)  # records read since the seek: ours from now
        log.info("shard %d: taken over (watermark %d, submit offset %s)", self.shard,
                 resume.watermark, resume.submit_offset,
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
        m, label, state = self.metrics, self.label, self.state
        m.wheel_entries.labels(label).set(len(state.wheel))
        m.loaded_horizon.labels(label).set(state.horizon_ms / 1000)
        m.watermark.labels(label).set(state.committed_watermark / 1000)
        m.prewarmed_buckets.labels(label).set(len(state.prewarmed))
        m.dispatch_lag.labels(label).set(self.dispatch_lag_ms() / 1000)
        if state.upcoming_rows is not None:
            m.upcoming_rows.labels(label).set(state.upcoming_rows)
