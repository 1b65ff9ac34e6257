"""What the wheel holds: one pending occurrence with its fired message pre-encoded."""

from __future__ import annotations

from dataclasses import dataclass

from chronowheel.core import wire
from chronowheel.store.base import DueRow

# Wheel key of an occurrence: (job id, scheduled instant, attempt). A retry of an occurrence
# is pending beside the job's next regular occurrence, so the job id alone is not unique.
OccurrenceKey = tuple[str, int, int]


@dataclass(slots=True)
class Pending:
    job_id: str
    scheduled_ms: int
    slot_ms: int
    attempt: int
    version: int
    topic: str
    key: bytes
    payload: bytes
    # cw-* headers (all but cw-fired-at, known only at publish) followed by the job's own.
    headers: tuple[tuple[str, bytes], ...]
    spec: bytes | None  # recurring jobs: canonical job JSON, to compute the next occurrence
    user_headers: tuple[tuple[str, str], ...] = ()
    max_attempts: int = wire.DEFAULT_MAX_ATTEMPTS
    backoff_ms: int = wire.DEFAULT_BACKOFF_MS
    entry: str = ""
    """`DueRow.entry` when it is not the job id (a triggered or backfilled occurrence)."""

    @property
    def wheel_key(self) -> OccurrenceKey:
        return (self.entry or self.job_id, self.scheduled_ms, self.attempt)



# Header tuples with the values most occurrences share (attempt 1, the default retry policy)
# are made once and shared by every wheel entry: a loaded occurrence costs memory per object.
_SHARED: dict[tuple[str, int], tuple[str, bytes]] = {}
_SHARED_MAX = 1024


def _shared(name: str, value: int) -> tuple[str, bytes]:
    hit = _SHARED.get((name, value))
    if hit is None:
        hit = (name, str(value).encode())
        if len(_SHARED) < _SHARED_MAX:
            _SHARED[(name, value)] = hit
    return hit


def encode_headers(job_id: str, scheduled_ms: int, attempt: int, max_attempts: int,
                   backoff_ms: int, user: tuple[tuple[str, str], ...]) -> list[tuple[str, bytes]]:
    """The cw-* headers of an occurrence (all but cw-fired-at) followed by the job's own."""
    return list(_headers(job_id, scheduled_ms, attempt, max_attempts, backoff_ms, user, None))


def _requested_headers(row: DueRow, key: bytes) -> tuple[tuple[str, bytes], ...]:
    """Headers of an occurrence a trigger or backfill asked for: its own occurrence key and
    the header naming the request."""
    marker = wire.TRIGGERED if row.origin == wire.TRIGGER_ORIGIN else wire.BACKFILL
    return (
        (wire.JOB_ID, key),
        (wire.SCHEDULED_AT, str(row.scheduled_ms).encode()),
        _shared(wire.ATTEMPT, row.attempt),
        (wire.OCCURRENCE, row.entry.encode()),
        _shared(wire.MAX_ATTEMPTS, row.max_attempts),
        _shared(wire.BACKOFF_MS, row.backoff_ms),
        (marker, row.request_id.encode()),
        *((k, v.encode()) for k, v in row.headers),
    )


def _headers(job_id: str, scheduled_ms: int, attempt: int, max_attempts: int, backoff_ms: int,
             user: tuple[tuple[str, str], ...],
             key: bytes | None) -> tuple[tuple[str, bytes], ...]:
    # A tuple, not a list (smaller), with `key` (the job id encoded, when the caller has it)
    # shared rather than encoded again: this is what a wheel entry holds. The occurrence key
    # is wire.occurrence_id, built from bytes here to skip a decode and an encode.
    scheduled = str(scheduled_ms).encode()
    return (
        (wire.JOB_ID, key if key is not None else job_id.encode()),
        (wire.SCHEDULED_AT, scheduled),
        _shared(wire.ATTEMPT, attempt),
        (wire.OCCURRENCE, b"%s@%s" % (key if key is not None else job_id.encode(), scheduled)),
        # The worker library's retry policy travels with the message (the job's spec).
        _shared(wire.MAX_ATTEMPTS, max_attempts),
        _shared(wire.BACKOFF_MS, backoff_ms),
        *((k, v.encode()) for k, v in user),
    )


def pending_from_row(row: DueRow) -> Pending:
    key = row.job_id.encode()
    if row.origin:
        # Published as it is, like a one-shot: its job's schedule is not its business.
        return Pending(
            job_id=row.job_id, scheduled_ms=row.scheduled_ms, slot_ms=row.slot_ms,
            attempt=row.attempt, version=row.version, topic=row.topic, key=key,
            payload=row.payload, headers=_requested_headers(row, key), spec=None,
            user_headers=row.headers, max_attempts=row.max_attempts,
            backoff_ms=row.backoff_ms, entry=row.entry)
    return Pending(
        job_id=row.job_id, scheduled_ms=row.scheduled_ms, slot_ms=row.slot_ms,
        attempt=row.attempt, version=row.version, topic=row.topic, key=key,
        payload=row.payload,
        headers=_headers(row.job_id, row.scheduled_ms, row.attempt, row.max_attempts,
                         row.backoff_ms, row.headers, key),
        spec=row.spec, user_headers=row.headers, max_attempts=row.max_attempts,
        backoff_ms=row.backoff_ms,
    )


def with_schedule(p: Pending, scheduled_ms: int) -> Pending:
    """The same job's message for another scheduled instant (catch-up fires)."""
    return Pending(
        job_id=p.job_id, scheduled_ms=scheduled_ms, slot_ms=p.slot_ms, attempt=p.attempt,
        version=p.version, topic=p.topic, key=p.key, payload=p.payload,
        headers=_headers(p.job_id, scheduled_ms, p.attempt, p.max_attempts, p.backoff_ms,
                         p.user_headers, p.key),
        spec=p.spec, user_headers=p.user_headers, max_attempts=p.max_attempts,
        backoff_ms=p.backoff_ms,
    )
