"""What Cassandra warns a client about, counted by kind and logged at most once per kind per
interval.

A server attaches warnings to its answer (an oversized or multi-partition batch, a read that
met many tombstones, a guardrail crossed); the driver keeps them on the request's
`ResponseFuture.warnings` and also logs each one, a line per answer, through the
`cassandra.protocol` logger. Under load that was hundreds of identical lines a minute, and an
operator reading the node's log could not see a real problem in them. The store reads the
warnings of every answer it settles instead (`note`), counts them in
`chronowheel_store_server_warnings_total{kind}` (this object is a Prometheus collector), and
logs the first warning of a kind at once and then at most one line per kind per `interval_s`,
saying how many came since the last line; the driver's own line is muted
(`mute_driver_lines`). The label `kind` has a fixed set of values (`KINDS`), whatever the
server says.

Pure Python beside prometheus_client: no driver import, so the unit tests need no server.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # "Unlogged batch covering 48 partitions detected against table [ns.bucket_counts]. ..."
    ("unlogged_batch", re.compile(r"^Unlogged batch covering", re.IGNORECASE)),
    # "Batch for [ns.bucket_counts] is of size 5642, exceeding specified threshold of 5120 ..."
    ("batch_size", re.compile(r"^Batch (for|of) .*size", re.IGNORECASE)),
    # "Read 1000 live rows and 1500 tombstone cells for query ..."
    ("tombstones", re.compile(r"tombstone", re.IGNORECASE)),
    # "Aggregation query used without partition key"
    ("aggregation", re.compile(r"^Aggregation query", re.IGNORECASE)),
    # "Guardrail partition_keys_in_select violated: ..."
    ("guardrail", re.compile(r"guardrail", re.IGNORECASE)),
)
OTHER = "other"

DEFAULT_INTERVAL_S = 60.0
DRIVER_LINE = "Server warning: %s"
"""The format string of the driver's own line per warning (cassandra/protocol.py)."""


def kind_of(message: str) -> str:
    """The bounded label of a server warning."""
    for kind, pattern in KINDS:
        if pattern.search(message):
            return kind
    return OTHER


class ServerWarnings(Collector):
    """Counts and rate-limited log lines of server warnings. Thread-safe: `note` may be called
    from any thread."""

    def __init__(self, *, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._log = logger
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._latest: dict[str, str] = {}
        self._quiet_until: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def note(self, messages: Iterable[str], what: str) -> None:
        """Count the warnings Cassandra sent with its answer to `what` (a request's name)."""
        for message in messages:
            kind = kind_of(message)
            with self._lock:
                self._counts[kind] = self._counts.get(kind, 0) + 1
                self._latest[kind] = message
                now = self._clock()
                if now < self._quiet_until.get(kind, float("-inf")):
                    self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
                    continue
                self._quiet_until[kind] = now + self.interval_s
                since = self._unlogged.pop(kind, 0)
            more = (f"; {since} more of this kind since the last such line" if since
                    else "")
            self._log.warning(
                "Cassandra warned (%s) on %s: %s%s (warnings are counted in "
                "chronowheel_store_server_warnings_total; at most one line per kind every "
                "%.0f s)", kind, what or "a request", message, more, self.interval_s)

    @property
    def counts(self) -> dict[str, int]:
        """kind -> warnings counted so far."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def latest(self) -> dict[str, str]:
        """kind -> the last warning of that kind, word for word."""
        with self._lock:
            return dict(self._latest)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "chronowheel_store_server_warnings",
            "warnings Cassandra sent with its answers to this process's requests, by kind: "
            "unlogged_batch, batch_size, tombstones, aggregation, guardrail, other",
            labels=["kind"])
        counts = self.counts
        for kind in (*(kind for kind, _ in KINDS), OTHER):  # every kind, 0 until it comes
            family.add_metric([kind], counts.get(kind, 0))
        yield family


class _MuteDriverLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != DRIVER_LINE


_MUTE = _MuteDriverLine()


def mute_driver_lines() -> None:
    """Drop the driver's line per server warning (`cassandra.protocol`): the store counts and
    logs them itself. Idempotent. Should the driver change its wording, its lines come back
    rather than anything go unseen."""
    logger = logging.getLogger("cassandra.protocol")
    if _MUTE not in logger.filters:
        logger.addFilter(_MUTE)
