"""End-to-end benchmark of one `chronowheel node` on the local stack, with the limits it runs on.

One command, one run, on loopback Cassandra + Kafka (a fresh namespace, dropped at the end):

  limits   raw aiokafka transactional produce (the node's message sizes, headers and batching;
           one producer, and one per shard at once), raw cassandra-driver prepared inserts of
           `due` rows (the node's row shape and concurrency), heapq push/pop for reference.
           Measured before the node starts, so nothing else of ours competes.
  ingest   M jobs far in the future are submitted; time until the node has applied them all
           (chronowheel_ingested_total on /metrics).
  ladder   for each rate R: R*T jobs due evenly over T seconds are submitted ahead of time;
           a read_committed consumer measures lateness = receive time - cw-scheduled-at (and
           cw-fired-at - cw-scheduled-at). A step passes when every occurrence arrived and the
           receive p99 < 100 ms; the ladder stops at the first failing step.
  herd     H jobs due at the same instant (top of a second): time from that instant to the last
           occurrence received (and to the largest cw-fired-at), lateness percentiles. The node's
           RSS before submitting the herd and once the wheel holds it gives bytes per entry.

Early fires (cw-fired-at or receive time before cw-scheduled-at), duplicate cw-occurrence and
missing occurrences are counted; any of them makes the exit status 1.

Writes loadtest/results/bench-<preset>.json, loadtest/results/measured.json (read by
`chronowheel capacity`) and the preset's section of loadtest/RESULTS.md.

Usage (the local stack must be up: `./run stack up`):
  .venv/bin/python loadtest/bench/run_bench.py --preset quick
  .venv/bin/python loadtest/bench/run_bench.py --preset full
  .venv/bin/python loadtest/bench/run_bench.py --preset quick --rates 500,1000 --herd 20000 \
      --note "quick run, machine busy"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import glob
import heapq
import ipaddress
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic
from chronowheel.bus.kafka import open_admin, plain_producer, transactional_producer
from chronowheel.bus.kafka import reader as kafka_reader
from chronowheel.core.model import encode_upsert
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.store.cassandra import connect

ROOT = Path(__file__).resolve().parents[2]
LOADTEST = ROOT / "loadtest"
RESULTS_DIR = LOADTEST / "results"
RESULTS_MD = LOADTEST / "RESULTS.md"
LOG_DIR = LOADTEST / "out"

ON_TIME_P99_MS = 100.0
# The node applies each new upsert with 2 requests: read `jobs`, then one logged batch
# writing `due` and `jobs` (the bucket counts are one update per minute per ingest batch,
# negligible per job). A logged batch costs the server more than one insert.
CASSANDRA_REQUESTS_PER_JOB = 2
# Same as the node's shard actor (INGEST_CONCURRENCY in node/shard.py).
NODE_INGEST_CONCURRENCY = 64
PAD = "x" * 48  # payload padding: a small realistic JSON payload of ~90 bytes
PROBE_BATCH = 500  # records per getmany of the read_committed probe

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "shards": 16, "ingest_jobs": 20_000, "rates": [50, 100, 250, 500, 1000, 2000, 4000],
        "step_s": 10, "herd": 100_000, "raw_s": 3.0, "raw_batches": [5000, 100],
        "heap_n": 200_000, "refine": False,
    },
    "full": {
        "shards": 16, "ingest_jobs": 200_000,
        "rates": [500, 1000, 2000, 4000, 6000, 8000, 12000, 16000],
        "step_s": 30, "herd": 100_000, "raw_s": 10.0, "raw_batches": [5000, 100],
        "heap_n": 1_000_000, "refine": True,
    },
}


# --- small helpers -------------------------------------------------------------------------
def wall_ms() -> float:
    return time.time_ns() / 1e6


_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending sequence (q in 0..100)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summarize(values: Iterable[float]) -> dict[str, float | int | None]:
    v = sorted(values)
    return {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95),
            "p99": percentile(v, 99), "max": v[-1] if v else None}


def require_loopback(what: str, servers: str) -> None:
    for item in servers.split(","):
        host = item.strip().rsplit(":", 1)[0].strip("[]")
        if not host:
            continue
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise SystemExit(f"{what}: {host!r} is not a loopback address; the benchmark only "
                             "runs against a local stack")


def fmt(x: float | int | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "-"
    return f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# --- machine -------------------------------------------------------------------------------
def _first_match(path: str, pattern: str) -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1).strip() if m else None


def _proc_cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _java_version(java: str) -> str | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else None


def _kafka_process() -> tuple[str | None, str | None]:
    """(java binary, Kafka version) of a local broker process, when one can be seen."""
    for cmdline_path in glob.glob("/proc/[0-9]*/cmdline"):
        pid = cmdline_path.split("/")[2]
        args = _proc_cmdline(pid)
        if "kafka.Kafka" not in args:
            continue
        java: str | None = None
        with contextlib.suppress(OSError):
            java = os.readlink(f"/proc/{pid}/exe")
        version = None
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            m = re.search(r"kafka_[0-9.]+-([0-9][0-9A-Za-z.\-]*?)\.jar", env)
            version = m.group(1) if m else None
        return java, version
    return None, None


def _pinned(pom: Path, prop: str) -> str | None:
    return _first_match(str(pom), rf"<{re.escape(prop)}>([^<]+)</")


def machine_info(settings: Settings) -> dict[str, Any]:
    java_bin, kafka_version = _kafka_process()
    java = _java_version(java_bin or "java")
    cassandra_version = None
    with contextlib.suppress(Exception):
        cluster, session = connect(settings)
        try:
            row = session.execute("SELECT release_version FROM system.local").one()
            cassandra_version = str(row[0])
        finally:
            cluster.shutdown()
    mem_kb = _first_match("/proc/meminfo", r"^MemTotal:\s+(\d+)")
    code = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, timeout=10,
                              capture_output=True, text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "services", "pyproject.toml"],
                               cwd=ROOT, timeout=10, capture_output=True, text=True,
                               check=False).stdout.strip()
        code = head + (" with uncommitted changes under services/" if dirty else "")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": _first_match("/proc/cpuinfo", r"^model name\s*:\s*(.+)$") or platform.processor(),
        "memory_gib": round(int(mem_kb) / 1024 / 1024, 1) if mem_kb else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": java,
        "kafka": kafka_version or (
            (_pinned(ROOT / "deploy/local/kafka/pom.xml", "kafka.version") or "?")
            + " (pinned in deploy/local)"),
        "cassandra": cassandra_version,
        "loadavg_start": os.getloadavg(),
        "code": code,
    }


# --- the node ------------------------------------------------------------------------------
class NodeProc:
    """`python -m chronowheel node` as a child process with its own log."""

    MARKER = "serving /metrics and /healthz on http://127.0.0.1:"

    def __init__(self, settings: Settings, log_path: Path, extra_env: dict[str, str],
                 profile_path: Path | None) -> None:
        self.settings = settings
        self.log_path = log_path
        self.extra_env = extra_env
        self.profile_path = profile_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        # Slowest /metrics answer: the node's event loop serves it, so a slow answer means a
        # busy or blocked loop.
        self.slowest_scrape_s = 0.0

    def start(self) -> None:
        env = dict(os.environ)
        env.update({
            "CHRONOWHEEL_NAMESPACE": self.settings.namespace,
            "CHRONOWHEEL_CASSANDRA": self.settings.cassandra,
            "CHRONOWHEEL_KAFKA": self.settings.kafka,
            "CHRONOWHEEL_HTTP_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        cmd = [sys.executable]
        if self.profile_path is not None:
            cmd += ["-m", "cProfile", "-o", str(self.profile_path)]
        cmd += ["-m", "chronowheel", "node"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it; closed below
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=ROOT)
        finally:
            log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _http(self, path: str) -> tuple[int, bytes]:
        assert self.port is not None
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=20) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    async def wait_ready(self, shards: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_say = 0.0
        while True:
            if not self.alive():
                raise RuntimeError(f"node exited early:\n{self.log_tail()}")
            if self.port is None:
                for line in self.log_tail(200_000).splitlines():
                    if self.MARKER in line:
                        self.port = int(line.split(self.MARKER, 1)[1].split()[0])
            if self.port is not None:
                with contextlib.suppress(OSError, ValueError):
                    _status, body = await asyncio.to_thread(self._http, "/healthz")
                    owned = orjson.loads(body).get("shards", [])
                    if len(owned) == shards:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"node not ready after {timeout_s:.0f}s:\n{self.log_tail()}")
            if time.monotonic() - last_say > 5:
                say("waiting for the node to own every shard ...")
                last_say = time.monotonic()
            await asyncio.sleep(0.25)

    async def metrics(self) -> dict[str, float]:
        """The node's /metrics, as {'name{labels}': value}."""
        for attempt in range(3):
            t0 = time.monotonic()
            try:
                _status, body = await asyncio.to_thread(self._http, "/metrics")
            except (OSError, TimeoutError) as exc:
                if attempt == 2 or not self.alive():
                    raise RuntimeError(
                        f"the node's /metrics did not answer 3 times ({exc!r}): its event loop "
                        f"is blocked; dispatch-stopped events in its log: "
                        f"{self.dispatch_stopped_events()}") from exc
                say(f"/metrics did not answer ({exc!r}); retrying")
                continue
            finally:
                self.slowest_scrape_s = max(self.slowest_scrape_s, time.monotonic() - t0)
            break
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
        return out

    def dispatch_stopped_events(self) -> int:
        """How often the node said it stopped dispatching (clock skew check)."""
        return self.log_tail(50_000_000).count("dispatch STOPPED")

    def rss_bytes(self) -> int:
        kb = _first_match(f"/proc/{self.pid}/status", r"^VmRSS:\s+(\d+)")
        return int(kb) * 1024 if kb else 0

    def stop(self, timeout_s: float = 60) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode


