"""Fault scenarios against the local cluster profile: three `chronowheel node` processes, a
steady one-shot load plus a herd, a read_committed checker, and a fault in the middle.

Each scenario ends with a `ScenarioResult`: occurrences accepted (acknowledged by Kafka on
`<ns>.submit`), lost, early and duplicate ones, lateness (checker arrival minus scheduled
instant) of the steady load before and after the fault and of the herd, and the recovery time:
from the fault until the last steady occurrence that arrived later than the "late" bar, which
is `late_ms` or twice the steady p99 before the fault, whichever is more (so a busy machine's
usual lateness does not count as an outage); 0 when none did. Sizes scale with
CHRONOWHEEL_CHAOS_SCALE: 1 is the full size, the default 0.05 (the CI size) a twentieth.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from chronowheel.bus.kafka import plain_producer
from chronowheel.core import wire
from chronowheel.core.model import ValidationPolicy, encode_upsert, parse_command
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.ops.cluster import read_state_records
from chronowheel.settings import Settings
from chronowheel.testing.collect import Collector, Fired, wall_ms
from chronowheel.testing.lateness import LatenessTally, percentile
from chronowheel.timeouts import wait_event

from testkit.cluster import LocalCluster
from testkit.fleet import Fleet, until
from testkit.verdict import Verdict

SCALE_ENV = "CHRONOWHEEL_CHAOS_SCALE"
DEFAULT_SCALE = 0.05
RESTART_TIMEOUT_S = 600.0
"""How long a killed server may take to answer again and rejoin the cluster. A Cassandra
node restarted beside three loaded chronowheel nodes and five other JVMs on two cores took
223 s to rejoin (JVM start and commit-log replay starved of CPU), close to the stack's
default 300 s."""
STEADY, HERD = "steady", "herd"


def chaos_scale(env: dict[str, str] | None = None) -> float:
    """CHRONOWHEEL_CHAOS_SCALE: 1 runs the full sizes, the default 0.05 a twentieth."""
    raw = (env if env is not None else os.environ).get(SCALE_ENV, "").strip()
    if not raw:
        return DEFAULT_SCALE
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}: expected a number such as 1 or 0.05, got {raw!r}") \
            from None
    if not 0 < scale <= 10:
        raise ValueError(f"{SCALE_ENV}: must be in (0, 10], got {scale}")
    return scale


def scaled(full: int, scale: float, floor: int) -> int:
    return max(floor, round(full * scale))


@dataclass(frozen=True)
class Load:
    """The workload around one fault."""

    rate: int
    """steady one-shot jobs submitted (and due) per second"""
    herd: int
    """jobs due at one instant, a couple of seconds after the fault"""
    lead_ms: int = 4_000
    """each steady job is due this long after it is sent"""
    warmup_s: float = 8.0
    down_s: float = 15.0
    """how long the faulty server stays down"""
    after_s: float = 15.0
    """steady load after the server is back"""
    herd_ingest_rate: int = 1_000
    """jobs/s assumed for planning the herd's instant after its submission"""

    @classmethod
    def at_scale(cls, scale: float, **kw: Any) -> Load:
        """Full size: 400 jobs/s steady, a 20,000-job herd."""
        return cls(rate=scaled(400, scale, 40), herd=scaled(20_000, scale, 1_000), **kw)

    def describe(self) -> str:
        return f"{self.rate}/s steady + {self.herd:,} herd"


