"""One frozen settings object. Every field is a CLI flag and a CHRONOWHEEL_* environment variable.

Precedence: command-line flag > environment variable > default.

Secrets (passwords, key passphrases, the HTTP bearer token) are the exception: they have no
command-line flag, so they never show in `ps` output or shell history. Each is read from
CHRONOWHEEL_<NAME> or from the file named by CHRONOWHEEL_<NAME>_FILE (one trailing newline
stripped), is held as a `Secret` whose repr and str are masked, and is never part of
`repr(settings)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chronowheel.core import limits, wire
from chronowheel.errors import ConfigError

ENV_PREFIX = "CHRONOWHEEL_"
KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
NODE_GROUP_PROTOCOLS = ("classic", "consumer")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


KEYSPACE_RULE = ("letters, digits and '_', starting with a letter, at most 48, not starting "
                 "with 'system'")
"""Cassandra's rule for a keyspace's name, in words (48: its limit; `system*`: its own)."""


def valid_keyspace(name: str) -> bool:
    """Whether Cassandra takes `name` as a keyspace's name unquoted, for a keyspace of ours.
    Cassandra folds an unquoted name to lower case, and so does `Settings.keyspace`."""
    return (bool(name) and len(name) <= 48 and name[0].isascii() and name[0].isalpha()
            and all(c.isascii() and (c.isalnum() or c == "_") for c in name)
            and not name.lower().startswith("system"))


class Secret:
    """A password or token. Shown as `***` by repr, str and format; `reveal()` gives the value.

    Only the code that hands the value to a driver calls `reveal()`.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __format__(self, spec: str) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> Any:  # no pickling a password into a file or a queue by accident
        raise TypeError("a Secret cannot be pickled")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secret:  # immutable: copies may share it
        return self


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


def _secret(help: str) -> dict[str, Any]:
    """Field metadata of a secret (the field itself: default None, repr=False)."""
    return {"help": help, "secret": True}


def parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