def metric_sum(m: dict[str, float], name: str) -> float:
    """Sum of a metric over all its label sets."""
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


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


# --- the read_committed probe on <ns>.fired ------------------------------------------------
@dataclass
class Seen:
    received: list[float] = field(default_factory=list)
    scheduled: list[int] = field(default_factory=list)
    fired: list[int] = field(default_factory=list)


class FiredProbe:
    """Reads <ns>.fired read_committed from the start; timestamps each fetch as it returns."""

    def __init__(self, settings: Settings, partitions: int) -> None:
        self.settings = settings
        self.partitions = partitions
        self.by_phase: dict[str, Seen] = {}
        self.occurrences: set[bytes] = set()
        self.duplicates = 0
        self.early_fired = 0
        self.early_received = 0
        self.total = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        c = kafka_reader(self.settings, fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20,
                   fetch_max_bytes=64 << 20)
        await c.start()
        tps = [TopicPartition(self.settings.fired_topic, p) for p in range(self.partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        self._consumer = c
        self._task = asyncio.create_task(self._run(), name="fired-probe")

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            # Bounded batches: each is stamped when it returns, so a herd is not stamped at once
            # after all of it has been decoded.
            batches = await self._consumer.getmany(timeout_ms=200, max_records=PROBE_BATCH)
            now = wall_ms()
            for msgs in batches.values():
                for m in msgs:
                    self._record(now, m.key or b"", m.headers or ())

    def _record(self, now: float, key: bytes, headers: Sequence[tuple[str, bytes]]) -> None:
        h = dict(headers)
        occ = h.get("cw-occurrence", b"")
        sched = int(h.get("cw-scheduled-at", b"0"))
        fired = int(h.get("cw-fired-at", b"0"))
        self.total += 1
        if occ in self.occurrences:
            self.duplicates += 1
        else:
            self.occurrences.add(occ)
        if fired < sched:
            self.early_fired += 1
        if now < sched:
            self.early_received += 1
        phase = key.split(b".", 2)[1].decode() if key.count(b".") >= 2 else "?"
        seen = self.by_phase.get(phase)
        if seen is None:
            seen = self.by_phase[phase] = Seen()
        seen.received.append(now)
        seen.scheduled.append(sched)
        seen.fired.append(fired)

    def count(self, phase: str) -> int:
        s = self.by_phase.get(phase)
        return 0 if s is None else len(s.received)

    def check_alive(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()
            raise RuntimeError("fired probe stopped")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()


# --- workload ------------------------------------------------------------------------------
def job_id(run: str, phase: str, i: int) -> str:
    return f"{run}.{phase}.{i:07d}"


def payload(phase: str, i: int) -> dict[str, Any]:
    return {"bench": phase, "i": i, "pad": PAD}


def upserts(run: str, phase: str, dues: Sequence[int]) -> list[tuple[bytes, bytes]]:
    out = []
    for i, at in enumerate(dues):
        jid = job_id(run, phase, i)
        out.append((jid.encode(), encode_upsert({"id": jid, "at": at,
                                                  "payload": payload(phase, i)})))
    return out


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


async def wait_ingested(node: NodeProc, target: float, total: int, what: str,
                        timeout_s: float) -> float:
    """Poll until chronowheel_ingested_total >= target; returns the wall ms it was seen."""
    deadline = time.monotonic() + timeout_s
    last_say = time.monotonic()
    while True:
        m = await node.metrics()
        done = metric_sum(m, "chronowheel_ingested_total")
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


async def wait_received(probe: FiredProbe, node: NodeProc, phase: str, expected: int,
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


def lateness_report(seen: Seen | None, start_ms: float) -> dict[str, Any]:
    if seen is None or not seen.received:
        return {"received": 0}
    recv = [r - s for r, s in zip(seen.received, seen.scheduled, strict=True)]
    fired = [float(f - s) for f, s in zip(seen.fired, seen.scheduled, strict=True)]
    last_recv = max(seen.received)
    return {
        "received": len(recv),
        "receive_lateness_ms": summarize(recv),
        "fired_lateness_ms": summarize(fired),
        "last_received_after_start_s": (last_recv - start_ms) / 1000,
        "last_fired_after_start_s": (max(seen.fired) - start_ms) / 1000,
    }


# --- limits --------------------------------------------------------------------------------
def fired_like_message(run: str, i: int, now: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    jid = job_id(run, "raw", i)
    headers = encode_headers(jid, now, 1, 5, 10_000, ())
    headers.append(("cw-fired-at", str(now).encode()))
    return jid.encode(), orjson.dumps(payload("raw", i)), headers


async def raw_kafka_rate(settings: Settings, topic: str, partitions: int, producers: int,
                         batch: int, seconds: float, run: str) -> dict[str, Any]:
    """Transactional produce like the node's commit: per transaction up to `batch` fired-like
    messages appended per partition with create_batch/send_batch, one state-like record, commit.
    `producers` transactional producers run at once (one per shard in the node)."""
    prods = [transactional_producer(settings, f"{settings.namespace}-rawbench-{p}")
             for p in range(producers)]
    await asyncio.gather(*(p.start() for p in prods))
    counts = [0] * producers
    txns = [0] * producers
    now = int(wall_ms())
    template = [fired_like_message(run, i, now) for i in range(min(batch, 5000))]

    async def one(idx: int, producer: AIOKafkaProducer, deadline: float) -> None:
        seq = 0
        while time.monotonic() < deadline:
            await producer.begin_transaction()
            batches: dict[int, Any] = {}
            for j in range(batch):
                key, value, headers = template[j % len(template)]
                part = (seq + j) % partitions
                b = batches.get(part)
                if b is None:
                    b = batches[part] = producer.create_batch()
                if b.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    await producer.send_batch(b, topic, partition=part)
                    b = batches[part] = producer.create_batch()
                    b.append(key=key, value=value, timestamp=None, headers=headers)
            state = orjson.dumps({"shard": idx, "watermark": now, "node": "rawbench"})
            sb = batches.get(idx % partitions)
            if sb is None:
                sb = batches[idx % partitions] = producer.create_batch()
            if sb.append(key=f"shard-{idx}".encode(), value=state, timestamp=None,
                         headers=[]) is None:
                await producer.send_batch(sb, topic, partition=idx % partitions)
                sb = batches[idx % partitions] = producer.create_batch()
                sb.append(key=f"shard-{idx}".encode(), value=state, timestamp=None, headers=[])
            for part, b in batches.items():
                await producer.send_batch(b, topic, partition=part)
            await producer.commit_transaction()
            seq += batch
            counts[idx] += batch
            txns[idx] += 1

    try:
        # warm-up transaction per producer (metadata, coordinator lookup)
        await asyncio.gather(*(one(i, p, time.monotonic() + 0.01) for i, p in enumerate(prods)))
        counts[:] = [0] * producers
        txns[:] = [0] * producers
        t0 = time.monotonic()
        await asyncio.gather(*(one(i, p, t0 + seconds) for i, p in enumerate(prods)))
        elapsed = time.monotonic() - t0
    finally:
        await asyncio.gather(*(p.stop() for p in prods), return_exceptions=True)
    total = sum(counts)
    return {"producers": producers, "batch": batch, "messages": total,
            "transactions": sum(txns), "seconds": round(elapsed, 3),
            "msgs_per_s": total / elapsed if elapsed else None,
            "txn_ms": 1000 * elapsed * producers / sum(txns) if sum(txns) else None}


async def raw_kafka_visibility(settings: Settings, topic: str, partitions: int,
                               seconds: float, run: str, batch: int = 20,
                               every_ms: float = 20) -> dict[str, Any]:
    """The floor under lateness: a transactional producer stamps the wall clock, sends `batch`
    fired-like messages and commits, every `every_ms`; a read_committed consumer (the probe's
    settings) measures receive time - stamp. Also reports stamp -> commit_transaction() return."""
    producer = transactional_producer(settings, f"{settings.namespace}-rawlatency")
    consumer = kafka_reader(settings, auto_offset_reset="latest", fetch_max_wait_ms=20)
    await asyncio.gather(producer.start(), consumer.start())
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    seen: list[float] = []
    commits: list[float] = []
    marker = f"{run}.lat".encode()

    async def consume() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            now = wall_ms()
            for msgs in batches.values():
                for m in msgs:
                    if m.key == marker:
                        stamp = dict(m.headers or ()).get("cw-fired-at", b"0")
                        seen.append(now - int(stamp) / 1000)

    task = asyncio.create_task(consume())
    sent = 0
    try:
        deadline = time.monotonic() + seconds
        value = orjson.dumps(payload("raw", 0))
        while time.monotonic() < deadline:
            stamp_us = time.time_ns() // 1000
            headers = encode_headers(marker.decode(), stamp_us // 1000, 1, 5, 10_000, ())
            headers.append(("cw-fired-at", str(stamp_us).encode()))
            await producer.begin_transaction()
            for j in range(batch):
                await producer.send(topic, value, key=marker, partition=j % partitions,
                                    headers=headers)
            await producer.commit_transaction()
            commits.append(wall_ms() - stamp_us / 1000)
            sent += batch
            await asyncio.sleep(every_ms / 1000)
        end = time.monotonic() + 10
        while len(seen) < sent and time.monotonic() < end:
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.gather(producer.stop(), consumer.stop(), return_exceptions=True)
    return {"transactions": len(commits), "batch": batch, "every_ms": every_ms,
            "messages": sent, "received": len(seen),
            "commit_ms": summarize(commits), "visible_ms": summarize(seen)}


async def probe_consume_rate(settings: Settings, topic: str, partitions: int,
                             seconds: float) -> dict[str, Any]:
    """How fast the harness's own read_committed probe reads fired-like messages (decoding
    their headers as the probe does): the ceiling of any receive-side rate it reports."""
    c = kafka_reader(settings, fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20,
               fetch_max_bytes=64 << 20)
    await c.start()
    n = 0
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            batches = await c.getmany(timeout_ms=500, max_records=PROBE_BATCH)
            if not batches:
                break
            for msgs in batches.values():
                for m in msgs:
                    h = dict(m.headers or ())
                    int(h.get("cw-scheduled-at", b"0"))
                    int(h.get("cw-fired-at", b"0"))
                    n += 1
        elapsed = time.monotonic() - t0
    finally:
        await c.stop()
    return {"messages": n, "seconds": round(elapsed, 3), "msgs_per_s": n / elapsed}


def raw_cassandra_rate(settings: Settings, concurrency: int, seconds: float, run: str,
                       shards: int) -> dict[str, Any]:
    """Prepared inserts of `due` rows shaped like the node's, `concurrency` in flight, driven
    by the driver's own callbacks. Rows go to shard numbers no node owns and expire soon."""
    cluster, session = connect(settings)
    try:
        ks = settings.keyspace
        stmt = session.prepare(
            f"INSERT INTO {ks}.due (minute, shard, slot_ms, job_id, attempt, scheduled_ms, "
            f"version, topic, payload, headers, spec, max_attempts, backoff_ms) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        base = int(wall_ms()) + 3_600_000
        body = orjson.dumps(payload("raw", 0))
        topic = settings.fired_topic
        lock = threading.Lock()
        slots = threading.Semaphore(concurrency)
        state = {"done": 0, "errors": 0}
        first_error: list[BaseException] = []

        def params(i: int) -> tuple[Any, ...]:
            slot = base + i
            return (slot - slot % 60_000, 100_000 + shards + i % shards, slot,
                    job_id(run, "raw", i), 1, slot, 1, topic, body, [], None, 5, 10_000, 600)

        def ok(_rows: object) -> None:
            with lock:
                state["done"] += 1
            slots.release()

        def err(exc: BaseException) -> None:
            with lock:
                state["errors"] += 1
                if not first_error:
                    first_error.append(exc)
            slots.release()

        def drive(deadline: float) -> int:
            i = 0
            while time.monotonic() < deadline:
                slots.acquire()
                f = session.execute_async(stmt, params(i))
                f.add_callbacks(ok, err)
                i += 1
            for _ in range(concurrency):  # wait for what is in flight
                slots.acquire()
            for _ in range(concurrency):
                slots.release()
            return i

        drive(time.monotonic() + 0.3)  # warm-up
        state.update(done=0, errors=0)
        t0 = time.monotonic()
        sent = drive(t0 + seconds)
        elapsed = time.monotonic() - t0
    finally:
        cluster.shutdown()
    if first_error:
        say(f"raw cassandra: {state['errors']} errors, first: {first_error[0]!r}")
    return {"concurrency": concurrency, "inserts": sent, "errors": state["errors"],
            "seconds": round(elapsed, 3), "inserts_per_s": state["done"] / elapsed}


def heapq_rate(n: int) -> dict[str, Any]:
    rng = random.Random(7)
    base = 1_800_000_000_000
    items = [(base + rng.randrange(3_600_000), i, f"job-{i}") for i in range(n)]
    heap: list[tuple[int, int, str]] = []
    gc.collect()
    t0 = time.perf_counter()
    push = heapq.heappush
    for it in items:
        push(heap, it)
    t1 = time.perf_counter()
    pop = heapq.heappop
    while heap:
        pop(heap)
    t2 = time.perf_counter()
    return {"n": n, "push_per_s": n / (t1 - t0), "pop_per_s": n / (t2 - t1)}


# --- the run -------------------------------------------------------------------------------
@dataclass
class Config:
    preset: str
    shards: int
    ingest_jobs: int
    rates: list[int]
    step_s: float
    herd: int
    raw_s: float
    raw_batches: list[int]
    heap_n: int
    refine: bool
    namespace: str
    kafka: str
    cassandra: str
    keep: bool
    note: str
    node_env: dict[str, str]
    profile: Path | None
    skip_limits: bool
    write_results: bool


def run_cli(args: list[str], what: str) -> str:
    out = subprocess.run([sys.executable, "-m", "chronowheel", *args], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout.strip()


async def create_raw_topic(settings: Settings, name: str, partitions: int) -> None:
    admin = await open_admin(settings)
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=30000)
    finally:
        await admin.close()


async def cleanup(settings: Settings, topics: list[str]) -> None:
    admin = await open_admin(settings)
    try:
        existing = set(await admin.list_topics())
        gone = [t for t in topics if t in existing]
        if gone:
            await admin.delete_topics(gone, timeout_ms=60000)
    finally:
        await admin.close()

    def drop() -> None:
        cluster, session = connect(settings)
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
        finally:
            cluster.shutdown()

    await asyncio.to_thread(drop)


async def measure_limits(cfg: Config, settings: Settings, run: str) -> dict[str, Any]:
    limits: dict[str, Any] = {"kafka_txn": [], "cassandra_insert": []}
    raw_topic = f"{settings.namespace}.rawbench"
    await create_raw_topic(settings, raw_topic, cfg.shards)
    for batch in cfg.raw_batches:
        for producers in (1, cfg.shards):
            say(f"limit: raw Kafka transactional produce, {producers} producer(s), "
                f"batch {batch}, {cfg.raw_s:.0f}s ...")
            r = await raw_kafka_rate(settings, raw_topic, cfg.shards, producers, batch,
                                     cfg.raw_s, run)
            say(f"  {fmt(r['msgs_per_s'])} msgs/s ({fmt(r['txn_ms'], 1)} ms per transaction)")
            limits["kafka_txn"].append(r)
    say(f"limit: transaction commit-to-visible latency (read_committed), {cfg.raw_s:.0f}s ...")
    vis = await raw_kafka_visibility(settings, raw_topic, cfg.shards, cfg.raw_s, run)
    limits["kafka_visibility"] = vis
    say(f"  commit p50 {fmt(vis['commit_ms']['p50'], 1)} p99 {fmt(vis['commit_ms']['p99'], 1)}"
        f" ms; visible p50 {fmt(vis['visible_ms']['p50'], 1)} p99 "
        f"{fmt(vis['visible_ms']['p99'], 1)} ms")
    say(f"limit: the probe's own read_committed consume rate, up to {cfg.raw_s:.0f}s ...")
    limits["probe_consume"] = await probe_consume_rate(settings, raw_topic, cfg.shards,
                                                       cfg.raw_s)
    say(f"  {fmt(limits['probe_consume']['msgs_per_s'])} msgs/s")
    for conc in sorted({NODE_INGEST_CONCURRENCY, min(1024, NODE_INGEST_CONCURRENCY
                                                       * cfg.shards)}):
        say(f"limit: raw Cassandra prepared inserts of due rows, {conc} in flight, "
            f"{cfg.raw_s:.0f}s ...")
        r = await asyncio.to_thread(raw_cassandra_rate, settings, conc, cfg.raw_s, run,
                                    cfg.shards)
        say(f"  {fmt(r['inserts_per_s'])} inserts/s")
        limits["cassandra_insert"].append(r)
    say(f"limit: heapq push/pop of {cfg.heap_n:,} entries ...")
    limits["heapq"] = await asyncio.to_thread(heapq_rate, cfg.heap_n)
    say(f"  push {fmt(limits['heapq']['push_per_s'])}/s, pop {fmt(limits['heapq']['pop_per_s'])}/s")
    return limits


async def ingest_phase(cfg: Config, settings: Settings, node: NodeProc,
                       producer: AIOKafkaProducer, run: str) -> dict[str, Any]:
    m = cfg.ingest_jobs
    base_at = int(wall_ms()) + 3_600_000
    # Spread over 30 minutes starting in an hour: never loaded during the run, no hot bucket.
    dues = [base_at + (i * 1_800_000) // max(1, m) for i in range(m)]
    recs = upserts(run, "ingest", dues)
    before = metric_sum(await node.metrics(), "chronowheel_ingested_total")
    say(f"ingest: submitting {m:,} jobs due in 1 h ...")
    t0 = await submit(producer, settings.submit_topic, recs, "ingest")
    t_sent = wall_ms()
    t1 = await wait_ingested(node, before + m, m, "ingest", timeout_s=60 + m / 100)
    rate = m / ((t1 - t0) / 1000)
    say(f"ingest: {m:,} jobs applied in {(t1 - t0) / 1000:.1f}s = {rate:,.0f} jobs/s "
        f"(submitting took {(t_sent - t0) / 1000:.1f}s)")
    return {"jobs": m, "seconds": (t1 - t0) / 1000, "submit_seconds": (t_sent - t0) / 1000,
            "jobs_per_s": rate}


async def ladder_step(cfg: Config, settings: Settings, node: NodeProc, probe: FiredProbe,
                      producer: AIOKafkaProducer, run: str, rate: int,
                      ingest_rate: float) -> dict[str, Any]:
    phase = f"r{rate}"
    n = int(rate * cfg.step_s)
    lead_ms = max(10_000.0, 1.5 * n / max(ingest_rate, 1.0) * 1000 + 5_000)
    start = math.ceil((wall_ms() + lead_ms) / 1000) * 1000
    dues = [start + (i * 1000) // rate for i in range(n)]
    recs = upserts(run, phase, dues)
    before_ing = metric_sum(await node.metrics(), "chronowheel_ingested_total")
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
    m0 = await node.metrics()
    end = start + cfg.step_s * 1000
    say(f"ladder {rate}/s: firing for {cfg.step_s:.0f}s ...")
    await wait_received(probe, node, phase, n, end + 30_000 + cfg.step_s * 2000,
                        f"ladder {rate}/s")
    m1 = await node.metrics()
    rep = lateness_report(probe.by_phase.get(phase), start)
    p99 = (rep.get("receive_lateness_ms") or {}).get("p99")
    complete = rep["received"] >= n
    ok = complete and p99 is not None and p99 < ON_TIME_P99_MS and not late_ingest
    span = rep.get("last_received_after_start_s") or 0
    achieved = rep["received"] / span if span else None
    node_p99 = histogram_quantile_upper(m0, m1, "chronowheel_lateness_seconds", 0.99)
    rep.update({"rate": rate, "jobs": n, "step_s": cfg.step_s, "complete": complete,
                "ingest_overran": late_ingest, "achieved_per_s": achieved,
                "node_p99_bucket_ms": None if node_p99 is None else node_p99 * 1000,
                "pass": ok})
    r = rep.get("receive_lateness_ms") or {}
    f = rep.get("fired_lateness_ms") or {}
    say(f"ladder {rate}/s: {'PASS' if ok else 'FAIL'} received {rep['received']:,}/{n:,}; "
        f"receive lateness p50 {fmt(r.get('p50'), 1)} p95 {fmt(r.get('p95'), 1)} "
        f"p99 {fmt(r.get('p99'), 1)} max {fmt(r.get('max'), 1)} ms; fired-at p99 "
        f"{fmt(f.get('p99'), 1)} ms")
    return rep


async def herd_phase(cfg: Config, settings: Settings, node: NodeProc, probe: FiredProbe,
                     producer: AIOKafkaProducer, run: str, ingest_rate: float) -> dict[str, Any]:
    h = cfg.herd
    gc_wait = 2.0
    await asyncio.sleep(gc_wait)  # let the previous step's garbage settle
    rss0 = node.rss_bytes()
    wheel0 = metric_sum(await node.metrics(), "chronowheel_wheel_entries")
    lead_ms = max(30_000.0, 1.5 * h / max(ingest_rate, 1.0) * 1000 + 20_000)
    second = math.ceil((wall_ms() + lead_ms) / 1000) * 1000
    recs = upserts(run, "herd", [second] * h)
    before_ing = metric_sum(await node.metrics(), "chronowheel_ingested_total")
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
        wheel1 = metric_sum(await node.metrics(), "chronowheel_wheel_entries")
        if wheel1 - wheel0 >= h:
            await asyncio.sleep(0.5)
            rss1 = node.rss_bytes()
            break
        await asyncio.sleep(0.25)
    loaded = wheel1 - wheel0
    per_entry = (rss1 - rss0) / loaded if loaded >= h else None
    say(f"herd: wheel +{loaded:,.0f} entries, node RSS {rss0 / 2**20:.0f} -> "
        f"{rss1 / 2**20:.0f} MiB = {fmt(per_entry)} bytes per entry")
    m0 = await node.metrics()
    say("herd: waiting for the instant and the last occurrence ...")
    await wait_received(probe, node, "herd", h, second + 300_000, "herd")
    m1 = await node.metrics()
    rep = lateness_report(probe.by_phase.get("herd"), second)
    node_p99 = histogram_quantile_upper(m0, m1, "chronowheel_lateness_seconds", 0.99)
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
                await cleanup(settings, [settings.submit_topic, settings.state_topic,
                                         settings.fired_topic, settings.rejected_topic,
                                         settings.dead_topic, f"{settings.namespace}.rawbench"])
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
    node: NodeProc | None = None
    probe: FiredProbe | None = None
    producer: AIOKafkaProducer | None = None
    status = 0
    try:
        if not cfg.skip_limits:
            result["limits"] = await measure_limits(cfg, settings, run_id)
        probe = FiredProbe(settings, cfg.shards)
        await probe.start()
        log_path = LOG_DIR / f"bench-node-{cfg.preset}.log"
        node = NodeProc(settings, log_path, cfg.node_env, cfg.profile)
        say(f"starting the node (log {log_path.relative_to(ROOT)}) ...")
        node.start()
        await node.wait_ready(cfg.shards, timeout_s=120)
        say(f"node pid {node.pid} ready on port {node.port}, RSS {node.rss_bytes() / 2**20:.0f}"
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
        m = await node.metrics()
        result["node_final_metrics"] = {
            "fired_total": metric_sum(m, "chronowheel_fired_total"),
            "ingested_total": metric_sum(m, "chronowheel_ingested_total"),
            "rejected_total": metric_sum(m, "chronowheel_rejected_total"),
            "rss_bytes": node.rss_bytes(),
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
        "received": probe.total, "expected": expected,
        "missing": max(0, expected - len(probe.occurrences)),
        "duplicates": probe.duplicates,
        "early_fired_at": probe.early_fired, "early_received": probe.early_received,
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
    return status


# --- figures and reports -------------------------------------------------------------------
def summary(r: dict[str, Any]) -> dict[str, Any]:
    limits = r.get("limits", {})
    kafka = limits.get("kafka_txn", [])
    cass = limits.get("cassandra_insert", [])
    best_kafka_1 = max((k["msgs_per_s"] or 0 for k in kafka if k["producers"] == 1),
                       default=None)
    best_kafka_n = max((k["msgs_per_s"] or 0 for k in kafka if k["producers"] > 1),
                       default=None)
    kafka_limit = max(x for x in (best_kafka_1, best_kafka_n, 0) if x is not None) or None
    cass_limit = max((c["inserts_per_s"] for c in cass), default=None)
    steps = r.get("ladder", [])
    passed = [s for s in steps if s["pass"]]
    best = max(passed, key=lambda s: s["rate"]) if passed else None
    ingest = r.get("ingest", {}).get("jobs_per_s")
    herd = r.get("herd", {})
    return {
        "ingest_jobs_per_s": ingest,
        "ingest_vs_raw_insert": ratio(ingest, cass_limit),
        "ingest_requests_vs_raw_insert": ratio(
            None if ingest is None else ingest * CASSANDRA_REQUESTS_PER_JOB, cass_limit),
        "fires_per_s": None if best is None else best["rate"],
        "fires_achieved_per_s": None if best is None else best.get("achieved_per_s"),
        "fires_vs_raw_kafka_txn": ratio(None if best is None else float(best["rate"]),
                                        kafka_limit),
        "lateness_p99_ms": None if best is None else best["receive_lateness_ms"]["p99"],
        "fired_lateness_p99_ms": None if best is None else best["fired_lateness_ms"]["p99"],
        "herd_seconds": herd.get("last_received_after_start_s"),
        "herd_fired_seconds": herd.get("last_fired_after_start_s"),
        "herd_fires_per_s": (herd["received"] / herd["last_received_after_start_s"])
        if herd.get("last_received_after_start_s") else None,
        "wheel_bytes_per_entry": herd.get("wheel_bytes_per_entry"),
        "raw_kafka_txn_msgs_per_s_1": best_kafka_1,
        "raw_kafka_txn_msgs_per_s_n": best_kafka_n,
        "raw_cassandra_inserts_per_s": cass_limit,
        "probe_consume_msgs_per_s": limits.get("probe_consume", {}).get("msgs_per_s"),
        "heapq_push_per_s": limits.get("heapq", {}).get("push_per_s"),
        "heapq_pop_per_s": limits.get("heapq", {}).get("pop_per_s"),
    }


def render_table(r: dict[str, Any]) -> str:
    s = r["summary"]
    lines = ["| figure | value | limit | ratio |", "|---|---:|---:|---:|"]

    def row(name: str, value: str, limit: str = "", rat: float | None = None) -> None:
        lines.append(f"| {name} | {value} | {limit} | "
                     f"{'' if rat is None else f'{rat:.1%}'} |")

    cass = s["raw_cassandra_inserts_per_s"]
    row("ingest, jobs/s", fmt(s["ingest_jobs_per_s"]),
        f"{fmt(cass)} raw `due` inserts/s", s["ingest_vs_raw_insert"])
    row(f"ingest, Cassandra statements/s ({CASSANDRA_REQUESTS_PER_JOB} per job)",
        fmt(None if s["ingest_jobs_per_s"] is None
            else s["ingest_jobs_per_s"] * CASSANDRA_REQUESTS_PER_JOB),
        f"{fmt(cass)} raw inserts/s", s["ingest_requests_vs_raw_insert"])
    kafka = max((x for x in (s["raw_kafka_txn_msgs_per_s_1"], s["raw_kafka_txn_msgs_per_s_n"])
                 if x is not None), default=None)
    row("sustained fires/s with p99 < 100 ms", fmt(s["fires_per_s"]),
        f"{fmt(kafka)} raw txn msgs/s", s["fires_vs_raw_kafka_txn"])
    row("lateness p99 at that rate, receive (ms)", fmt(s["lateness_p99_ms"], 1))
    row("lateness p99 at that rate, cw-fired-at (ms)", fmt(s["fired_lateness_p99_ms"], 1))
    herd = r.get("herd", {})
    row(f"herd of {fmt(herd.get('jobs'))}: instant to last received (s)",
        fmt(s["herd_seconds"], 2))
    row("herd: instant to last cw-fired-at (s)", fmt(s["herd_fired_seconds"], 2))
    row("herd: fires/s", fmt(s["herd_fires_per_s"]), f"{fmt(kafka)} raw txn msgs/s",
        ratio(s["herd_fires_per_s"], kafka))
    probe = s.get("probe_consume_msgs_per_s")
    row("herd: fires/s vs the probe's own consume rate", fmt(s["herd_fires_per_s"]),
        f"{fmt(probe)} probe msgs/s", ratio(s["herd_fires_per_s"], probe))
    row("wheel bytes per entry (node RSS growth)", fmt(s["wheel_bytes_per_entry"]))
    row("heapq push/s, pop/s (reference)",
        f"{fmt(s['heapq_push_per_s'])} / {fmt(s['heapq_pop_per_s'])}")
    out = ["\n".join(lines), "", "Dispatch ladder (lateness in ms; receive = read_committed "
           "consumer receive time - cw-scheduled-at; fired = cw-fired-at - cw-scheduled-at):",
           "",
           "| rate/s | jobs | received | achieved/s | recv p50 | recv p95 | recv p99 | recv max "
           "| fired p50 | fired p99 | node p99 ≤ | result |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for st in r.get("ladder", []):
        rl = st.get("receive_lateness_ms") or {}
        fl = st.get("fired_lateness_ms") or {}
        verdict = "pass" if st["pass"] else (
            "FAIL (ingest overran)" if st["ingest_overran"] else
            "FAIL (incomplete)" if not st["complete"] else "FAIL (p99)")
        out.append(
            f"| {st['rate']:,} | {st['jobs']:,} | {st['received']:,} | "
            f"{fmt(st.get('achieved_per_s'))} | {fmt(rl.get('p50'), 1)} | "
            f"{fmt(rl.get('p95'), 1)} | {fmt(rl.get('p99'), 1)} | {fmt(rl.get('max'), 1)} | "
            f"{fmt(fl.get('p50'), 1)} | {fmt(fl.get('p99'), 1)} | "
            f"{fmt(st.get('node_p99_bucket_ms'), 0)} | {verdict} |")
    if herd:
        rl = herd.get("receive_lateness_ms") or {}
        fl = herd.get("fired_lateness_ms") or {}
        out += ["", f"Herd lateness (ms): receive p50 {fmt(rl.get('p50'))}, p95 "
                f"{fmt(rl.get('p95'))}, p99 {fmt(rl.get('p99'))}, max {fmt(rl.get('max'))}; "
                f"cw-fired-at p50 {fmt(fl.get('p50'))}, p99 {fmt(fl.get('p99'))}, max "
                f"{fmt(fl.get('max'))}."]
    lim = r.get("limits", {})
    if lim:
        out += ["", "Limits measured in this run (before the node started):", "",
                "| limit | setting | rate/s | per transaction |", "|---|---|---:|---:|"]
        for k in lim.get("kafka_txn", []):
            out.append(f"| aiokafka transactional produce | {k['producers']} producer(s), "
                       f"batch {k['batch']:,} | {fmt(k['msgs_per_s'])} | "
                       f"{fmt(k['txn_ms'], 1)} ms |")
        for c in lim.get("cassandra_insert", []):
            out.append(f"| cassandra-driver prepared `due` insert | {c['concurrency']} in flight"
                       f" | {fmt(c['inserts_per_s'])} | |")
        vis = lim.get("kafka_visibility")
        if vis:
            cm, vm = vis["commit_ms"], vis["visible_ms"]
            out.append(f"| transaction stamp -> visible to read_committed (ms) | "
                       f"{vis['batch']} msgs every {vis['every_ms']:.0f} ms | p50 "
                       f"{fmt(vm['p50'], 1)}, p99 {fmt(vm['p99'], 1)}, max {fmt(vm['max'], 1)} "
                       f"| commit p50 {fmt(cm['p50'], 1)}, p99 {fmt(cm['p99'], 1)} ms |")
        pc = lim.get("probe_consume")
        if pc:
            out.append(f"| the harness's read_committed probe, consume + decode | "
                       f"batches of {PROBE_BATCH} | {fmt(pc['msgs_per_s'])} | |")
        hq = lim.get("heapq")
        if hq:
            out.append(f"| heapq push / pop | {hq['n']:,} entries | {fmt(hq['push_per_s'])} / "
                       f"{fmt(hq['pop_per_s'])} | |")
    c = r.get("checks", {})
    out += ["", f"Checks: {c.get('received', 0):,} received of {c.get('expected', 0):,} "
            f"expected; missing {c.get('missing')}, duplicate cw-occurrence "
            f"{c.get('duplicates')}, early by cw-fired-at {c.get('early_fired_at')}, early by "
            f"receive time {c.get('early_received')}. The node stopped dispatching (clock skew "
            f"check) {r.get('node_final_metrics', {}).get('dispatch_stopped_events', '?')} "
            f"time(s); slowest /metrics answer "
            f"{r.get('node_final_metrics', {}).get('slowest_metrics_scrape_s', '?')} s."]
    return "\n".join(out)


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, {m['os']}; Python "
            f"{m['python']}; Java: {m['java']}; Kafka {m['kafka']}; Cassandra {m['cassandra']}; "
            f"code {m.get('code')}; load average at start "
            f"{' '.join(f'{x:.2f}' for x in m['loadavg_start'])}, at end "
            f"{' '.join(f'{x:.2f}' for x in m.get('loadavg_end', ()))}")


def write_outputs(cfg: Config, r: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS_DIR / f"bench-{cfg.preset}.json"
    json_path.write_bytes(orjson.dumps(r, option=orjson.OPT_INDENT_2))
    s = r["summary"]
    command = r["command"]
    measured = {
        "fires_per_s_per_node": s["fires_per_s"],
        "ingest_jobs_per_s_per_node": s["ingest_jobs_per_s"],
        "herd_100k_seconds": s["herd_seconds"] if r.get("herd", {}).get("jobs") == 100_000
        else None,
        "lateness_p99_ms": s["lateness_p99_ms"],
        "wheel_bytes_per_entry": s["wheel_bytes_per_entry"],
        "measured_on": r["started"],
        "command": command,
        "preset": cfg.preset,
        "machine": machine_line(r["machine"]),
        "note": cfg.note,
    }
    (RESULTS_DIR / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
    section = "\n".join([
        f"<!-- bench:{cfg.preset}:begin -->",
        f"## `{cfg.preset}` preset" + (f" — {cfg.note}" if cfg.note else ""),
        "",
        f"- command: `{command}`",
        f"- date: {r['started']} (UTC), finished {r['finished']}",
        f"- machine: {machine_line(r['machine'])}",
        f"- node: one `chronowheel node` process, {cfg.shards} shards, default settings"
        + (f" plus {cfg.node_env}" if cfg.node_env else ""),
        f"- raw JSON: `loadtest/results/{json_path.name}`",
        "",
        render_table(r),
        "",
        f"<!-- bench:{cfg.preset}:end -->",
    ])
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else RESULTS_HEADER
    pattern = re.compile(rf"<!-- bench:{re.escape(cfg.preset)}:begin -->.*?"
                         rf"<!-- bench:{re.escape(cfg.preset)}:end -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS_MD.write_text(text)
    say(f"wrote {json_path.relative_to(ROOT)}, loadtest/results/measured.json and "
        f"{RESULTS_MD.relative_to(ROOT)}")


RESULTS_HEADER = """# chronowheel benchmark results

Produced by `loadtest/bench/run_bench.py` (see loadtest/README.md). Each preset's section is
replaced by its latest run. Lateness is measured by a read_committed consumer on the same machine
and clock as the node: receive time minus `cw-scheduled-at` (what a user sees), and
`cw-fired-at` minus `cw-scheduled-at` (when the node stamped the transaction). Ratios compare a
figure with the raw limit measured in the same run.
"""


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--shards", type=int)
    p.add_argument("--ingest-jobs", type=int)
    p.add_argument("--rates", help="comma-separated ladder of fire rates per second")
    p.add_argument("--step-s", type=float, help="seconds of due jobs per ladder step")
    p.add_argument("--herd", type=int, help="jobs due at the same instant (0 = skip)")
    p.add_argument("--raw-s", type=float, help="seconds per raw limit measurement")
    p.add_argument("--heap-n", type=int)
    p.add_argument("--namespace", help="default: bench<unix time> (fresh each run)")
    p.add_argument("--kafka", default="127.0.0.1:9092")
    p.add_argument("--cassandra", default="127.0.0.1:9042")
    p.add_argument("--keep", action="store_true", help="keep the namespace afterwards")
    p.add_argument("--note", default="", help="shown in RESULTS.md, e.g. 'machine busy'")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the node, e.g. CHRONOWHEEL_MAX_BATCH=2000")
    p.add_argument("--profile", type=Path, help="run the node under cProfile, write stats here")
    p.add_argument("--skip-limits", action="store_true")
    p.add_argument("--no-write", action="store_true",
                   help="print only: do not write results/ and RESULTS.md")
    a = p.parse_args(argv)
    pre = PRESETS[a.preset]
    node_env = {}
    for item in a.node_env:
        k, sep, v = item.partition("=")
        if not sep or not k.startswith("CHRONOWHEEL_"):
            p.error(f"--node-env {item!r}: expected CHRONOWHEEL_NAME=VALUE")
        node_env[k] = v
    cfg = Config(
        preset=a.preset,
        shards=a.shards or pre["shards"],
        ingest_jobs=a.ingest_jobs if a.ingest_jobs is not None else pre["ingest_jobs"],
        rates=[int(x) for x in a.rates.split(",")] if a.rates else list(pre["rates"]),
        step_s=a.step_s or pre["step_s"],
        herd=a.herd if a.herd is not None else pre["herd"],
        raw_s=a.raw_s or pre["raw_s"],
        raw_batches=list(pre["raw_batches"]),
        heap_n=a.heap_n or pre["heap_n"],
        refine=pre["refine"],
        namespace=a.namespace or f"bench{int(time.time())}",
        kafka=a.kafka, cassandra=a.cassandra, keep=a.keep, note=a.note, node_env=node_env,
        profile=a.profile, skip_limits=a.skip_limits, write_results=not a.no_write)
    if cfg.ingest_jobs < 1 or cfg.step_s <= 0 or any(r <= 0 for r in cfg.rates):
        p.error("sizes and rates must be positive")
    if cfg.ingest_jobs > 5_000_000 or cfg.herd > 5_000_000 or \
            max(cfg.rates) * cfg.step_s > 5_000_000:
        p.error("refusing more than 5,000,000 jobs in one phase")
    return cfg


async def run_until_signal(cfg: Config) -> int:
    """SIGTERM or SIGINT (even when started in the background) cancels the run: the node is
    stopped and the namespace dropped on the way out."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await run(cfg)
    except asyncio.CancelledError:
        say("interrupted")
        return 130


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    return asyncio.run(run_until_signal(cfg))


if __name__ == "__main__":
    sys.exit(main())
