"""The shard's invariants under interleaved ingest, load and dispatch (a Hypothesis state machine).

The three tasks of one shard share a `ShardState` (node/state.py). Here a real ShardActor runs
them on an in-memory store and bus with a manual clock; rules submit commands, move the clock
and turn the event loop, and every storage call takes a varying number of loop turns each way,
so the tasks interleave at every storage access, as they do against Cassandra. After every rule:
- never early: nothing is handed to the publisher before its slot;
- exactly once: no occurrence of one submitted version is published twice;
- watermark: every stored row with slot <= the committed watermark has been taken by
  dispatch, and nothing in the wheel is at or below the watermark;
- horizon: every stored row with watermark < slot <= horizon is in the wheel at its slot,
  and everything in the wheel is a stored row (for jobs no task is changing right now).
At the end, with time run far ahead, every stored row has been taken: nothing is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable, Coroutine
from operator import attrgetter
from typing import Any

import orjson
from chronowheel.bus.memory import MemoryBus
from chronowheel.core.clock import ManualClock
from chronowheel.core.model import ValidationPolicy, encode_cancel, encode_retry, encode_upsert
from chronowheel.core.wheel import TimingWheel
from chronowheel.core.wire import StateRecord
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import OccurrenceKey, Pending, WheelKey
from chronowheel.node.publisher import Publisher
from chronowheel.node.shard import ShardActor
from chronowheel.node.transactions import NodeTransactions
from chronowheel.settings import Settings
from chronowheel.store.memory import MemoryStore
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z
JOBS = [f"job-{i}" for i in range(6)]
# Above the rows one example can write: the loader's memory cap is tested on its own below,
# because more rows than the cap on a single millisecond stall the loader (a known limit).
BIG_CAP = 100
# Loop turns after an action: none (actions pile up) to enough for a few storage calls.
TURNS = st.integers(0, 40)
LATENCIES = (0, 0, 1, 1, 2, 3, 5, 10, 25)  # loop turns a storage call takes each way


class ShardMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(T0)
        # Small numbers so that paging, batching, pre-warming, skipping empty minutes and
        # catch-up all happen within a few dozen steps.
        self.settings = s = Settings(
            namespace="sm", shards=1, lookahead_ms=30_000, prewarm_ms=150_000,
            hot_bucket_rows=2, bucket_page_rows=2, bucket_cap_rows=BIG_CAP, max_batch=3,
            ingest_batch=3, ingest_concurrency=2, catch_up_grace_ms=5_000,
            skip_empty_after_ms=90_000, idle_commit_ms=1_000)
        self.store = MemoryStore(pause=_yield)
        self.bus = MemoryBus(s, self.clock)
        self.bus.create_namespace(1)
        self.bus.produce(s.state_topic, 0, StateRecord.key(0), orjson.dumps({"watermark": T0}))
        group = self.bus.submit_group(group_id="sm-nodes", client_id="sm",
                                      session_timeout_ms=10_000, on_assigned=_nothing,
                                      on_revoked=_nothing)
        metrics = NodeMetrics()
        self.transactions = NodeTransactions(
            producer=lambda: self.bus.producer("sm-node-sm", "sm-nodes"), clock=self.clock,
            metrics=metrics, on_fenced=lambda session: None)
        self.loop.run_until_complete(self.transactions.start())
        self.txn_task = self.loop.create_task(self.transactions.run())
        self.actor = ShardActor(
            shard=0, shards=1, settings=s, store=self.store, bus=self.bus,
            transactions=self.transactions, submit=group, clock=self.clock, metrics=metrics,
            policy=ValidationPolicy.from_settings(s), group_id="sm-nodes", node_id="sm",
            dispatch_blocked=lambda: False)
        self.state = self.actor.state
        self._watch(self.actor.publisher)
        self.task = self.loop.create_task(self.actor.run())
        self._turn_until(lambda: self.actor.ready)
        self.tokens = itertools.count()
        self.published: set[tuple[bytes, int, int]] = set()

    def _watch(self, publisher: Publisher) -> None:
        """Record what dispatch takes out of the wheel and what it hands to the publisher."""
        self.taken: set[tuple[OccurrenceKey, int]] = set()
        # Keyed and timed as the node's own wheel is: each entry is its key and knows its slot.
        self.state.wheel = RecordingWheel(self.taken, start_ms=T0, tick_ms=1,
                                          due_of=attrgetter("slot_ms"))
        commit = publisher.commit
        self.published: set[tuple[bytes, int, int]] = set()

        async def checked_commit(fired: list[Pending], *, release: bool = False) -> None:
            now = self.clock.now_ms()
            for p in fired:
                assert p.slot_ms <= now, f"early: {p.job_id} slot {p.slot_ms} at {now}"
                occurrence = (p.payload, p.scheduled_ms, p.attempt)
                assert occurrence not in self.published, f"published twice: {occurrence}"
                self.published.add(occurrence)
            await commit(fired, release=release)

        publisher.commit = checked_commit  # type: ignore[method-assign]

    @initialize(rnd=st.randoms(use_true_random=False))
    def vary_storage_latency(self, rnd: random.Random) -> None:
        """Each storage call yields to the loop a varying number of times (on its way there
        and back): how long a call is in flight relative to the other tasks varies."""

        async def pause() -> None:
            for _ in range(rnd.choice(LATENCIES)):
                await asyncio.sleep(0)

        self.store.pause = pause

    # --- commands ------------------------------------------------------------------------
    def _submit(self, job_id: str, value: bytes) -> None:
        msg = self.bus.produce(self.settings.submit_topic, 0, job_id.encode(), value)
        self.actor.enqueue([msg])

    def _token(self) -> str:
        return f"v{next(self.tokens)}"  # unique per command: tells versions apart

    @rule(job=st.sampled_from(JOBS), offset=st.integers(-5_000, 240_000),
          window=st.sampled_from([0, 0, 2_000]), turns=TURNS)
    def upsert_one_shot(self, job: str, offset: int, window: int, turns: int) -> None:
        fields: dict[str, Any] = {"id": job, "at": max(0, self.clock.now_ms() + offset),
                                  "payload": self._token()}
        if window:
            fields["window"] = window
        self._submit(job, encode_upsert(fields))
        self.run_loop(turns)

    @rule(job=st.sampled_from(JOBS), every=st.sampled_from([7_000, 20_000, 61_000]),
          catch_up=st.sampled_from(["all", "coalesce", "skip"]), turns=TURNS)
    def upsert_recurring(self, job: str, every: int, catch_up: str, turns: int) -> None:
        self._submit(job, encode_upsert({"id": job, "every": every, "catch_up": catch_up,
                                         "max_catch_up": 3, "payload": self._token()}))
        self.run_loop(turns)

    @rule(job=st.sampled_from(JOBS), turns=TURNS)
    def cancel(self, job: str, turns: int) -> None:
        self._submit(job, encode_cancel(job))
        self.run_loop(turns)

    @rule(job=st.sampled_from(JOBS), offset=st.integers(-2_000, 90_000),
          attempt=st.integers(2, 3), turns=TURNS)
    def retry(self, job: str, offset: int, attempt: int, turns: int) -> None:
        # A job of its own per retry: two retries of one job and attempt on one slot are one
        # due row (its key has no scheduled instant), and two of one occurrence and attempt
        # are one wheel entry, so only one of them would be delivered.
        now, token = self.clock.now_ms(), next(self.tokens)
        job = f"{job}-retry-{token}"
        self._submit(job, encode_retry(id=job, scheduled_ms=now - 1_000,
                                       attempt=attempt,
                                       at_ms=max(0, now + offset),
                                       topic=self.settings.fired_topic,
                                       payload=f"r{token}".encode()))
        self.run_loop(turns)

    # --- the loop and the clock ----------------------------------------------------------
    @rule(turns=st.integers(1, 300))
    def run_loop(self, turns: int) -> None:
        """Let the shard's tasks run for a while: each storage call is a point where another
        task may take over, so the number of turns decides how far each gets."""
        self._turn(self._turns(turns))

    async def _turns(self, turns: int) -> None:
        for _ in range(turns):
            await _one_turn()
            self._check_alive()
            if _idle(self.loop):
                return  # the turns left would change nothing

    def _check_alive(self) -> None:
        if self.task.done():
            self.task.result()  # a failed task fails the test
            raise AssertionError("the shard actor stopped")

    @rule(ms=st.sampled_from([1, 10, 50, 400, 3_000, 15_000, 70_000]), turns=TURNS)
    def advance_clock(self, ms: int, turns: int) -> None:
        self.clock.advance(ms)
        self.run_loop(turns)

    def _turn(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def _settle(self, quiet_turns: int = 30, limit: int = 100_000) -> None:
        """Turn the loop until nothing happens any more at the current instant."""
        self._turn(self._settled(quiet_turns, limit))

    async def _settled(self, quiet_turns: int, limit: int) -> None:
        quiet, last = 0, None
        for _ in range(limit):
            await _one_turn()
            self._check_alive()
            now = (self.store.calls, self.bus.commits, self.state.watermark)
            quiet, last = (quiet + 1, last) if now == last else (0, now)
            if quiet >= quiet_turns or _idle(self.loop):
                return
        raise AssertionError("the shard never settled")

    def _turn_until(self, done: Callable[[], bool], limit: int = 100_000) -> None:
        self._turn(self._until(done, limit))

    async def _until(self, done: Callable[[], bool], limit: int) -> None:
        for _ in range(limit):
            if done():
                return
            await _one_turn()
            self._check_alive()
            if _idle(self.loop) and not done():
                break  # nothing left to run: it never will
        raise AssertionError("the shard did not get there")

    # --- invariants ----------------------------------------------------------------------
    def _rows(self) -> list[Any]:
        return self.store.due_rows(0)

    @invariant()
    def watermark_is_never_ahead_of_time_or_the_horizon(self) -> None:
        state = self.state
        assert state.committed_watermark <= state.watermark <= self.clock.now_ms()
        assert state.watermark <= max(state.horizon_ms, T0)

    @invariant()
    def everything_at_or_below_the_committed_watermark_was_taken(self) -> None:
        for row in self._rows():
            if row.slot_ms <= self.state.committed_watermark:
                key = (row.job_id, row.scheduled_ms, row.attempt)
                assert (key, row.slot_ms) in self.taken, f"skipped: {row}"

    @invariant()
    def the_wheel_holds_exactly_the_rows_between_watermark_and_horizon(self) -> None:
        state = self.state
        busy = state.busy_jobs()
        # Keyed by the entries themselves (see Pending.__hash__): compare by occurrence.
        in_wheel = {p.wheel_key: due for p, due in _entries(state.wheel.due_times())}
        stored = {(r.job_id, r.scheduled_ms, r.attempt): r.slot_ms for r in self._rows()}
        for key, due in in_wheel.items():
            assert due > state.watermark, f"in the wheel at/below the watermark: {key} {due}"
            if key[0] not in busy:
                assert stored.get(key) == due, f"stale wheel entry {key} at {due}"
        for key, slot in stored.items():
            if state.watermark < slot <= state.horizon_ms and key[0] not in busy:
                assert in_wheel.get(key) == slot, f"row {key} at {slot} missing from the wheel"

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            self.actor.state.stopping = True
            self.task.cancel()
            with contextlib.suppress(BaseException):
                self._turn(self.task)
            self.txn_task.cancel()
            with contextlib.suppress(BaseException):
                self._turn(self.txn_task)
            # Tasks the actor made and never got to run (a drain that failed at once, as on
            # an example Hypothesis had already ended): cancelled and run to their end before
            # the loop closes, not dropped with their coroutines never awaited.
            left = asyncio.all_tasks(self.loop)
            for task in left:
                task.cancel()
            if left:
                with contextlib.suppress(BaseException):
                    self._turn(asyncio.gather(*left, return_exceptions=True))
            self.loop.close()

    def _drain(self) -> None:
        """With time run far ahead, the shard catches up: every stored row due by then has
        been taken (nothing skipped), and the invariants still hold."""
        state = self.state
        self._turn_until(lambda: not self.actor.queued and not state.ingest_slots)
        end = self.clock.now_ms() + 300_000
        while self.clock.now_ms() < end:
            self._settle()  # every task asleep: the next clock step wakes what is due
            self.clock.advance(min(20_000, end - self.clock.now_ms()))
            self._settle()
            now = self.clock.now_ms()
            assert state.horizon_ms >= now and state.watermark == now, "dispatch fell behind"
        self.the_wheel_holds_exactly_the_rows_between_watermark_and_horizon()
        now = self.clock.now_ms()
        for row in self._rows():
            if row.slot_ms <= now:
                key = (row.job_id, row.scheduled_ms, row.attempt)
                assert (key, row.slot_ms) in self.taken, f"never fired: {row}"


class RecordingWheel(TimingWheel[WheelKey, Pending]):
    def __init__(self, taken: set[tuple[OccurrenceKey, int]], **kw: Any) -> None:
        super().__init__(**kw)
        self.taken = taken

    def advance(self, now_ms: int,
                max_batch: int | None = None) -> list[tuple[int, WheelKey, Pending]]:
        entries = super().advance(now_ms, max_batch)
        self.taken.update((p.wheel_key, due) for due, _key, p in entries)
        return entries


def _entries(due_times: dict[Any, int]) -> list[tuple[Pending, int]]:
    assert all(isinstance(key, Pending) for key in due_times), "wheel keyed by a tuple"
    return list(due_times.items())


async def _yield() -> None:
    await asyncio.sleep(0)


# A turn is the loop passes one `loop.run_until_complete(asyncio.sleep(0))` from outside the
# loop gives the other tasks (the sleeper's two steps, then the stop: three), taken inside one
# coroutine that runs many turns: the same interleaving, without starting and stopping the
# loop (and making a task) for every turn.
PASSES_PER_TURN = 3


async def _one_turn() -> None:
    for _ in range(PASSES_PER_TURN):
        await asyncio.sleep(0)


def _idle(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether nothing but the caller can run on the loop: no callback ready for the next
    pass and no timer due. Everything here is in memory (no I/O) and the clock is manual, so
    turns taken from then on change nothing, and are not taken (about three turns in four
    were). Asked from a task while it runs, so its own next step is not in the queue yet.
    (`_ready` and `_scheduled` are asyncio's base event loop's.)"""
    base = loop if isinstance(loop, asyncio.BaseEventLoop) else None
    assert base is not None, f"not an asyncio base event loop: {loop!r}"
    ready: Any = base._ready  # type: ignore[attr-defined]
    timers: Any = base._scheduled  # type: ignore[attr-defined]
    return not ready and not (timers and timers[0].when() <= base.time())


async def _nothing(shards: list[int]) -> None:
    del shards


TestShardInvariants = ShardMachine.TestCase
TestShardInvariants.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
