"""`chronowheel capacity`: size shards, scheduler nodes, Cassandra and Kafka for a workload.

Per-node throughput and memory per wheel entry come from measurements: by default
`measured.json` beside this module, package data that is a copy of the benchmark's
`loadtest/results/measured.json` (tests/unit/test_cli_capacity.py keeps the two the same), so
the command works from an installed wheel; `--measured PATH` picks another file in the same
format (e.g. the measured-quick.json `loadtest/measure_quick.py` writes):

    {"fires_per_s_per_node": int,          occurrences one node process publishes per second
     "ingest_jobs_per_s_per_node": int,    submit commands one node process applies per second
     "wheel_bytes_per_entry": int,         node memory per loaded occurrence (its RSS growth
                                           per pending entry; small payloads included)
     "measured_on": str, "command": str,   when/where, and how to reproduce
     "wheel_bytes_measured_on": str,       optional: when wheel_bytes_per_entry came from a
     "wheel_bytes_command": str,           run of its own (`run_bench.py --record-memory`
                                           with a 1,000,000-job herd), and its command
     "details": {...},                     optional: raw figures of the run
     "storage": {...}}                     optional: Cassandra's disk per stored row, the
                                           compaction peak and long-horizon ingest, measured
                                           with millions of jobs stored (`Storage` below;
                                           `loadtest/bench/scale_bench.py --record-storage`)

A measured knee beats the node benchmark's fires/s: `loadtest/locust_capacity.py` (the capacity
test: a locust load raised step by step until an SLO breaks) appends each knee, with the size of
the cluster it ran on, to `loadtest/results/knees.json`. Given `--cluster
nodes=N,shards=S,cassandra=C,kafka=K`, the command takes fires/s per node from the latest knee
measured on a cluster of exactly that size (the knee's fires/s / N) and says so; with no such
knee, or no `--cluster`, it uses the benchmark's figure and says that. `--knees PATH` names
another knees file (default: loadtest/results/knees.json under the current directory, as when
run from a checkout's root):

    {"knees": [{"cluster": {"nodes": int, "shards": int, "cassandra_nodes": int,
                            "kafka_nodes": int},
                "knee": {"fires_per_s": float, ...} or null, "measured_on": str,
                "code": str, "command": str, "slo": {...}, "lower_bound": bool, ...}]}

Everything else is arithmetic on the flags, documented in deploy/runbooks/capacity.md; the
figures marked "assumed" are inputs (flags) with defaults, not measurements.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from chronowheel.core.durations import parse_duration
from chronowheel.errors import ConfigError, ValidationError
from chronowheel.ops.format import count

DAY_S = 86_400
GIB = 1 << 30
MEASURED_RELATIVE = Path("loadtest") / "results" / "measured.json"
"""Where the benchmark writes the figures in a source checkout."""
MEASURED_RESOURCE = "measured.json"
"""The copy of MEASURED_RELATIVE shipped in this package (beside this module)."""
PACKAGED_SOURCE = f"{MEASURED_RELATIVE}, as shipped with chronowheel"
KNEES_RELATIVE = Path("loadtest") / "results" / "knees.json"
"""Where the capacity test (loadtest/locust_capacity.py) appends its knees."""
CLUSTER_KEYS = {"nodes": "nodes", "shards": "shards", "cassandra": "cassandra_nodes",
                "kafka": "kafka_nodes"}
"""--cluster's names -> the knees file's"""
BENCHMARK_FIRES = "the node benchmark"
MEASURED_KEYS = ("fires_per_s_per_node", "ingest_jobs_per_s_per_node", "wheel_bytes_per_entry")
MAX_SHARDS = 4096  # what `chronowheel init` accepts

# Storage overheads per row beyond the variable fields (keys, clustering columns, cell
# metadata, timestamps), rounded up from Cassandra's row format; and per Kafka record
# (record batch share, headers framing). Deliberately generous: disk is cheap to over-plan.
DUE_ROW_FIXED_BYTES = 160
JOB_ROW_FIXED_BYTES = 120
SPEC_JSON_FIXED_BYTES = 80     # {"id":..,"at":"..","topic":..} around id and payload
BUCKET_COUNT_ROW_BYTES = 60
RETIRED_ROW_FIXED_BYTES = 80
SUBMIT_RECORD_FIXED_BYTES = 150  # {"v":1,"op":"upsert","job":{...}} + record framing
FIRED_RECORD_FIXED_BYTES = 260   # 7 cw-* headers + record framing
STATE_RECORD_BYTES = 200


LONG_HORIZON_S = 3_600
"""Jobs submitted more than this far ahead of their instant plan with the long-horizon ingest
rate (when measured): their rows land in buckets spread over days, not the next minutes."""


@dataclass(frozen=True)
class Storage:
    """Cassandra's disk use measured with millions of jobs stored (`scale_bench.py`): bytes on
    disk of one replica (Cassandra's default LZ4 compression) per row of each table, for the
    run's payload and id sizes; how far the data directory grew above its live sstables while
    compactions ran (None: not measured); and ingest of jobs due days ahead."""

    jobs_stored: int
    jobs_row_bytes: float        # a `jobs` row with its share of the three SAI indexes
    due_row_bytes: float
    retired_row_bytes: float     # a `due_retired` row
    payload_bytes: int           # the run's payload JSON per job (headers: none)
    id_bytes: int
    compaction_peak_ratio: float | None  # largest data directory / live sstables meanwhile
    ingest_long_horizon_jobs_per_s_per_node: float
    """submit commands applied per second (as ingest_jobs_per_s_per_node counts them), the
    median of the run's per-million rates"""
    measured_on: str
    command: str

    @classmethod
    def from_doc(cls, doc: Any, source: str) -> Storage:
        if not isinstance(doc, dict):
            raise ConfigError(f"{source}: storage must be a JSON object")
        numbers = ("jobs_stored", "jobs_row_bytes", "due_row_bytes", "retired_row_bytes",
                   "payload_bytes", "id_bytes", "compaction_peak_ratio",
                   "ingest_long_horizon_jobs_per_s_per_node")
        for key in numbers:
            value = doc.get(key)
            if key == "compaction_peak_ratio" and value is None:
                continue  # not measured (the data directory was not on the bench's machine)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{source}: storage.{key} must be a positive number, "
                                  f"got {value!r}")
        peak = doc.get("compaction_peak_ratio")
        return cls(int(doc["jobs_stored"]), float(doc["jobs_row_bytes"]),
                   float(doc["due_row_bytes"]), float(doc["retired_row_bytes"]),
                   int(doc["payload_bytes"]), int(doc["id_bytes"]),
                   None if peak is None else float(peak),
                   float(doc["ingest_long_horizon_jobs_per_s_per_node"]),
                   str(doc.get("measured_on", "?")), str(doc.get("command", "?")))


