"""The limits the servers enforce, and the ones chronowheel adds, in one place.

Every limit a server enforces on something a command makes us store or publish is checked here
before the write, so a command over it is rejected with the limit named instead of failing in
the middle of a shard's batch (docs/design.md, "Failure isolation"). The defaults are the
servers' own defaults; a cluster configured otherwise sets the matching `CHRONOWHEEL_*`
setting (settings.py) to the same value.

Pure: no driver imports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Final

# --- Cassandra -----------------------------------------------------------------------------

CASSANDRA_MAX_TTL_S: Final = 630_720_000
"""Cassandra's largest TTL: 20 years (`Attributes.MAX_TTL`), fixed in the server. A row whose
TTL would be larger is refused (`ttl is too large`)."""

CASSANDRA_BATCH_FAIL_BYTES: Final = 50 * 1024
"""Cassandra's default `batch_size_fail_threshold` (50 KiB): a batch over several partitions
whose mutations add up to more is refused (`Batch too large`). A job's due row and jobs row
go in one logged batch, so one job's rows must fit under it."""

CASSANDRA_BATCH_WARN_BYTES: Final = 5 * 1024
"""Cassandra's default `batch_size_warn_threshold` (5 KiB): larger batches are logged."""

ROW_OVERHEAD_BYTES: Final = 480
"""What Cassandra counts for a job's two rows besides their variable parts: about 20 bytes
per cell (timestamp, TTL, deletion time) plus the fixed-size columns. Measured against
Cassandra 5.0's own figure in its batch size warning: 52 bytes per job more than the 420 this
was before (a single job with a 2,300-byte payload: 5,242 counted, 5,190 estimated with 420;
nine jobs with 100-byte payloads: 7,578 against 7,110), so 480 errs high again."""

RETIRED_ROW_BYTES: Final = 160
"""About what Cassandra counts for an edit's retirement of its old due row (a `due_retired`
row: partition and clustering keys, a version cell), beside the job id, erring high. With
`due_deletes` the batch also carries the old row's delete, about as large: see
`retired_row_bytes`."""


def retired_row_bytes(job_id: str) -> int:
    """What an edit's retirement (and, with `due_deletes`, the delete) adds to its batch."""
    return 2 * (len(job_id.encode()) + RETIRED_ROW_BYTES)


HEADER_OVERHEAD_BYTES: Final = 8
"""Per header of the `headers` map: the map entry's own cell overhead."""

# --- Kafka ---------------------------------------------------------------------------------

KAFKA_MAX_MESSAGE_BYTES: Final = 1_048_588
"""Kafka's default `max.message.bytes` of a topic (a record batch at most this large). Used
when a topic's own configuration cannot be read."""

RECORD_OVERHEAD_BYTES: Final = 128
"""A record's framing in a batch of one, besides its key, value and headers: the batch
header (61 bytes) and the record's varints, with room to spare."""

# --- chronowheel's own ---------------------------------------------------------------------

MAX_REASON_BYTES: Final = 1024
"""Longest `cw-reason` header of a rejected command or dead letter, UTF-8; a longer reason
is cut and ends with `...`."""

MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of arrays and objects a submitted command may have (the payload inside
a job is two levels down): deeper input is rejected by name, before any parser or encoder
meets its own recursion limit."""

DEFAULT_MIN_PERIOD_MS: Final = 1_000
"""Shortest `every` interval and cron period a job may have by default (the setting
`min_period_ms`): below it one job alone could fire thousands of times a second."""

MIN_MAX_LATENESS_MS: Final = 1_000
"""Shortest lateness bound (`max_lateness`) a job may have: a working node publishes tens of
milliseconds late, and a bound near that would drop on-time work as missed."""

MAX_MAX_LATENESS_MS: Final = 3653 * 86_400_000
"""Longest lateness bound a job may have (ten years, the default horizon): longer means none."""

MAX_PAUSE_AFTER_FAILURES: Final = 100
"""Most consecutive failed runs `pause_after_failures` may wait for before it pauses a job."""

AUTO_PAUSE_RUNS: Final = 1_000
"""Runs of a job the worker reads to find its streak of failed runs (one history read, the
most `job history` reads): `pause_after_failures` times `max_attempts` (each failed run may
hold that many attempts) must fit in it."""

MAX_PAUSE_NOTE_CHARS: Final = 500
"""Longest note a pause may carry (why the job was paused, shown by `job show`)."""

MAX_RECURRENCE_STEPS: Final = 100_000
"""Most candidate instants a recurrence may examine to find its next occurrence; a schedule
whose next occurrence is not found within them (excluded on almost every date, or matching
almost never) is rejected with that reason rather than hold the event loop."""


def job_rows_bytes(*, job_id: str, topic: str, payload_len: int, spec_len: int,
                   recurring: bool, headers: Iterable[tuple[str, str | bytes]] = ()) -> int:
    """About what Cassandra counts for one job's due row and jobs row in a batch: the
    variable parts plus the per-cell overhead. It errs high (ids and topics counted as
    UTF-8 twice), so a job under the limit by this count is under it by Cassandra's."""
    size = (payload_len + spec_len + 2 * len(job_id.encode()) + len(topic.encode())
            + ROW_OVERHEAD_BYTES)
    if recurring:
        size += spec_len  # the due row of a recurring job carries its spec too
    for name, value in headers:
        size += len(name.encode()) + len(_utf8(value)) + HEADER_OVERHEAD_BYTES
    return size


def _utf8(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def max_ttl_reach_ms(retention_ms: int) -> int:
    """How far ahead of now an occurrence may be and still get a due row: the row lives
    until its slot plus the retention period, within Cassandra's largest TTL."""
    return CASSANDRA_MAX_TTL_S * 1000 - retention_ms


def record_bytes(key: bytes | None, value: bytes | None,
                 headers: Iterable[tuple[str, bytes]]) -> int:
    """A Kafka record's size in a batch of one, rounded up (see RECORD_OVERHEAD_BYTES)."""
    size = RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
    for name, header_value in headers:
        size += len(name.encode()) + len(header_value) + 10
    return size


def cut_reason(reason: str, limit: int = MAX_REASON_BYTES) -> str:
    """`reason` within `limit` bytes of UTF-8, cut at a character boundary and marked."""
    data = reason.encode()
    if len(data) <= limit:
        return reason
    return data[: limit - 3].decode(errors="ignore") + "..."


TOPIC_LIMIT_REFRESH_MS: Final = 300_000
"""How long a topic's `max.message.bytes` read from the brokers is trusted before it is read
again (a refusal as too large reads it again at once)."""

REQUEST_OVERHEAD_BYTES: Final = 1024
"""A produce request's framing around one batch: what a record may not use of the
producer's `max_request_size`."""


def max_record_bytes(topic_max_message_bytes: int | None, max_request_size: int) -> int:
    """The largest record (as `record_bytes` counts) a topic takes from a producer: its
    `max.message.bytes` (Kafka's default when unknown), within the producer's largest
    request."""
    topic_limit = KAFKA_MAX_MESSAGE_BYTES if topic_max_message_bytes is None \
        else topic_max_message_bytes
    return min(topic_limit, max_request_size - REQUEST_OVERHEAD_BYTES)


def oversize_note(value: bytes | None) -> bytes:
    """What stands in for a payload too large to keep in a dead letter: its size and
    SHA-256, as a small JSON object."""
    data = value or b""
    return (b'{"replaced":"payload too large","size":%d,"sha256":"%s"}'
            % (len(data), hashlib.sha256(data).hexdigest().encode()))
