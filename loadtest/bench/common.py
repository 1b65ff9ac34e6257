"""What every part of the benchmark shares: paths, presets, the run's configuration, the
workload's job ids and payloads, the node's defaults, progress output and number formatting."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from chronowheel.core.model import encode_upsert
from chronowheel.settings import Settings
from chronowheel.testing import require_loopback

ROOT = Path(__file__).resolve().parents[2]
LOADTEST = ROOT / "loadtest"
RESULTS_DIR = LOADTEST / "results"
RESULTS_MD = LOADTEST / "RESULTS.md"
LOG_DIR = LOADTEST / "out"

ON_TIME_P99_MS = 100.0
# The node writes 2 rows per new job (`due` and `jobs`), several jobs per logged batch, after
# reading the `jobs` rows in groups of 50 (bucket counts are counter batches, negligible per
# job): the report compares rows written/s with raw single-row inserts/s.
CASSANDRA_REQUESTS_PER_JOB = 2
PAD = "x" * 48  # payload padding: a small realistic JSON payload of ~90 bytes
# Time zones of the workloads' cron jobs: every UTC offset class, with and without DST.
ZONES = ("UTC", "Europe/London", "Europe/Berlin", "Europe/Moscow", "Africa/Cairo",
         "Africa/Lagos", "Asia/Kolkata", "Asia/Shanghai", "Asia/Tokyo", "Asia/Dubai",
         "Asia/Singapore", "Australia/Sydney", "Pacific/Auckland", "America/New_York",
         "America/Chicago", "America/Denver", "America/Los_Angeles", "America/Sao_Paulo",
         "America/Mexico_City", "Pacific/Honolulu")
SMALL_TXN_BATCH = 100
"""The raw produce limit is measured with the node's largest transaction and with this one."""

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "shards": 16, "ingest_jobs": 20_000,
        "rates": [50, 100, 250, 500, 1000, 2000, 5000, 10000],
        "step_s": 10, "herd": 100_000, "raw_s": 3.0, "heap_n": 200_000, "refine": False,
    },
    # The throughput targets at their own sizes: the rates they name and a herd of 1,000,000
    # (also what RSS per loaded occurrence is measured with).
    "targets": {
        "shards": 16, "ingest_jobs": 50_000, "rates": [1000, 2000, 5000, 10000],
        "step_s": 10, "herd": 1_000_000, "raw_s": 3.0, "heap_n": 200_000, "refine": False,
    },
    "full": {
        "shards": 16, "ingest_jobs": 200_000,
        "rates": [500, 1000, 2000, 4000, 6000, 8000, 12000, 16000],
        "step_s": 30, "herd": 100_000, "raw_s": 10.0, "heap_n": 1_000_000, "refine": True,
    },
}


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
    record_memory: bool = False

    @property
    def node_settings(self) -> Settings:
        """The settings the node runs with: its defaults, with the --node-env overrides."""
        return node_settings(self.node_env)


def node_settings(node_env: dict[str, str]) -> Settings:
    return Settings.from_env(node_env)


def node_ingest_concurrency(node: Settings) -> int:
    """Jobs of one ingest batch a shard writes to Cassandra at once (a node setting)."""
    return int(node.ingest_concurrency)


# --- output ---------------------------------------------------------------------------------
_T0 = time.monotonic()


def stored_commands(m: dict[str, float], op: str | None = None) -> float:
    """Commands the node applied that changed what is stored (first applies), from its
    /metrics: re-deliveries after a takeover and identical re-submits count as
    outcome="unchanged" and are not progress."""
    name = "chronowheel_ingested_total{"
    want = 'outcome="stored"'
    return sum(v for k, v in m.items() if k.startswith(name) and want in k
               and (op is None or f'op="{op}"' in k))


