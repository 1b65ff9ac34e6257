"""The demo: a node and a worker on a fresh namespace, a mixed workload, a live summary.

Everything runs against the real Cassandra and Kafka named by the settings. Lateness is
measured where a user would see it: a read_committed consumer's receive time minus the
occurrence's scheduled instant (so it includes the consumer's own fetch delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import reader as kafka_reader
from chronowheel.client import SchedulerClient
from chronowheel.core.recurrence import compile_schedule, occurrences
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.worker import Occurrence, Worker

log = logging.getLogger(__name__)

RECURRING = (  # (job id, kind, expression, zone)
    ("tick-london", "cron", "*/10 * * * * *", "Europe/London"),
    ("tick-new-york", "cron", "*/15 * * * * *", "America/New_York"),
    ("tick-kolkata", "cron", "*/20 * * * * *", "Asia/Kolkata"),
    ("heartbeat", "every", "5s", "UTC"),
)


@dataclass
class DemoPlan:
    start_ms: int
    one_shots: dict[str, int]
    herd_at_ms: int
    herd: list[str]
    end_ms: int


@dataclass
class Tally:
    received: Counter[str] = field(default_factory=Counter)
    lateness_ms: list[int] = field(default_factory=list)  # all but the herd
    herd_lateness_ms: list[int] = field(default_factory=list)
    early: int = 0
    rejected: int = 0
    handled: int = 0
    herd_last_ms: int | None = None

    def record(self, occurrence: str, scheduled_ms: int, received_ms: int, fired_ms: int,
               herd: bool) -> None:
        self.received[occurrence] += 1
        if self.received[occurrence] > 1:
            return  # a duplicate: counted, not measured twice
        (self.herd_lateness_ms if herd else self.lateness_ms).append(received_ms - scheduled_ms)
        if fired_ms < scheduled_ms or received_ms < scheduled_ms:
            self.early += 1
        if herd:
            self.herd_last_ms = max(self.herd_last_ms or 0, received_ms)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.received.values() if n > 1)

    def percentile(self, q: float, *, herd: bool = False) -> int | None:
        values = self.herd_lateness_ms if herd else self.lateness_ms
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_plan(now_ms: int, *, one_shots: int, herd: int, seconds: int) -> DemoPlan:
    start = now_ms
    spread_ms = max(10_000, (seconds - 20) * 1000)
    shots = {f"reminder-{i:05d}": start + 5_000 + (i * 7919) % spread_ms
             for i in range(one_shots)}
    # The herd's second comes once ingest has surely finished, well inside the run.
    herd_at = ((start + min(45_000, spread_ms // 2)) // 1000) * 1000
    return DemoPlan(start, shots, herd_at, [f"herd-{i:05d}" for i in range(herd)],
                    start + seconds * 1000)


def expected_recurring(plan: DemoPlan, until_ms: int, first_ms: int) -> dict[str, int]:
    out = {}
    for job_id, kind, expr, tz in RECURRING:
        sched = (compile_schedule(cron=expr, tz=tz) if kind == "cron"
                 else compile_schedule(every_ms=5_000))
        out[job_id] = len([t for t in occurrences(sched, first_ms, 10_000, inclusive=True)
                           if t <= until_ms])
    return out


async def run_demo(settings: Settings, *, seconds: int = 100, one_shots: int = 1_500,
                   herd: int = 10_000, shards: int = 8, out: TextIO = sys.stdout) -> int:
    """Run the whole demo; return 0 when every check holds (no early, no duplicate, none
    missing), 1 otherwise."""
    settings = settings.replace(shards=shards, http_port=settings.http_port or 0)
    say = _printer(out)
    say(f"namespace {settings.namespace}: creating keyspace and topics ({shards} shards)")
    await init_namespace(settings)
    node = Node(settings, node_id="demo-node")
    tally = Tally()
    handled_by_worker: Counter[str] = Counter()

    async def handle(occ: Occurrence) -> None:
        handled_by_worker[occ.occurrence] += 1

    worker = Worker(settings, handlers={settings.fired_topic: handle}, concurrency=64)
    reader = _reader(settings)
    await node.start()
    assert node.http is not None
    say(f"node started; metrics at http://127.0.0.1:{node.http.port}/metrics")
    await worker.start()
    await reader.start()
    herd_ids: set[str] = set()
    reading = asyncio.create_task(_read(reader, settings, tally, herd_ids))
    try:
        await _wait_owned(node)
        plan = make_plan(_now(), one_shots=one_shots, herd=herd, seconds=seconds)
        herd_ids.update(plan.herd)
        say(f"submitting {one_shots} one-shot jobs over the next {seconds - 20}s, "
            f"{len(RECURRING)} recurring jobs (London, New York, Kolkata, every 5s), "
            f"a {herd}-job herd at {_clock(plan.herd_at_ms)}, and 3 bad commands")
        first_recurring = await _submit(settings, plan)
        say(f"submitted in {(_now() - plan.start_ms) / 1000:.1f}s")
        while _now() < plan.end_ms:
            await asyncio.sleep(2)
            tally.handled = sum(handled_by_worker.values())
            say(_status_line(tally, plan))
            if node._failure is not None or worker.failure is not None:
                raise RuntimeError(f"a component failed: {node._failure or worker.failure!r}")
        await asyncio.sleep(2)  # let the last transactions reach the reader
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await reader.stop()
        await worker.shutdown()
        await node.shutdown()
    tally.handled = sum(handled_by_worker.values())
    return _summary(say, tally, plan, first_recurring, node)


async def _submit(settings: Settings, plan: DemoPlan) -> int:
    async with SchedulerClient(settings) as client:
        first = _now()
        for job_id, kind, expr, tz in RECURRING:
            if kind == "cron":
                await client.cron(job_id, expr, tz=tz, payload={"zone": tz})
            else:
                await client.every(job_id, expr, payload={"beat": True})
        for job_id, at in plan.one_shots.items():
            await client.schedule(job_id, at, payload={"kind": "reminder", "job": job_id})
        for job_id in plan.herd:
            await client.schedule(job_id, plan.herd_at_ms, payload={"kind": "herd"})
        for raw in (  # bad input travels to <ns>.rejected; the pipeline keeps going
            {"v": 1, "op": "upsert", "job": {"id": "bad-1", "at": plan.start_ms, "paylod": 1}},
            {"v": 1, "op": "upsert", "job": {"id": "bad-2", "cron": "0 9 * * *",
                                              "tz": "Europe/Lundon"}},
            {"v": 1, "op": "upsert", "job": {"id": "bad-3", "at": plan.start_ms,
                                              "topic": settings.submit_topic}},
        ):
            await _send_unvalidated(client, raw)
        await client.flush()
    return first


async def _send_unvalidated(client: SchedulerClient, command: dict[str, Any]) -> None:
    # The client validates before sending; a raw producer (any language) does not, which is
    # what these stand for.
    producer = client._producer
    assert producer is not None
    await producer.send(client.topic, orjson.dumps(command),
                        key=command["job"]["id"].encode())


def _reader(settings: Settings) -> AIOKafkaConsumer:
    return kafka_reader(settings, fetch_max_wait_ms=20, max_partition_fetch_bytes=4 << 20)


async def _read(reader: AIOKafkaConsumer, settings: Settings, tally: Tally,
                herd: set[str]) -> None:
    tps = [TopicPartition(settings.fired_topic, p) for p in range(settings.shards)]
    tps.append(TopicPartition(settings.rejected_topic, 0))
    reader.assign(tps)
    await reader.seek_to_beginning(*tps)
    while True:
        batches = await reader.getmany(timeout_ms=100)
        received = _now()
        for tp, msgs in batches.items():
            for m in msgs:
                if tp.topic == settings.rejected_topic:
                    tally.rejected += 1
                    continue
                h = {k: v.decode() for k, v in (m.headers or ())}
                tally.record(h["cw-occurrence"], int(h["cw-scheduled-at"]), received,
                             int(h["cw-fired-at"]), h["cw-job-id"] in herd)


async def _wait_owned(node: Node, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not (len(node.owned) == node.shards
               and all(o.actor.ready for o in node.owned.values())):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node owns {sorted(node.owned)} after {timeout_s}s")
        await asyncio.sleep(0.1)


def _status_line(t: Tally, plan: DemoPlan) -> str:
    now = _now()
    due = sum(1 for at in plan.one_shots.values() if at <= now)
    if plan.herd_at_ms <= now:
        due += len(plan.herd)
    p50, p99 = t.percentile(0.5), t.percentile(0.99)
    return (f"t+{(now - plan.start_ms) / 1000:5.0f}s  fired {len(t.received):6d} "
            f"(one-shots due {due:6d})  lateness p50 {_ms(p50)} p99 {_ms(p99)}  "
            f"early {t.early}  duplicates {t.duplicates}  rejected {t.rejected}  "
            f"worker handled {t.handled}")


def _summary(say: Any, t: Tally, plan: DemoPlan, first_recurring: int, node: Node) -> int:
    fired_ids = {occ.rsplit("@", 1)[0] for occ in t.received}
    missing = [j for j in (*plan.one_shots, *plan.herd) if j not in fired_ids]
    recurring = Counter(occ.rsplit("@", 1)[0] for occ in t.received
                        if occ.rsplit("@", 1)[0] in {r[0] for r in RECURRING})
    expected = expected_recurring(plan, plan.end_ms, first_recurring)
    herd_span = (None if t.herd_last_ms is None else t.herd_last_ms - plan.herd_at_ms)
    say("")
    say("summary")
    say(f"  occurrences fired      {len(t.received)}")
    say(f"  one-shot + herd jobs   {len(plan.one_shots) + len(plan.herd) - len(missing)} of "
        f"{len(plan.one_shots) + len(plan.herd)} fired")
    for job_id, _, expr, tz in RECURRING:
        say(f"  {job_id:<16} {recurring[job_id]:3d} fires (about {expected[job_id]} expected; "
            f"{expr} {tz})")
    say(f"  lateness (ms)          p50 {_ms(t.percentile(0.5))}  p95 {_ms(t.percentile(0.95))}"
        f"  p99 {_ms(t.percentile(0.99))}  max {_ms(max(t.lateness_ms, default=None))}"
        "  (all but the herd; read_committed receive time minus scheduled time)")
    say(f"  herd lateness (ms)     p50 {_ms(t.percentile(0.5, herd=True))}  "
        f"p99 {_ms(t.percentile(0.99, herd=True))}")
    say(f"  herd of {len(plan.herd)} at one second: last received "
        f"{_ms(herd_span)} ms after that second")
    say(f"  early                  {t.early} (must be 0)")
    say(f"  duplicates             {t.duplicates} (must be 0)")
    say(f"  rejected commands      {t.rejected} (3 were sent on purpose)")
    say(f"  handled by the worker  {t.handled}")
    ok = t.early == 0 and t.duplicates == 0 and not missing and t.rejected == 3
    say("result: OK" if ok else f"result: FAILED (missing {len(missing)}: {missing[:5]})")
    del node
    return 0 if ok else 1


def _printer(out: TextIO) -> Any:
    def say(text: str) -> None:
        print(text, file=out, flush=True)
    return say


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value}"


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def _now() -> int:
    return time.time_ns() // 1_000_000
