"""Pure parts of failure handling: the backoff, the retry command and the dead letter."""

from __future__ import annotations

import hashlib
from typing import TypedDict

from chronowheel.core import limits, wire
from chronowheel.core.model import DAY_MS, MAX_ATTEMPTS, MAX_BACKOFF_MS, encode_retry
from chronowheel.worker.occurrence import Occurrence

MAX_RETRY_DELAY_MS = DAY_MS
ERROR_LIMIT_BYTES = 2048
DEAD_HEADERS = (wire.ERROR, wire.FAILED_AT, wire.SOURCE_TOPIC, wire.SOURCE_PARTITION,
                wire.SOURCE_OFFSET, wire.REASON, wire.ORIGINAL_BYTES)


class DeadLetter(Exception):
    """Raise from a handler to dead-letter the occurrence at once, without further retries."""


def retry_delay_ms(backoff_ms: int, failed_attempt: int) -> int:
    """Delay before the delivery after `failed_attempt`: backoff doubling per attempt, capped."""
    if failed_attempt < 1:
        raise ValueError(f"failed_attempt must be at least 1, got {failed_attempt}")
    if backoff_ms <= 0:
        return 0
    # Past 2**40 the cap has long been reached; stop before building a huge integer.
    exponent = min(failed_attempt - 1, 40)
    return min(MAX_RETRY_DELAY_MS, backoff_ms << exponent)


def gives_up(occ: Occurrence, error: BaseException) -> bool:
    """True when this failure dead-letters instead of retrying."""
    return (isinstance(error, DeadLetter) or occ.attempt >= occ.max_attempts
            or occ.attempt >= MAX_ATTEMPTS)


def retry_command(occ: Occurrence, now_ms: int) -> tuple[bytes, bytes]:
    """(key, value) of the `retry` command for the next delivery of `occ`, for `<ns>.submit`.

    The occurrence and attempt are fixed by `occ`, so a duplicate of this command (a crash
    between producing it and committing) delivers the same (occurrence, attempt) again, which
    the idempotency helper recognises.
    """
    backoff = min(occ.backoff_ms, MAX_BACKOFF_MS)
    value = next_attempt(occ, at_ms=now_ms + retry_delay_ms(backoff, occ.attempt),
                         max_attempts=min(occ.max_attempts, MAX_ATTEMPTS))
    return occ.job_id.encode(), value


def next_attempt(occ: Occurrence, *, at_ms: int, max_attempts: int,
                 redrive_id: str = "") -> bytes:
    """The `retry` command of `occ`'s next attempt, due at `at_ms`, with `max_attempts`:
    what the delivery of a job carries to its next one (payload, the job's own headers, its
    backoff, `pause_after_failures` and overlap policy `concurrency`, a trigger's or
    backfill's key). A worker's retry and a dead letter's redrive (`client/dead.py`, which
    gives its `redrive_id`) are both made here, so neither drops a field the other keeps.
    Not carried, for any retry: the job's lateness bound (docs/worker.md)."""
    return encode_retry(
        id=occ.job_id, scheduled_ms=occ.scheduled_ms, attempt=occ.attempt + 1, at_ms=at_ms,
        topic=occ.topic, payload=occ.payload, headers=occ.job_headers,
        max_attempts=max_attempts,
        backoff_ms=min(occ.backoff_ms, MAX_BACKOFF_MS),  # the node would reject a longer one
        pause_after_failures=occ.pause_after_failures, concurrency=occ.concurrency,
        redrive_id=redrive_id, **requested_by(occ))


class Requested(TypedDict, total=False):
    origin: str
    request_id: str


def requested_by(occ: Occurrence) -> Requested:
    """The retry fields that keep a triggered or backfilled occurrence's key and marker."""
    for header, origin in ((wire.TRIGGERED, wire.TRIGGER_ORIGIN),
                           (wire.BACKFILL, wire.BACKFILL_ORIGIN)):
        request_id = occ.headers.get(header)
        if request_id:
            return {"origin": origin, "request_id": request_id}
    return {}


def error_text(error: BaseException, limit: int = ERROR_LIMIT_BYTES) -> str:
    """`Type: message`, cut to at most `limit` UTF-8 bytes on a character boundary."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def dead_headers(raw_headers: tuple[tuple[str, bytes], ...], error: BaseException,
                 failed_at_ms: int, topic: str, partition: int, offset: int,
                 ) -> list[tuple[str, bytes]]:
    """The original headers plus why, when and where it failed (replacing any older ones)."""
    kept = [(k, v) for k, v in raw_headers if k.lower() not in DEAD_HEADERS]
    return [*kept,
            (wire.ERROR, error_text(error).encode()),
            (wire.FAILED_AT, str(failed_at_ms).encode()),
            (wire.SOURCE_TOPIC, topic.encode()),
            (wire.SOURCE_PARTITION, str(partition).encode()),
            (wire.SOURCE_OFFSET, str(offset).encode())]


def refusal_reason(what: str, kind: str, reason: str) -> bytes:
    """The `cw-reason` of a dead letter standing in for a record the broker refused: `what`
    was refused (`retry refused`, `dead letter refused`), `kind` and the broker's words."""
    return limits.cut_reason(f"{what}: {kind}: {reason}").encode()


def minimal_dead_letter(key: bytes | None, value: bytes,
                        headers: list[tuple[str, bytes]], reason: bytes,
                        ) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the dead letter sent when the broker refused the full one:
    the payload replaced by a note of its size and SHA-256, only chronowheel's own headers
    kept (why, when and where it failed among them, so the record can be read again at its
    source), the refusal in `cw-reason`, the payload's size in `cw-original-bytes`; without a key (a
    record that is not an occurrence), `<topic>:<partition>@<offset>` of the source."""
    kept = [(k, v) for k, v in headers
            if k.lower().startswith(wire.RESERVED_HEADER_PREFIX)
            and k.lower() not in (wire.REASON, wire.ORIGINAL_BYTES)]
    if key is None:
        source = dict(kept)
        key = b"%s:%s@%s" % (source.get(wire.SOURCE_TOPIC, b""),
                             source.get(wire.SOURCE_PARTITION, b""),
                             source.get(wire.SOURCE_OFFSET, b""))
    note = (b'{"replaced":"the broker refused the dead letter","size":%d,"sha256":"%s"}'
            % (len(value), hashlib.sha256(value).hexdigest().encode()))
    return key, note, [
        *kept, (wire.REASON, reason), (wire.ORIGINAL_BYTES, str(len(value)).encode())]