@dataclass(kw_only=True)
class ScenarioResult(Verdict):
    """A scenario's verdict: besides lost, early and duplicate occurrences, a scenario that
    accepted nothing measured nothing, and a chronowheel node that exited is a failure."""

    scenario: str = field(kw_only=False)
    load: str = field(kw_only=False)
    accepted: int = 0
    before_p99_ms: float | None = None
    """steady load due before the fault"""
    steady_p99_ms: float | None = None
    """steady load due from the fault on"""
    herd_p99_ms: float | None = None
    max_lateness_ms: float | None = None
    recovery_s: float | None = None
    restart_s: float | None = None
    victim: str = ""
    exited: list[str] = field(default_factory=list)
    """chronowheel nodes that were no longer running at the end"""
    notes: list[str] = field(default_factory=list)

    def row(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:,.0f} ms"

        rec = "-" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        return (f"| {self.scenario} | {self.load} | {self.accepted:,} | {self.lost} | "
                f"{self.early} | {self.duplicates} | {ms(self.before_p99_ms)} | "
                f"{ms(self.steady_p99_ms)} | {ms(self.herd_p99_ms)} | "
                f"{ms(self.max_lateness_ms)} | {rec} |")

    def summary(self) -> str:
        extra = f"; victim {self.victim}" if self.victim else ""
        restart = "" if self.restart_s is None else f"; restart {self.restart_s:.1f} s"
        notes = "".join(f"\n    {n}" for n in self.notes)
        return f"[chaos] {self.row()}{extra}{restart}{notes}"

    def problems(self) -> list[str]:
        out = []
        if self.accepted == 0:
            out.append("no job was accepted: the scenario measured nothing")
        out += super().problems()
        if self.exited:
            out.append(f"chronowheel nodes exited: {self.exited}")
        return out


class Checker:
    """A read_committed reader of `<ns>.fired` (from its end when started) that tallies each
    occurrence: steady or herd, lateness, early, duplicate; and notes the late ones."""

    def __init__(self, settings: Settings, herd_prefix: str) -> None:
        self.tally = LatenessTally()
        self.herd_prefix = herd_prefix
        self.steady: list[tuple[int, float]] = []
        """(scheduled ms, arrival ms) of each steady occurrence's first delivery"""
        self.collector = Collector(settings, keep_messages=False, from_end=True,
                                   on_fired=self.observe)

    def observe(self, f: Fired) -> None:
        group = HERD if f.job_id.startswith(self.herd_prefix) else STEADY
        first = self.tally.observe(f.occurrence, f.scheduled_ms, f.received_ms,
                                   fired_ms=f.fired_ms, group=group)
        if first and group == STEADY:
            self.steady.append((f.scheduled_ms, f.received_ms))

    def recovery(self, fault_ms: int, late_ms: float) -> tuple[float | None, float | None,
                                                                float, float]:
        """(steady p99 before the fault, from the fault on, the late bar, recovery seconds)."""
        before = sorted(r - s for s, r in self.steady if s < fault_ms)
        after = sorted(r - s for s, r in self.steady if s >= fault_ms)
        before_p99 = percentile(before, 99)
        bar = max(late_ms, 2 * (before_p99 or 0.0))
        late = [r for s, r in self.steady if r >= fault_ms and r - s > bar]
        return (before_p99, percentile(after, 99), bar,
                (max(late) - fault_ms) / 1000 if late else 0.0)

    async def start(self) -> Checker:
        await self.collector.start()
        return self

    async def stop(self) -> None:
        await self.collector.stop()


