"""The phases of a benchmark run against one `chronowheel node` process: ingest, the dispatch
ladder and the herd, each measured by a read_committed probe on <ns>.fired; and the run itself,
which creates the namespace, measures the limits, runs the phases and drops the namespace."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from chronowheel.bus.kafka import plain_producer
from chronowheel.settings import Settings
from chronowheel.testing import (
    Collector,
    Fired,
    GroupTally,
    LatenessTally,
    NodeProcess,
    drop_namespace,
    metric_sum,
    require_loopback,
    summarize,
    wall_ms,
)
from common import (
    LOG_DIR,
    ON_TIME_P99_MS,
    ROOT,
    Config,
    fmt,
    phase_of,
    say,
    stored_commands,
    upserts,
)
from limits import measure_limits
from machine import machine_info
from report import record_memory, render_table, summary, write_outputs


class BenchNode(NodeProcess):
    """The node under test, whose /metrics answers are timed and retried: its event loop serves
    them, so a slow answer means a busy or blocked loop."""

    def __init__(self, settings: Settings, log_path: Path, extra_env: dict[str, str],
                 profile_path: Path | None) -> None:
        super().__init__(settings, log_path, env=extra_env, profile_path=profile_path, cwd=ROOT)
        self.slowest_scrape_s = 0.0

    def start(self, **env_overrides: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")  # one run per log
        super().start(**env_overrides)

    async def ready(self, timeout_s: float) -> None:
        def waiting(_shards: list[int] | None) -> None:
            say("waiting for the node to own every shard ...")

        await self.wait_ready(timeout_s, progress=waiting)

    async def scrape(self) -> dict[str, float]:
        """The node's /metrics, as {'name{labels}': value}; retried twice."""
        for attempt in range(3):
            t0 = time.monotonic()
            try:
                return await asyncio.to_thread(self.metrics)
            except (OSError, TimeoutError) as exc:
                if attempt == 2 or not self.alive():
                    raise RuntimeError(
                        f"the node's /metrics did not answer 3 times ({exc!r}): its event loop "
                        f"is blocked; dispatch-stopped events in its log: "
                        f"{self.dispatch_stopped_events()}") from exc
                say(f"/metrics did not answer ({exc!r}); retrying")
            finally:
                self.slowest_scrape_s = max(self.slowest_scrape_s, time.monotonic() - t0)
        raise AssertionError("unreachable")

    def dispatch_stopped_events(self) -> int:
        """How often the node said it stopped dispatching (clock skew check)."""
        return self.log_text().count("dispatch STOPPED")

    def rss(self) -> int:
        return self.rss_bytes() or 0


def histogram_buckets(m: dict[str, float], name: str) -> list[tuple[float, float]]:
    out = []
    for k, v in m.items():
        if k.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', k)
            if le:
                out.append((float(le.group(1)), v))
    return sorted(out)


def histogram_quantile_upper(before: dict[str, float], after: dict[str, float], name: str,
                             q: float) -> float | None:
    """Upper bound (bucket edge) of quantile q of the observations between two scrapes."""
    b = dict(histogram_buckets(before, name))
    a = histogram_buckets(after, name)
    deltas = [(le, v - b.get(le, 0.0)) for le, v in a]
    total = deltas[-1][1] if deltas else 0
    if total <= 0:
        return None
    for le, cum in deltas:
        if cum >= q * total:
            return le
    return None




class FiredProbe:
    """Reads <ns>.fired read_committed from the start; tallies each occurrence's lateness by
    the phase named in its key (each batch stamped when its fetch returns)."""

    def __init__(self, settings: Settings) -> None:
        self.tally = LatenessTally()
        self.collector = Collector(settings, (settings.fired_topic,), keep_messages=False,
                                   on_fired=self._record)

    def _record(self, m: Fired) -> None:
        self.tally.observe(m.occurrence, m.scheduled_ms, m.received_ms, fired_ms=m.fired_ms,
                           group=phase_of(m.key))

    async def start(self) -> None:
        await self.collector.start()

    async def stop(self) -> None:
        await self.collector.stop()

    def count(self, phase: str) -> int:
        return self.tally.count(phase)

    def check_alive(self) -> None:
        self.collector.check_alive()


