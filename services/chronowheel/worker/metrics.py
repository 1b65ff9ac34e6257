"""Prometheus metrics of one worker. A registry per worker so tests can run several in-process.

Labels stay bounded: `topic` is one of the worker's configured topics, `partition` one of their
partitions (and a partition's series is dropped when it is revoked), `outcome` a fixed set.
Nothing is labelled per job or per occurrence.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from chronowheel.observe import tracing
from chronowheel.worker.handling import Handler, WorkerStats, is_async_handler

if TYPE_CHECKING:
    from chronowheel.worker.occurrence import Occurrence

HANDLER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, 300.0)

SUCCEEDED = "succeeded"
FAILED = "failed"


class WorkerMetrics:
    def __init__(self, stats: WorkerStats) -> None:
        r = self.registry = CollectorRegistry()
        r.register(_StatsCollector(stats))
        self.handled = Counter(
            "chronowheel_worker_handled_total",
            "handler calls by outcome: succeeded (returned) or failed (raised; then retried or "
            "dead-lettered)", ["topic", "outcome"], registry=r)
        self.handler_seconds = Histogram("chronowheel_worker_handler_seconds",
                                         "handler run time, from call to return or raise",
                                         ["topic"], buckets=HANDLER_BUCKETS, registry=r)
        self.consumer_lag = Gauge(
            "chronowheel_worker_consumer_lag",
            "records of an assigned partition not yet handled: not yet fetched (up to the last "
            "stable offset) plus fetched and still in flight", ["topic", "partition"], registry=r)
        self.assigned_partitions = Gauge("chronowheel_worker_assigned_partitions",
                                         "partitions assigned to this worker", registry=r)
        self.holding = Gauge("chronowheel_worker_holding_records",
                             "records received and not yet fully handled", registry=r)

    def count_marks(self, counts: MarkCounts) -> None:
        """Export the outcome marks' rounds and requests (the worker's intake counts them)."""
        self.registry.register(_MarksCollector(counts))

    def forget_partition(self, topic: str, partition: int) -> None:
        with contextlib.suppress(KeyError):  # never measured
            self.consumer_lag.remove(topic, str(partition))


class _StatsCollector(Collector):
    """The worker's own tallies (`WorkerStats`), read at scrape time: the handling code counts
    once, in one place, and the metrics cannot disagree with `worker.stats`."""

    FAMILIES = (
        ("chronowheel_worker_retried", "retried",
         "retry commands submitted after a handler failed"),
        ("chronowheel_worker_dead_lettered", "dead",
         "records published to <ns>.dead: occurrences out of attempts and malformed records"),
        ("chronowheel_worker_skipped", "skipped",
         "deliveries found already handled (duplicates), not run again"),
        ("chronowheel_worker_cancelled", "cancelled",
         "handlings cancelled at shutdown or revocation (uncommitted: redelivered)"),
    )

    def __init__(self, stats: WorkerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self._stats
        for name, field, doc in self.FAMILIES:
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))
        quarantined = CounterMetricFamily(
            "chronowheel_worker_quarantined",
            "records whose retry or dead letter the broker refused (too large, invalid), by "
            "what was kept: a dead letter without the payload (letter) or only a log line (log)",
            labels=["kept"])
        quarantined.add_metric(["letter"], stats.quarantined - stats.unlettered)
        quarantined.add_metric(["log"], stats.unlettered)
        yield quarantined


class MarkCounts(Protocol):
    rounds: int
    mark_requests: int


class _MarksCollector(Collector):
    """Rounds of outcome marks and the Cassandra requests they took, read at scrape time: the
    requests are what a worker's idempotency costs Cassandra (docs/worker.md, "Idempotency")."""

    def __init__(self, counts: MarkCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "chronowheel_worker_mark_rounds", "rounds of outcome marks written (each holds the "
            "marks of every partition queued since the last)", value=self._counts.rounds)
        yield CounterMetricFamily(
            "chronowheel_worker_mark_requests", "Cassandra requests the rounds of outcome marks "
            "took (a batch per replica set and size limit)", value=self._counts.mark_requests)


def observed(handler: Handler, topic: str, metrics: WorkerMetrics) -> Handler:
    """`handler` timed and counted per call, and traced when tracing is on; an `async def`
    stays one (the slots choose how to run a handler by that)."""
    timed = _timed(handler, topic, metrics)
    t = tracing.tracer()
    return timed if t is None else _traced(timed, topic, t)


def _traced(handler: Handler, topic: str, tracer: Any) -> Handler:
    """Runs the handler inside a `chronowheel.handle` span, child of the job's traceparent
    (an occurrence without one is handled untraced)."""
    from opentelemetry import trace

    def span(occ: Occurrence) -> Any:
        parent = tracing.parent_of(occ.headers)
        if parent is None:
            return None
        return tracer.start_as_current_span("chronowheel.handle", context=parent, attributes={
            "chronowheel.topic": topic, "chronowheel.occurrence": occ.occurrence,
            "chronowheel.attempt": occ.attempt, "chronowheel.job_id": occ.job_id,
            "messaging.destination.name": topic,
        }, kind=trace.SpanKind.CONSUMER)

    if is_async_handler(handler):
        async_handler = cast(Callable[["Occurrence"], Awaitable[None]], handler)

        async def traced_async(occ: Occurrence) -> None:
            scope = span(occ)
            if scope is None:
                await async_handler(occ)
                return
            with scope:
                await async_handler(occ)

        return traced_async

    def traced(occ: Occurrence) -> Any:
        scope = span(occ)
        if scope is None:
            return handler(occ)
        with scope:
            return handler(occ)

    return traced


def _timed(handler: Handler, topic: str, metrics: WorkerMetrics) -> Handler:
    seconds = metrics.handler_seconds.labels(topic).observe
    ok = metrics.handled.labels(topic, SUCCEEDED).inc
    failed = metrics.handled.labels(topic, FAILED).inc
    clock = time.perf_counter

    if is_async_handler(handler):
        async_handler = cast(Callable[["Occurrence"], Awaitable[None]], handler)

        async def timed_async(occ: Occurrence) -> None:
            t0 = clock()
            try:
                await async_handler(occ)
            except Exception:
                failed()
                raise
            finally:
                seconds(clock() - t0)
            ok()

        return timed_async

    def timed(occ: Occurrence) -> Any:
        t0 = clock()
        try:
            result = handler(occ)
        except Exception:
            failed()
            raise
        finally:
            seconds(clock() - t0)
        # A plain function returning an awaitable is refused by the slots as a failure.
        (failed if inspect.isawaitable(result) else ok)()
        return result

    return timed