class Workload:
    """Submits one-shot jobs to `<ns>.submit`; `expected` holds every occurrence Kafka
    acknowledged (a send that failed was never accepted, so it is not expected)."""

    def __init__(self, settings: Settings, prefix: str) -> None:
        self.settings = settings
        self.prefix = prefix
        self.expected: dict[str, int] = {}
        self.failed_sends = 0
        self._producer = plain_producer(settings, linger_ms=5)
        self._seq = 0
        self._pending: set[asyncio.Future[Any]] = set()

    async def start(self) -> Workload:
        await self._producer.start()
        return self

    async def stop(self) -> None:
        await self.flush()
        await self._producer.stop()

    def _accepted(self, occurrence: str, at_ms: int) -> Callable[[asyncio.Future[Any]], None]:
        def done(fut: asyncio.Future[Any]) -> None:
            self._pending.discard(fut)
            if fut.cancelled() or fut.exception() is not None:
                self.failed_sends += 1
            else:
                self.expected[occurrence] = at_ms
        return done

    async def send(self, job_id: str, at_ms: int, extra: dict[str, Any] | None = None) -> None:
        payload = {"n": job_id, **(extra or {})}
        value = encode_upsert({"id": job_id, "at": at_ms, "payload": payload})
        fut = await self._producer.send(self.settings.submit_topic, value, key=job_id.encode())
        self._pending.add(fut)
        fut.add_done_callback(self._accepted(wire.occurrence_id(job_id, at_ms), at_ms))

    async def flush(self) -> None:
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def steady(self, rate: int, lead_ms: int, stop: asyncio.Event) -> None:
        """`rate` jobs per second, each due `lead_ms` after it is sent, until `stop`."""
        step_s, owed = 0.1, 0.0
        next_at = time.monotonic()
        while not stop.is_set():
            owed += rate * step_s
            now = int(wall_ms())
            while owed >= 1:
                owed -= 1
                self._seq += 1
                await self.send(f"{self.prefix}s{self._seq:08d}", now + lead_ms)
            next_at += step_s
            await wait_event(stop, max(0.0, next_at - time.monotonic()))

    async def herd(self, n: int, at_ms: int) -> None:
        for i in range(n):
            await self.send(f"{self.prefix}h{i:07d}", at_ms)
        await self.flush()


Fault = Callable[[], Awaitable[str]]
"""Injects a fault; returns what it hit (e.g. the server killed)."""
Heal = Callable[[], Awaitable[float]]
"""Undoes it; returns the seconds until the server was serving again."""


async def run_scenario(name: str, settings: Settings, load: Load, log_dir: Path, *,
                       fault: Fault | None = None, heal: Heal | None = None,
                       during: Callable[[Workload], Coroutine[Any, Any, None]] | None = None,
                       late_ms: float = 1_000, drain_timeout_s: float = 180,
                       say: Callable[[str], None] = print) -> ScenarioResult:
    """Three nodes, steady load, a herd due two seconds after the fault, the fault held for
    `load.down_s`, healed, more load, then the verdict. `during` runs beside the load (e.g.
    bad commands) instead of, or besides, a fault."""
    prefix = f"{name[:12]}-"
    checker = await Checker(settings, f"{prefix}h").start()
    nodes = Fleet(settings, log_dir)
    workload = await Workload(settings, prefix).start()
    result = ScenarioResult(name, load.describe())
    stop = asyncio.Event()
    steady: asyncio.Task[None] | None = None
    beside: asyncio.Task[None] | None = None
    try:
        nodes.start_many(3)
        took = await nodes.wait_sharing()
        say(f"[chaos] {name}: three nodes share {settings.shards} shards after {took:.1f}s")
        steady = asyncio.create_task(workload.steady(load.rate, load.lead_ms, stop))
        await asyncio.sleep(load.warmup_s)
        herd_budget_ms = load.herd * 1000 // load.herd_ingest_rate + 3_000
        fault_ms = int(wall_ms()) + herd_budget_ms
        herd_at = fault_ms + 2_000
        t_herd = time.monotonic()
        await workload.herd(load.herd, herd_at)
        say(f"[chaos] {name}: herd of {load.herd:,} submitted in "
            f"{time.monotonic() - t_herd:.1f}s, due in {(herd_at - wall_ms()) / 1000:.1f}s")
        if during is not None:
            beside = asyncio.create_task(during(workload))
        await asyncio.sleep(max(0.0, (fault_ms - wall_ms()) / 1000))
        fault_ms = int(wall_ms())
        if fault is not None:
            result.victim = await fault()
            say(f"[chaos] {name}: fault injected: {result.victim}")
        await asyncio.sleep(load.down_s)
        if heal is not None:
            result.restart_s = await heal()
            say(f"[chaos] {name}: healed after {result.restart_s:.1f}s")
        await asyncio.sleep(load.after_s)
        if beside is not None:
            await beside
        stop.set()
        await steady
        await workload.flush()
        expected = workload.expected

        def all_seen() -> bool:
            checker.collector.check_alive()
            return all(o in checker.tally.seen for o in expected)

        with contextlib.suppress(AssertionError):
            await until(all_seen, drain_timeout_s, "every accepted occurrence", nodes)
        await asyncio.sleep(3)  # a late duplicate would arrive here
        dead = nodes.dead()
        result.exited = dead
        if dead:
            result.notes.append(f"nodes exited: {dead}")
        tally = checker.tally
        missing = tally.missing(expected)
        result.accepted = len(expected)
        result.lost = len(missing)
        result.lost_examples = missing[:10]
        if missing:
            result.notes += await explain_missing(settings, missing, expected, checker, log_dir)
        result.early = tally.early
        result.duplicates = tally.duplicates
        result.herd_p99_ms = tally.percentile(99, HERD)
        every = tally.lateness_ms()
        result.max_lateness_ms = max(every) if every else None
        result.before_p99_ms, result.steady_p99_ms, bar, result.recovery_s = \
            checker.recovery(fault_ms, late_ms)
        load1, load5, _ = os.getloadavg()
        result.notes.append(f"late bar {bar:,.0f} ms; machine load average {load1:.1f} (1 min), "
                            f"{load5:.1f} (5 min) at the end")
        if workload.failed_sends:
            result.notes.append(f"{workload.failed_sends} submissions not acknowledged by "
                                "Kafka (not accepted, so not expected)")
        if dead:
            result.notes.append(nodes.tails())
        return result
    finally:
        stop.set()
        for task in (steady, beside):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        await workload.stop()
        await asyncio.to_thread(nodes.stop)
        await checker.stop()