@dataclass(frozen=True)
class Settings:
    namespace: str = _opt("chronowheel", "namespace: prefix of topics and Cassandra keyspace")
    cassandra_keyspace: str = _opt(
        "", "the namespace's Cassandra keyspace, when it is not named after the namespace "
            "(default: the namespace with '-' and '.' as '_'); one keyspace holds one namespace")
    cassandra: str = _opt("127.0.0.1:9042", "Cassandra contact points, host[:port],...")
    kafka: str = _opt("127.0.0.1:9092", "Kafka bootstrap servers, host:port,...")
    shards: int = _opt(16, "number of shards N (fixed at init)")
    replication: str = _opt(
        "1", "Cassandra replication at init: a factor N (SimpleStrategy, one data centre) or "
             "dc1:N,dc2:M (NetworkTopologyStrategy); Kafka topics get N, or the largest M")
    consistency: str = _opt("LOCAL_QUORUM", "Cassandra consistency level for reads and writes")
    http_port: int = _opt(8080, "HTTP port for /metrics and /healthz (0 = pick a free one)")
    lookahead_ms: int = _opt(120_000, "keep the wheel loaded this far ahead of now")
    prewarm_ms: int = _opt(900_000, "load hot buckets this far ahead of their minute")
    hot_bucket_rows: int = _opt(5_000, "a bucket with more rows than this is hot (pre-warmed)")
    bucket_page_rows: int = _opt(5_000, "rows per page when reading a bucket partition")
    bucket_cap_rows: int = _opt(200_000, "at most this many rows of one bucket held in memory")
    max_clock_skew_ms: int = _opt(500, "stop dispatching when clock and Cassandra disagree more")
    tick_ms: int = _opt(1, "timing wheel tick in milliseconds")
    gc_young_threshold: int = _opt(
        50_000, "node and worker processes: allocations between young garbage "
                "collections (Python's "
                "default is 700; 0 keeps it). Larger lets the Cassandra driver's short-lived "
                "reference cycles die young instead of triggering full collections, which "
                "pause the event loop ~0.5 s per million objects")
    marks_wait_ms: int = _opt(
        100, "worker: the longest a round of outcome marks waits for more outcomes before "
             "it is written (one request per ten partitions' rows; a round with concurrency "
             "marks queued goes at once; an even trickle of requests keeps Cassandra's "
             "request threads spinning). 0 writes each round as soon as the last returns. "
             "Delays offset commits, not handlers; a crash can make run again up to this "
             "much more of what was handled, at most concurrency marks")
    malloc_threshold_bytes: int = _opt(
        131_072, "node process: glibc's mmap and trim thresholds, fixed (0 = glibc's dynamic "
                 "ones, which rise to 32 MiB and then keep freed buffers resident)")
    max_batch: int = _opt(
        5_000, "most occurrences a shard dispatches in one step, and most messages a node "
               "transaction gathers from several shards (one shard's step always goes whole)")
    node_transaction_spacing_ms: int = _opt(
        0, "least time from the start of one node transaction to the start of the next (0: "
           "back to back). Each transaction costs the brokers a fixed amount of CPU whatever "
           "it carries: on brokers short of CPU, fewer and larger transactions leave more of "
           "it for everything else, at up to this much more lateness. A shard's first part "
           "after a takeover, a released shard's last part and a full transaction (max_batch "
           "messages) do not wait")
    node_transaction_spacing_max_ms: int = _opt(
        0, "most the spacing between node transactions grows to, above "
           "node_transaction_spacing_ms, while the brokers take longer than their floor of "
           "the last minute to end a transaction (EndTxn): short of CPU, they get fewer "
           "transactions; with CPU to spare, transactions go at the least spacing. 0: no "
           "adapting")
    node_session_timeout_ms: int = _opt(
        3_000, "Kafka group session timeout: how fast a dead node's shards move (brokers "
               "must allow it: group.min.session.timeout.ms at most this)")
    node_heartbeat_interval_ms: int = _opt(
        100, "Kafka group heartbeat interval: how soon a node hears of a rebalance (under a "
             "third of the session timeout). A moved shard waits for two heartbeats, its old "
             "owner's to hear of the move and its new owner's to be given it after the old "
             "one released it: 100 ms brought that hand-over's median from 90-212 ms to "
             "60-87 ms (300 before); brokers must allow it: "
             "group.consumer.min.heartbeat.interval.ms at most this")
    node_loop_stall_limit_ms: int = _opt(
        15_000, "a node whose event loop answers nothing for this long leaves its group (its "
                "shards move); a busy loop under it keeps them (more than the session timeout)")
    node_group_protocol: str = _opt(
        "consumer", "Kafka group protocol of the nodes: consumer (Kafka 4's KIP-848: only the "
                    "shards that move pause; the brokers' group.consumer.min.session.timeout.ms "
                    "and group.consumer.min.heartbeat.interval.ms must allow the node's) or "
                    "classic (aiokafka's eager protocol: every rebalance pauses every shard "
                    "for a moment)")
    node_instance_id: str = _opt(
        "", "static group membership: a stable name per node (e.g. its host name); a node "
            "restarted within the session timeout gets its shards back without a rebalance, "
            "but a stopped one keeps them until the timeout (empty = dynamic membership)")
    retention_ms: int = _opt(7 * 86_400_000, "keep fired due rows this long (TTL)")
    run_history: bool = _opt(
        True, "record each run (fired-at, handler start and end, outcome) and per-job "
              "counters, in batches off the hot path (node and worker)")
    history_limit: int = _opt(20, "runs a job's history shows: its last N")
    history_ttl_ms: int = _opt(
        7 * 86_400_000, "keep each run history row this long (TTL): with the job's rate it "
                        "bounds what a job's history stores")
    history_queue_rows: int = _opt(
        100_000, "run history rows a process queues at most; more are dropped and counted, "
                 "never waited for")
    history_queue_bytes: int = _opt(
        32 << 20, "run history bytes a process queues at most (about: each row's strings, "
                  "and on a node the occurrence's payload, kept until written); more are "
                  "dropped and counted, never waited for")
    history_batch_rows: int = _opt(2_000, "run history rows written per batch")
    history_writes_in_flight: int = _opt(
        32, "most requests of a process's run history writer in flight (a write of several "
            "jobs is a request per group of them with the same replicas: each counts; a "
            "worker's auto-pause report is not among them)")
    history_writes_per_s: int = _opt(
        50, "most run history requests a second per process (0: no cap; a request holds the "
             "runs, or the counters, of up to 10 jobs with the same replicas): bounds what "
             "history costs; past it rows queue, then drop (counted)")
    history_round_ms: int = _opt(
        500, "run history batches of a process start at least this far apart (0: as soon as "
             "the previous one ends): at ordinary rates history goes to Cassandra in a few "
             "bursts a second instead of a request whenever a run comes, which keeps "
             "Cassandra's request threads spinning; history is that much later")
    allowed_topics: str = _opt(
        "", "regex of extra target topics jobs may fire to (besides <ns>.fired)"
    )
    max_id_bytes: int = _opt(256, "longest job id in bytes")
    max_payload_bytes: int = _opt(262_144, "largest payload in bytes")
    max_horizon_ms: int = _opt(3653 * 86_400_000, "latest 'at' accepted, relative to now")
    min_period_ms: int = _opt(
        limits.DEFAULT_MIN_PERIOD_MS, "shortest 'every' interval and cron period a job may "
                                      "have, in ms")
    max_lateness_ms: int = _opt(
        0, "the namespace's lateness bound for jobs without their own max_lateness: an "
           "occurrence not published within this many ms of its scheduled instant is dropped "
           "as missed (0: no bound; set it alike on every node)")
    store_batch_fail_bytes: int = _opt(
        limits.CASSANDRA_BATCH_FAIL_BYTES,
        "Cassandra's batch_size_fail_threshold in bytes (keep equal to the cluster's): a job "
        "whose rows would exceed it in their logged batch is rejected before anything is "
        "stored")
    # --- node tunables (defaults measured on the local stack; see docs/design.md) --------
    ingest_batch: int = _opt(
        500, "submit commands a shard applies per ingest step; their offset is committed "
             "after each step, so a takeover re-applies at most this many")
    ingest_group_bytes: int = _opt(
        4_500, "new jobs written per logged batch: at most about this many bytes (keep it "
               "under Cassandra's batch_size_warn_threshold)")
    ingest_group_jobs: int = _opt(16, "new jobs written per logged batch: at most this many")
    ingest_concurrency: int = _opt(
        64, "jobs of one ingest batch a shard writes to Cassandra concurrently")
    ingest_writes_in_flight: int = _opt(
        32, "ingest writes to Cassandra in flight on the node at most, all shards' in-order "
            "passes together (the urgent lane's are not counted): few queued requests keep "
            "each one's wait short, more may apply a herd faster (128: from no faster to a "
            "twentieth faster in two hours measured, a job due soon behind it twice as "
            "late); 0: no node-wide limit")
    ingest_writes_in_flight_due_soon: int = _opt(
        8, "the same bound while one of the node's shards has an occurrence due within "
           "ingest_due_soon_ms or fired one that recently (its transaction under way): "
           "completions a few at a time keep the event loop's turns and Cassandra's queue "
           "short for the firing (one-shots due 2 s after they were sent, behind a herd: "
           "p99 143 ms against 199 with 32 throughout, the herd applied 8 per cent "
           "slower); 0 or more than ingest_writes_in_flight: that bound")
    ingest_due_soon_ms: int = _opt(
        500, "how near an occurrence's instant (before it, and after it fired) the node's "
             "ingest writes are held to ingest_writes_in_flight_due_soon")
    ingest_counts_in_flight: int = _opt(
        2, "bucket count requests a shard's ingest has in flight: a step counts its rows "
           "with one request per (shard, hour) it touches, about 0.7 a job for jobs spread "
           "over 30 days; 64 per shard filled Cassandra's queue and the node's event loop "
           "(a one-shot due soon behind such a herd: p50 130 ms late against 20 ms with 2), "
           "and 2 applied the herd as fast")
    ingest_slack_ms: int = _opt(
        50, "a command due in the past (or this soon) gets a slot this far ahead of now")
    catch_up_grace_ms: int = _opt(
        60_000, "the first occurrence of a recurring job that a gap (outage, pause) "
                "withheld is on time if fired at most this late; the others due by then, "
                "and a first one later than this, follow the job's catch-up policy")
    catch_up_lag_ms: int = _opt(
        5_000, "an occurrence fired at most this late is a node running behind, not a gap: "
               "the ones due after it fire in turn, late, whatever the catch-up policy")
    catch_up_rate: int = _opt(
        500, "late occurrences (due more than catch_up_lag_ms ago) a shard back from a gap "
             "(an outage, a takeover, a clock-skew block) publishes per second at most, "
             "beside the on-time ones; 0: all at once")
    due_deletes: bool = _opt(
        False, "also delete each due row a cancel, an edit or a pause takes back (beside its "
               "due_retired row): only while a node older than due_retired may take a shard "
               "over (a rolling upgrade from it, a rollback to it); each delete is a tombstone "
               "that reads of the minute meet")
    backfill_rows_per_cycle: int = _opt(
        100, "backfill occurrences a shard hands to its wheel per cycle at most, and only "
             "while no on-time occurrence is waiting")
    backfill_cycle_ms: int = _opt(100, "a shard's backfills advance once per this interval")
    calendar_refresh_ms: int = _opt(
        30_000, "a named calendar read from Cassandra is used this long before it is read "
                "again (changes made through another node are seen within this time)")
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
    warm_grace_ms: int = _opt(
        30_000, "a shard revoked cleanly is kept in memory (warm) this long for the next "
                "assignment, which resumes it without a reload if it comes back (0: never "
                "kept warm)")
    lost_shard_retry_ms: int = _opt(
        1_000, "a shard given up because another claimer fenced its claim is taken over again "
               "after this (doubled at each further loss within five minutes, up to 30 s) if "
               "the group still assigns it to this node; also how soon the shards a fence's "
               "recovery did not take, its membership unconfirmed, are looked at again, and a "
               "shard whose submit partition could not be sought (0: the first two left "
               "until the next rebalance; the node stops for the third)")
    missing_watermark_lookback_ms: int = _opt(
        3_600_000, "without a watermark record, a shard loads from this far back")
    skew_check_interval_ms: int = _opt(5_000, "measure the clock skew to Cassandra this often")
    pump_fetch_records: int = _opt(5_000, "most submit records fetched by one poll")
    # Queued records are held in memory as fetched (about 0.8 KiB each): a few ingest steps'
    # worth per shard keeps ingest busy, and a backlog stays in Kafka instead of in the node.
    pump_pause_rows: int = _opt(
        2_000, "pause fetching a shard's submit partition with this many records queued")
    pump_resume_rows: int = _opt(1_000, "resume it once fewer than this many are queued")
    urgent_ms: int = _opt(
        30_000, "an upsert of a one-shot due within this of now is applied ahead of its shard's "
                "backlog (the urgent lane; nothing of the same job before it may wait); 0: "
                "every command strictly in offset order")
    urgent_lookahead_records: int = _opt(
        20_000, "past its queued records, a shard with a backlog reads this many offsets "
                "ahead for urgent one-shots (only their keys are kept; 0: none)")
    http_host: str = _opt("127.0.0.1", "address the HTTP endpoint listens on (loopback unless "
                                       "set; 0.0.0.0 for all)")
    # --- Kafka security ----------------------------------------------------------------------
    kafka_security_protocol: str = _opt(
        "PLAINTEXT", "Kafka security protocol: " + ", ".join(KAFKA_SECURITY_PROTOCOLS))
    kafka_sasl_mechanism: str = _opt(
        "PLAIN", "SASL mechanism for SASL_*: " + ", ".join(KAFKA_SASL_MECHANISMS))
    kafka_sasl_username: str = _opt("", "SASL user name (the password comes from "
                                        "CHRONOWHEEL_KAFKA_SASL_PASSWORD[_FILE])")
    kafka_ssl_cafile: str = _opt("", "PEM file of the CAs that sign the brokers' certificates "
                                     "(empty: the system trust store)")
    kafka_ssl_certfile: str = _opt("", "PEM client certificate for mutual TLS")
    kafka_ssl_keyfile: str = _opt("", "PEM private key of the client certificate (passphrase: "
                                      "CHRONOWHEEL_KAFKA_SSL_KEY_PASSWORD[_FILE])")
    kafka_ssl_check_hostname: bool = _opt(True, "verify that the broker certificate names the "
                                                "host connected to")
    # --- Cassandra security ------------------------------------------------------------------
    cassandra_username: str = _opt("", "Cassandra user (PasswordAuthenticator; the password "
                                       "comes from CHRONOWHEEL_CASSANDRA_PASSWORD[_FILE])")
    cassandra_ssl: bool = _opt(False, "connect to Cassandra over TLS (on when a CA file is set)")
    cassandra_ssl_cafile: str = _opt("", "PEM file of the CAs that sign the Cassandra nodes' "
                                         "certificates (empty: the system trust store)")
    cassandra_ssl_certfile: str = _opt("", "PEM client certificate (client_encryption_options "
                                           "require_client_auth)")
    cassandra_ssl_keyfile: str = _opt("", "PEM private key of the client certificate "
                                          "(passphrase: "
                                          "CHRONOWHEEL_CASSANDRA_SSL_KEY_PASSWORD[_FILE])")
    cassandra_ssl_check_hostname: bool = _opt(True, "verify that the node certificate names "
                                                    "the host connected to")
    cassandra_local_dc: str = _opt("", "the driver's local data centre (DCAwareRoundRobinPolicy); "
                                       "empty: the data centre of the first contact point")
    # --- secrets: environment or file only, never a flag, never in repr ----------------------
    kafka_sasl_password: Secret | None = field(
        default=None, repr=False, compare=False, metadata=_secret("Kafka SASL password"))
    kafka_ssl_key_password: Secret | None = field(
        default=None, repr=False, compare=False,
        metadata=_secret("passphrase of the Kafka client key"))
    cassandra_password: Secret | None = field(
        default=None, repr=False, compare=False, metadata=_secret("Cassandra password"))
    cassandra_ssl_key_password: Secret | None = field(
        default=None, repr=False, compare=False,
        metadata=_secret("passphrase of the Cassandra client key"))
    http_token: Secret | None = field(
        default=None, repr=False, compare=False,
        metadata=_secret("bearer token for HTTP paths beyond /metrics and /healthz"))
    console_token: Secret | None = field(
        default=None, repr=False, compare=False,
        metadata=_secret("token of `chronowheel console`: bearer token or basic-auth "
                         "password that actions (and every page off loopback) require"))
    state_dir: str = _opt(
        os.path.join(os.path.expanduser("~"), ".cache", "chronowheel", "stack"),
        "folder for the local stack's data and logs",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "kafka_security_protocol",
                           self.kafka_security_protocol.strip().upper())
        object.__setattr__(self, "kafka_sasl_mechanism",
                           self.kafka_sasl_mechanism.strip().upper())
        if self.kafka_security_protocol not in KAFKA_SECURITY_PROTOCOLS:
            raise ConfigError(f"kafka_security_protocol: expected one of "
                              f"{', '.join(KAFKA_SECURITY_PROTOCOLS)}, got "
                              f"{self.kafka_security_protocol!r}")
        object.__setattr__(self, "node_group_protocol",
                           self.node_group_protocol.strip().lower())
        if self.node_group_protocol not in NODE_GROUP_PROTOCOLS:
            raise ConfigError(f"node_group_protocol: expected one of "
                              f"{', '.join(NODE_GROUP_PROTOCOLS)}, got "
                              f"{self.node_group_protocol!r}")
        if self.kafka_sasl_mechanism not in KAFKA_SASL_MECHANISMS:
            raise ConfigError(f"kafka_sasl_mechanism: expected one of "
                              f"{', '.join(KAFKA_SASL_MECHANISMS)}, got "
                              f"{self.kafka_sasl_mechanism!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("secret") and value is not None and not isinstance(value, Secret):
                if not isinstance(value, str):
                    raise ConfigError(f"{f.name}: expected a string")
                object.__setattr__(self, f.name, Secret(value))
            elif isinstance(f.default, bool) and not isinstance(value, bool):
                raise ConfigError(f"{f.name}: expected true or false")
        for name in ("ingest_writes_in_flight", "ingest_writes_in_flight_due_soon",
                     "ingest_due_soon_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be 0 or more, got {getattr(self, name)}")
        for name in ("backfill_rows_per_cycle", "backfill_cycle_ms", "ingest_counts_in_flight"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("history_limit", "history_queue_rows", "history_batch_rows",
                     "history_writes_in_flight"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.node_transaction_spacing_ms <= 1000:
            raise ConfigError(f"node_transaction_spacing_ms: must be 0 to 1000 (a second), "
                              f"got {self.node_transaction_spacing_ms}")
        if not 0 <= self.node_transaction_spacing_max_ms <= 1000:
            raise ConfigError(f"node_transaction_spacing_max_ms: must be 0 to 1000 (a second), "
                              f"got {self.node_transaction_spacing_max_ms}")
        if self.history_queue_bytes < 1024:
            raise ConfigError(f"history_queue_bytes: must be at least 1024, got "
                              f"{self.history_queue_bytes}")
        if not 0 <= self.history_round_ms <= 10_000:
            raise ConfigError(f"history_round_ms: must be 0 to 10000 (ten seconds), got "
                              f"{self.history_round_ms}")
        if self.history_writes_per_s < 0:
            raise ConfigError(f"history_writes_per_s: must be 0 (no cap) or more, got "
                              f"{self.history_writes_per_s}")
        if not 1000 <= self.history_ttl_ms <= limits.CASSANDRA_MAX_TTL_S * 1000:
            raise ConfigError(f"history_ttl_ms: must be 1000 (a second) to "
                              f"{limits.CASSANDRA_MAX_TTL_S * 1000} (Cassandra's largest TTL), "
                              f"got {self.history_ttl_ms}")
        if not 0 <= self.malloc_threshold_bytes <= 1 << 25:
            raise ConfigError(f"malloc_threshold_bytes: must be 0 (glibc's dynamic thresholds) "
                              f"to {1 << 25} (32 MiB, glibc's most), "
                              f"got {self.malloc_threshold_bytes}")
        if self.cassandra_keyspace and not valid_keyspace(self.cassandra_keyspace):
            raise ConfigError(f"cassandra_keyspace: {self.cassandra_keyspace!r} is not a valid "
                              f"keyspace name ({KEYSPACE_RULE})")
        if self.lost_shard_retry_ms < 0:
            raise ConfigError(f"lost_shard_retry_ms: must be 0 (never taken again before a "
                              f"rebalance) or more, got {self.lost_shard_retry_ms}")
        if self.warm_grace_ms < 0:
            raise ConfigError(f"warm_grace_ms: must be 0 (no shard kept warm) or more, "
                              f"got {self.warm_grace_ms}")
        if self.catch_up_rate < 0:
            raise ConfigError(f"catch_up_rate: must be 0 (no pacing) or more, "
                              f"got {self.catch_up_rate}")
        if self.max_lateness_ms and not (
                limits.MIN_MAX_LATENESS_MS <= self.max_lateness_ms <= limits.MAX_MAX_LATENESS_MS):
            raise ConfigError(f"max_lateness_ms: must be 0 (no bound) or "
                              f"{limits.MIN_MAX_LATENESS_MS} to {limits.MAX_MAX_LATENESS_MS}, "
                              f"got {self.max_lateness_ms}")
        if not 0 <= self.marks_wait_ms <= 1000:
            raise ConfigError(f"marks_wait_ms: must be 0 to 1000 (a second), got "
                              f"{self.marks_wait_ms}")
        if self.gc_young_threshold < 0:
            raise ConfigError(f"gc_young_threshold: must be 0 (Python's default) or more, "
                              f"got {self.gc_young_threshold}")
        reach_ms = limits.max_ttl_reach_ms(self.retention_ms)
        if self.max_horizon_ms > reach_ms:
            # A due row lives until its slot plus the retention period, within Cassandra's
            # 20-year TTL: a job accepted further ahead could never be stored.
            raise ConfigError(
                f"max_horizon_ms + retention_ms: at most {limits.CASSANDRA_MAX_TTL_S * 1000} "
                f"(Cassandra's largest TTL, 20 years), got {self.max_horizon_ms} + "
                f"{self.retention_ms}")
        if self.min_period_ms < 1 or self.store_batch_fail_bytes < 1:
            raise ConfigError(f"min_period_ms and store_batch_fail_bytes: must be at least 1, "
                              f"got {self.min_period_ms} and {self.store_batch_fail_bytes}")
        if isinstance(self.replication, int):  # Settings(replication=3) from Python code
            object.__setattr__(self, "replication", str(self.replication))
        self.cassandra_replication()  # fail at start, not at init
        if not 0 < self.node_heartbeat_interval_ms * 3 <= self.node_session_timeout_ms:
            raise ConfigError(
                f"node_heartbeat_interval_ms: {self.node_heartbeat_interval_ms} must be "
                f"positive and at most a third of node_session_timeout_ms "
                f"({self.node_session_timeout_ms}), or a node misses rebalances")
        if self.node_loop_stall_limit_ms <= self.node_session_timeout_ms:
            raise ConfigError(
                f"node_loop_stall_limit_ms: {self.node_loop_stall_limit_ms} must exceed "
                f"node_session_timeout_ms ({self.node_session_timeout_ms}): the stall limit "
                f"drops a hung node, the session timeout a dead one")

    # --- security ------------------------------------------------------------------------
    @property
    def kafka_uses_ssl(self) -> bool:
        return self.kafka_security_protocol in ("SSL", "SASL_SSL")

    @property
    def kafka_uses_sasl(self) -> bool:
        return self.kafka_security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def cassandra_uses_ssl(self) -> bool:
        return bool(self.cassandra_ssl or self.cassandra_ssl_cafile
                    or self.cassandra_ssl_certfile)

    def cassandra_replication(self) -> dict[str, int]:
        """{"replication_factor": N} for a plain number, else {dc: N, ...} per data centre."""
        text = str(self.replication).strip()
        where = f"replication: {text!r}"
        if text.isdigit():
            n = int(text)
            if not 1 <= n <= 9:
                raise ConfigError(f"{where}: a factor must be 1..9")
            return {"replication_factor": n}
        out: dict[str, int] = {}
        for item in text.split(","):
            dc, sep, factor = item.strip().partition(":")
            dc = dc.strip()
            if not sep or not dc or not factor.strip().isdigit():
                raise ConfigError(f"{where}: expected N or dc1:N,dc2:M")
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", dc):
                raise ConfigError(f"{where}: data centre name {dc!r} has characters other than "
                                  "letters, digits, '_', '-', '.'")
            if dc in out:
                raise ConfigError(f"{where}: data centre {dc!r} named twice")
            n = int(factor)
            if not 1 <= n <= 9:
                raise ConfigError(f"{where}: factor of {dc} must be 1..9")
            out[dc] = n
        return out

    @property
    def topic_replication(self) -> int:
        """Kafka topic replication: the factor, or the largest per-data-centre factor."""
        return max(self.cassandra_replication().values())

    # --- derived names -------------------------------------------------------------------
    @property
    def keyspace(self) -> str:
        """`cassandra_keyspace`, or the namespace's name made a keyspace's; in lower case, as
        Cassandra keeps an unquoted name (and as `system_schema` is looked up)."""
        return self.cassandra_keyspace.lower() or self.derived_keyspace

    @property
    def derived_keyspace(self) -> str:
        """The keyspace named after the namespace: `cassandra_keyspace`'s default."""
        return self.namespace.replace("-", "_").replace(".", "_").lower()

    @property
    def keyspace_flag(self) -> str:
        """` --cassandra-keyspace NAME` when the keyspace is not the derived one, for the
        commands that errors suggest."""
        return f" --cassandra-keyspace {self.keyspace}" if self.cassandra_keyspace else ""

    @property
    def submit_topic(self) -> str:
        return wire.submit_topic(self.namespace)

    @property
    def state_topic(self) -> str:
        return wire.state_topic(self.namespace)

    @property
    def fired_topic(self) -> str:
        return wire.fired_topic(self.namespace)

    @property
    def rejected_topic(self) -> str:
        return wire.rejected_topic(self.namespace)

    @property
    def dead_topic(self) -> str:
        return wire.dead_topic(self.namespace)

    @property
    def internal_topics(self) -> frozenset[str]:
        return wire.internal_topics(self.namespace)

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
            if f.metadata.get("secret"):
                secret = read_secret(env, f.name)
                if secret is not None:
                    values[f.name] = secret
                continue
            raw = env.get(env_name(f.name))
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw, f"environment {env_name(f.name)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def safe_view(self) -> dict[str, Any]:
        """Every setting by name, for display: secrets only say whether they are set."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = ("(set)" if value is not None else "(unset)") \
                if f.metadata.get("secret") else value
        return out


def secret_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Settings) if f.metadata.get("secret")]


def read_secret(env: Mapping[str, str], name: str) -> Secret | None:
    """CHRONOWHEEL_<NAME> or the contents of the file named by CHRONOWHEEL_<NAME>_FILE.

    Errors name the variables and the file, never the value.
    """
    var = env_name(name)
    direct = env.get(var)
    path = env.get(var + "_FILE")
    if direct and path:
        raise ConfigError(f"both {var} and {var}_FILE are set: set one of them")
    if direct:
        return Secret(direct)
    if not path:
        return None
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{var}_FILE: cannot read {path}: {exc.strerror}") from None
    text = text[:-1] if text.endswith("\n") else text
    text = text[:-1] if text.endswith("\r") else text
    if not text:
        raise ConfigError(f"{var}_FILE: {path} is empty")
    return Secret(text)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _convert(f: dataclasses.Field[Any], raw: str, where: str) -> Any:
    kind = type(f.default)
    if kind is bool:
        try:
            return parse_bool(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: {f.name}: {exc}") from None
    if kind is int:
        try:
            return int(raw.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{where}: expected an integer for {f.name}, got {raw!r}") from None
    return raw


def add_settings_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add a flag per named setting; the help shows the environment variable and the default.

    Naming `kafka` brings the Kafka security flags along, naming `cassandra` the Cassandra
    ones, so every command that connects takes them; the help's epilog lists the secrets those
    read (by variable name). A secret gets no flag: naming one here is a programming error.
    """
    by_name = {f.name: f for f in dataclasses.fields(Settings)}
    wanted = list(dict.fromkeys(names))
    secrets: list[str] = []
    if "kafka" in wanted:
        wanted += [n for n in KAFKA_SECURITY_SETTINGS if n not in wanted]
        secrets += KAFKA_SECRETS
    if "cassandra" in wanted:
        wanted += [n for n in ("cassandra_keyspace", *CASSANDRA_SECURITY_SETTINGS)
                   if n not in wanted]
        secrets += CASSANDRA_SECRETS
    if "http_port" in wanted:
        wanted += [] if "http_host" in wanted else ["http_host"]
        secrets.append("http_token")
    for name in wanted:
        f = by_name[name]
        if f.metadata.get("secret"):
            raise ValueError(f"{name} is a secret: environment or file only, never a flag")
        kind = type(f.default)
        parser.add_argument(
            flag_name(name),
            dest=name,
            type=parse_bool if kind is bool else int if kind is int else str,
            metavar="{true,false}" if kind is bool else None,
            default=None,
            help=f"{f.metadata['help']} [env {env_name(name)}; default {f.default!r}]",
        )
    if secrets:
        add_secret_notes(parser, secrets)


SECRETS_NOTE = "secrets, read from the environment or a file only (never a flag):"


class _SecretsNoteFormatter(argparse.HelpFormatter):
    """The default formatter, except that the secrets note keeps one variable per line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        head, sep, tail = text.partition(SECRETS_NOTE)
        if not sep:
            return super()._fill_text(text, width, indent)
        before = super()._fill_text(head, width, indent) + "\n\n" if head.strip() else ""
        return before + indent + SECRETS_NOTE + "\n" + "\n".join(
            indent + line for line in tail.strip("\n").splitlines())


def add_secret_notes(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Say in --help which secrets a command reads, by variable name only."""
    lines = [f"  {env_name(n)} or {env_name(n)}_FILE" for n in dict.fromkeys(names)]
    note = SECRETS_NOTE + "\n" + "\n".join(lines)
    parser.epilog = f"{parser.epilog}\n\n{note}" if parser.epilog else note
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = _SecretsNoteFormatter


def settings_from_args(args: argparse.Namespace) -> Settings:
    names = {f.name for f in dataclasses.fields(Settings)}
    overrides = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return Settings.from_env(**overrides)


KAFKA_SECURITY_SETTINGS = (
    "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
    "kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile", "kafka_ssl_check_hostname",
)
CASSANDRA_SECURITY_SETTINGS = (
    "cassandra_username", "cassandra_ssl", "cassandra_ssl_cafile", "cassandra_ssl_certfile",
    "cassandra_ssl_keyfile", "cassandra_ssl_check_hostname", "cassandra_local_dc",
)
KAFKA_SECRETS = ("kafka_sasl_password", "kafka_ssl_key_password")
CASSANDRA_SECRETS = ("cassandra_password", "cassandra_ssl_key_password")
SECURITY_SETTINGS = KAFKA_SECURITY_SETTINGS + CASSANDRA_SECURITY_SETTINGS
CONNECTION_SETTINGS = ("namespace", "cassandra_keyspace", "cassandra", "kafka", "consistency")
NODE_TUNABLES = (
    "ingest_batch", "ingest_group_bytes", "ingest_group_jobs", "ingest_concurrency",
    "ingest_writes_in_flight", "ingest_writes_in_flight_due_soon", "ingest_due_soon_ms",
    "ingest_counts_in_flight",
    "ingest_slack_ms", "catch_up_grace_ms", "catch_up_lag_ms", "catch_up_rate",
    "backfill_rows_per_cycle",
    "backfill_cycle_ms", "calendar_refresh_ms",
    "idle_commit_ms", "idle_commit_clearance_ms", "skip_empty_after_ms", "stop_drain_ms",
    "stop_deadline_ms", "warm_grace_ms", "lost_shard_retry_ms", "missing_watermark_lookback_ms",
    "skew_check_interval_ms", "pump_fetch_records", "pump_pause_rows", "pump_resume_rows",
    "urgent_ms", "urgent_lookahead_records", "gc_young_threshold", "malloc_threshold_bytes",
)
"""Settings only the node reads: `chronowheel node` has a flag for each."""

HISTORY_SETTINGS = ("run_history", "history_limit", "history_ttl_ms", "history_queue_rows",
                    "history_queue_bytes", "history_batch_rows", "history_writes_in_flight",
                    "history_writes_per_s", "history_round_ms")
"""Settings of run history (`chronowheel node` and `chronowheel worker` have a flag for each;
`job history` and the console read `history_limit`)."""
