"""The demo: a node and a worker on a fresh namespace, a mixed workload, a live summary.

Everything runs against the real Cassandra and Kafka named by the settings. Lateness is
measured at two points, each minus the occurrence's scheduled instant: when a read_committed
reader receives the fired message (so it includes the reader's own fetch delay), and when the
worker's handler starts (what a user's code sees: the worker's fetch, idempotency and slots
come on top).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from chronowheel.admin import init_namespace
from chronowheel.client import SchedulerClient
from chronowheel.core.recurrence import compile_schedule, occurrences
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.supervise import install_stop_signals
from chronowheel.testing import Collector, Fired, LatenessTally, wait_owned, wall_ms
from chronowheel.timeouts import wait_event
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


HERD = "herd"
OTHERS = ""  # every occurrence but the herd's: one-shots and recurring jobs
HANDLER_DRAIN_S = 30.0
"""After the run, how long the worker may take to start the handlers of what was received."""


@dataclass
class Tally:
    """What the demo saw, at two points: received by a read_committed reader, and started by
    the worker's handler (what a user's code sees)."""

    received: LatenessTally = field(default_factory=LatenessTally)
    started: LatenessTally = field(default_factory=LatenessTally)
    rejected: int = 0

    @property
    def unhandled(self) -> list[str]:
        """Occurrences received whose handler has not started (yet)."""
        return self.started.missing(self.received.seen)


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
                   herd: int = 10_000, shards: int = 8, out: TextIO = sys.stdout,
                   stop_on_signals: bool = False) -> int:
    """Run the whole demo; return 0 when every check holds (nothing received or handled early,
    twice, or not at all), 1 otherwise, 130 when stopped by a signal. With `stop_on_signals`,
    the first SIGTERM/SIGINT ends the run early (summary included), a second aborts."""
    settings = settings.replace(shards=shards, http_port=settings.http_port or 0)
    say = _printer(out)
    say(f"namespace {settings.namespace}: creating keyspace and topics ({shards} shards)")
    await init_namespace(settings)
    stop = asyncio.Event()
    if stop_on_signals:
        install_stop_signals(stop.set, graceful="ending the demo early: stopping the worker and "
                                                 "the node, then the summary")
    node = Node(settings, node_id="demo-node")
    tally = Tally()
    herd_ids: set[str] = set()

    def group(job_id: str) -> str:
        return HERD if job_id in herd_ids else OTHERS

    async def handle(occ: Occurrence) -> None:
        # What a user sees: when the handler starts, against the instant the job was due.
        tally.started.observe(occ.occurrence, occ.scheduled_ms, wall_ms(),
                              group=group(occ.job_id))

    def received(m: Fired) -> None:
        if m.topic == settings.rejected_topic:
            tally.rejected += 1
        else:
            tally.received.observe(m.occurrence, m.scheduled_ms, m.received_ms,
                                   fired_ms=m.fired_ms, group=group(m.job_id))

    worker = Worker(settings, handlers={settings.fired_topic: handle}, concurrency=64)
    reader = Collector(settings, (settings.fired_topic, settings.rejected_topic),
                       keep_messages=False, on_fired=received)
    await node.start()
    assert node.http is not None
    say(f"node started; metrics at http://127.0.0.1:{node.http.port}/metrics")
    await worker.start()
    await reader.start()
    plan: DemoPlan | None = None
    try:
        await wait_owned(node)
        plan = make_plan(_now(), one_shots=one_shots, herd=herd, seconds=seconds)
        herd_ids.update(plan.herd)
        say(f"submitting {one_shots} one-shot jobs over the next {seconds - 20}s, "
            f"{len(RECURRING)} recurring jobs (London, New York, Kolkata, every 5s), "
            f"a {herd}-job herd at {_clock(plan.herd_at_ms)}, and 3 bad commands")
        first_recurring = await _submit(settings, plan)
        say(f"submitted in {(_now() - plan.start_ms) / 1000:.1f}s")

        async def every_2s(until_ms: int, done: Callable[[], bool] = lambda: False) -> None:
            while _now() < until_ms and not stop.is_set() and not done():
                await wait_event(stop, 2)
                say(_status_line(tally, plan))
                reader.check_alive()
                if node._failure is not None or worker.failure is not None:
                    raise RuntimeError(f"a component failed: {node._failure or worker.failure!r}")

        await every_2s(plan.end_ms)
        await asyncio.sleep(2)  # let the last transactions reach the reader
        if tally.unhandled and not stop.is_set():
            say(f"waiting up to {HANDLER_DRAIN_S:.0f}s for the worker to start the handlers of "
                f"{len(tally.unhandled)} received occurrences")
            await every_2s(_now() + int(HANDLER_DRAIN_S * 1000), lambda: not tally.unhandled)
    finally:
        await reader.stop()
        await worker.shutdown()
        await node.shutdown()
    if plan is None:
        return 130
    ok = _summary(say, tally, plan, first_recurring)
    if stop.is_set():
        say("result: INTERRUPTED (ended early by a signal)")
        return 130
    return 0 if ok else 1


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


def _status_line(t: Tally, plan: DemoPlan) -> str:
    now = _now()
    due = sum(1 for at in plan.one_shots.values() if at <= now)
    if plan.herd_at_ms <= now:
        due += len(plan.herd)
    r, h = t.received, t.started
    return (f"t+{(now - plan.start_ms) / 1000:5.0f}s  fired {r.distinct:6d} "
            f"(one-shots due {due:6d})  lateness p50 {_ms(r.percentile(50, OTHERS))} "
            f"p99 {_ms(r.percentile(99, OTHERS))}  handler start p99 "
            f"{_ms(h.percentile(99, OTHERS))}  early {r.early + h.early}  duplicates "
            f"{r.duplicates + h.duplicates}  rejected {t.rejected}  worker handled {h.distinct}")


def _percentiles(tally: LatenessTally, group: str, qs: tuple[int, ...] = (50, 95, 99)) -> str:
    g = tally.group(group)
    return "  ".join([*(f"p{q} {_ms(g.percentile(q))}" for q in qs),
                      f"max {_ms(max(g.lateness_ms, default=None))}"])


def _summary(say: Callable[[str], None], t: Tally, plan: DemoPlan, first_recurring: int,
             ) -> bool:
    """Print the summary; whether every check holds."""
    r, h = t.received, t.started
    fired_ids = {occ.rsplit("@", 1)[0] for occ in r.seen}
    missing = [j for j in (*plan.one_shots, *plan.herd) if j not in fired_ids]
    unhandled = t.unhandled
    recurring = Counter(occ.rsplit("@", 1)[0] for occ in r.seen
                        if occ.rsplit("@", 1)[0] in {r[0] for r in RECURRING})
    expected = expected_recurring(plan, plan.end_ms, first_recurring)
    herd_received, herd_started = r.group(HERD), h.group(HERD)

    def after_herd(last_ms: float | None) -> float | None:
        return None if last_ms is None else last_ms - plan.herd_at_ms

    say("")
    say("summary")
    say(f"  occurrences fired      {r.distinct}")
    say(f"  one-shot + herd jobs   {len(plan.one_shots) + len(plan.herd) - len(missing)} of "
        f"{len(plan.one_shots) + len(plan.herd)} fired")
    for job_id, _, expr, tz in RECURRING:
        say(f"  {job_id:<16} {recurring[job_id]:3d} fires (about {expected[job_id]} expected; "
            f"{expr} {tz})")
    say(f"  lateness (ms)          {_percentiles(r, OTHERS)}"
        "  (all but the herd; read_committed receive time minus scheduled time)")
    say(f"  handler start (ms)     {_percentiles(h, OTHERS)}"
        "  (all but the herd; the worker's handler start minus scheduled time)")
    say(f"  herd lateness (ms)     receive {_percentiles(r, HERD, (50, 99))}; handler start "
        f"{_percentiles(h, HERD, (50, 99))}")
    say(f"  herd of {len(plan.herd)} at one second: last received "
        f"{_ms(after_herd(herd_received.last_observed_ms))} ms, last handler start "
        f"{_ms(after_herd(herd_started.last_observed_ms))} ms after that second")
    say(f"  early                  {r.early} received, {h.early} handler starts (must be 0)")
    say(f"  duplicates             {r.duplicates} received, {h.duplicates} handler starts "
        "(must be 0)")
    say(f"  rejected commands      {t.rejected} (3 were sent on purpose)")
    say(f"  handled by the worker  {h.distinct} of {r.distinct} received "
        f"({len(unhandled)} not started, must be 0)")
    ok = (r.early == 0 and h.early == 0 and r.duplicates == 0 and h.duplicates == 0
          and not missing and not unhandled and t.rejected == 3)
    if ok:
        say("result: OK")
    else:
        say(f"result: FAILED (missing {len(missing)}: {missing[:5]}; handler not started "
            f"{len(unhandled)}: {unhandled[:5]})")
    return ok


def _printer(out: TextIO) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(text, file=out, flush=True)
    return say


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def _now() -> int:
    return time.time_ns() // 1_000_000
