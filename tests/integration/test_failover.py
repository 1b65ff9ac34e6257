"""Failover with real `chronowheel node` processes and a read_committed collector.

1. kill -9 of one of two nodes while a 20,000-job burst is firing: the survivor takes over,
   every occurrence is published exactly once and none early.
2. Fencing: a node paused with SIGSTOP (while its transaction holds fired messages of its
   shards) past the session timeout loses its shards; after SIGCONT it publishes nothing for
   them (no duplicate is visible to read_committed readers).
3. Hot bucket: 50,000 jobs due at one instant are pre-warmed before their minute begins and all
   fire once, none early; the herd's duration is reported.
4. Graceful SIGTERM: the node exits 0 in time, the other node takes over, nothing is lost or
   duplicated.

Every wait is a bounded poll whose failure message carries the tail of each node's log.
Measurements (ingest rate, takeover time, lateness) are printed; run with `-s` to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from chronowheel.bus.kafka import reader
from chronowheel.core.buckets import MINUTE_MS
from chronowheel.core.shard import shard_of
from chronowheel.node.service import STOP_DEADLINE_S
from chronowheel.settings import Settings
from chronowheel.testing import percentile

from testkit.fleet import until
from tests.integration.harness import (
    Collector,
    Fired,
    NodeProcess,
    make_namespace,
    now_ms,
    produce,
    settled,
    upsert,
)
from tests.integration.offset_node import offset_prefix

pytestmark = pytest.mark.integration

# NodeProcess runs nodes with CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS=6000.
SESSION_TIMEOUT_MS = 6_000
# Ingest (validate + Cassandra writes) is the slow part of these tests, and its rate depends on
# the machine and on its load: from about 250 to over 1,000 jobs/s on two cores shared with
# Cassandra and Kafka. The big tests measure it first (`calibrate`) and plan their due times
# from it; the small ones plan with this floor.
INGEST_RATE_FLOOR = 250
DAY_MS = 86_400_000
POLL_S = 0.05


# --- processes ---------------------------------------------------------------------------------


class Nodes:
    """Node processes of one test; whatever still runs at the end is killed."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.all: list[NodeProcess] = []

    def start(self, settings: Settings, name: str, *, clock_offset_ms: int = 0,
              **env: str) -> NodeProcess:
        """A node process; with `clock_offset_ms` its clock runs that far ahead of this one's
        (offset_node.py; its clock-skew check is then relaxed)."""
        node = NodeProcess(settings, name, self.log_dir)
        if clock_offset_ms:
            node.args_prefix = offset_prefix(clock_offset_ms)
            env.setdefault("CHRONOWHEEL_MAX_CLOCK_SKEW_MS", str(10**12))
        node.start(**env)
        self.all.append(node)
        return node

    def tails(self, chars: int = 2_500) -> str:
        return "".join(f"\n--- {n.name} log tail ---\n{n.log_text()[-chars:]}" for n in self.all)

    def cleanup(self) -> None:
        for n in self.all:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()  # SIGKILL also ends a SIGSTOPped process
            if n.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.wait(30)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(tmp_path)
    try:
        yield n
    finally:
        n.cleanup()


def alive(node: NodeProcess) -> bool:
    return node.proc is not None and node.proc.poll() is None


def owned(node: NodeProcess) -> set[int] | None:
    """The shards a healthy node owns (all of them taken over), else None."""
    if not alive(node):
        return None
    h = node.health()
    if h is None or not h.get("ok"):
        return None
    return set(h.get("shards", []))


def sharing(shards: int, *members: NodeProcess) -> Callable[[], bool]:
    """Every member healthy and owning some shards; together all shards, each once."""
    def check() -> bool:
        sets = [owned(m) for m in members]
        if any(not s for s in sets):
            return False
        union: set[int] = set()
        for s in sets:
            assert s is not None
            if union & s:
                return False
            union |= s
        return union == set(range(shards))
    return check


