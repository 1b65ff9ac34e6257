"""The node's records of runs for the run history (`history.py`): what it published, what it
missed (lateness bound) and what a catch-up left out."""

from __future__ import annotations

from collections.abc import Callable

from chronowheel.core import runs
from chronowheel.core.recurrence import Schedule, next_after
from chronowheel.core.runs import RunRecord
from chronowheel.history import RunRecorder
from chronowheel.node.pending import Pending, RequestedPending

SKIPPED_COUNT_CAP = 100
"""The most occurrences of a cron schedule one catch-up's skipped count walks: a walk runs in
dispatch, on the event loop (about 23 µs a step for a per-second cron here), so a thousand jobs
back from a long outage must not hold their shards; beyond it the count is a lower bound. An
interval schedule's count is exact and costs no walk."""


def _occurrence(p: Pending) -> str:
    return p.entry if isinstance(p, RequestedPending) else f"{p.job_id}@{p.scheduled_ms}"


def fired_runs(done_ms: int, node_id: str) -> Callable[[Pending], RunRecord]:
    """How the history writer turns an occurrence of a part committed at `done_ms` into its
    run record: fired-at, lateness against its slot (the instant it was due), this node."""

    def record(p: Pending) -> RunRecord:
        return RunRecord(p.job_id, p.scheduled_ms, p.attempt, _occurrence(p), fired_ms=done_ms,
                         lateness_ms=max(0, done_ms - p.slot_ms), node_id=node_id)

    return record


def missed_sink(history: Callable[[], RunRecorder | None],
                node_id: str) -> Callable[[Pending, int], None]:
    """A `node.lateness.Missed` sink: each missed occurrence as a run with outcome `missed`
    (and its lateness), for the recorder `history()` returns (None: not recorded)."""

    def sink(p: Pending, lateness_ms: int) -> None:
        recorder = history()
        if recorder is not None:
            recorder.add(RunRecord(p.job_id, p.scheduled_ms, p.attempt, _occurrence(p),
                                   lateness_ms=lateness_ms, node_id=node_id,
                                   outcome=runs.MISSED))

    return sink


def skipped_count(schedule: Schedule, first_ms: int, next_ms: int | None,
                  fired: tuple[int, ...], cap: int = SKIPPED_COUNT_CAP) -> int:
    """How many occurrences a catch-up left out: those in [first_ms, next_ms) (where the
    schedule goes on) that it did not fire; at most `cap` are walked."""
    every = schedule.every_ms
    if every is not None and next_ms is not None and next_ms > first_ms:
        # An interval: both ends are on its grid, so no walk (a walk of a long outage's
        # occurrences would hold the event loop, in dispatch, for each job).
        return max(0, -(-(next_ms - first_ms) // every) - len(set(fired)))
    seen = 0
    at: int | None = first_ms
    while at is not None and (next_ms is None or at < next_ms) and seen < cap:
        seen += 1
        at = next_after(schedule, at)
    return max(0, seen - len(set(fired)))
