"""Workers without servers: the in-memory worker bus and stores, driven by a manual clock.

Time moves only when a test moves it (`advance`, `during`); `settle` lets every task run until
none has anything left to do at the current instant. Each worker reaches the shared bus and
stores through a `Gate` of its own: closing it stands for a paused process (every call it
makes waits, and so does every answer it was waiting for); `kill` closes it for good and
lets the group go on without the worker, as a SIGKILL does. Built on a node rig (`node=`), the
workers share its clock, bus and store, so a retry they submit is scheduled and fired by its
nodes.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from chronowheel.bus.memory import MemoryBus, Message
from chronowheel.bus.memory_worker import MemoryWorkerBus, MemoryWorkerConsumer
from chronowheel.bus.ports import PartitionsChanged, TopicPartition
from chronowheel.core import wire
from chronowheel.core.clock import ManualClock
from chronowheel.core.shard import shard_of
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.store.base import Mark, WorkerStores
from chronowheel.store.memory import MemoryStore
from chronowheel.store.memory_worker import MemoryMarks
from chronowheel.worker import Handler, Worker
from chronowheel.worker.timing import ClockTimer

from tests.unit.node_rig import NodeRig
from tests.unit.rig_settle import settle

T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z
T = TypeVar("T")


class Gate:
    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.dead = False


class Gated:
    """`target` with every coroutine method made to wait for the gate, before and after."""

    def __init__(self, target: Any, gate: Gate) -> None:
        self._target = target
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        gate = self._gate

        async def gated(*args: Any, **kwargs: Any) -> Any:
            await gate.open.wait()
            result = await attr(*args, **kwargs)
            await gate.open.wait()
            return result
        return gated


class GatedBus:
    def __init__(self, bus: MemoryWorkerBus, gate: Gate) -> None:
        self.bus = bus
        self.gate = gate
        self.consumers: list[MemoryWorkerConsumer] = []

    def consumer(self, *, group_id: str, topics: Sequence[str], session_timeout_ms: int,
                 on_assigned: PartitionsChanged, on_revoked: PartitionsChanged) -> Any:
        consumer = self.bus.consumer(group_id=group_id, topics=topics,
                                     session_timeout_ms=session_timeout_ms,
                                     on_assigned=on_assigned, on_revoked=on_revoked)
        self.consumers.append(consumer)
        return Gated(consumer, self.gate)

    def producer(self) -> Any:
        return Gated(self.bus.producer(), self.gate)


class WorkerRig:
    def __init__(self, *, partitions: int = 2, node: NodeRig | None = None,
                 **settings: Any) -> None:
        if node is not None:  # the node rig's namespace, as its settings have it
            assert not settings, "a rig beside a node takes the node rig's settings"
            self.clock = node.clock
            self.settings = node.settings
            self.memory = node.bus
            self.store = node.store
        else:
            self.clock = ManualClock(T0)
            self.settings = Settings(namespace="unit", shards=partitions, **settings)
            self.memory = MemoryBus(self.settings, self.clock)
            self.memory.create_namespace(partitions)
            self.store = MemoryStore(clock=self.clock)
        self.bus = MemoryWorkerBus(self.memory)
        self.marks = MemoryMarks(lambda: self.clock.now_ms() / 1000)
        self.workers: list[Worker] = []
        self.gates: dict[Worker, Gate] = {}
        self.buses: dict[Worker, GatedBus] = {}

    @property
    def topic(self) -> str:
        return self.settings.fired_topic

    # --- workers -------------------------------------------------------------------------
    def worker(self, handler: Handler, *, worker_id: str = "w1", topic: str | None = None,
               **options: Any) -> Worker:
        gate = Gate()
        stores = WorkerStores(marks=Gated(self.marks, gate), claims=Gated(self.store, gate),
                              runs=Gated(self.store, gate))
        bus = GatedBus(self.bus, gate)
        options.setdefault("session_timeout_ms", 6000)
        worker = Worker(self.settings, handlers={topic or self.topic: handler},
                        clock=self.clock, timer=ClockTimer(self.clock), bus=bus, stores=stores,
                        worker_id=worker_id, **options)
        self.workers.append(worker)
        self.gates[worker] = gate
        self.buses[worker] = bus
        return worker

    async def start(self, handler: Handler, **kw: Any) -> Worker:
        worker = self.worker(handler, **kw)
        await self.during(worker.start())
        return worker

    async def shutdown(self, worker: Worker, deadline_s: float | None = None) -> None:
        await self.during(worker.shutdown(deadline_s))

    def pause(self, worker: Worker) -> None:
        self.gates[worker].open.clear()

    def resume(self, worker: Worker) -> None:
        self.gates[worker].open.set()

    async def expire(self, worker: Worker) -> None:
        """The worker's group session expired (it was paused or killed)."""
        for consumer in self.buses[worker].consumers:
            await self.bus.expire(consumer)

    async def kill(self, worker: Worker) -> None:
        """SIGKILL: it makes no call any more; its group goes on without it."""
        self.gates[worker].dead = True
        self.pause(worker)
        await self.expire(worker)

    async def __aenter__(self) -> WorkerRig:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_all()

    async def stop_all(self) -> None:
        """Stop every worker (the killed ones last, only to end their tasks)."""
        for worker in sorted(self.workers, key=lambda w: self.gates[w].dead):
            dead = self.gates[worker].dead
            self.resume(worker)
            await self.during(worker.shutdown(0.0))
            assert dead or worker.failure is None, f"worker failed: {worker.failure!r}"
        self.workers.clear()

    # --- input ---------------------------------------------------------------------------
    def fire(self, job_id: str, *, scheduled_ms: int = T0, attempt: int = 1,
             max_attempts: int = 5, backoff_ms: int = 1000, payload: bytes = b"{}",
             headers: tuple[tuple[str, str], ...] = (), partition: int | None = None,
             topic: str | None = None) -> Message:
        """An occurrence as the node publishes it, on its job's partition unless told."""
        raw = encode_headers(job_id, scheduled_ms, attempt, max_attempts, backoff_ms, headers)
        raw.append((wire.FIRED_AT, str(self.clock.now_ms()).encode()))
        topic = topic or self.topic
        count = len(self.memory.topics[topic])
        part = shard_of(job_id, count) if partition is None else partition
        return self.memory.produce(topic, part, job_id.encode(), payload, raw)

    def fire_copy(self, msg: Message) -> Message:
        return self.memory.produce(msg.topic, msg.partition, msg.key, msg.value, msg.headers)

    # --- time ----------------------------------------------------------------------------
    def _fingerprint(self) -> tuple[Any, ...]:
        return (self.clock.now_ms(), self.store.calls, self.marks.calls, self.bus.commits,
                self.memory.commits, self.bus.sent,
                sum(len(p) for t in self.memory.topics.values() for p in t),
                tuple((repr(w.stats), w.holding()) for w in self.workers))

    async def settle(self) -> None:
        await settle(self._fingerprint, "the workers")

    async def advance(self, delta_ms: int, step_ms: int = 100) -> None:
        end = self.clock.now_ms() + delta_ms
        while self.clock.now_ms() < end:
            self.clock.set(min(end, self.clock.now_ms() + step_ms))
            await self.settle()

    async def during(self, work: Awaitable[T] | Coroutine[Any, Any, T], *,
                     limit_ms: int = 120_000, step_ms: int = 100) -> T:
        """Run `work`, moving time on while it waits (it may wait for leases, deadlines)."""
        task = asyncio.ensure_future(work)
        await self.settle()
        end = self.clock.now_ms() + limit_ms
        while not task.done():
            if self.clock.now_ms() >= end:
                task.cancel()
                raise AssertionError(f"not done within {limit_ms} ms of the rig's time")
            self.clock.advance(step_ms)
            await self.settle()
        return task.result()

    async def until(self, what: str, predicate: Callable[[], bool], *,
                    limit_ms: int = 60_000, step_ms: int = 100) -> None:
        """Move time on until `predicate` holds."""
        await self.settle()
        end = self.clock.now_ms() + limit_ms
        while not predicate():
            if self.clock.now_ms() >= end:
                raise AssertionError(f"not within {limit_ms} ms of the rig's time: {what}")
            self.clock.advance(step_ms)
            await self.settle()

    # --- output --------------------------------------------------------------------------
    def committed(self, worker: Worker) -> dict[int, int]:
        return {p: o for (g, t, p), o in self.memory.group_offsets.items()
                if g == worker.group_id and t == self.topic}

    def marks_of(self, scope: str, partition: int) -> dict[int, Mark]:
        return dict(self.marks.marks.get((scope, self.topic, partition), {}))

    def messages(self, topic: str) -> list[Message]:
        return self.memory.messages(topic)

    def tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)
