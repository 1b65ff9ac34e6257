"""The fuzz run against the real servers; what it sends and checks: tests/fuzz/__init__.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from chronowheel.bus.kafka import Producer
from chronowheel.core import wire
from chronowheel.settings import Settings
from chronowheel.testing import (
    Collector,
    Fired,
    LatenessTally,
    NodeProcess,
    metric_sum,
    summarize,
)

from tests.fuzz.commands import Case, Expect, Generator
from tests.integration.harness import REPO, make_namespace, now_ms, settled

pytestmark = [pytest.mark.fuzz, pytest.mark.integration]

SHARDS = 2
CHUNK = 500
"""commands built and sent together (their instants are taken when the chunk is built)"""
SHOWN = 40
"""violations listed in a failure message (all are in the report)"""
ZSTD_PRODUCER = Path(__file__).with_name("ZstdProduce.java")
ERROR_COUNTERS = ("quarantined", "error", "fail", "fenced", "abort")
"""/metrics counters an ERROR log line may be accounted for by"""
ISOLATION_COUNTERS = ("chronowheel_quarantined_total", "chronowheel_dead_lettered_total",
                      "chronowheel_transaction_refused_total")
"""/metrics counters of commands and occurrences set aside (reported, not judged)"""


@dataclass
class Observed:
    """What the read_committed reader saw on <ns>.fired and <ns>.rejected."""

    tally: LatenessTally = field(default_factory=LatenessTally)
    fired: dict[str, list[Fired]] = field(default_factory=lambda: defaultdict(list))
    rejected: dict[tuple[int, int], list[dict[str, str]]] = field(
        default_factory=lambda: defaultdict(list))
    by_digest: dict[tuple[bytes | None, str], list[dict[str, str]]] = field(
        default_factory=lambda: defaultdict(list))
    rejected_count: int = 0
    rejected_topic: str = ""

    def on_message(self, m: Fired) -> None:
        if m.topic == self.rejected_topic:
            self.rejected_count += 1
            h = m.headers
            try:
                where = (int(h[wire.SOURCE_PARTITION]), int(h[wire.SOURCE_OFFSET]))
            except (KeyError, ValueError):
                where = (-1, -1)
            self.rejected[where].append(h)
            self.by_digest[(m.key, _digest_of_rejected(m))].append(h)
            return
        self.tally.observe(m.occurrence, m.scheduled_ms, m.received_ms, fired_ms=m.fired_ms)
        m.value = m.value[:64]  # kept for the report only
        self.fired[m.job_id].append(m)


def _digest_of_rejected(m: Fired) -> str:
    if wire.ORIGINAL_BYTES in m.headers:
        try:
            return str(orjson.loads(m.value)["original_sha256"])
        except (ValueError, KeyError, TypeError):
            return ""
    return hashlib.sha256(m.value).hexdigest()


def _digest(value: bytes | None) -> str:
    return hashlib.sha256(value or b"").hexdigest()


def _zstd_command(settings: Settings) -> list[str] | None:
    """How to run ZstdProduce.java (Kafka's Java client from the local stack's classpath), or
    None where there is no JVM, no classpath or a secured cluster, or CHRONOWHEEL_FUZZ_ZSTD=0
    (to look past a zstd failure: those cases then go gzip)."""
    if os.environ.get("CHRONOWHEEL_FUZZ_ZSTD", "1") == "0":
        return None
    if settings.kafka_security_protocol != "PLAINTEXT" or shutil.which("java") is None:
        return None
    cache = Path(os.environ.get("CHRONOWHEEL_CACHE_DIR")
                 or Path.home() / ".cache" / "chronowheel")
    found = sorted((cache / "classpath").glob("kafka-*.txt"))
    if not found:
        return None
    return ["java", "-cp", found[-1].read_text().strip(), str(ZSTD_PRODUCER),
            settings.kafka, settings.submit_topic]


async def _send_zstd(command: list[str], cases: list[Case]) -> None:
    def b64(data: bytes | None) -> str:
        return "-" if data is None else base64.b64encode(data).decode()

    lines = "".join(f"{c.partition}\t{b64(c.key)}\t{b64(c.value)}\n" for c in cases)
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(lines.encode())
    if proc.returncode != 0:
        raise AssertionError(f"ZstdProduce.java failed ({proc.returncode}): "
                             f"{err.decode(errors='replace')[-2000:]}")
    pairs = out.decode().split()
    for k, c in enumerate(cases):
        c.sent_partition, c.offset = int(pairs[2 * k]), int(pairs[2 * k + 1])


async def _send(settings: Settings, gen: Generator, n: int, observed: Observed,
                node: NodeProcess) -> list[Case]:
    producers = {
        "none": Producer(settings, "fuzz producer", acks="all", linger_ms=5,
                         max_batch_size=1 << 20, max_request_size=16 << 20),
        "gzip": Producer(settings, "fuzz gzip producer", acks="all", linger_ms=5,
                         compression_type="gzip", max_batch_size=1 << 20,
                         max_request_size=16 << 20),
    }
    for p in producers.values():
        await p.start()
    cases: list[Case] = []
    zstd = _zstd_command(settings)
    try:
        while len(cases) < n:
            chunk = list(gen.cases(min(CHUNK, n - len(cases)), now_ms))
            if zstd is None:
                for c in chunk:
                    if c.compression == "zstd":
                        c.compression = "gzip"
                        c.note += " (no JVM for zstd: sent gzip)"
            python = [c for c in chunk if c.compression != "zstd"]
            futs = [await producers[c.compression].send(
                settings.submit_topic, c.value, key=c.key, partition=c.partition)
                for c in python]
            for c, meta in zip(python, await asyncio.gather(*futs), strict=True):
                c.sent_partition, c.offset = meta.partition, meta.offset
            java = [c for c in chunk if c.compression == "zstd"]
            if java and zstd is not None:
                await _send_zstd(zstd, java)
            cases += chunk
            if not node.alive():
                break
    finally:
        for p in producers.values():
            await p.stop()
    return cases


async def _settle(node: NodeProcess, cases: list[Case], observed: Observed,
                  timeout_s: float) -> str | None:
    """Until every command is applied or rejected (by /metrics), every good job fired and the
    reader has read every rejection; returns what was still missing when time ran out."""
    goods = [c for c in cases if c.expect is Expect.GOOD]
    last_good = max((c.at_ms or 0 for c in goods), default=0)
    deadline = time.monotonic() + timeout_s
    while True:
        if not node.alive():
            return "the node process exited"
        try:
            m = await asyncio.to_thread(node.metrics, 5)
        except OSError:
            m = {}
        terminal = (metric_sum(m, "chronowheel_ingested_total")
                    + metric_sum(m, "chronowheel_rejected_total"))
        rejected = metric_sum(m, "chronowheel_rejected_total")
        unfired = [c for c in goods if c.job_id not in observed.fired]
        missing = []
        if terminal < len(cases):
            missing.append(f"/metrics counts {terminal:.0f} of {len(cases)} commands applied "
                           "or rejected")
        if unfired:
            missing.append(f"{len(unfired)} good jobs not fired")
        if observed.rejected_count < rejected:
            missing.append(f"reader has {observed.rejected_count} of {rejected:.0f} "
                           "rejections")
        if not missing and now_ms() > last_good + 1_500:
            return None
        if time.monotonic() > deadline:
            return "; ".join(missing) or "good jobs' instants not yet passed"
        await asyncio.sleep(0.5)


def _stored(settings: Settings, table: str, column: str, names: Iterable[str]) -> set[str]:
    from cassandra.concurrent import execute_concurrent_with_args
    from chronowheel.store.cassandra import connect

    names = sorted(set(names))
    if not names:
        return set()
    cluster, session = connect(settings)
    try:
        stmt = session.prepare(
            f"SELECT {column} FROM {settings.keyspace}.{table} WHERE {column} = ?")
        found: set[str] = set()
        results = execute_concurrent_with_args(session, stmt, [(x,) for x in names],
                                               concurrency=64, raise_on_first_error=True)
        for ok, rows in results:
            if ok:
                found.update(row[0] for row in rows)
        return found
    finally:
        cluster.shutdown()


def _error_lines(log_text: str) -> list[str]:
    out = []
    for line in log_text.splitlines():
        if not line.startswith("{"):
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                out.append(line)
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("level") in ("ERROR", "CRITICAL"):
            exc = (doc.get("exc") or "").strip().splitlines()
            out.append(f"{doc.get('logger')}: {doc.get('msg')}"
                       + (f" [{exc[-1]}]" if exc else ""))
    return out


def _reason(headers: list[dict[str, str]]) -> str:
    return headers[0].get(wire.REASON, "<no cw-reason>")[:200]


async def test_fuzzed_commands_on_the_real_servers(
        stack: Any, namespace: str, tmp_path: Path, fuzz_commands: int, fuzz_seed: int) -> None:
    await run_fuzz(stack, namespace, tmp_path, fuzz_commands, fuzz_seed)


async def run_fuzz(stack_like: Any, namespace: str, tmp_path: Path, commands: int, seed: int,
                   **overrides: Any) -> dict[str, Any]:
    """One fuzz run: `namespace` (SHARDS shards; `overrides` go to its Settings) initialised on
    the servers of `stack_like` (any object with `cassandra` and `kafka` addresses), one node,
    `commands` commands from `seed`; fails the calling test on any invariant violation, else
    returns the report (also printed, and written to CHRONOWHEEL_FUZZ_REPORT when set).
    Dropping the namespace is the caller's."""
    t0 = time.monotonic()
    settings = await make_namespace(stack_like, namespace, shards=SHARDS, **overrides)
    node = NodeProcess(settings, tmp_path / "node.log", name="node", cwd=REPO,
                       env={"CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS": "6000"})
    observed = Observed(rejected_topic=settings.rejected_topic)
    collector = Collector(settings, (settings.fired_topic, settings.rejected_topic),
                          keep_messages=False, on_fired=observed.on_message)
    node.start()
    try:
        await node.wait_ready(120)
        before = node.metrics()
        await collector.start()
        gen = Generator(seed, namespace, SHARDS)
        started = time.monotonic()
        cases = await _send(settings, gen, commands, observed, node)
        sent_s = time.monotonic() - started
        stuck = await _settle(node, cases, observed, timeout_s=60 + commands / 100)
        if node.alive():
            # A duplicate would have to come from something already published: every
            # command applied, every shard's watermark committed past now, the collector
            # read to the end of its topics.
            await settled(settings, collector, timeout_s=60 + commands / 100)
        collector.check_alive()
        alive = node.alive()
        try:
            after = node.metrics() if alive else {}
        except OSError:
            after = {}
    finally:
        await collector.stop()
        node.stop()

    violations: list[str] = []
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: dict[str, Counter[str]] = defaultdict(Counter)

    if not alive:
        violations.append(f"the node process is not running (exit {node.proc and node.proc.poll()})"
                          f"; log {node.log_path}, tail:\n{node.log_tail(2000)}")
    if stuck:
        violations.append(f"the run did not settle: {stuck}")

    # --- match each command to its rejection (by source partition/offset, else digest)
    rejected_of: dict[int, list[dict[str, str]]] = {}
    for c in cases:
        hit = observed.rejected.get((c.sent_partition, c.offset))
        if not hit and c.misrouted:
            hit = observed.by_digest.get((c.key, _digest(c.value)))
        if hit:
            rejected_of[c.index] = hit
    jobs = _stored(settings, "jobs", "job_id",
                   [c.job_id for c in cases if c.job_id and c.expect is not Expect.GOOD])
    cals = _stored(settings, "calendars", "name", [c.calendar for c in cases if c.calendar])

    for c in cases:
        rej = rejected_of.get(c.index)
        applied = (c.job_id in jobs) or (c.calendar in cals) or (
            c.job_id is not None and c.job_id in observed.fired)
        outcome = "rejected" if rej else "applied" if applied else "dropped"
        if c.expect is Expect.GOOD:
            fires = observed.fired.get(c.job_id or "", [])
            if rej:
                violations.append(f"{c.describe(seed)}: a good command was rejected: "
                                  f"{_reason(rej)}")
            elif len(fires) != 1:
                violations.append(f"{c.describe(seed)}: expected to fire exactly once at "
                                  f"{c.at_ms}, fired {len(fires)} times "
                                  f"{[f.occurrence for f in fires][:5]}")
            else:
                f = fires[0]
                outcome = "fired"
                if f.scheduled_ms != c.at_ms:
                    violations.append(f"{c.describe(seed)}: fired for {f.scheduled_ms}, "
                                      f"submitted at={c.at_ms}")
                if f.fired_ms < f.scheduled_ms or f.received_ms < f.scheduled_ms:
                    violations.append(f"{c.describe(seed)}: fired early: scheduled "
                                      f"{f.scheduled_ms}, cw-fired-at {f.fired_ms}, read at "
                                      f"{f.received_ms:.0f}")
        elif rej:
            missing_reason = [h for h in rej if not h.get(wire.REASON)]
            if missing_reason:
                violations.append(f"{c.describe(seed)}: rejected without a cw-reason "
                                  f"header: {missing_reason[0]}")
            if applied and c.job_id in jobs and c.expect is Expect.REJECT:
                violations.append(f"{c.describe(seed)}: rejected ({_reason(rej)}) and yet "
                                  "its job row was stored")
            reasons[c.kind][_reason(rej)[:90]] += 1
        elif c.expect is Expect.REJECT:
            violations.append(f"{c.describe(seed)}: expected on {settings.rejected_topic} "
                              f"with a cw-reason; "
                              + ("was applied instead (its row exists)" if applied
                                 else "neither rejected nor applied (silently dropped)"))
        elif not applied:
            violations.append(f"{c.describe(seed)}: neither applied (no job or calendar "
                              f"row) nor on {settings.rejected_topic}: silently dropped")
        outcomes[c.kind][outcome] += 1

    # --- never early, never twice, across everything that fired
    if observed.tally.early:
        violations.append(f"{observed.tally.early} deliveries were early (before cw-scheduled-at"
                          " by cw-fired-at or by the reader's clock)")
    dups = [(o, n) for o, n in observed.tally.seen.items() if n > 1]
    if dups:
        violations.append(f"{len(dups)} occurrences delivered more than once to a "
                          f"read_committed reader, e.g. {dups[:5]}")

    # --- ERROR in the node's log only with an error counter that rose
    errors = _error_lines(node.log_text())
    rose = {k: after[k] - before.get(k, 0.0) for k in after
            if any(w in k.split("{")[0] for w in ERROR_COUNTERS)
            and not k.split("{")[0].endswith("_created")
            and after[k] > before.get(k, 0.0)}
    set_aside = {k: after[k] - before.get(k, 0.0) for k in after
                 if k.split("{")[0] in ISOLATION_COUNTERS and after[k] > before.get(k, 0.0)}
    if errors and not rose:
        violations.append(f"{len(errors)} ERROR lines in {node.log_path} and no error counter "
                          f"of /metrics rose; first: " + " | ".join(errors[:5]))

    good = sorted(f.received_ms - f.scheduled_ms for c in cases if c.expect is Expect.GOOD
                  for f in observed.fired.get(c.job_id or "", [])[:1])
    report = {
        "seed": seed, "commands": len(cases), "send_seconds": round(sent_s, 1),
        "total_seconds": round(time.monotonic() - t0, 1),
        "outcomes": {k: dict(v) for k, v in sorted(outcomes.items())},
        "reasons": {k: dict(v.most_common(5)) for k, v in sorted(reasons.items())},
        "good_lateness_ms": summarize(good), "early": observed.tally.early,
        "duplicates": observed.tally.duplicates, "error_log_lines": len(errors),
        "error_counters_rose": rose, "set_aside_counters_rose": set_aside,
        "violations": len(violations),
        "first_violations": violations[:SHOWN], "node_log": str(node.log_path),
        "fired_occurrences": observed.tally.distinct,
    }
    text = json.dumps(report, indent=1, default=str, ensure_ascii=False)
    print(text)
    (tmp_path / "fuzz-report.json").write_text(text)
    if os.environ.get("CHRONOWHEEL_FUZZ_REPORT"):
        Path(os.environ["CHRONOWHEEL_FUZZ_REPORT"]).write_text(text)
    if violations:
        by_kind = Counter(v.split("] ")[0].split(" ", 1)[-1] for v in violations)
        pytest.fail(f"{len(violations)} invariant violations (seed {seed}, "
                    f"{len(cases)} commands; by kind {dict(by_kind)}):\n"
                    + "\n".join(f"- {v}" for v in violations[:SHOWN]), pytrace=False)
    return report