async def explain_missing(settings: Settings, missing: list[str], expected: dict[str, int],
                          checker: Checker, log_dir: Path, log_lines: int = 25) -> list[str]:
    """What a failed run needs to be understood without its logs: the shards the missing
    occurrences belong to and when they were due, where the live checker stands on each fired
    partition against its end, whether a fresh reader from the beginning finds them
    (read_committed, then read_uncommitted: present only there means left in an open or
    aborted transaction), each shard's committed state record, and the nodes' own warnings."""
    notes: list[str] = []
    shards: dict[int, list[int]] = {}
    for o in missing:
        job_id = o.rsplit("@", 1)[0]
        shards.setdefault(shard_of(job_id, settings.shards), []).append(expected[o])
    now = int(wall_ms())
    for k, due in sorted(shards.items()):
        notes.append(f"missing on shard {k}: {len(due)}, due {(min(due) - now) / 1000:+.1f} s "
                     f"to {(max(due) - now) / 1000:+.1f} s from now")
    with contextlib.suppress(Exception):
        standing = await checker.collector.standing()
        notes.append("live checker (partition: next offset / last stable offset): " + ", ".join(
            f"{tp.partition}: {pos}/{end}" for tp, (pos, end) in sorted(standing.items())))
    for isolation in ("read_committed", "read_uncommitted"):
        found: set[str] = set()
        wanted = set(missing)

        def keep(f: Fired, found: set[str] = found, wanted: set[str] = wanted) -> None:
            with contextlib.suppress(KeyError):
                if f.occurrence in wanted:
                    found.add(f.occurrence)
        again = Collector(settings, isolation=isolation, keep_messages=False, on_fired=keep)
        try:
            await again.start()
            await again.read_to_end(timeout_s=60)
        except Exception as exc:  # a diagnostic: say why it could not look
            notes.append(f"a fresh {isolation} reader could not read to the end: {exc!r}")
            continue
        finally:
            with contextlib.suppress(Exception):
                await again.stop()
        notes.append(f"a fresh {isolation} reader from the beginning finds {len(found)} of "
                     f"the {len(missing)} missing")
    with contextlib.suppress(Exception):
        records = await read_state_records(settings, settings.shards)
        notes.append("state records: " + "; ".join(
            f"shard {k}: watermark {(r.watermark - now) / 1000:+.1f} s, owner {r.owner}"
            for k, r in sorted(records.items())))
    for log in sorted(log_dir.glob("*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if (" WARNING " in line or " ERROR " in line) and " aiokafka" not in line]
        if lines:
            notes.append(f"{log.name}, its last {min(log_lines, len(lines))} of {len(lines)} "
                         "warnings and errors:\n      " + "\n      ".join(
                             line[:300] for line in lines[-log_lines:]))
    with contextlib.suppress(Exception):  # the brokers' own errors (e.g. transaction markers)
        members = await asyncio.to_thread(LocalCluster().members)
        for name, member in sorted(members.items()):
            if not name.startswith("kafka") or not member.log.exists():
                continue
            errors = [line for line in member.log.read_text(errors="replace").splitlines()
                      if " ERROR " in line or (" WARN " in line and any(
                          w in line for w in ("TransactionMarker", "TransactionCoordinator",
                                              "TransactionStateManager")))]
            if errors:
                notes.append(f"{name}'s log, its last {min(log_lines, len(errors))} of "
                             f"{len(errors)} errors and transaction warnings:\n      " +
                             "\n      ".join(line[:300] for line in errors[-log_lines:]))
    return notes


# --- server faults -----------------------------------------------------------------------------


@dataclass
class ServerFault:
    """kill -9 of one server of the cluster profile (`pick` chooses it at the moment of the
    fault), and its restart: until it answers, the cluster has formed again and, for Kafka,
    every partition of the namespace's submit and fired topics has three in-sync replicas."""

    cluster: LocalCluster
    settings: Settings
    pick: Callable[[], Awaitable[tuple[str, str]]]
    """(server name, a description of why it was chosen)"""
    victim: str = ""

    @property
    def topics(self) -> tuple[str, str]:
        return (self.settings.submit_topic, self.settings.fired_topic)

    async def inject(self) -> str:
        name, why = await self.pick()
        await asyncio.to_thread(self.cluster.kill, name)
        self.victim = name
        return f"{name} ({why})" if why else name

    async def heal(self) -> float:
        took = await asyncio.to_thread(self.cluster.start, self.victim, RESTART_TIMEOUT_S)
        if self.victim.startswith("kafka"):
            took += await self.cluster.wait_in_sync(self.settings, self.topics, 3)
        return took


def cassandra_node(cluster: LocalCluster, settings: Settings,
                   name: str = "cassandra-3") -> ServerFault:
    async def pick() -> tuple[str, str]:
        return name, "one of three replicas of every row"
    return ServerFault(cluster, settings, pick)


def busiest_kafka_leader(cluster: LocalCluster, settings: Settings) -> ServerFault:
    async def pick() -> tuple[str, str]:
        topics = (settings.submit_topic, settings.fired_topic)
        name, led = await cluster.busiest_leader(settings, topics)
        return name, f"leader of {led} of {2 * settings.shards} submit and fired partitions"
    return ServerFault(cluster, settings, pick)


def active_controller(cluster: LocalCluster, settings: Settings) -> ServerFault:
    async def pick() -> tuple[str, str]:
        return await asyncio.to_thread(cluster.active_controller), "the active KRaft controller"
    return ServerFault(cluster, settings, pick)


async def new_controller(cluster: LocalCluster, old: str, timeout_s: float = 60,
                         poll_s: float = 0.2) -> tuple[str, float]:
    """(name, seconds) of the first KRaft leader other than `old` that the live nodes know
    (proves an election). Moments in which no live node knows any leader, as while the
    survivors stand as candidates, are waited through."""
    t0 = time.monotonic()
    while True:
        leader = await asyncio.to_thread(cluster.quorum_leader)
        if leader is not None and leader != old:
            return leader, time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"no new KRaft leader {timeout_s:.0f}s after {old} died "
                                 f"(last known: {leader or 'none'})")
        await asyncio.sleep(poll_s)


# --- soak ----------------------------------------------------------------------------------------


@dataclass
class SoakSample:
    at_s: float
    rss_mb: list[float]
    max_lag_s: float
    delivered: int


async def run_soak(settings: Settings, cluster: LocalCluster, log_dir: Path, *, rate: int,
                   minutes: float, fault_every_s: float, down_s: float = 20.0,
                   lead_ms: int = 4_000, sample_every_s: float = 15.0,
                   say: Callable[[str], None] = print) -> tuple[ScenarioResult, list[SoakSample]]:
    """`rate` one-shot jobs/s for `minutes` on three nodes, one server fault every
    `fault_every_s` (a Cassandra node, the busiest Kafka leader, the KRaft controller, in
    turn; each restarted after `down_s`), with RSS and dispatch lag sampled."""
    prefix = "soak-"
    checker = await Checker(settings, f"{prefix}h").start()
    nodes = Fleet(settings, log_dir)
    workload = await Workload(settings, prefix).start()
    makers = [lambda: cassandra_node(cluster, settings, "cassandra-2"),
              lambda: busiest_kafka_leader(cluster, settings),
              lambda: active_controller(cluster, settings)]
    result = ScenarioResult("soak", f"{rate}/s for {minutes:g} min, a fault every "
                                    f"{fault_every_s:g} s")
    samples: list[SoakSample] = []
    stop = asyncio.Event()
    steady: asyncio.Task[None] | None = None
    try:
        nodes.start_many(3)
        await nodes.wait_sharing()
        t0 = time.monotonic()
        steady = asyncio.create_task(workload.steady(rate, lead_ms, stop))
        end = t0 + minutes * 60
        next_fault = t0 + fault_every_s
        next_sample = t0
        faults = 0
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                samples.append(await asyncio.to_thread(_sample, nodes, now - t0,
                                                       checker.tally.distinct))
                s = samples[-1]
                say(f"[soak] {s.at_s:5.0f}s rss MB {s.rss_mb} max lag {s.max_lag_s:.1f}s "
                    f"delivered {s.delivered:,} accepted {len(workload.expected):,}")
                next_sample += sample_every_s
            if now >= next_fault and now + down_s + 30 < end:
                fault = makers[faults % len(makers)]()
                faults += 1
                what = await fault.inject()
                say(f"[soak] fault {faults}: killed {what}")
                await asyncio.sleep(down_s)
                took = await fault.heal()
                say(f"[soak] fault {faults}: {fault.victim} back after {took:.1f}s")
                result.notes.append(f"fault {faults}: {what}, back after {took:.1f}s")
                next_fault += fault_every_s
            if nodes.dead():
                break
            await asyncio.sleep(1.0)
        stop.set()
        await steady
        await workload.flush()
        expected = workload.expected
        with contextlib.suppress(AssertionError):
            await until(lambda: all(o in checker.tally.seen for o in expected), 300,
                        "every accepted occurrence", nodes)
        await asyncio.sleep(3)
        tally = checker.tally
        missing = tally.missing(expected)
        result.accepted, result.lost, result.lost_examples = len(expected), len(missing), \
            missing[:10]
        result.early, result.duplicates = tally.early, tally.duplicates
        every = tally.lateness_ms()
        result.steady_p99_ms = tally.percentile(99, STEADY)
        result.max_lateness_ms = max(every) if every else None
        dead = nodes.dead()
        result.exited = dead
        if dead:
            result.notes.append(f"nodes exited: {dead}{nodes.tails()}")
        return result, samples
    finally:
        stop.set()
        if steady is not None and not steady.done():
            steady.cancel()
            with contextlib.suppress(BaseException):
                await steady
        await workload.stop()
        await asyncio.to_thread(nodes.stop)
        await checker.stop()


def _sample(nodes: Fleet, at_s: float, delivered: int) -> SoakSample:
    rss, lag = [], 0.0
    for n in nodes.nodes:
        r = n.rss_bytes() if n.alive() else None
        rss.append(round((r or 0) / 2**20, 1))
        with contextlib.suppress(OSError):
            m = n.metrics(timeout_s=5)
            lag = max([lag, *(v for k, v in m.items()
                               if k.startswith("chronowheel_dispatch_lag_seconds"))])
    return SoakSample(round(at_s, 1), rss, lag, delivered)


# --- bad input ---------------------------------------------------------------------------------


def _valid_doc(job_id: str, at_ms: int) -> dict[str, Any]:
    return {"v": 1, "op": "upsert", "job": {"id": job_id, "at": at_ms, "payload": {"k": 1}}}


def _mutations(rng: random.Random, job_id: str, at_ms: int,
               policy: ValidationPolicy) -> list[Callable[[], tuple[bytes | None, bytes]]]:
    """Ways to spoil a command; each returns (record key, record value)."""
    key = job_id.encode()

    def doc_with(**job: Any) -> bytes:
        d = _valid_doc(job_id, at_ms)
        d["job"].update(job)
        return orjson.dumps(d)

    def without(name: str) -> bytes:
        d = _valid_doc(job_id, at_ms)
        del d["job"][name]
        return orjson.dumps(d)

    def junk(n: int) -> bytes:
        return bytes(rng.getrandbits(8) for _ in range(n))

    valid = orjson.dumps(_valid_doc(job_id, at_ms))
    return [
        lambda: (key, junk(rng.randint(1, 64))),
        lambda: (key, b""),
        lambda: (key, valid[: rng.randint(1, len(valid) - 1)]),
        lambda: (key, rng.choice([b"[]", b"42", b'"text"', b"null", b"true", b"{}"])),
        lambda: (key, orjson.dumps({"op": "upsert", "job": {"id": job_id, "at": at_ms}})),
        lambda: (key, orjson.dumps({"v": rng.choice([0, 2, "1", 1.0, None]), "op": "upsert",
                                    "job": {"id": job_id, "at": at_ms}})),
        lambda: (key, orjson.dumps({"v": 1, "op": rng.choice(["insert", "", "UPSERT", 7]),
                                    "job": {"id": job_id, "at": at_ms}})),
        lambda: (key, orjson.dumps({"v": 1, "op": "upsert",
                                    "job": rng.choice([None, [], "job", 3])})),
        lambda: (key, without("at")),
        lambda: (key, doc_with(at=rng.choice(["soon", "2026-13-01T00:00:00Z", -5, 1.5, True,
                                               [], {}, "2026-12-01 09:00"]))),
        lambda: (key, doc_with(at=at_ms + policy.max_horizon_ms + 86_400_000)),
        lambda: (rng.choice([b"other-key", b"", key + b"x"]), valid),
        lambda: (None, doc_with(id=rng.choice([None, 5, "", "x" * (policy.max_id_bytes + 1)]))),
        lambda: (key, doc_with(**{rng.choice(["when", "payloads", "retries", "ID"]): 1})),
        lambda: (key, doc_with(topic=rng.choice([wire.submit_topic(policy.namespace),
                                                  "__consumer_offsets", "bad topic!", "other"]))),
        lambda: (key, doc_with(payload_b64=rng.choice(["not base64!", "abc", "===="]))),
        lambda: (key, doc_with(headers={wire.RESERVED_HEADER_PREFIX + "job-id": "x"})),
        lambda: (key, doc_with(cron=rng.choice(["61 * * * *", "* * *", "every day"]),
                               tz="UTC")),
        lambda: (key, doc_with(cron="0 9 * * *",
                               tz=rng.choice(["Mars/Olympus", "UTC+25", "localtime"]))),
        lambda: (key, doc_with(every=rng.choice(["0s", "-5s", "soon", 0]))),
    ]


def bad_commands(n: int, policy: ValidationPolicy, *, prefix: str, at_ms: int,
                 seed: int = 12) -> Iterator[tuple[bytes | None, bytes]]:
    """`n` malformed or invalid `<ns>.submit` records (seeded), each checked against the
    project's own validator to be refused, so none of them may fire."""
    rng = random.Random(seed)
    made = 0
    while made < n:
        job_id = f"{prefix}bad{made:07d}"
        ways = _mutations(rng, job_id, at_ms, policy)
        key, value = rng.choice(ways)()
        try:
            parse_command(value, key=key, policy=policy, now_ms=int(wall_ms()))
        except ValidationError:
            made += 1
            yield key, value
