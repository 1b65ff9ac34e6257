"""One frozen settings object. Every field is a CLI flag and a CHRONOWHEEL_* environment variable.

Precedence: command-line flag > environment variable > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chronowheel.errors import ConfigError

ENV_PREFIX = "CHRONOWHEEL_"


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    namespace: str = _opt("chronowheel", "namespace: prefix of topics and Cassandra keyspace")
    cassandra: str = _opt("127.0.0.1:9042", "Cassandra contact points, host[:port],...")
    kafka: str = _opt("127.0.0.1:9092", "Kafka bootstrap servers, host:port,...")
    shards: int = _opt(16, "number of shards N (fixed at init)")
    replication: int = _opt(1, "Cassandra replication factor and Kafka topic replication (init)")
    consistency: str = _opt("LOCAL_QUORUM", "Cassandra consistency level for reads and writes")
    http_port: int = _opt(8080, "HTTP port for /metrics and /healthz (0 = pick a free one)")
    lookahead_ms: int = _opt(120_000, "keep the wheel loaded this far ahead of now")
    prewarm_ms: int = _opt(900_000, "load hot buckets this far ahead of their minute")
    hot_bucket_rows: int = _opt(5_000, "a bucket with more rows than this is hot (pre-warmed)")
    bucket_page_rows: int = _opt(5_000, "rows per page when reading a bucket partition")
    bucket_cap_rows: int = _opt(200_000, "at most this many rows of one bucket held in memory")
    max_clock_skew_ms: int = _opt(500, "stop dispatching when clock and Cassandra disagree more")
    tick_ms: int = _opt(1, "timing wheel tick in milliseconds")
    max_batch: int = _opt(5_000, "most occurrences dispatched in one Kafka transaction")
    node_session_timeout_ms: int = _opt(
        10_000, "Kafka group session timeout: how fast a dead node's shards move")
    retention_ms: int = _opt(7 * 86_400_000, "keep fired due rows this long (TTL)")
    allowed_topics: str = _opt(
        "", "regex of extra target topics jobs may fire to (besides <ns>.fired)"
    )
    max_id_bytes: int = _opt(256, "longest job id in bytes")
    max_payload_bytes: int = _opt(262_144, "largest payload in bytes")
    max_horizon_ms: int = _opt(3653 * 86_400_000, "latest 'at' accepted, relative to now")
    # --- node tunables (defaults measured on the local stack; see docs/design.md) --------
    ingest_batch: int = _opt(2_000, "submit commands a shard applies per ingest batch")
    ingest_concurrency: int = _opt(
        64, "jobs of one ingest batch a shard writes to Cassandra concurrently")
    ingest_slack_ms: int = _opt(
        50, "a command due in the past (or this soon) gets a slot this far ahead of now")
    catch_up_grace_ms: int = _opt(
        60_000, "a recurring occurrence fired at most this late is on time; later ones "
                "follow the job's catch-up policy")
    idle_commit_ms: int = _opt(
        2_000, "with nothing to publish, still commit an advancing watermark this often")
    idle_commit_clearance_ms: int = _opt(
        250, "skip an idle watermark commit when an entry is due within this margin")
    skip_empty_after_ms: int = _opt(
        600_000, "when the loaded horizon trails by more, skip empty minutes by their counts")
    stop_drain_ms: int = _opt(
        20_000, "on a graceful stop, wait this long at most for a shard's ingest batch")
    stop_deadline_ms: int = _opt(
        30_000, "on a graceful stop or a revocation, abort shards still running after this")
    missing_watermark_lookback_ms: int = _opt(
        3_600_000, "without a watermark record, a shard loads from this far back")
    skew_check_interval_ms: int = _opt(5_000, "measure the clock skew to Cassandra this often")
    pump_fetch_records: int = _opt(5_000, "most submit records fetched by one poll")
    pump_pause_rows: int = _opt(
        20_000, "pause fetching a shard's submit partition with this many records queued")
    pump_resume_rows: int = _opt(5_000, "resume it once fewer than this many are queued")
    state_dir: str = _opt(
        os.path.join(os.path.expanduser("~"), ".cache", "chronowheel", "stack"),
        "folder for the local stack's data and logs",
    )

    # --- derived names -------------------------------------------------------------------
    @property
    def keyspace(self) -> str:
        return self.namespace.replace("-", "_").replace(".", "_")

    @property
    def submit_topic(self) -> str:
        return f"{self.namespace}.submit"

    @property
    def state_topic(self) -> str:
        return f"{self.namespace}.state"

    @property
    def fired_topic(self) -> str:
        return f"{self.namespace}.fired"

    @property
    def rejected_topic(self) -> str:
        return f"{self.namespace}.rejected"

    @property
    def dead_topic(self) -> str:
        return f"{self.namespace}.dead"

    @property
    def internal_topics(self) -> frozenset[str]:
        return frozenset(
            {self.submit_topic, self.state_topic, self.rejected_topic, self.dead_topic})

    def cassandra_hosts(self) -> list[tuple[str, int]]:
        out = []
        for item in self.cassandra.split(","):
            item = item.strip()
            if not item:
                continue
            host, _, port = item.partition(":")
            out.append((host, int(port) if port else 9042))
        if not out:
            raise ConfigError(f"cassandra: no contact point in {self.cassandra!r}")
        return out

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(env_name(f.name))
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw, f"environment {env_name(f.name)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _convert(f: dataclasses.Field[Any], raw: str, where: str) -> Any:
    kind = type(f.default)
    if kind is int:
        try:
            return int(raw.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{where}: expected an integer for {f.name}, got {raw!r}") from None
    return raw


def add_settings_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add a flag per named setting; the help shows the environment variable and the default."""
    by_name = {f.name: f for f in dataclasses.fields(Settings)}
    for name in names:
        f = by_name[name]
        kind = type(f.default)
        parser.add_argument(
            flag_name(name),
            dest=name,
            type=int if kind is int else str,
            default=None,
            help=f"{f.metadata['help']} [env {env_name(name)}; default {f.default!r}]",
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    names = {f.name for f in dataclasses.fields(Settings)}
    overrides = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return Settings.from_env(**overrides)


CONNECTION_SETTINGS = ("namespace", "cassandra", "kafka", "consistency")
NODE_TUNABLES = (
    "ingest_batch", "ingest_concurrency", "ingest_slack_ms", "catch_up_grace_ms",
    "idle_commit_ms", "idle_commit_clearance_ms", "skip_empty_after_ms", "stop_drain_ms",
    "stop_deadline_ms", "missing_watermark_lookback_ms", "skew_check_interval_ms",
    "pump_fetch_records", "pump_pause_rows", "pump_resume_rows",
)
"""Settings only the node reads: `chronowheel node` has a flag for each."""