def metric(node: NodeProcess, name: str) -> dict[str, float]:
    """Samples of one metric from the node's /metrics, keyed by their label set."""
    if node.http_port() is None or not alive(node):
        return {}
    try:
        samples = node.metrics(timeout_s=5)
    except OSError:
        return {}
    return {key[len(name):]: value for key, value in samples.items()
            if key == name or key.startswith(name + "{")}


def metric_sum(node: NodeProcess, name: str, shards: Iterable[int] | None = None) -> float:
    samples = metric(node, name)
    if shards is None:
        return sum(samples.values())
    wanted = {f'{{shard="{k}"}}' for k in shards}
    return sum(v for labels, v in samples.items() if labels in wanted)


# --- collecting --------------------------------------------------------------------------------


@dataclass
class Tap(Collector):
    """A Collector of the fired topic that also notes, per message, when it arrived here (this
    process's clock) and its Kafka record timestamp, and counts messages per partition."""

    received_ms: list[int] = field(default_factory=list)
    record_ms: list[int] = field(default_factory=list)
    per_partition: Counter[int] = field(default_factory=Counter)

    def on_message(self, record: Any, arrived_ms: int) -> None:
        self.received_ms.append(arrived_ms)
        self.record_ms.append(record.timestamp)
        self.per_partition[record.partition] += 1

    def occurrences(self) -> set[str]:
        return {m.occurrence for m in self.messages}

    def count_in(self, partitions: Iterable[int]) -> int:
        return sum(self.per_partition[p] for p in partitions)


@contextlib.asynccontextmanager
async def tapping(settings: Settings, isolation: str = "read_committed") -> AsyncIterator[Tap]:
    tap = Tap(settings, (settings.fired_topic,), isolation)
    await tap.start()
    try:
        yield tap
    finally:
        await tap.stop()


def occurrence(job_id: str, at: int) -> str:
    return f"{job_id}@{at}"


def assert_exactly_once(tap: Tap, jobs: dict[str, int]) -> None:
    counts = Counter(m.occurrence for m in tap.messages)
    dupes = {k: c for k, c in counts.items() if c > 1}
    assert not dupes, (f"{len(dupes)} occurrences published more than once (read_committed), "
                       f"e.g. {sorted(dupes.items())[:5]}")
    expected = {occurrence(j, at) for j, at in jobs.items()}
    missing = expected - counts.keys()
    extra = counts.keys() - expected
    assert not missing, f"{len(missing)} occurrences never published, e.g. {sorted(missing)[:5]}"
    assert not extra, f"{len(extra)} unexpected occurrences, e.g. {sorted(extra)[:5]}"


def assert_never_early(tap: Tap, clock_offset_ms: int = 0) -> None:
    """Judged three ways: the node's cw-fired-at, the record's timestamp (set when the node's
    producer appended it, before the commit) and this process's clock at arrival; the last
    two on the node's clock when it runs `clock_offset_ms` ahead."""
    off = clock_offset_ms
    early = [(m.occurrence, m.fired_ms - m.scheduled_ms, ts + off - m.scheduled_ms,
              recv + off - m.scheduled_ms)
             for m, ts, recv in zip(tap.messages, tap.record_ms, tap.received_ms, strict=True)
             if min(m.fired_ms, ts + off, recv + off) < m.scheduled_ms]
    assert not early, (f"{len(early)} occurrences published early (occurrence, fired-at, record "
                       f"timestamp, arrival, each minus scheduled ms): {early[:5]}")


def distribution(values: list[float]) -> str:
    if not values:
        return "n=0"
    s = sorted(values)
    q = {p: percentile(s, p) for p in (50, 90, 99)}
    return (f"n={len(s)} min={s[0]:.0f} p50={q[50]:.0f} p90={q[90]:.0f} p99={q[99]:.0f} "
            f"max={s[-1]:.0f} (ms)")