@dataclass(frozen=True)
class Measured:
    fires_per_s_per_node: float
    ingest_jobs_per_s_per_node: float
    wheel_bytes_per_entry: float
    measured_on: str
    command: str
    source: str
    # Memory per entry does not depend on the machine's speed, so it may come from a run of
    # its own, at the size the targets name (1,000,000 loaded); by default the same run.
    wheel_bytes_measured_on: str = ""
    wheel_bytes_command: str = ""
    fires_source: str = BENCHMARK_FIRES
    """where fires_per_s_per_node came from: the benchmark, or a measured knee (described)"""
    storage: Storage | None = None
    """measured disk per row and long-horizon ingest; None: the fixed row overheads"""

    @classmethod
    def from_doc(cls, doc: Any, source: str) -> Measured:
        if not isinstance(doc, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        for key in MEASURED_KEYS:
            value = doc.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{source}: {key} must be a positive number, got {value!r}")
        measured_on, command = str(doc.get("measured_on", "?")), str(doc.get("command", "?"))
        storage = doc.get("storage")
        return cls(float(doc["fires_per_s_per_node"]), float(doc["ingest_jobs_per_s_per_node"]),
                   float(doc["wheel_bytes_per_entry"]), measured_on, command, source,
                   str(doc.get("wheel_bytes_measured_on") or measured_on),
                   str(doc.get("wheel_bytes_command") or command),
                   storage=None if storage is None else Storage.from_doc(storage, source))


def packaged_measured() -> Path:
    """The measured figures shipped in the package (a copy of loadtest/results/measured.json)."""
    return Path(str(resources.files("chronowheel.cli") / MEASURED_RESOURCE))


def find_measured(explicit: str | None) -> Path:
    """`--measured PATH` when given, else the figures shipped in the package."""
    return Path(explicit) if explicit else packaged_measured()


def load_measured(path: Path) -> Measured:
    packaged = path == packaged_measured()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        if packaged:  # a broken install: package data left out
            raise ConfigError(f"the measured figures are missing from the installed package "
                              f"({path}): give a file with --measured PATH") from None
        raise ConfigError(f"cannot read measured figures {path}: {exc.strerror} (in a source "
                          f"checkout, loadtest/measure_quick.py or the benchmark writes them; "
                          f"without --measured the figures shipped with the package are used)"
                          ) from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    if packaged:
        return Measured.from_doc(doc, PACKAGED_SOURCE)
    shown = os.path.relpath(path)  # the short name when run from the repository
    return Measured.from_doc(doc, str(path) if shown.startswith("..") else shown)


def parse_cluster(text: str) -> dict[str, int]:
    """`nodes=3,shards=16,cassandra=3,kafka=3` (all four) -> the knees file's cluster keys."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        key = CLUSTER_KEYS.get(name.strip().lower())
        if not sep or key is None:
            raise argparse.ArgumentTypeError(
                f"--cluster {text!r}: expected nodes=N,shards=S,cassandra=C,kafka=K")
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--cluster {text!r}: {value.strip()!r} is not a "
                                             f"whole number") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"--cluster {text!r}: {name.strip()} must be >= 1")
        out[key] = n
    if set(out) != set(CLUSTER_KEYS.values()):
        raise argparse.ArgumentTypeError(
            f"--cluster {text!r}: give all of nodes, shards, cassandra and kafka")
    return out


def describe_cluster(c: Any) -> str:
    return (f"{c.get('nodes')} node(s), {c.get('shards')} shards, {c.get('cassandra_nodes')} "
            f"Cassandra, {c.get('kafka_nodes')} Kafka")


def find_knees(explicit: str | None) -> Path | None:
    """`--knees PATH`, else loadtest/results/knees.json under the current directory (run from
    a checkout's root), else none."""
    if explicit:
        return Path(explicit)
    return KNEES_RELATIVE if KNEES_RELATIVE.is_file() else None


def load_knees(path: Path) -> list[dict[str, Any]]:
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read knees {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    knees = doc.get("knees") if isinstance(doc, dict) else None
    if not isinstance(knees, list):
        raise ConfigError(f'{path}: expected {{"knees": [...]}}')
    return [k for k in knees if isinstance(k, dict)]


def matching_knee(knees: list[dict[str, Any]],
                  cluster: dict[str, int]) -> dict[str, Any] | None:
    """The latest knee measured on a cluster of exactly this size (None: none)."""
    found = [k for k in knees
             if isinstance(k.get("cluster"), dict)
             and all(k["cluster"].get(key) == n for key, n in cluster.items())
             and isinstance(k.get("knee"), dict)
             and isinstance(k["knee"].get("fires_per_s"), int | float)
             and k["knee"]["fires_per_s"] > 0]
    return max(found, key=lambda k: str(k.get("measured_on", ""))) if found else None


def with_knee(m: Measured, cluster: dict[str, int] | None,
              knees_path: Path | None) -> Measured:
    """The measured figures with fires/s per node from the matching knee when there is one;
    `fires_source` says which was used and why."""
    if cluster is None:
        return replace(m, fires_source=f"{BENCHMARK_FIRES} (a measured knee is used with "
                                       f"--cluster, for the cluster size it was measured on)")
    if knees_path is None:
        return replace(m, fires_source=f"{BENCHMARK_FIRES} (no measured knee: no "
                                       f"{KNEES_RELATIVE} here and no --knees)")
    where = os.path.relpath(knees_path)
    knee = matching_knee(load_knees(knees_path), cluster)
    if knee is None:
        return replace(m, fires_source=f"{BENCHMARK_FIRES} (no measured knee for "
                                       f"{describe_cluster(cluster)} in {where})")
    k = knee["knee"]
    slo = knee.get("slo") or {}
    bound = " (a lower bound: no step broke the SLO)" if knee.get("lower_bound") else ""
    source = (f"the measured knee of {describe_cluster(cluster)} in {where}: "
              f"{k['fires_per_s']:,.0f} fires/s / {cluster['nodes']} node(s){bound}, SLO "
              f"p{slo.get('percentile', '?')} <= {slo.get('bound_ms', '?')} ms; measured on "
              f"{knee.get('measured_on', '?')}, code {knee.get('code', '?')}: "
              f"{knee.get('command', '?')}")
    return replace(m, fires_per_s_per_node=float(k["fires_per_s"]) / cluster["nodes"],
                   fires_source=source)


@dataclass(frozen=True)
class Workload:
    jobs_per_day: float          # occurrences fired per day
    peak_factor: float = 1.0     # peak fire rate / average fire rate
    peak_minutes: float = 1.0    # how long the peak lasts
    horizon_s: float = DAY_S     # mean lead time, submit to fire
    payload_bytes: int = 256
    replication: int = 3
    submits_per_day: float | None = None  # default: one submit per occurrence (one-shots)
    ingest_peak_factor: float = 1.0
    headers_bytes: int = 64
    id_bytes: int = 24
    retention_s: float = 7 * DAY_S        # fired due rows kept (settings.retention_ms)
    jobs_retention_s: float | None = None  # how long a jobs row is kept (default: none)
    kafka_retention_s: float = 7 * DAY_S
    utilization: float = 0.5     # most of a node's measured capacity planned for normal load
    growth: float = 2.0          # shards are fixed: plan them for this multiple of the load
    nodes_per_host: int = 1      # node processes sharing a host: a host failure loses them all
    lookahead_s: float = 120.0
    prewarm_s: float = 900.0
    hot_bucket_rows: int = 5_000
    changed_share: float = 0.0   # pending occurrences cancelled, edited or paused before due
    compression: float = 1.0     # on-disk bytes / raw bytes (1.0 = none assumed)
    disk_headroom: float = 2.0   # provisioned / used: room for compaction and growth
    cassandra_node_disk_bytes: float = 2e12
    cassandra_writes_per_node: float = 20_000.0
    kafka_broker_disk_bytes: float = 2e12

    def check(self) -> None:
        positive = ("jobs_per_day", "peak_factor", "peak_minutes", "utilization", "growth",
                    "compression", "disk_headroom", "cassandra_node_disk_bytes",
                    "cassandra_writes_per_node", "kafka_broker_disk_bytes")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValidationError(f"--{name.replace('_', '-')}", "must be positive",
                                      getattr(self, name))
        if self.peak_factor < 1:
            raise ValidationError("--peak-factor", "must be at least 1", self.peak_factor)
        if not 0 < self.utilization <= 1:
            raise ValidationError("--utilization", "must be in (0, 1]", self.utilization)
        if not 0 <= self.changed_share <= 1:
            raise ValidationError("--changed-share", "must be in [0, 1]", self.changed_share)
        if self.replication < 1:
            raise ValidationError("--replication", "must be at least 1", self.replication)
        if self.nodes_per_host < 1:
            raise ValidationError("--nodes-per-host", "must be at least 1", self.nodes_per_host)


def _pow2(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


def ingest_rate(w: Workload, m: Measured) -> tuple[float, str]:
    """Ingested jobs/s per node to plan with, and which figure it is: the long-horizon run's
    when jobs are submitted more than an hour ahead and it was measured (and is lower)."""
    st = m.storage
    if st is not None and w.horizon_s > LONG_HORIZON_S \
            and st.ingest_long_horizon_jobs_per_s_per_node < m.ingest_jobs_per_s_per_node:
        return (st.ingest_long_horizon_jobs_per_s_per_node,
                f"the long-horizon run ({count(st.jobs_stored)} jobs stored, due 1 to 90 days "
                f"ahead; the horizon is over {LONG_HORIZON_S // 3600} h)")
    return m.ingest_jobs_per_s_per_node, "the node benchmark"


def row_sizes(w: Workload, st: Storage | None) -> dict[str, Any]:
    """Bytes per row on one replica's disk. Measured: the run's row sizes plus what this
    workload's payload, headers and id add beyond the run's (times --compression; smaller
    ones are not subtracted). Otherwise fixed overheads plus the variable fields."""
    if st is None:
        return {
            "due": (DUE_ROW_FIXED_BYTES + w.id_bytes + w.payload_bytes
                    + w.headers_bytes) * w.compression,
            "due_retired": (RETIRED_ROW_FIXED_BYTES + w.id_bytes) * w.compression,
            "jobs": (JOB_ROW_FIXED_BYTES + 2 * w.id_bytes + SPEC_JSON_FIXED_BYTES
                     + w.payload_bytes + w.headers_bytes) * w.compression,
            "source": "fixed overheads per row (no storage figures measured)",
        }
    extra = max(0, w.payload_bytes + w.headers_bytes - st.payload_bytes) * w.compression
    extra_id = max(0, w.id_bytes - st.id_bytes) * w.compression
    return {
        "due": st.due_row_bytes + extra + extra_id,
        "due_retired": st.retired_row_bytes + extra_id,
        "jobs": st.jobs_row_bytes + extra + 2 * extra_id,  # the key and the spec's "id"
        "source": (f"measured with {count(st.jobs_stored)} jobs stored ({st.payload_bytes} B "
                   f"payloads), on {st.measured_on}: {st.command}"),
    }


def plan(w: Workload, m: Measured) -> dict[str, Any]:
    """The whole model; every number the output shows is computed here (pure)."""
    w.check()
    submits_per_day = w.jobs_per_day if w.submits_per_day is None else w.submits_per_day
    avg_fire = w.jobs_per_day / DAY_S
    peak_fire = avg_fire * w.peak_factor
    avg_submit = submits_per_day / DAY_S
    peak_submit = avg_submit * w.ingest_peak_factor

    # --- scheduler nodes and shards -----------------------------------------------------
    # Fire and ingest share a node's CPU; each was measured alone at full speed, so their
    # fractions add up (conservative: assumes the peaks coincide).
    ingest_per_node, ingest_source = ingest_rate(w, m)
    demand = peak_fire / m.fires_per_s_per_node + peak_submit / ingest_per_node
    # A shard never splits across nodes, and nodes get whole shards: 4+ shards per node (at
    # the planned growth) keeps the busiest node within 25% of the average.
    nodes_at_growth = math.ceil(demand * w.growth / w.utilization)
    shards = min(MAX_SHARDS, max(16, _pow2(4 * nodes_at_growth)))
    per_shard = demand / shards  # node-equivalents one shard needs at peak
    if per_shard > w.utilization:
        raise ConfigError(
            f"cannot be placed: with the measured {m.fires_per_s_per_node:,.0f} fires/s and "
            f"{ingest_per_node:,.0f} ingested jobs/s per node ({m.source}), one "
            f"shard would need {per_shard:.0%} of a node at peak even with {MAX_SHARDS} shards "
            f"(at most {w.utilization:.0%} is planned); measure on production-like hardware")
    # Never fewer than one host more than a host holds: losing a host must not stop dispatch.
    down = w.nodes_per_host
    nodes = max(2, down + 1)
    while True:
        normal = math.ceil(shards / nodes) * per_shard
        failover = math.ceil(shards / (nodes - down)) * per_shard
        if normal <= w.utilization and failover <= 1.0:
            break
        nodes += 1

    # --- memory per node ----------------------------------------------------------------
    avg_rows_per_bucket = avg_fire * 60 / shards
    # Buckets above hot_bucket_rows are pre-warmed: if even ordinary ones are, the wheel
    # holds prewarm (not lookahead) worth of rows.
    ordinary_hot = avg_rows_per_bucket > w.hot_bucket_rows
    window_s = w.prewarm_s if ordinary_hot else w.lookahead_s
    peak_extra_rows = max(0.0, peak_fire - avg_fire) * 60 * w.peak_minutes
    entries_per_shard = (avg_fire * window_s + peak_extra_rows) / shards
    bytes_per_entry = m.wheel_bytes_per_entry + w.payload_bytes + w.headers_bytes
    shards_per_node = math.ceil(shards / nodes)
    shards_per_node_failover = math.ceil(shards / (nodes - down))
    memory = {
        "avg_rows_per_bucket": avg_rows_per_bucket,
        "peak_rows_per_bucket": peak_fire * 60 / shards,
        "ordinary_buckets_hot": ordinary_hot,
        "wheel_window_s": window_s,
        "entries_per_shard": entries_per_shard,
        "bytes_per_entry": bytes_per_entry,
        "shards_per_node": shards_per_node,
        "shards_per_node_one_down": shards_per_node_failover,
        "entries_per_node": entries_per_shard * shards_per_node,
        "wheel_bytes_per_node": entries_per_shard * shards_per_node * bytes_per_entry,
        "wheel_bytes_per_node_one_down":
            entries_per_shard * shards_per_node_failover * bytes_per_entry,
        # Only a peak well above the average should be pre-warmed early, not every bucket.
        "recommended_hot_bucket_rows": max(w.hot_bucket_rows,
                                           math.ceil(2 * avg_rows_per_bucket)),
        "recommended_bucket_cap_rows": max(200_000, math.ceil(1.25 * entries_per_shard)),
    }

    # --- Cassandra ----------------------------------------------------------------------
    pending_rows = avg_fire * w.horizon_s                      # Little's law
    retained_rows = avg_fire * w.retention_s                   # fired rows until their TTL
    # A change of a pending occurrence leaves its due row (read and skipped) and a retired
    # row, both until that occurrence's TTL (its slot + retention: at most horizon +
    # retention after the change); its replacement, if any, is in pending_rows.
    retired_rows = (pending_rows + retained_rows) * w.changed_share
    jobs_retention_s = w.jobs_retention_s
    jobs_rows = avg_submit * (w.horizon_s + w.retention_s if jobs_retention_s is None
                              else jobs_retention_s)
    counts_rows = shards * 1440 * 365  # one counter per (minute, shard), never expires: a year
    sizes = row_sizes(w, m.storage)
    due_rows = pending_rows + retained_rows + retired_rows
    one_replica = (due_rows * sizes["due"] + retired_rows * sizes["due_retired"]
                   + jobs_rows * sizes["jobs"] + counts_rows * BUCKET_COUNT_ROW_BYTES)
    on_disk = one_replica * w.replication
    provisioned = on_disk * w.disk_headroom
    stored_jobs = jobs_rows  # a stored job: its jobs row, and its due rows pending or kept
    per_job = one_replica / stored_jobs if stored_jobs else 0.0
    # Per submit: read jobs row, write due row + bucket count + jobs row. Per fire of a
    # one-shot: nothing (rows expire by TTL); the bucket is read once.
    writes_peak = peak_submit * 3
    replica_writes_peak = writes_peak * w.replication
    cassandra_nodes = max(w.replication,
                          math.ceil(provisioned / w.cassandra_node_disk_bytes),
                          math.ceil(replica_writes_peak / w.cassandra_writes_per_node))
    cassandra = {
        "pending_due_rows": pending_rows,
        "retained_fired_rows": retained_rows,
        "due_rows_changed_kept": retired_rows,
        "due_retired_rows": retired_rows,
        "due_row_bytes": sizes["due"],
        "due_retired_row_bytes": sizes["due_retired"],
        "jobs_rows": jobs_rows,
        "jobs_rows_growth_per_day": submits_per_day,
        "job_row_bytes": sizes["jobs"],
        "row_sizes_source": sizes["source"],
        "bucket_count_rows_per_year": counts_rows,
        "bytes_one_replica": one_replica,
        "bytes_per_stored_job": per_job,
        "bytes_per_stored_job_replicated": per_job * w.replication,
        "bytes_on_disk_replicated": on_disk,
        "bytes_provisioned": provisioned,
        "bytes_provisioned_per_node": provisioned / cassandra_nodes,
        "compaction_peak_ratio": m.storage.compaction_peak_ratio if m.storage else None,
        "headroom_below_compaction_peak": bool(
            m.storage and m.storage.compaction_peak_ratio
            and w.disk_headroom < m.storage.compaction_peak_ratio),
        "writes_per_s_peak": writes_peak,
        "reads_per_s_peak": peak_submit,
        "bucket_rows_read_per_s_avg": avg_fire,
        "replica_writes_per_s_peak": replica_writes_peak,
        "nodes": cassandra_nodes,
    }

    # --- Kafka --------------------------------------------------------------------------
    submit_record = SUBMIT_RECORD_FIXED_BYTES + 2 * w.id_bytes + w.payload_bytes \
        + w.headers_bytes
    fired_record = FIRED_RECORD_FIXED_BYTES + 3 * w.id_bytes + w.payload_bytes + w.headers_bytes
    per_day = submits_per_day * submit_record + w.jobs_per_day * fired_record
    kafka_disk = per_day * (w.kafka_retention_s / DAY_S) * w.replication
    partitions = 3 * shards + 2  # submit, state, fired: N each; rejected, dead: 1
    in_peak = peak_submit * submit_record + peak_fire * fired_record
    brokers = max(w.replication, math.ceil(kafka_disk * w.disk_headroom
                                           / w.kafka_broker_disk_bytes))
    kafka = {
        "partitions": partitions,
        "partition_replicas": partitions * w.replication,
        "submit_record_bytes": submit_record,
        "fired_record_bytes": fired_record,
        "bytes_per_day": per_day,
        "bytes_on_disk_replicated": kafka_disk,
        "bytes_in_per_s_peak": in_peak,
        "replicated_bytes_in_per_s_peak": in_peak * w.replication,
        "brokers": brokers,
        "note": "target topics other than <ns>.fired add their own partitions",
    }
    return {
        "workload": asdict(w) | {"submits_per_day": submits_per_day},
        "measured": asdict(m),
        "rates": {"avg_fire_per_s": avg_fire, "peak_fire_per_s": peak_fire,
                  "avg_submit_per_s": avg_submit, "peak_submit_per_s": peak_submit},
        "scheduler": {"demand_node_equivalents": demand, "shards": shards, "nodes": nodes,
                      "ingest_jobs_per_s_per_node": ingest_per_node,
                      "ingest_source": ingest_source,
                      "per_shard_node_fraction": per_shard,
                      "busiest_node_utilization": math.ceil(shards / nodes) * per_shard,
                      "busiest_node_utilization_one_down":
                          math.ceil(shards / (nodes - down)) * per_shard},
        "memory": memory,
        "cassandra": cassandra,
        "kafka": kafka,
    }


# --- rendering ---------------------------------------------------------------------------

def size(n: float) -> str:
    """Binary units: 1.5 GiB, 320 MiB, 12 KiB, 900 B."""
    for unit, factor in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", GIB), ("MiB", 1 << 20),
                         ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n:.0f} B"


def render(p: dict[str, Any]) -> str:
    w, m, r = p["workload"], p["measured"], p["rates"]
    s, mem, c, k = p["scheduler"], p["memory"], p["cassandra"], p["kafka"]

    def n(x: float) -> str:
        return count(round(x))

    down = ("one node down" if w["nodes_per_host"] == 1
            else f"one host ({w['nodes_per_host']} nodes) down")

    lines = [
        f"measured per node: {n(m['fires_per_s_per_node'])} fires/s, "
        f"{n(s['ingest_jobs_per_s_per_node'])} ingested jobs/s, "
        f"{n(m['wheel_bytes_per_entry'])} B per wheel entry",
        f"  benchmark figures from {m['source']}, measured on {m['measured_on']}",
        f"  fires/s per node from {m['fires_source']}",
        f"  ingested jobs/s per node from {s['ingest_source']}",
        *([f"  bytes per wheel entry measured on {m['wheel_bytes_measured_on']}: "
           f"{m['wheel_bytes_command']}"]
          if m["wheel_bytes_measured_on"] != m["measured_on"] else []),
        "",
        "load",
        f"  occurrences per day          {n(w['jobs_per_day'])}",
        f"  fire rate                    {n(r['avg_fire_per_s'])}/s average, "
        f"{n(r['peak_fire_per_s'])}/s peak (x{w['peak_factor']:g} for "
        f"{w['peak_minutes']:g} min)",
        f"  submit rate                  {n(r['avg_submit_per_s'])}/s average, "
        f"{n(r['peak_submit_per_s'])}/s peak",
        "",
        "scheduler",
        f"  demand at peak               {s['demand_node_equivalents']:.1f} node-equivalents "
        f"(fires + ingest, at 100% of the measured rates)",
        f"  shards (fixed at init)       {s['shards']}  (>= 4 per node at x{w['growth']:g} "
        f"growth, power of two)",
        f"  nodes                        {s['nodes']}  (busiest at "
        f"{s['busiest_node_utilization']:.0%}, target <= {w['utilization']:.0%}; {down}: "
        f"{s['busiest_node_utilization_one_down']:.0%})",
        f"  shards per node              {mem['shards_per_node']} "
        f"({mem['shards_per_node_one_down']} with {down})",
        "",
        "memory per node (timing wheel)",
        f"  rows per minute bucket       {n(mem['avg_rows_per_bucket'])} average, "
        f"{n(mem['peak_rows_per_bucket'])} at peak",
        f"  wheel entries per shard      {n(mem['entries_per_shard'])} (window "
        f"{mem['wheel_window_s']:g}s of ordinary rows + the pre-warmed peak)",
        f"  bytes per entry              {n(mem['bytes_per_entry'])} (measured "
        f"{n(m['wheel_bytes_per_entry'])} + payload {w['payload_bytes']} + headers "
        f"{w['headers_bytes']})",
        f"  wheel memory                 {size(mem['wheel_bytes_per_node'])} "
        f"({size(mem['wheel_bytes_per_node_one_down'])} with {down})",
    ]
    lines += [
        f"  settings                     --hot-bucket-rows {mem['recommended_hot_bucket_rows']}"
        f"  --bucket-cap-rows {mem['recommended_bucket_cap_rows']}",
    ]
    if mem["ordinary_buckets_hot"]:
        lines.append(f"  note: ordinary buckets exceed --hot-bucket-rows {w['hot_bucket_rows']}"
                     f": raise it, or every bucket is pre-warmed")
    lines += [
        "",
        f"cassandra (replication {w['replication']})",
        f"  due rows pending             {n(c['pending_due_rows'])} (rate x horizon "
        f"{w['horizon_s'] / DAY_S:g}d)",
        f"  due rows fired, kept by TTL  {n(c['retained_fired_rows'])} (retention "
        f"{w['retention_s'] / DAY_S:g}d)",
        f"  jobs rows                    {n(c['jobs_rows'])} (one-shot rows expire retention "
        f"after they fire)",
        *([f"  changed before due           {n(c['due_retired_rows'])} due rows kept beside as "
           f"many due_retired rows (--changed-share {w['changed_share']:g})"]
          if c["due_retired_rows"] else []),
        f"  row sizes on disk            due {n(c['due_row_bytes'])} B, jobs "
        f"{n(c['job_row_bytes'])} B, due_retired {n(c['due_retired_row_bytes'])} B",
        f"    {c['row_sizes_source']}",
        f"  disk per stored job          {size(c['bytes_per_stored_job'])} on one replica, "
        f"{size(c['bytes_per_stored_job_replicated'])} with {w['replication']} replicas",
        f"  data                         {size(c['bytes_one_replica'])} one replica, "
        f"{size(c['bytes_on_disk_replicated'])} replicated, "
        f"{size(c['bytes_provisioned'])} provisioned (x{w['disk_headroom']:g} headroom), "
        f"{size(c['bytes_provisioned_per_node'])} per node",
        *([f"  compaction                   the measured run's data directory peaked at "
           f"x{c['compaction_peak_ratio']:.2f} of its live sstables"
           + (f": --disk-headroom {w['disk_headroom']:g} is below that"
              if c["headroom_below_compaction_peak"] else "")]
          if c["compaction_peak_ratio"] is not None else []),
        f"  operations at peak           {n(c['writes_per_s_peak'])} writes/s "
        f"({n(c['replica_writes_per_s_peak'])} replica writes/s), "
        f"{n(c['reads_per_s_peak'])} reads/s, {n(c['bucket_rows_read_per_s_avg'])} bucket rows "
        f"read/s",
        f"  nodes                        {c['nodes']} (assumed "
        f"{size(w['cassandra_node_disk_bytes'])} disk and "
        f"{n(w['cassandra_writes_per_node'])} writes/s per node: not measured here)",
        "",
        f"kafka (replication {w['replication']})",
        f"  partitions                   {k['partitions']} ({k['partition_replicas']} "
        f"replicas): submit, state, fired x {s['shards']}; rejected, dead x 1",
        f"  records                      submit {k['submit_record_bytes']} B, fired "
        f"{k['fired_record_bytes']} B",
        f"  throughput at peak           {size(k['bytes_in_per_s_peak'])}/s in "
        f"({size(k['replicated_bytes_in_per_s_peak'])}/s replicated)",
        f"  disk                         {size(k['bytes_per_day'])}/day, "
        f"{size(k['bytes_on_disk_replicated'])} for "
        f"{w['kafka_retention_s'] / DAY_S:g}d retention, replicated",
        f"  brokers                      {k['brokers']} (assumed "
        f"{size(w['kafka_broker_disk_bytes'])} disk per broker)",
    ]
    return "\n".join(lines)


# --- command -----------------------------------------------------------------------------

def _duration_s(text: str) -> float:
    try:
        return parse_duration(text, path="duration") / 1000
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number(text: str) -> float:
    """Accepts 1e9, 1_000_000_000 and 1000000000."""
    try:
        return float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "capacity", help="size shards, nodes, Cassandra and Kafka for a workload",
        description="Capacity model (deploy/runbooks/capacity.md). Per-node throughput and "
                    "bytes per wheel entry are the benchmark's (loadtest/results/measured.json "
                    "of the source, shipped with the package); --measured PATH reads another "
                    "file. With --cluster, fires/s per node come from the capacity test's "
                    "latest knee measured on a cluster of that size (loadtest/results/"
                    "knees.json), when there is one; the output says which source it used.")
    d = Workload(jobs_per_day=1)
    p.add_argument("--jobs-per-day", type=_number, required=True, metavar="N",
                   help="occurrences fired per day (1e9 is fine)")
    p.add_argument("--peak-factor", type=_number, default=d.peak_factor, metavar="F",
                   help="peak fire rate over the average, e.g. 20 for a top-of-hour herd (1)")
    p.add_argument("--peak-minutes", type=_number, default=d.peak_minutes, metavar="M",
                   help="how long the peak lasts, minutes (1)")
    p.add_argument("--horizon", type=_duration_s, default=d.horizon_s, metavar="D",
                   help="mean lead time from submit to fire, e.g. 7d (1d)")
    p.add_argument("--payload-bytes", type=int, default=d.payload_bytes, metavar="B",
                   help=f"mean payload size ({d.payload_bytes})")
    p.add_argument("--replication", type=int, default=d.replication, metavar="R",
                   help=f"Cassandra and Kafka replication factor ({d.replication})")
    p.add_argument("--submits-per-day", type=_number, metavar="N",
                   help="submit commands per day (default: one per occurrence)")
    p.add_argument("--ingest-peak-factor", type=_number, default=d.ingest_peak_factor,
                   metavar="F", help="peak submit rate over the average (1)")
    p.add_argument("--headers-bytes", type=int, default=d.headers_bytes, metavar="B",
                   help=f"job headers per occurrence ({d.headers_bytes})")
    p.add_argument("--id-bytes", type=int, default=d.id_bytes, metavar="B",
                   help=f"mean job id length ({d.id_bytes})")
    p.add_argument("--retention", type=_duration_s, default=d.retention_s, metavar="D",
                   help="fired due rows kept (the node's --retention-ms) (7d)")
    p.add_argument("--jobs-retention", type=_duration_s, metavar="D",
                   help="how long jobs rows are kept (default: horizon + retention)")
    p.add_argument("--kafka-retention", type=_duration_s, default=d.kafka_retention_s,
                   metavar="D", help="retention of submit/fired topics (7d)")
    p.add_argument("--utilization", type=_number, default=d.utilization, metavar="U",
                   help="share of measured node capacity to plan for (0.5)")
    p.add_argument("--growth", type=_number, default=d.growth, metavar="G",
                   help="plan the (fixed) shard count for G times this load (2)")
    p.add_argument("--nodes-per-host", type=int, default=d.nodes_per_host, metavar="K",
                   help="node processes per host: the failure rule drops K nodes at once (1)")
    p.add_argument("--lookahead", type=_duration_s, default=d.lookahead_s, metavar="D",
                   help="the node's --lookahead-ms (2m)")
    p.add_argument("--prewarm", type=_duration_s, default=d.prewarm_s, metavar="D",
                   help="the node's --prewarm-ms (15m)")
    p.add_argument("--hot-bucket-rows", type=int, default=d.hot_bucket_rows, metavar="N",
                   help=f"the node's --hot-bucket-rows ({d.hot_bucket_rows})")
    p.add_argument("--changed-share", type=_number, default=d.changed_share, metavar="S",
                   help="share of pending occurrences cancelled, edited or paused before they "
                        "are due: each keeps its due row and adds a due_retired row (0)")
    p.add_argument("--compression", type=_number, default=d.compression, metavar="RATIO",
                   help="on-disk/raw bytes in Cassandra for what the measured row sizes do not "
                        "cover (payload, headers or id above the measured run's; all of a row "
                        "without storage figures) (1.0: none assumed)")
    p.add_argument("--disk-headroom", type=_number, default=d.disk_headroom, metavar="X",
                   help="provisioned disk over used (2.0)")
    p.add_argument("--cassandra-node-disk-gb", type=_number, default=2000, metavar="GB",
                   help="assumed usable disk per Cassandra node (2000)")
    p.add_argument("--cassandra-writes-per-node", type=_number,
                   default=d.cassandra_writes_per_node, metavar="N",
                   help="assumed replica writes/s per Cassandra node (20000)")
    p.add_argument("--kafka-broker-disk-gb", type=_number, default=2000, metavar="GB",
                   help="assumed usable disk per Kafka broker (2000)")
    p.add_argument("--measured", metavar="PATH",
                   help="measured figures (default: the package's copy of "
                        "loadtest/results/measured.json)")
    p.add_argument("--cluster", type=parse_cluster, metavar="nodes=N,shards=S,cassandra=C,kafka=K",
                   help="the cluster being planned: fires/s per node then come from the latest "
                        "knee the capacity test measured on a cluster of this size, if any")
    p.add_argument("--knees", metavar="PATH",
                   help="the capacity test's knees (default: loadtest/results/knees.json under "
                        "the current directory)")
    p.add_argument("--json", action="store_true", help="the whole model as JSON")
    p.set_defaults(func=run)


def workload_from_args(args: argparse.Namespace) -> Workload:
    return Workload(
        jobs_per_day=args.jobs_per_day, peak_factor=args.peak_factor,
        peak_minutes=args.peak_minutes, horizon_s=args.horizon,
        payload_bytes=args.payload_bytes, replication=args.replication,
        submits_per_day=args.submits_per_day, ingest_peak_factor=args.ingest_peak_factor,
        headers_bytes=args.headers_bytes, id_bytes=args.id_bytes, retention_s=args.retention,
        jobs_retention_s=args.jobs_retention, kafka_retention_s=args.kafka_retention,
        utilization=args.utilization, growth=args.growth,
        nodes_per_host=args.nodes_per_host, lookahead_s=args.lookahead,
        prewarm_s=args.prewarm, hot_bucket_rows=args.hot_bucket_rows,
        changed_share=args.changed_share,
        compression=args.compression, disk_headroom=args.disk_headroom,
        cassandra_node_disk_bytes=args.cassandra_node_disk_gb * 1e9,
        cassandra_writes_per_node=args.cassandra_writes_per_node,
        kafka_broker_disk_bytes=args.kafka_broker_disk_gb * 1e9)


def run(args: argparse.Namespace) -> int:
    measured = with_knee(load_measured(find_measured(args.measured)), args.cluster,
                         find_knees(args.knees))
    result = plan(workload_from_args(args), measured)
    print(orjson.dumps(result).decode() if args.json else render(result))
    return 0