async def submit(producer: AIOKafkaProducer, topic: str,
                 records: Sequence[tuple[bytes, bytes]], what: str) -> float:
    """Send records with the default (murmur2) partitioner; returns the wall ms of the first."""
    t_first = wall_ms()
    futs = []
    for n, (key, value) in enumerate(records, 1):
        futs.append(await producer.send(topic, value, key=key))
        if n % 50_000 == 0:
            say(f"{what}: {n:,}/{len(records):,} sent")
    await asyncio.gather(*futs)
    return t_first


async def wait_ingested(node: BenchNode, target: float, total: int, what: str,
                        timeout_s: float) -> float:
    """Poll until the commands stored (chronowheel_ingested_total{outcome="stored"}) reach
    target; returns the wall ms it was seen."""
    deadline = time.monotonic() + timeout_s
    last_say = time.monotonic()
    while True:
        m = await node.scrape()
        done = stored_commands(m)
        if done >= target:
            return wall_ms()
        if metric_sum(m, "chronowheel_rejected_total") > 0:
            raise RuntimeError(f"{what}: the node rejected commands (see {node.log_path})")
        if not node.alive():
            raise RuntimeError(f"node died during {what}:\n{node.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: only {done - (target - total):,.0f}/{total:,} applied "
                               f"after {timeout_s:.0f}s")
        if time.monotonic() - last_say > 5:
            say(f"{what}: {done - (target - total):,.0f}/{total:,} applied")
            last_say = time.monotonic()
        await asyncio.sleep(0.1)


async def wait_received(probe: FiredProbe, node: BenchNode, phase: str, expected: int,
                        until_wall_ms: float, what: str) -> None:
    last_say = time.monotonic()
    while probe.count(phase) < expected and wall_ms() < until_wall_ms:
        probe.check_alive()
        if not node.alive():
            raise RuntimeError(f"node died during {what}:\n{node.log_tail()}")
        if time.monotonic() - last_say > 5:
            stopped = node.dispatch_stopped_events()
            say(f"{what}: {probe.count(phase):,}/{expected:,} received"
                + (f" (the node stopped dispatching {stopped}x: clock skew check)"
                   if stopped else ""))
            last_say = time.monotonic()
        await asyncio.sleep(0.05)



def lateness_report(seen: GroupTally, start_ms: float) -> dict[str, Any]:
    if not seen.count:
        return {"received": 0}
    assert seen.last_observed_ms is not None and seen.last_fired_ms is not None
    return {
        "received": seen.count,
        "receive_lateness_ms": summarize(seen.lateness_ms),
        "fired_lateness_ms": summarize(seen.fired_lateness_ms),
        "last_received_after_start_s": (seen.last_observed_ms - start_ms) / 1000,
        "last_fired_after_start_s": (seen.last_fired_ms - start_ms) / 1000,
    }


