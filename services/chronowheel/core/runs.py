"""Run history: what happened to each occurrence of a job, and the per-job counters.

Pure: the vocabulary of outcomes, the record of one run, how a node's record and a worker's
record of the same run combine, and which counters a record adds to. Storage is behind
`store.base.RunHistoryStore`; the writers are `history.py` (node and worker).

A run is one delivery of one occurrence: (job id, scheduled instant, occurrence key, attempt).
The node writes its part when the transaction that published it commits (fired-at, node id,
lateness); the worker library writes its part when the handler ends (start, end, outcome,
worker id). Both are upserts of the same row, each setting only its own fields, so they may
arrive in either order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime

# --- the vocabulary ---------------------------------------------------------------------------
SUCCEEDED = "succeeded"
"""The handler returned."""
FAILED = "failed"
"""The handler raised, and neither its retry nor a dead letter could be produced (the broker
refused both; the record is logged and committed)."""
RETRIED = "retried"
"""The handler raised; a retry (the next attempt, its own run) was submitted."""
DEAD_LETTERED = "dead-lettered"
"""The handler raised on the last attempt (or its retry was refused): sent to `<ns>.dead`."""
SKIPPED = "skipped"
"""Not run: the job's catch-up policy left it out, or its overlap policy (`concurrency:
forbid`) found another occurrence of the job running."""
MISSED = "missed"
"""Not published: it could not be within the job's lateness bound (`max_lateness`)."""
CANCELLED = "cancelled"
"""The handling was stopped: a newer occurrence replaced it (`concurrency: replace`)."""
FIRED = "fired"
"""Published, no handler outcome recorded yet (a run's state before the worker's record;
never stored as an outcome: see `RunRecord.state`)."""

OUTCOMES: tuple[str, ...] = (SUCCEEDED, FAILED, RETRIED, DEAD_LETTERED, SKIPPED, MISSED,
                             CANCELLED)
"""Every outcome a run record may carry."""
FAILURES = frozenset({FAILED, RETRIED, DEAD_LETTERED})
"""Outcomes of a handler call that raised (each counts as a failed run)."""
FINAL_FAILURES = frozenset({FAILED, DEAD_LETTERED})
"""Outcomes that end an occurrence as failed: no retry of it is to come (auto-pause counts
these; `retried` is an attempt, not yet a failed run)."""

MAX_HISTORY_LIMIT = 1_000
"""The most runs one history read returns (`job history --limit`, `job_history(limit=)`)."""

COUNTERS: tuple[str, ...] = ("fired", "succeeded", "failed", "dead_lettered", "skipped",
                             "missed")
"""The per-job counters, in display order."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run of one occurrence; None for what the writer of this record does not know."""

    job_id: str
    scheduled_ms: int
    attempt: int = 1
    occurrence: str = ""
    """`cw-occurrence`: `<job id>@<scheduled ms>`, or a requested occurrence's own key (a
    trigger or backfill may share the scheduled instant of the job's own occurrence)."""
    fired_ms: int | None = None
    """When the transaction that published it committed (the node's clock)."""
    lateness_ms: int | None = None
    """fired_ms minus the instant it was due (its slot)."""
    node_id: str | None = None
    started_ms: int | None = None
    """When the worker started the handler (the worker's clock)."""
    ended_ms: int | None = None
    outcome: str | None = None
    worker_id: str | None = None
    error: str | None = None
    """The handler's error, cut short (failures only)."""

    def __post_init__(self) -> None:
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise ValueError(f"run outcome {self.outcome!r}: not one of {', '.join(OUTCOMES)}")
        if not self.occurrence:
            object.__setattr__(self, "occurrence", f"{self.job_id}@{self.scheduled_ms}")

    @property
    def key(self) -> tuple[str, int, int, str]:
        """What tells runs apart: (job id, scheduled instant, attempt, occurrence key)."""
        return (self.job_id, self.scheduled_ms, self.attempt, self.occurrence)

    @property
    def state(self) -> str:
        """The outcome, else "fired" once published, else "pending"."""
        if self.outcome is not None:
            return self.outcome
        return FIRED if self.fired_ms is not None else "pending"

    @property
    def duration_ms(self) -> int | None:
        if self.started_ms is None or self.ended_ms is None:
            return None
        return self.ended_ms - self.started_ms

    def merged(self, newer: RunRecord) -> RunRecord:
        """This record with every field `newer` knows (not None) taken from it: how two
        writes of the same row combine in the store."""
        if newer.key != self.key:
            raise ValueError(f"cannot merge run {newer.key} into {self.key}")
        changes = {f.name: getattr(newer, f.name) for f in fields(RunRecord)
                   if getattr(newer, f.name) is not None}
        return replace(self, **changes)

    def as_json(self) -> dict[str, object]:
        """The record as `job history --json` and the client show it."""
        return {"job_id": self.job_id, "scheduled_ms": self.scheduled_ms,
                "attempt": self.attempt, "occurrence": self.occurrence, "state": self.state,
                "outcome": self.outcome, "fired_ms": self.fired_ms,
                "lateness_ms": self.lateness_ms, "node_id": self.node_id,
                "started_ms": self.started_ms, "ended_ms": self.ended_ms,
                "duration_ms": self.duration_ms, "worker_id": self.worker_id,
                "error": self.error}


def counter_deltas(record: RunRecord) -> dict[str, int]:
    """What one written record adds to its job's counters. The node's record of a publish
    adds `fired`; the worker's record of the handler's end adds its outcome (a failed call
    is `failed`, and also `dead_lettered` when it went to `<ns>.dead`)."""
    out: dict[str, int] = {}
    if record.fired_ms is not None:
        out["fired"] = 1
    outcome = record.outcome
    if outcome == SUCCEEDED:
        out["succeeded"] = 1
    elif outcome in FAILURES:
        out["failed"] = 1
        if outcome == DEAD_LETTERED:
            out["dead_lettered"] = 1
    elif outcome == SKIPPED:
        out["skipped"] = 1
    elif outcome == MISSED:
        out["missed"] = 1
    return out


def add_counts(into: dict[str, dict[str, int]], records: Iterable[RunRecord]) -> None:
    """Sum `counter_deltas` of `records` per job id into `into` (job id -> counter -> n)."""
    for r in records:
        deltas = counter_deltas(r)
        if not deltas:
            continue
        mine = into.setdefault(r.job_id, {})
        for name, n in deltas.items():
            mine[name] = mine.get(name, 0) + n


@dataclass(frozen=True, slots=True)
class RunCounters:
    """A job's counters since its first recorded run (kept as long as the job's counters
    row: counters cannot expire), and its newest run's state."""

    fired: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    missed: int = 0
    last_outcome: str | None = None
    """The state of the newest run recorded (by scheduled instant), None when there is none."""

    @classmethod
    def of(cls, counts: Mapping[str, int], last: RunRecord | None) -> RunCounters:
        return cls(**{name: int(counts.get(name, 0)) for name in COUNTERS},
                   last_outcome=None if last is None else last.state)

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {name: getattr(self, name) for name in COUNTERS}
        out["last_outcome"] = self.last_outcome
        return out


def shown_status(status: str, *, recurring: bool, scheduled_ms: int | None,
                 last: RunRecord | None) -> str:
    """The status to show for a jobs row. A one-shot's row keeps `scheduled` after it fires
    (the node writes nothing to it at publish: that is the hot path), so a one-shot whose
    newest recorded run (`last`) is of its pending instant, or of a later one (a trigger or
    backfill run after it fired: a shard publishes in the order of the instants), reads as
    `finished`, or `retrying` while that run's retry is to come."""
    if status == "scheduled" and not recurring and last is not None \
            and scheduled_ms is not None and last.scheduled_ms >= scheduled_ms \
            and last.state != "pending":
        # Fired (its outcome alongside) or missed; a failed attempt with a retry to come, or
        # a retry published and not yet handled, is not over yet.
        retrying = last.outcome == RETRIED or (last.attempt > 1 and last.outcome is None)
        return "retrying" if retrying else "finished"
    return status


@dataclass(frozen=True, slots=True)
class JobHistory:
    """A job's last runs (newest first) and its counters."""

    job_id: str
    runs: list[RunRecord]
    counters: RunCounters

    def as_json(self) -> dict[str, object]:
        return {"id": self.job_id, "counters": self.counters.as_json(),
                "runs": [r.as_json() for r in self.runs]}


def iso_ms(ms: int) -> str:
    """Epoch ms as RFC 3339 UTC to the second, for notes and messages."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Streak:
    """A job's newest consecutive failed runs (`failure_streak`)."""

    count: int
    """Failed runs in a row, newest first, back to a success or the boundary."""
    newest: RunRecord | None
    """The last attempt of the newest failed run (None when `count` is 0)."""


def failure_streak(runs: Iterable[RunRecord], *, job_id: str, since_ms: int) -> Streak:
    """The streak of failed runs that auto-pause (`pause_after_failures`) counts, from the
    job's runs as history returns them (any order).

    Only the job's own occurrences count (a trigger's or backfill's has its own occurrence
    key), and only those scheduled at or after `since_ms` (the job's schedule as last stored
    or resumed). An occurrence's state is that of its highest attempt. Walking from the
    newest scheduled instant back: a run that ended failed (`dead-lettered`, `failed`) adds
    one; one that succeeded ends the streak; the others neither count nor end it (one whose
    retry is to come, published and not handled yet, skipped, missed or cancelled), so two
    workers finishing runs out of order see the same streak once both are recorded.
    """
    last: dict[int, RunRecord] = {}
    for r in runs:
        if r.job_id != job_id or r.scheduled_ms < since_ms \
                or r.occurrence != f"{job_id}@{r.scheduled_ms}":
            continue
        seen = last.get(r.scheduled_ms)
        if seen is None or r.attempt > seen.attempt:
            last[r.scheduled_ms] = r
    count, newest = 0, None
    for scheduled in sorted(last, reverse=True):
        r = last[scheduled]
        if r.outcome == SUCCEEDED:
            break
        if r.outcome in FINAL_FAILURES:
            count += 1
            if newest is None:
                newest = r
    return Streak(count, newest)
