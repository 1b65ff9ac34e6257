"""The outcome a worker records for a failed run is its own occurrence's, whatever other slots
do meanwhile, and what it queues for the run history keeps only what the row needs (no
exception, so no traceback holding the occurrence and its payload). The handler slots
(`worker/handling.py`) driven directly, with a producer whose sends a test holds and refuses."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import weakref
from typing import Any, cast

from chronowheel.bus.ports import RecordRefused
from chronowheel.core import runs
from chronowheel.core.clock import ManualClock
from chronowheel.history import RunRecorder
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.store.memory_history import MemoryRunHistory
from chronowheel.worker.handling import Slots, WorkerStats
from chronowheel.worker.occurrence import Occurrence
from chronowheel.worker.policy import DeadLetter

T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z


class HeldProducer:
    """Sends to `<ns>.dead`: the full letter (with a payload) is refused; the payload-less
    one is refused for the jobs in `refuse_minimal`; a job in `hold` waits for its event
    before its payload-less letter is answered."""

    def __init__(self, dead_topic: str) -> None:
        self.dead_topic = dead_topic
        self.refuse_minimal: set[bytes] = set()
        self.hold: dict[bytes, asyncio.Event] = {}
        self.holding: dict[bytes, asyncio.Event] = {}
        self.sent: list[tuple[str, bytes | None]] = []

    async def send(self, topic: str, key: bytes | None, value: bytes,
                   headers: Any = ()) -> None:
        assert topic == self.dead_topic and key is not None
        if value.startswith(b"payload"):
            raise RecordRefused(topic, "too_large", "MessageSizeTooLargeError: test")
        if key in self.hold:
            self.holding.setdefault(key, asyncio.Event()).set()
            await self.hold[key].wait()
        if key in self.refuse_minimal:
            raise RecordRefused(topic, "invalid", "InvalidRecordError: test")
        self.sent.append((topic, key))


def occurrence(job_id: str, offset: int, max_attempts: int = 1) -> Occurrence:
    headers = encode_headers(job_id, T0, 1, max_attempts, 1_000, ())
    headers.append(("cw-fired-at", str(T0).encode()))
    return Occurrence.from_record("unit.fired", 0, offset, b"payload of " + job_id.encode(),
                                  headers)


def slots(producer: HeldProducer, settings: Settings, history: RunRecorder,
          stats: WorkerStats) -> Slots:
    def fail(where: str, exc: BaseException) -> None:
        raise AssertionError(f"{where}: {exc!r}")

    return Slots(cast(Any, None), {}, concurrency=2, settings=settings,
                 clock=ManualClock(T0), timer=cast(Any, None), ledger=None,
                 producer=cast(Any, producer),
                 executor=concurrent.futures.ThreadPoolExecutor(1), stats=stats, fail=fail,
                 history=history, worker_id="w1")


def recorder() -> RunRecorder:
    return RunRecorder(MemoryRunHistory(), ttl_s=60, queue_rows=100, batch_rows=100,
                       in_flight=1)


async def test_a_failure_is_recorded_failed_only_when_its_own_dead_letter_was_refused() -> None:
    settings = Settings(namespace="unit", shards=1)
    producer = HeldProducer(settings.dead_topic)
    producer.refuse_minimal.add(b"cursed")
    release = producer.hold[b"lucky"] = asyncio.Event()
    stats = WorkerStats()
    history = recorder()
    s = slots(producer, settings, history, stats)
    lucky, cursed = occurrence("lucky", 1), occurrence("cursed", 2)

    # Slot 1: lucky's full dead letter is refused, its payload-less one is in flight...
    first = asyncio.ensure_future(s._settle(lucky, DeadLetter("no"), None, T0))
    held = producer.holding.setdefault(b"lucky", asyncio.Event())
    await asyncio.wait_for(held.wait(), 5)
    # ... while slot 2's occurrence is refused both letters (logged only).
    await s._settle(cursed, DeadLetter("no"), None, T0)
    assert stats.unlettered == 1
    release.set()
    await asyncio.wait_for(first, 5)
    assert producer.sent == [(settings.dead_topic, b"lucky")]
    assert stats.dead == 1 and stats.quarantined == 2

    await history.flush()
    store = cast(MemoryRunHistory, history.store)
    outcomes = {job: (await store.job_runs(job, 1))[0].outcome for job in ("lucky", "cursed")}
    assert outcomes == {"lucky": runs.DEAD_LETTERED, "cursed": runs.FAILED}
    assert store.counts["lucky"] == {"failed": 1, "dead_lettered": 1}
    assert store.counts["cursed"] == {"failed": 1}


async def test_a_refused_retry_with_a_refused_dead_letter_is_recorded_failed() -> None:
    settings = Settings(namespace="unit", shards=1)

    class RefusesAll(HeldProducer):
        async def send(self, topic: str, key: bytes | None, value: bytes,
                       headers: Any = ()) -> None:
            raise RecordRefused(topic, "invalid", "InvalidRecordError: test")

    stats = WorkerStats()
    history = recorder()
    s = slots(RefusesAll(settings.dead_topic), settings, history, stats)
    occ = occurrence("j", 1, max_attempts=3)  # a retry is due: refused, then both letters
    await s._settle(occ, RuntimeError("down"), None, T0)
    await history.flush()
    [run] = await cast(MemoryRunHistory, history.store).job_runs("j", 1)
    assert (run.outcome, run.error) == (runs.FAILED, "RuntimeError: down")


async def test_a_queued_failure_keeps_no_exception_nor_the_occurrence() -> None:
    settings = Settings(namespace="unit", shards=1)
    producer = HeldProducer(settings.dead_topic)
    stats = WorkerStats()
    history = recorder()
    s = slots(producer, settings, history, stats)

    class Boom(RuntimeError):
        pass

    def handler(occ: Occurrence) -> None:  # the traceback's frame holds `occ`
        raise Boom("x" * 1_000)

    occ = occurrence("j", 1)
    try:
        handler(occ)
    except Boom as exc:
        error: Boom | None = exc
    assert error is not None
    await s._settle(occ, error, None, T0)
    gone = weakref.ref(error)
    held = weakref.ref(occ)
    del error, occ
    gc.collect()
    # Only the history queue could still hold them: it does not.
    assert gone() is None and held() is None
    assert history.queued == 1
    await history.flush()
    [run] = await cast(MemoryRunHistory, history.store).job_runs("j", 1)
    assert run.error is not None and run.error.startswith("Boom: xxx")
    assert len(run.error.encode()) <= 300