def run_cli(args: list[str], what: str) -> str:
    out = subprocess.run([sys.executable, "-m", "chronowheel", *args], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout.strip()



async def ingest_phase(cfg: Config, settings: Settings, node: BenchNode,
                       producer: AIOKafkaProducer, run: str) -> dict[str, Any]:
    m = cfg.ingest_jobs
    base_at = int(wall_ms()) + 3_600_000
    # Spread over 30 minutes starting in an hour: never loaded during the run, no hot bucket.
    dues = [base_at + (i * 1_800_000) // max(1, m) for i in range(m)]
    recs = upserts(run, "ingest", dues)
    before = stored_commands(await node.scrape())
    say(f"ingest: submitting {m:,} jobs due in 1 h ...")
    t0 = await submit(producer, settings.submit_topic, recs, "ingest")
    t_sent = wall_ms()
    t1 = await wait_ingested(node, before + m, m, "ingest", timeout_s=60 + m / 100)
    rate = m / ((t1 - t0) / 1000)
    say(f"ingest: {m:,} jobs applied in {(t1 - t0) / 1000:.1f}s = {rate:,.0f} jobs/s "
        f"(submitting took {(t_sent - t0) / 1000:.1f}s)")
    return {"jobs": m, "seconds": (t1 - t0) / 1000, "submit_seconds": (t_sent - t0) / 1000,
            "jobs_per_s": rate}


async def ladder_step(cfg: Config, settings: Settings, node: BenchNode, probe: FiredProbe,
                      producer: AIOKafkaProducer, run: str, rate: int,
                      ingest_rate: float) -> dict[str, Any]:
    phase = f"r{rate}"
    n = int(rate * cfg.step_s)
    lead_ms = max(10_000.0, 1.5 * n / max(ingest_rate, 1.0) * 1000 + 5_000)
    start = math.ceil((wall_ms() + lead_ms) / 1000) * 1000
    dues = [start + (i * 1000) // rate for i in range(n)]
    recs = upserts(run, phase, dues)
    before_ing = stored_commands(await node.scrape())
    say(f"ladder {rate}/s: submitting {n:,} jobs due over {cfg.step_s:.0f}s starting in "
        f"{(start - wall_ms()) / 1000:.0f}s ...")
    await submit(producer, settings.submit_topic, recs, phase)
    t_ing = await wait_ingested(node, before_ing + n, n, f"ladder {rate}/s ingest",
                                timeout_s=(start - wall_ms()) / 1000 + 120)
    late_ingest = t_ing > start
    if late_ingest:
        say(f"ladder {rate}/s: WARNING ingest finished {(t_ing - start) / 1000:.1f}s after "
            "the first due instant")
    while wall_ms() < start - 200:
        await asyncio.sleep(min(1.0, (start - 200 - wall_ms()) / 1000))
    m0 = await node.scrape()
    end = start + cfg.step_s * 1000
    say(f"ladder {rate}/s: firing for {cfg.step_s:.0f}s ...")
    await wait_received(probe, node, phase, n, end + 30_000 + cfg.step_s * 2000,
                        f"ladder {rate}/s")
    m1 = await node.scrape()
    rep = lateness_report(probe.tally.group(phase), start)
    p99 = (rep.get("receive_lateness_ms") or {}).get("p99")
    complete = rep["received"] >= n
    ok = complete and p99 is not None and p99 < ON_TIME_P99_MS and not late_ingest
    span = rep.get("last_received_after_start_s") or 0
    achieved = rep["received"] / span if span else None
    node_p99 = histogram_quantile_upper(m0, m1, "chronowheel_lateness_seconds", 0.99)
    rep.update(transaction_figures(m0, m1, end - start + 2_000))
    rep.update({"rate": rate, "jobs": n, "step_s": cfg.step_s, "complete": complete,
                "ingest_overran": late_ingest, "achieved_per_s": achieved,
                "node_p99_bucket_ms": None if node_p99 is None else node_p99 * 1000,
                "pass": ok})
    r = rep.get("receive_lateness_ms") or {}
    f = rep.get("fired_lateness_ms") or {}
    say(f"ladder {rate}/s: {'PASS' if ok else 'FAIL'} received {rep['received']:,}/{n:,}; "
        f"receive lateness p50 {fmt(r.get('p50'), 1)} p95 {fmt(r.get('p95'), 1)} "
        f"p99 {fmt(r.get('p99'), 1)} max {fmt(r.get('max'), 1)} ms; fired-at p99 "
        f"{fmt(f.get('p99'), 1)} ms; {fmt(rep.get('transactions_per_s'), 1)} transactions/s, "
        f"{fmt(rep.get('fired_per_transaction'), 1)} fired per transaction; "
        f"{fmt(rep.get('full_gc'))} full GC(s), {fmt(rep.get('full_gc_seconds'), 3)} s")
    return rep


def transaction_figures(before: dict[str, float], after: dict[str, float],
                        span_ms: float | None) -> dict[str, Any]:
    """Kafka transactions the node committed between two scrapes, and what they carried."""
    txns = metric_sum(after, "chronowheel_transaction_seconds_count") - \
        metric_sum(before, "chronowheel_transaction_seconds_count")
    fired = metric_sum(after, "chronowheel_fired_total") - \
        metric_sum(before, "chronowheel_fired_total")
    out: dict[str, Any] = {"transactions": txns,
                           "fired_per_transaction": fired / txns if txns else None}
    # Full garbage collections pause the node's event loop (node/gc_policy.py).
    for what, key in (("full_gc", 'chronowheel_gc_pause_seconds_count{generation="2"}'),
                      ("full_gc_seconds", 'chronowheel_gc_pause_seconds_sum{generation="2"}')):
        out[what] = after.get(key, 0.0) - before.get(key, 0.0)
    if span_ms:
        out["transactions_per_s"] = txns / (span_ms / 1000)
    return out


async def herd_phase(cfg: Config, settings: Settings, node: BenchNode, probe: FiredProbe,
                     producer: AIOKafkaProducer, run: str, ingest_rate: float) -> dict[str, Any]:
    h = cfg.herd
    gc_wait = 2.0
    await asyncio.sleep(gc_wait)  # let the previous step's garbage settle
    rss0 = node.rss()
    wheel0 = metric_sum(await node.scrape(), "chronowheel_wheel_entries")
    # The herd must be in the wheel before its instant for the RSS to be read: its ingest ran
    # at half the ingest phase's rate in one run (a longer backlog), so allow three times.
    lead_ms = max(30_000.0, 3 * h / max(ingest_rate, 1.0) * 1000 + 20_000)
    second = math.ceil((wall_ms() + lead_ms) / 1000) * 1000
    recs = upserts(run, "herd", [second] * h)
    before_ing = stored_commands(await node.scrape())
    say(f"herd: submitting {h:,} jobs all due at one instant, "
        f"{(second - wall_ms()) / 1000:.0f}s from now ...")
    await submit(producer, settings.submit_topic, recs, "herd")
    t_ing = await wait_ingested(node, before_ing + h, h, "herd ingest",
                                timeout_s=(second - wall_ms()) / 1000 + 300)
    late_ingest = t_ing > second
    # Wait until the wheel holds the herd (ingest inserts it directly inside the lookahead;
    # otherwise the pre-warm loads it), then read the RSS.
    wheel1 = wheel0
    rss1 = rss0
    while wall_ms() < second - 500:
        wheel1 = metric_sum(await node.scrape(), "chronowheel_wheel_entries")
        if wheel1 - wheel0 >= h:
            await asyncio.sleep(0.5)
            rss1 = node.rss()
            break
        await asyncio.sleep(0.25)
    loaded = wheel1 - wheel0
    per_entry = (rss1 - rss0) / loaded if loaded >= h else None
    say(f"herd: wheel +{loaded:,.0f} entries, node RSS {rss0 / 2**20:.0f} -> "
        f"{rss1 / 2**20:.0f} MiB = {fmt(per_entry)} bytes per entry")
    m0 = await node.scrape()
    say("herd: waiting for the instant and the last occurrence ...")
    await wait_received(probe, node, "herd", h, second + 300_000, "herd")
    m1 = await node.scrape()
    rep = lateness_report(probe.tally.group("herd"), second)
    node_p99 = histogram_quantile_upper(m0, m1, "chronowheel_lateness_seconds", 0.99)
    rep.update(transaction_figures(m0, m1, None))
    rep.update({"jobs": h, "complete": rep["received"] >= h, "ingest_overran": late_ingest,
                "rss_before_bytes": rss0, "rss_loaded_bytes": rss1, "wheel_entries_added": loaded,
                "wheel_bytes_per_entry": per_entry,
                "node_p99_bucket_ms": None if node_p99 is None else node_p99 * 1000})
    r = rep.get("receive_lateness_ms") or {}
    say(f"herd: {rep['received']:,}/{h:,} received; last one "
        f"{fmt(rep.get('last_received_after_start_s'), 2)}s after the instant (last cw-fired-at "
        f"{fmt(rep.get('last_fired_after_start_s'), 2)}s); receive lateness p50 "
        f"{fmt(r.get('p50'), 0)} p99 {fmt(r.get('p99'), 0)} ms")
    return rep


async def run(cfg: Config) -> int:
    for what, servers in (("kafka", cfg.kafka), ("cassandra", cfg.cassandra)):
        require_loopback(what, servers)
    settings = Settings.from_env(namespace=cfg.namespace, kafka=cfg.kafka,
                                 cassandra=cfg.cassandra, shards=cfg.shards, http_port=0)
    try:
        return await run_phases(cfg, settings)
    finally:
        if not cfg.keep:
            say(f"dropping namespace {cfg.namespace} (keyspace and topics) ...")
            try:
                await drop_namespace(settings)  # its topics, the raw one included
            except Exception as exc:  # cleanup trouble must not hide the figures
                say(f"cleanup failed: {exc!r}")


async def run_phases(cfg: Config, settings: Settings) -> int:
    run_id = cfg.namespace.replace(".", "-")
    started = dt.datetime.now(dt.UTC)
    result: dict[str, Any] = {"preset": cfg.preset, "config": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv)}
    say(f"namespace {cfg.namespace}: init with {cfg.shards} shards ...")
    say("  " + run_cli(["init", "--namespace", cfg.namespace, "--shards", str(cfg.shards),
                        "--kafka", cfg.kafka, "--cassandra", cfg.cassandra], "chronowheel init"))
    result["machine"] = await asyncio.to_thread(machine_info, settings)
    say(f"machine: {result['machine']}")
    node: BenchNode | None = None
    probe: FiredProbe | None = None
    producer: AIOKafkaProducer | None = None
    status = 0
    try:
        if not cfg.skip_limits:
            result["limits"] = await measure_limits(cfg, settings, run_id)
        probe = FiredProbe(settings)
        await probe.start()
        log_path = LOG_DIR / f"bench-node-{cfg.preset}.log"
        node = BenchNode(settings, log_path, cfg.node_env, cfg.profile)
        say(f"starting the node (log {log_path.relative_to(ROOT)}) ...")
        node.start()
        await node.ready(timeout_s=120)
        say(f"node pid {node.pid} ready on port {node.http_port()}, RSS {node.rss() / 2**20:.0f}"
            " MiB")
        producer = plain_producer(settings, linger_ms=5)
        await producer.start()

        result["ingest"] = await ingest_phase(cfg, settings, node, producer, run_id)
        ingest_rate = result["ingest"]["jobs_per_s"]

        steps: list[dict[str, Any]] = []
        rates = list(cfg.rates)
        refined = False
        while rates:
            rate = rates.pop(0)
            rep = await ladder_step(cfg, settings, node, probe, producer, run_id, rate,
                                    ingest_rate)
            steps.append(rep)
            if not rep["pass"]:
                passed = [s["rate"] for s in steps if s["pass"]]
                if cfg.refine and not refined and passed:
                    mid = (max(passed) + rate) // 2
                    if mid not in (max(passed), rate):
                        refined = True
                        rates = [mid]
                        continue
                break
        result["ladder"] = steps
        if cfg.herd > 0:
            result["herd"] = await herd_phase(cfg, settings, node, probe, producer, run_id,
                                              ingest_rate)
        await asyncio.sleep(1.0)  # late duplicates, if any, would show up here
        m = await node.scrape()
        result["node_final_metrics"] = {
            "fired_total": metric_sum(m, "chronowheel_fired_total"),
            "ingested_total": stored_commands(m),
            "rejected_total": metric_sum(m, "chronowheel_rejected_total"),
            "rss_bytes": node.rss(),
            "slowest_metrics_scrape_s": round(node.slowest_scrape_s, 3),
            "dispatch_stopped_events": node.dispatch_stopped_events(),
        }
    finally:
        if producer is not None:
            await producer.stop()
        if node is not None:
            say("stopping the node ...")
            rc = await asyncio.to_thread(node.stop)
            result["node_exit_code"] = rc
        if probe is not None:
            await probe.stop()
    assert probe is not None
    expected = sum(s["jobs"] for s in result.get("ladder", [])) + \
        (result["herd"]["jobs"] if "herd" in result else 0)
    result["checks"] = {
        "received": probe.tally.deliveries, "expected": expected,
        "missing": max(0, expected - probe.tally.distinct),
        "duplicates": probe.tally.duplicates,
        "early_fired_at": probe.tally.early_fired,
        "early_received": probe.tally.early_observed,
    }
    c = result["checks"]
    say(f"checks: {c}")
    if c["duplicates"] or c["early_fired_at"] or c["early_received"] or c["missing"]:
        say("FAILED: early, duplicate or missing occurrences")
        status = 1
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    result["summary"] = summary(result)
    print(render_table(result), flush=True)
    if cfg.write_results:
        write_outputs(cfg, result)
    if cfg.record_memory:
        say(record_memory(result))
    return status


