"""Prometheus metrics of one node. A registry per node so tests can run several in-process.

Labels stay bounded: `shard` (at most the namespace's shard count, and a node exports only the
shards it owns), `op` and `outcome` (a handful of fixed values). Nothing is labelled per job,
per topic or per occurrence: those are unbounded.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0, 60.0, 300.0)


def observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """`count` observations of the same `amount` at the cost of one: a herd's occurrences share
    their slot and commit, and observing a million of them one by one cost seconds."""
    if count <= 0:
        return
    # prometheus_client has no bulk observe; this does what `observe` does, `count` times over
    # (tests/unit/test_node_metrics.py holds it to exactly that).
    histogram._raise_if_not_observable()
    histogram._sum.inc(amount * count)
    for i, bound in enumerate(histogram._upper_bounds):
        if amount <= bound:
            histogram._buckets[i].inc(count)
            break


class NodeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.dispatch_lag = Gauge(
            "chronowheel_dispatch_lag_seconds",
            "now minus the oldest unpublished due slot (0 when nothing is overdue)", ["shard"],
            registry=r)
        self.lateness = Histogram(
            "chronowheel_lateness_seconds",
            "publish-visible time (transaction committed) minus the occurrence's slot",
            buckets=LATENESS_BUCKETS, registry=r)
        self.wheel_entries = Gauge("chronowheel_wheel_entries", "occurrences held in the wheel",
                                   ["shard"], registry=r)
        self.ingest_writes_in_flight = Gauge(
            "chronowheel_ingest_writes_in_flight",
            "the in-order ingest passes' writes to Cassandra in flight on this node",
            registry=r)
        self.ingest_writes_bound = Gauge(
            "chronowheel_ingest_writes_bound",
            "their bound as last decided: ingest_writes_in_flight, or "
            "ingest_writes_in_flight_due_soon while an occurrence is due soon", registry=r)
        self.loaded_horizon = Gauge(
            "chronowheel_loaded_horizon_seconds",
            "epoch seconds through which every due row is in the wheel", ["shard"], registry=r)
        self.watermark = Gauge("chronowheel_watermark_seconds",
                               "epoch seconds through which every occurrence is published",
                               ["shard"], registry=r)
        self.prewarmed_buckets = Gauge("chronowheel_prewarmed_buckets",
                                       "hot minute buckets loaded ahead of the horizon",
                                       ["shard"], registry=r)
        self.ingested = Counter(
            "chronowheel_ingested_total",
            "submit commands applied, by outcome: stored (a change was written) or unchanged "
            "(nothing to do: an identical re-submit, a command applied before and delivered "
            "again after a takeover, a cancel of an unknown job)", ["op", "outcome"],
            registry=r)
        self.rejected = Counter("chronowheel_rejected_total",
                                "commands published to <ns>.rejected", registry=r)
        self.quarantined = Counter(
            "chronowheel_quarantined_total",
            "commands (stage=ingest, to <ns>.rejected) and recurring jobs (stage=dispatch, "
            "paused) set aside for an error about them alone, by reason: limit (over a "
            "server's limit, found before writing), store_refused (the store refused the "
            "write), internal (a bug on the per-command path)",
            ["stage", "reason"], registry=r)
        self.urgent = Counter(
            "chronowheel_ingest_urgent_total",
            "upserts of one-shots due soon that the urgent lane applied ahead of their shard's "
            "backlog", registry=r)
        self.forwarded = Counter("chronowheel_forwarded_total",
                                 "commands forwarded to their shard's partition", registry=r)
        self.fired = Counter("chronowheel_fired_total", "occurrences published", registry=r)
        self.excluded = Counter(
            "chronowheel_excluded_total",
            "recurring occurrences dropped when due because their date had been excluded "
            "(a calendar gained the date after the occurrence was computed)", registry=r)
        self.missed = Counter(
            "chronowheel_occurrences_missed_total",
            "occurrences not published because they could not be within their job's "
            "lateness bound (max_lateness, or the namespace's max_lateness_ms)",
            ["namespace"], registry=r)
        self.auto_paused = Counter(
            "chronowheel_auto_paused_total",
            "recurring jobs paused after their pause_after_failures consecutive failed runs "
            "(a worker's report the node applied; reports that found no such streak, or the "
            "job already paused, are not counted)", ["namespace"], registry=r)
        self.catch_up_queue = Gauge(
            "chronowheel_catch_up_queue",
            "late occurrences a shard holds for paced publishing (catch_up_rate)", ["shard"],
            registry=r)
        self.coalesced = Counter("chronowheel_catch_up_coalesced_total",
                                 "catch-ups (policy all) that hit max_catch_up and coalesced",
                                 registry=r)
        self.txn_seconds = Histogram("chronowheel_transaction_seconds",
                                     "node transaction latency (begin to committed)",
                                     buckets=LATENESS_BUCKETS, registry=r)
        self.txn_end_seconds = Histogram(
            "chronowheel_transaction_end_seconds",
            "how long the brokers took to end a committed node transaction once everything in "
            "it was sent (EndTxn); it grows when the brokers are short of CPU",
            buckets=LATENESS_BUCKETS, registry=r)
        self.txn_spacing_seconds = Gauge(
            "chronowheel_transaction_spacing_seconds",
            "the least time from one node transaction's begin to the next one's, now "
            "(node_transaction_spacing_ms, and up to node_transaction_spacing_max_ms while "
            "the brokers' end times grow)", registry=r)
        self.txn_messages = Counter("chronowheel_transaction_messages_total",
                                    "messages (fired, outbox, state records) in committed "
                                    "node transactions", registry=r)
        self.txn_shards = Counter("chronowheel_transaction_shard_parts_total",
                                  "shard contributions in committed node transactions",
                                  registry=r)
        self.dead_lettered = Counter(
            "chronowheel_dead_lettered_total",
            "due occurrences the node published to <ns>.dead instead of their topic, by "
            "reason: unknown_topic (the topic does not exist), too_large (over the topic's "
            "max.message.bytes or the producer's largest request), refused (the broker's "
            "authorizer), invalid (the broker found its timestamp invalid), unencodable",
            ["reason"], registry=r)
        self.txn_refused = Counter(
            "chronowheel_transaction_refused_total",
            "node transactions aborted because the broker refused some of their records "
            "(the node then starts a new session: its shards are claimed and published "
            "again, the refused occurrences dead-lettered)", registry=r)
        self.takeovers = Counter(
            "chronowheel_shard_takeovers_total",
            "shards taken by this node, by kind: full (claimed and loaded from the watermark) "
            "or warm (given back after a rebalance and resumed with its wheel kept)", ["kind"],
            registry=r)
        self.claims_lost = Counter(
            "chronowheel_shard_claims_lost_total",
            "takeovers whose claim another claimer of the shard fenced: the shard is given up "
            "and taken again after lost_shard_retry_ms if the group still assigns it to this "
            "node", registry=r)
        self.shards_unavailable = Counter(
            "chronowheel_shard_takeovers_unavailable_total",
            "takeovers that could not seek the shard's submit partition (no leader answered "
            "for it within the bus's deadline): the claim is released and the shard given up, "
            "taken again after lost_shard_retry_ms while the group assigns it to this node",
            registry=r)
        self.submit_expired = Counter(
            "chronowheel_submit_expired_unapplied_total",
            "offsets of <ns>.submit (an upper bound on commands) that retention deleted "
            "before any node applied them, found when a shard was taken over (its committed "
            "offset was below the partition's log start): those commands are lost; alert on "
            "any", registry=r)
        self.txn_failed = Counter(
            "chronowheel_transaction_failed_total",
            "node transactions that failed for a reason other than a fence or refused "
            "records (the node then starts a new session: its shards are claimed and "
            "published again from committed state)", registry=r)
        self.fenced = Counter("chronowheel_node_fenced_total",
                              "times the node's producer was found fenced", registry=r)
        self.clock_skew = Gauge("chronowheel_clock_skew_seconds",
                                "local clock minus Cassandra's clock", registry=r)
        self.dispatch_blocked = Gauge("chronowheel_dispatch_blocked",
                                      "1 while dispatch is stopped (clock skew too large)",
                                      registry=r)
        self.owned_shards = Gauge("chronowheel_owned_shards", "shards this node owns",
                                  registry=r)
        self.loop_stall_max = Gauge(
            "chronowheel_event_loop_stall_max_seconds",
            "longest the node's event loop was blocked since it started (a stall over "
            "node_loop_stall_limit_ms costs the node its shards)",
            registry=r)
        self.gc_pause = Histogram(
            "chronowheel_gc_pause_seconds",
            "pauses of the process's cyclic garbage collector, by generation (a collection "
            "of generation 2 walks every object, the wheels' entries included)",
            ["generation"], buckets=LATENESS_BUCKETS, registry=r)
        self.shards = Gauge("chronowheel_shards",
                            "shards of the namespace (fixed at init), to compare with the sum "
                            "of chronowheel_owned_shards", registry=r)
        self.upcoming_rows = Gauge(
            "chronowheel_upcoming_rows",
            "due rows counted in the minute buckets beyond the loaded horizon, up to the "
            "pre-warm window (the load coming)", ["shard"], registry=r)

    PER_SHARD = ("dispatch_lag", "wheel_entries", "loaded_horizon", "watermark",
                 "prewarmed_buckets", "upcoming_rows", "catch_up_queue")

    def forget_shard(self, label: str) -> None:
        """Drop a shard's series once this node no longer runs it."""
        for name in self.PER_SHARD:
            gauge: Gauge = getattr(self, name)
            with contextlib.suppress(KeyError):  # never set: stopped before its first step
                gauge.remove(label)
