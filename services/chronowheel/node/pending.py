"""What the wheel holds: one pending occurrence with its fired message pre-encoded."""

from __future__ import annotations

from dataclasses import dataclass

from chronowheel.core import wire
from chronowheel.core.wire import occurrence_id
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
    headers: list[tuple[str, bytes]]
    spec: bytes | None  # recurring jobs: canonical job JSON, to compute the next occurrence
    user_headers: tuple[tuple[str, str], ...] = ()
    max_attempts: int = wire.DEFAULT_MAX_ATTEMPTS
    backoff_ms: int = wire.DEFAULT_BACKOFF_MS

    @property
    def wheel_key(self) -> OccurrenceKey:
        return (self.job_id, self.scheduled_ms, self.attempt)



def encode_headers(job_id: str, scheduled_ms: int, attempt: int, max_attempts: int,
                   backoff_ms: int, user: tuple[tuple[str, str], ...]) -> list[tuple[str, bytes]]:
    out = [
        (wire.JOB_ID, job_id.encode()),
        (wire.SCHEDULED_AT, str(scheduled_ms).encode()),
        (wire.ATTEMPT, str(attempt).encode()),
        (wire.OCCURRENCE, occurrence_id(job_id, scheduled_ms).encode()),
        # The worker library's retry policy travels with the message (the job's spec).
        (wire.MAX_ATTEMPTS, str(max_attempts).encode()),
        (wire.BACKOFF_MS, str(backoff_ms).encode()),
    ]
    out.extend((k, v.encode()) for k, v in user)
    return out


def pending_from_row(row: DueRow) -> Pending:
    return Pending(
        job_id=row.job_id, scheduled_ms=row.scheduled_ms, slot_ms=row.slot_ms,
        attempt=row.attempt, version=row.version, topic=row.topic, key=row.job_id.encode(),
        payload=row.payload,
        headers=encode_headers(row.job_id, row.scheduled_ms, row.attempt, row.max_attempts,
                               row.backoff_ms, row.headers),
        spec=row.spec, user_headers=row.headers, max_attempts=row.max_attempts,
        backoff_ms=row.backoff_ms,
    )


def with_schedule(p: Pending, scheduled_ms: int) -> Pending:
    """The same job's message for another scheduled instant (catch-up fires)."""
    return Pending(
        job_id=p.job_id, scheduled_ms=scheduled_ms, slot_ms=p.slot_ms, attempt=p.attempt,
        version=p.version, topic=p.topic, key=p.key, payload=p.payload,
        headers=encode_headers(p.job_id, scheduled_ms, p.attempt, p.max_attempts, p.backoff_ms,
                               p.user_headers),
        spec=p.spec, user_headers=p.user_headers, max_attempts=p.max_attempts,
        backoff_ms=p.backoff_ms,
    )