def lateness_report(tap: Tap, title: str, keep: Callable[[Fired], bool],
                    clock_offset_ms: int = 0) -> None:
    fired = [float(m.fired_ms - m.scheduled_ms) for m in tap.messages if keep(m)]
    seen = [float(recv + clock_offset_ms - m.scheduled_ms)
            for m, recv in zip(tap.messages, tap.received_ms, strict=True) if keep(m)]
    print(f"  lateness, {title}: cw-fired-at {distribution(fired)}")
    print(f"  lateness, {title}: arrival     {distribution(seen)}")


async def submit(settings: Settings, jobs: dict[str, int]) -> None:
    await produce(settings, (upsert(j, at=at, payload={"job": j}) for j, at in jobs.items()))


def ingested(*members: NodeProcess) -> float:
    return sum(metric_sum(m, "chronowheel_ingested_total") for m in members)


def ingest_budget_ms(n: int, rate: float = INGEST_RATE_FLOOR) -> int:
    """Time to plan for ingesting n jobs at `rate` jobs/s, with margin."""
    return int(n * 1000 * 1.3 / rate) + 2_000


async def calibrate(settings: Settings, nodes: Nodes, *members: NodeProcess) -> float:
    """Ingest rate (jobs/s) right now, from 2,000 jobs due tomorrow (none may fire during the
    test: an early one would show up as an unexpected occurrence)."""
    calibration = {f"calibration-{i:04d}": now_ms() + DAY_MS for i in range(2_000)}
    before = ingested(*members)
    t0 = now_ms()
    await submit(settings, calibration)
    await until(lambda: ingested(*members) >= before + len(calibration), 120,
                "the calibration jobs ingested", nodes)
    return len(calibration) * 1000 / (now_ms() - t0)


# --- 1. kill -9 during a burst -----------------------------------------------------------------