def say(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


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


# --- workload -------------------------------------------------------------------------------
def job_id(run: str, phase: str, i: int) -> str:
    """`<run>.<phase>.<i>`: the probe groups what it receives by the phase in the key."""
    return f"{run}.{phase}.{i:07d}"


def phase_of(key: bytes | None) -> str:
    parts = (key or b"").split(b".", 2)
    return parts[1].decode() if len(parts) == 3 else "?"


def payload(phase: str, i: int) -> dict[str, Any]:
    return {"bench": phase, "i": i, "pad": PAD}


def payload_bytes(phase: str, i: int) -> int:
    """Size of a job's payload as the node stores it (compact JSON)."""
    return len(orjson.dumps(payload(phase, i)))


# The throughput targets of one node (16 shards, everything on one 2-core machine); the
# report states each beside the measured figure. Never asserted in tests.
TARGET_FIRES_PER_S = 5_000  # sustained, with receive p99 <= ON_TIME_P99_MS
AIM_FIRES_PER_S = 10_000
AIM_FIRES_P99_MS = 50.0
TARGET_INGEST_PER_S = 5_000
AIM_INGEST_PER_S = 7_200
TARGET_RSS_OVER_PAYLOAD = 300  # node RSS per loaded occurrence <= payload + this
TARGET_HERD_S = {100_000: 1.5, 1_000_000: 30.0}  # all received within


def upserts(run: str, phase: str, dues: Sequence[int]) -> list[tuple[bytes, bytes]]:
    out = []
    for i, at in enumerate(dues):
        jid = job_id(run, phase, i)
        out.append((jid.encode(), encode_upsert({"id": jid, "at": at,
                                                  "payload": payload(phase, i)})))
    return out


def add_stack_args(p: argparse.ArgumentParser) -> None:
    """--kafka and --cassandra, from CHRONOWHEEL_KAFKA / CHRONOWHEEL_CASSANDRA or the local
    stack's addresses."""
    p.add_argument("--kafka", default=os.environ.get("CHRONOWHEEL_KAFKA", "127.0.0.1:9092"))
    p.add_argument("--cassandra",
                   default=os.environ.get("CHRONOWHEEL_CASSANDRA", "127.0.0.1:9042"))


def fresh_namespace(args: argparse.Namespace, prefix: str) -> tuple[str, Settings,
                                                                      dict[str, str]]:
    """A run's namespace (`--namespace`, or `<prefix><epoch seconds>`), its settings on
    `--kafka` and `--cassandra` (loopback only: the run drops what it creates there) with
    `--shards`, and the node's extra environment (`--node-env KEY=VALUE`)."""
    require_loopback("kafka", args.kafka)
    require_loopback("cassandra", args.cassandra)
    ns = args.namespace or f"{prefix}{int(time.time())}"
    settings = Settings.from_env(namespace=ns, kafka=args.kafka, cassandra=args.cassandra,
                                 shards=args.shards, http_port=0)
    return ns, settings, dict(kv.split("=", 1) for kv in args.node_env)


def emit(out: dict[str, Any], path: str | None) -> None:
    """Print a run's result as JSON, and write it to `path` too when given."""
    text = json.dumps(out, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def init_with_cli(args: argparse.Namespace, namespace: str) -> None:
    """`chronowheel init` of a fresh namespace with `args.shards` shards on `args.kafka` and
    `args.cassandra`, as a user runs it."""
    say(f"namespace {namespace}: init with {args.shards} shards ...")
    subprocess.run([sys.executable, "-m", "chronowheel", "init", "--namespace", namespace,
                    "--shards", str(args.shards), "--kafka", args.kafka,
                    "--cassandra", args.cassandra], check=True, capture_output=True)


async def scratch_namespace(prefix: str, *, shards: int = 1) -> Settings:
    """A new namespace on the loopback servers of CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA
    (replication 1), initialised; the caller drops it (`chronowheel.testing.drop_namespace`)."""
    import secrets

    from chronowheel.admin import init_namespace

    cassandra = os.environ.get("CHRONOWHEEL_CASSANDRA", "127.0.0.1:9042")
    kafka = os.environ.get("CHRONOWHEEL_KAFKA", "127.0.0.1:9092")
    require_loopback("cassandra", cassandra)
    require_loopback("kafka", kafka)
    settings = Settings(namespace=prefix + secrets.token_hex(4), cassandra=cassandra,
                        kafka=kafka, shards=shards, replication="1")
    await init_namespace(settings)
    return settings