# Planned from the measured ingest rate: at the floor rate 20,000 jobs take ~100 s to ingest.
@pytest.mark.timeout(600)
async def test_kill_9_during_a_burst_loses_and_duplicates_nothing(
        stack: Any, namespace: str, nodes: Nodes) -> None:
    shards, n, spread_ms = 8, 20_000, 4_000
    settings = await make_namespace(stack, namespace, shards=shards)
    async with tapping(settings) as tap:
        a, b = nodes.start(settings, "a"), nodes.start(settings, "b")
        await until(sharing(shards, a, b), 90, "two nodes sharing the shards", nodes)
        a_shards = owned(a) or set()
        rate = await calibrate(settings, nodes, a, b)
        # Due in one burst, after the time ingest needs.
        t_submit = now_ms()
        burst = t_submit + ingest_budget_ms(n, rate) + 3_000
        jobs = {f"burst-{i:05d}": burst + i * spread_ms // n for i in range(n)}
        await submit(settings, jobs)
        await until(lambda: ingested(a, b) >= n + 2_000, (burst - now_ms()) / 1000 + 120,
                    f"{n} jobs ingested", nodes)
        ingest_s = (now_ms() - t_submit) / 1000  # from the first send
        print(f"\n[kill -9] calibration {rate:.0f} jobs/s; ingest of {n} jobs by 2 nodes / "
              f"{shards} shards took {ingest_s:.1f} s: {n / ingest_s:.0f} jobs/s; the burst "
              f"starts {(burst - now_ms()) / 1000:.1f} s after ingest finished")

        victim_jobs = {j: at for j, at in jobs.items() if shard_of(j, shards) in a_shards}
        # Kill half a second into the burst, once node a has visibly published some of it.
        await until(lambda: now_ms() >= burst + 500 and tap.count_in(a_shards) > 0,
                    (burst - now_ms()) / 1000 + 120, "the burst to start on node a", nodes)
        a.kill()
        kill_ms = now_ms()
        seen_at_kill = tap.count_in(a_shards)
        pending = sum(1 for at in victim_jobs.values() if at > kill_ms)
        print(f"[kill -9] killed node a (shards {sorted(a_shards)}) with {seen_at_kill} of its "
              f"{len(victim_jobs)} jobs visible and {pending} not yet due")
        # Never early: jobs due after the kill cannot have been published by node a. (Fails
        # only if ingest ran far slower than calibrated, into the burst.)
        assert pending > 0, "the kill came after the burst: ingest was slower than calibrated"

        takeover_s = await until(lambda: owned(b) == set(range(shards)),
                                 SESSION_TIMEOUT_MS / 1000 + 30, "node b to own every shard",
                                 nodes)
        # The group notices the dead node after the session timeout; then a rebalance and the
        # takeover (fencing, watermark, loading) follow, and the overdue jobs fire.
        assert takeover_s < SESSION_TIMEOUT_MS / 1000 + 10, \
            f"node b took {takeover_s:.1f} s to own and serve every shard{nodes.tails()}"
        all_s = await until(lambda: len(tap.occurrences()) >= n, 120,
                            f"all {n} occurrences published", nodes)
        await settled(settings, tap)  # a late duplicate would show up here
        last_victim = max(m.fired_ms for m in tap.messages if m.partition in a_shards)
        print(f"[kill -9] node b owned every shard {takeover_s:.1f} s after the kill; all "
              f"published {takeover_s + all_s:.1f} s after it; last of node a's shards fired "
              f"{(last_victim - kill_ms) / 1000:.1f} s after the kill")
        lateness_report(tap, "node b's own shards", lambda m: m.partition not in a_shards)
        lateness_report(tap, "node a's shards", lambda m: m.partition in a_shards)
        assert alive(b), f"node b died{nodes.tails()}"

    assert_exactly_once(tap, jobs)
    assert_never_early(tap)
    # Sanity: even the failed-over shards are published within a minute of their instant.
    worst = max(m.fired_ms - m.scheduled_ms for m in tap.messages)
    assert worst < 60_000, f"an occurrence was published {worst} ms late"


# --- 2. fencing of a paused owner --------------------------------------------------------------

OPEN_TRANSACTION_SEARCH_S = 5
TAKEOVER_BOUND_S = SESSION_TIMEOUT_MS // 1000 + 10


async def test_a_node_paused_past_its_session_publishes_nothing_for_lost_shards(
        stack: Any, namespace: str, nodes: Nodes) -> None:
    shards, dense, trail = 4, 1_000, 300
    settings = await make_namespace(stack, namespace, shards=shards)
    async with tapping(settings) as tap, tapping(settings, "read_uncommitted") as raw:
        a, b = nodes.start(settings, "a"), nodes.start(settings, "b")
        await until(sharing(shards, a, b), 90, "two nodes sharing the shards", nodes)
        a_shards = owned(a) or set()
        t0 = now_ms()
        stop_at = t0 + 3_000 + ingest_budget_ms(dense + trail)
        # A dense burst around the pause (node a is likely inside a transaction when it stops),
        # then a trail due until after the latest resume the test's own bounds allow (usually
        # about 8 s after the pause): the search for an open transaction (at most
        # OPEN_TRANSACTION_SEARCH_S), node b's takeover (asserted within the session timeout
        # plus 10 s) and 2 s of margin, so node a's wheel still holds jobs due after it.
        jobs = {f"dense-{i:04d}": stop_at - 500 + i * 2_000 // dense for i in range(dense)}
        trail_ms = (OPEN_TRANSACTION_SEARCH_S + TAKEOVER_BOUND_S + 2) * 1000
        jobs |= {f"trail-{i:04d}": stop_at + 1_500 + i * trail_ms // trail for i in range(trail)}
        n = len(jobs)
        await submit(settings, jobs)
        await until(lambda: ingested(a, b) >= n, (stop_at - now_ms()) / 1000 + 60,
                    f"{n} jobs ingested", nodes)
        in_a_wheel = metric_sum(a, "chronowheel_wheel_entries", a_shards)
        assert in_a_wheel > 0, f"node a holds no due entries for its shards{nodes.tails()}"
        late = (now_ms() - stop_at) / 1000
        await asyncio.sleep(max(0.0, -late))

        # Stop node a while its transaction holds messages of its shards: one producer per
        # node commits back to back during the burst, so a few tries find one open (a short
        # stop is far below the session timeout and changes nothing).
        held: dict[int, int] = {}
        async with OpenTransactions(settings, settings.fired_topic, a_shards) as probe:
            give_up = time.monotonic() + OPEN_TRANSACTION_SEARCH_S
            while time.monotonic() < give_up:
                a.signal(signal.SIGSTOP)
                held = await probe.held()
                if held:
                    break
                a.signal(signal.SIGCONT)
                await asyncio.sleep(0.01)
        stop_ms = now_ms()
        assert held, f"node a never had an open transaction on its shards{nodes.tails()}"
        takeover_s = await until(lambda: owned(b) == set(range(shards)), 60,
                                 "node b to own every shard while node a is stopped", nodes)
        assert takeover_s < TAKEOVER_BOUND_S, \
            f"node b took {takeover_s:.1f} s to own and serve every shard{nodes.tails()}"
        # node b publishes, for node a's former shards, jobs that came due during the pause
        await until(lambda: any(m.partition in a_shards and m.scheduled_ms > stop_ms + 1_000
                                for m in tap.messages), 30,
                    "node b to publish node a's jobs due during the pause", nodes)
        await asyncio.sleep(max(0.0, (stop_ms + SESSION_TIMEOUT_MS + 1_000 - now_ms()) / 1000))
        log_before_resume = len(a.log_text())  # a is stopped: it writes nothing meanwhile
        a.signal(signal.SIGCONT)
        cont_ms = now_ms()
        a_jobs = [at for j, at in jobs.items() if shard_of(j, shards) in a_shards]
        during = sum(1 for at in a_jobs if stop_ms < at <= cont_ms)
        after = sum(1 for at in a_jobs if at > cont_ms)
        print(f"\n[SIGSTOP] ingest done {-late:.1f} s before the pause; node a (shards "
              f"{sorted(a_shards)}) stopped with an open transaction of {sum(held.values())} "
              f"uncommitted fired records on partitions {sorted(held)}; stopped "
              f"{(cont_ms - stop_ms) / 1000:.1f} s holding "
              f"{in_a_wheel:.0f} wheel entries; node b owned every shard after "
              f"{takeover_s:.1f} s; {during} of node a's jobs came due during the pause, "
              f"{after} after it")
        # node a's wheel still held jobs overdue at the resume and jobs due later: publishing
        # any of them is what fencing must prevent.
        assert during > 0 and after > 0

        await until(lambda: len(tap.occurrences()) >= n, 60, f"all {n} occurrences", nodes)
        # After the resume, node a either keeps running (and rejoins) or exits cleanly.
        outcome = await rejoins_or_exits(a, nodes)
        # Anything due later than the last job, or a late duplicate, would show up here.
        await settled(settings, tap, raw, upto_ms=max(max(jobs.values()), now_ms()))
        raw_dupes = sum(c - 1 for c in Counter(m.occurrence for m in raw.messages).values())
        print(f"[SIGSTOP] after SIGCONT node a {outcome}; read_uncommitted readers saw "
              f"{raw_dupes} duplicate records (writes of an aborted transaction)")

    assert_exactly_once(tap, jobs)
    assert_never_early(tap)
    resumed = a.log_text()[log_before_resume:].splitlines()
    fenced = [ln for ln in resumed if "fenced by a newer owner" in ln]
    revoked = [ln for ln in resumed if "Revoking previously assigned partitions" in ln
               and any(f"partition={k})" in ln for k in a_shards)]
    print("[SIGSTOP] node a after the resume:\n  " + "\n  ".join((fenced + revoked)[:6]))
    assert fenced or revoked, f"node a never reported losing its shards{nodes.tails()}"


class OpenTransactions:
    """Which partitions of a topic hold records of a transaction that is still open: the
    high watermark (read_uncommitted) is past the last stable offset (read_committed)."""

    def __init__(self, settings: Settings, topic: str, partitions: Iterable[int]) -> None:
        self._tps = [TopicPartition(topic, k) for k in partitions]
        self._stable = reader(settings, isolation_level="read_committed")
        self._high = reader(settings, isolation_level="read_uncommitted")

    async def __aenter__(self) -> OpenTransactions:
        await self._stable.start()
        await self._high.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stable.stop()
        await self._high.stop()

    async def held(self) -> dict[int, int]:
        """partition -> records past its last stable offset, for partitions that have any."""
        stable = await self._stable.end_offsets(self._tps)
        high = await self._high.end_offsets(self._tps)
        return {tp.partition: high[tp] - stable[tp] for tp in self._tps
                if high[tp] > stable[tp]}


async def rejoins_or_exits(node: NodeProcess, nodes: Nodes) -> str:
    """Wait until a resumed node is healthy again (owning shards) or has exited 0."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if node.proc is not None and node.proc.poll() is not None:
            rc = node.proc.returncode
            assert rc == 0, f"{node.name} exited {rc}{nodes.tails()}"
            return "exited 0"
        if owned(node):
            return f"kept running and owns shards {sorted(owned(node) or ())} again"
        await asyncio.sleep(0.2)
    raise AssertionError(f"{node.name} neither rejoined nor exited in 60 s{nodes.tails()}")


# --- 3. hot bucket pre-warm --------------------------------------------------------------------

_PREWARMED = re.compile(r"shard (\d+): pre-warmed hot bucket (\d+) \((\d+) rows counted\) in "
                        r"(\d+) ms, (-?\d+) s ahead")


# Planned from the measured ingest rate: at the floor rate 50,000 jobs take ~260 s to ingest.
@pytest.mark.timeout(600)
async def test_a_hot_bucket_is_prewarmed_before_its_minute_and_its_herd_fires_once(
        stack: Any, namespace: str, nodes: Nodes) -> None:
    shards, n = 4, 50_000
    settings = await make_namespace(stack, namespace, shards=shards)
    ids = [f"herd-{i:05d}" for i in range(n)]
    per_shard = Counter(shard_of(j, shards) for j in ids)
    # Hot once a quarter of a shard's herd is ingested: the pre-warm reads that part from
    # Cassandra while ingest adds the rest straight into the pre-warmed minute.
    hot = min(per_shard.values()) // 4
    lookahead_ms = 2_000
    env = {"CHRONOWHEEL_LOOKAHEAD_MS": str(lookahead_ms),
           "CHRONOWHEEL_PREWARM_MS": str(10 * MINUTE_MS),
           "CHRONOWHEEL_HOT_BUCKET_ROWS": str(hot)}
    async with tapping(settings) as tap:
        # The ingest rate, measured by a node on this machine's clock, which then stops.
        first = nodes.start(settings, "calibration", **env)
        await until(lambda: owned(first) == set(range(shards)), 60,
                    "the calibration node to own all shards", nodes)
        rate = await calibrate(settings, nodes, first)
        first.signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, STOP_DEADLINE_S + 15) == 0, nodes.tails()

        # The midnight herd: every job at the first instant of one minute, after ingest. The
        # herd must turn hot while now + lookahead is still before its minute (the loader reads
        # whole minutes through now + lookahead; the pre-warm looks from the next minute to
        # load on). The herd's node runs its clock `offset` ahead, so that a minute of its
        # clock begins right when the plan needs it instead of up to a minute later.
        t_submit = now_ms()
        budget = ingest_budget_ms(n, rate) + 10_000  # + the node's start and takeover
        hot_by = t_submit + budget * 4 // 10
        earliest = max(t_submit + budget, hot_by + lookahead_ms + 10_000)
        offset = -(-earliest // MINUTE_MS) * MINUTE_MS - earliest
        minute = earliest + offset  # on the node's clock

        def node_now() -> int:
            return now_ms() + offset

        node = nodes.start(settings, "herd", clock_offset_ms=offset, **env)
        jobs = dict.fromkeys(ids, minute)
        await submit(settings, jobs)
        await until(lambda: owned(node) == set(range(shards)), 60, "the node to own all shards",
                    nodes)
        # Watch the pre-warm gauge until the minute begins, from the start of ingest: on a
        # loaded machine ingest can end after the minute began, the pre-warm well before it.
        prewarmed_seen: list[tuple[int, float]] = []

        def sample_until_minute() -> bool:
            t = node_now()
            if t >= minute - 200:
                return True
            v = metric_sum(node, "chronowheel_prewarmed_buckets")
            if node_now() < minute:
                prewarmed_seen.append((t, v))
            return False

        def ingested_all() -> bool:
            sample_until_minute()
            return ingested(node) >= n

        await until(ingested_all, (minute - node_now()) / 1000 + 120, f"{n} jobs ingested",
                    nodes)
        ingest_s = (now_ms() - t_submit) / 1000
        print(f"\n[herd] calibration: {rate:.0f} jobs/s; ingest of {n} jobs by 1 node / "
              f"{shards} shards took {ingest_s:.1f} s: {n / ingest_s:.0f} jobs/s (with the "
              f"node's start); the herd's minute begins {(minute - node_now()) / 1000:.1f} s "
              f"after ingest finished (node clock {offset} ms ahead)")

        await until(sample_until_minute, (minute - node_now()) / 1000 + 10,
                    "the herd's minute", nodes)
        await until(lambda: len(tap.occurrences()) >= n, 120, f"all {n} occurrences published",
                    nodes)
        # A late duplicate would show up here.
        await settled(settings, tap, upto_ms=node_now() + settings.ingest_slack_ms)
        histogram = metric(node, "chronowheel_lateness_seconds_bucket")

    assert_exactly_once(tap, jobs)
    assert_never_early(tap, offset)

    # Pre-warmed before the minute began: per the log (every shard) and per /metrics.
    lines = {int(m.group(1)): m for m in _PREWARMED.finditer(node.log_text())
             if int(m.group(2)) == minute}
    for k, m in sorted(lines.items()):
        print(f"[herd] shard {k}: pre-warmed {m.group(3)} counted rows in {m.group(4)} ms, "
              f"{m.group(5)} s ahead")
    assert set(lines) == set(range(shards)), \
        f"pre-warmed shards {sorted(lines)}, expected all {shards}{nodes.tails()}"
    assert all(int(m.group(3)) > hot and int(m.group(5)) > 0 for m in lines.values())
    assert any(v > 0 for _t, v in prewarmed_seen), \
        f"chronowheel_prewarmed_buckets stayed 0 before the minute: {prewarmed_seen[-5:]}"

    last_fired = max(m.fired_ms for m in tap.messages)
    last_seen = max(tap.received_ms) + offset
    print(f"[herd] minute start to last publish: {last_fired - minute} ms (cw-fired-at), "
          f"{last_seen - minute} ms (arrival here)")
    lateness_report(tap, "herd", lambda m: True, offset)
    cumulative = sorted((float(labels.split('"')[1]), v) for labels, v in histogram.items())
    p99 = next((le for le, v in cumulative if v >= 0.99 * cumulative[-1][1]), None)
    print(f"[herd] node's lateness histogram (slot to commit): 99% within {p99} s; "
          f"buckets {[(le, int(v)) for le, v in cumulative if v]}")


# --- 4. graceful SIGTERM -----------------------------------------------------------------------


async def test_sigterm_exits_0_in_time_and_the_other_node_takes_over_losing_nothing(
        stack: Any, namespace: str, nodes: Nodes) -> None:
    # Enough late jobs that node a is still applying them at the SIGTERM: with ingest in
    # groups it can apply its share of 3,000 in the moment between the check and the signal.
    shards, early, late = 4, 1_500, 12_000
    settings = await make_namespace(stack, namespace, shards=shards)
    async with tapping(settings) as tap:
        a, b = nodes.start(settings, "a"), nodes.start(settings, "b")
        await until(sharing(shards, a, b), 90, "two nodes sharing the shards", nodes)
        a_shards = owned(a) or set()
        t0 = now_ms()
        ready = t0 + 2_000 + ingest_budget_ms(early)
        # Ingested before the SIGTERM, due from before it until well after it.
        jobs = {f"early-{i:04d}": ready - 1_000 + i * 12_000 // early for i in range(early)}
        await submit(settings, jobs)
        await until(lambda: ingested(a, b) >= early, (ready - now_ms()) / 1000 + 60,
                    f"{early} jobs ingested", nodes)
        await asyncio.sleep(max(0.0, (ready - now_ms()) / 1000))
        # Submitted just before the SIGTERM: node a is still ingesting its share of these.
        later = {f"late-{i:04d}": now_ms() + 3_000 + i * 6_000 // late for i in range(late)}
        a_late = sum(1 for j in later if shard_of(j, shards) in a_shards)
        a_before = ingested(a)
        await submit(settings, later)
        jobs |= later
        await until(lambda: ingested(a) >= a_before + 20, 30, "node a ingesting the late jobs",
                    nodes)
        in_a_wheel = metric_sum(a, "chronowheel_wheel_entries", a_shards)
        a_applied = ingested(a) - a_before
        a.signal(signal.SIGTERM)
        term = time.monotonic()
        try:
            rc = await asyncio.to_thread(a.wait, STOP_DEADLINE_S + 15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node a still running {STOP_DEADLINE_S + 15:.0f} s after "
                                 f"SIGTERM{nodes.tails()}") from None
        exit_s = time.monotonic() - term
        # Pending work at the signal: due entries in its wheel and commands not yet applied.
        assert in_a_wheel > 0, f"node a held no due entries for its shards{nodes.tails()}"
        assert a_applied < a_late, "node a had ingested all its late jobs before the SIGTERM"
        assert rc == 0, f"node a exited {rc} after SIGTERM{nodes.tails()}"
        assert exit_s < STOP_DEADLINE_S, f"node a took {exit_s:.1f} s to stop"
        takeover_s = await until(lambda: owned(b) == set(range(shards)), 30,
                                 "node b to own every shard", nodes)
        print(f"\n[SIGTERM] node a (shards {sorted(a_shards)}, {in_a_wheel:.0f} wheel entries, "
              f"{a_applied:.0f} of its {a_late} late jobs applied) exited 0 in {exit_s:.1f} s; "
              f"node b owned every shard {time.monotonic() - term:.1f} s after the signal "
              f"({takeover_s:.1f} s after the exit)")
        await until(lambda: len(tap.occurrences()) >= len(jobs), 60,
                    f"all {len(jobs)} occurrences published", nodes)
        # Anything due later than the last job, or a late duplicate, would show up here.
        await settled(settings, tap, upto_ms=max(max(jobs.values()), now_ms()))
        lateness_report(tap, "node a's shards", lambda m: m.partition in a_shards)
        assert alive(b), f"node b died{nodes.tails()}"

    assert_exactly_once(tap, jobs)
    assert_never_early(tap)
    log_a = a.log_text()
    assert "stop requested: finishing open transactions, leaving the group" in log_a
    assert re.search(r"node \S+ stopped", log_a), f"no clean stop in node a's log{nodes.tails()}"
    assert "CRITICAL" not in log_a and "Traceback" not in log_a, nodes.tails(6_000)
