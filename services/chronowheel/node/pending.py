"""What the wheel holds: one pending occurrence, kept compact.

A node holds every occurrence due within its lookahead, millions of them, so an entry keeps
only what differs between occurrences: the job id, its instants and the payload (one bytes
object). The Kafka key and the cw-* headers are derived from these when the occurrence is
published, and what many entries share (the topic, the job's own headers, the retry policy) is
one shared `Delivery` object. `testing/entry_memory.py`
measures the cost of an entry.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Union

from chronowheel.core import wire
from chronowheel.store.base import DueRow

# Wheel key of an occurrence: (job id, scheduled instant, attempt). A retry of an occurrence
# is pending beside the job's next regular occurrence, so the job id alone is not unique.
OccurrenceKey = tuple[str, int, int]
# What a shard's wheel is keyed by: an entry is inserted as its own key (see Pending.__hash__)
# and found again by its OccurrenceKey.
WheelKey = Union["Pending", OccurrenceKey]


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where and how an occurrence is delivered beyond its payload and instant: the topic, the
    attempt, the job's own headers and the worker library's retry policy, with their header
    pairs encoded once. Most entries share one (attempt 1, default retry policy)."""

    topic: str
    attempt: int
    user_headers: tuple[tuple[str, str], ...]
    max_attempts: int
    backoff_ms: int
    attempt_header: tuple[str, bytes]
    # cw-max-attempts, cw-backoff-ms and the job's own headers, in publishing order.
    tail: tuple[tuple[str, bytes], ...]
    max_lateness_ms: int | None = None
    """The job's own lateness bound (its `cw-max-lateness-ms` header), read once here: the
    node checks it for every occurrence it dispatches."""


_DELIVERIES: dict[tuple[str, int, tuple[tuple[str, str], ...], int, int], Delivery] = {}
_DELIVERIES_MAX = 4096


def delivery(topic: str, attempt: int, user_headers: tuple[tuple[str, str], ...],
             max_attempts: int, backoff_ms: int) -> Delivery:
    """The shared `Delivery` for these values (a new one once the cache is full)."""
    cache_key = (topic, attempt, user_headers, max_attempts, backoff_ms)
    hit = _DELIVERIES.get(cache_key)
    if hit is None:
        tail = ((wire.MAX_ATTEMPTS, str(max_attempts).encode()),
                (wire.BACKOFF_MS, str(backoff_ms).encode()),
                *((k, v.encode()) for k, v in user_headers))
        # Rows decode a new string per topic value; entries share one per topic.
        hit = Delivery(sys.intern(topic), attempt, user_headers, max_attempts, backoff_ms,
                       (wire.ATTEMPT, str(attempt).encode()), tail,
                       _lateness_bound(user_headers))
        if len(_DELIVERIES) < _DELIVERIES_MAX:
            _DELIVERIES[cache_key] = hit
    return hit


def _lateness_bound(user_headers: tuple[tuple[str, str], ...]) -> int | None:
    for name, value in user_headers:
        # Written by the parser (JobSpec.fired_headers) as decimal ms; a job's own headers
        # cannot use the cw- prefix, so only the parser's value is ever found here.
        if name == wire.MAX_LATENESS_MS and value.isascii() and value.isdigit():
            return int(value)
    return None


@dataclass(frozen=True, slots=True)
class Recurring:
    """What a recurring job's occurrence needs to schedule the next one."""

    spec: bytes  # the canonical job JSON
    version: int  # of the jobs row this occurrence belongs to


class Pending:
    """One occurrence in a wheel: a one-shot's or a retry's (`recurring` is None), or a
    recurring job's (a `RecurringPending`). Make one with `pending()` or `pending_from_row()`.

    `slot_ms` is the instant the wheel fires it at. For most occurrences it is the scheduled
    instant itself, and then it is not a field: four fields make a 64-byte object, a fifth
    would make it 80 bytes under pymalloc's 16-byte alignment, 16 bytes more per entry of a
    wheel of millions. Subclasses that need another slot carry it in `_slot`. Either way
    `slot_ms` reads a field directly, at C speed (see `_fires_at`): the wheel reads it for
    every entry it moves or fires."""

    __slots__ = ("delivery", "job_id", "payload", "scheduled_ms")
    # A class attribute here, a slot only in RecurringPending: one-shots, the bulk of a
    # wheel, do not pay a field for it.
    recurring: Recurring | None = None

    def __init__(self, *, job_id: str, scheduled_ms: int, payload: bytes,
                 delivery: Delivery) -> None:
        self.job_id = job_id
        self.scheduled_ms = scheduled_ms
        self.payload = payload
        self.delivery = delivery

    slot_ms: int  # a field's own descriptor, set by _fires_at below

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.job_id!r}@{self.scheduled_ms} attempt "
                f"{self.attempt}, slot {self.slot_ms}, topic {self.topic!r})")

    @property
    def wheel_key(self) -> OccurrenceKey:
        return (self.job_id, self.scheduled_ms, self.attempt)

    # An entry is its own wheel key, which saves a key tuple (64 B) per entry: it hashes and
    # compares equal to its OccurrenceKey, so cancel((job_id, scheduled_ms, attempt)) finds
    # it, and two entries of the same occurrence are the same key.
    def __hash__(self) -> int:
        return hash((self.job_id, self.scheduled_ms, self.delivery.attempt))

    def __eq__(self, other: object) -> bool:
        # Called only when hashes collide (a dict compares identity first), so building the
        # keys costs nothing on the hot path; it keeps a RequestedPending, keyed by its entry,
        # distinct from the job's own occurrence at the same instant.
        if isinstance(other, Pending):
            return self.wheel_key == other.wheel_key
        if isinstance(other, tuple):
            return other == self.wheel_key
        return NotImplemented

    @property
    def key(self) -> bytes:
        """The Kafka key of the fired message: the job id."""
        return self.job_id.encode()

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def topic(self) -> str:
        return self.delivery.topic

    @property
    def user_headers(self) -> tuple[tuple[str, str], ...]:
        return self.delivery.user_headers

    @property
    def max_attempts(self) -> int:
        return self.delivery.max_attempts

    @property
    def backoff_ms(self) -> int:
        return self.delivery.backoff_ms

    def headers(self, key: bytes, *extra: tuple[str, bytes]) -> list[tuple[str, bytes]]:
        """The fired message's headers: cw-* (all but those in `extra`, known only at
        publish), the job's own, then `extra`. `key` is `self.key`, which the caller has."""
        scheduled = str(self.scheduled_ms).encode()
        d = self.delivery
        return [
            (wire.JOB_ID, key),
            (wire.SCHEDULED_AT, scheduled),
            d.attempt_header,
            (wire.OCCURRENCE, b"%s@%s" % (key, scheduled)),
            *d.tail,
            *extra,
        ]


class ShiftedPending(Pending):
    """A one-shot's or a retry's occurrence fired at another instant than its scheduled one
    (a slot moved by ingest's per-millisecond cap, or a spread window)."""

    __slots__ = ("_slot",)

    def __init__(self, *, job_id: str, scheduled_ms: int, slot_ms: int, payload: bytes,
                 delivery: Delivery) -> None:
        super().__init__(job_id=job_id, scheduled_ms=scheduled_ms, payload=payload,
                         delivery=delivery)
        self._slot = slot_ms


class RecurringPending(Pending):
    __slots__ = ("_slot", "recurring")

    def __init__(self, *, job_id: str, scheduled_ms: int, slot_ms: int, payload: bytes,
                 delivery: Delivery, recurring: Recurring) -> None:
        super().__init__(job_id=job_id, scheduled_ms=scheduled_ms, payload=payload,
                         delivery=delivery)
        self._slot = slot_ms
        self.recurring = recurring


class RequestedPending(Pending):
    """An occurrence a trigger or a backfill asked for: published as it is, like a one-shot,
    under its own occurrence key (`entry`, from wire.requested_occurrence_id), so it is neither
    the job's scheduled occurrence nor a copy of it, with a header naming the request."""

    __slots__ = ("_slot", "entry", "marker")

    def __init__(self, *, job_id: str, scheduled_ms: int, slot_ms: int, payload: bytes,
                 delivery: Delivery, entry: str, marker: tuple[str, bytes]) -> None:
        super().__init__(job_id=job_id, scheduled_ms=scheduled_ms, payload=payload,
                         delivery=delivery)
        self._slot = slot_ms
        self.entry = entry
        self.marker = marker

    @property
    def wheel_key(self) -> OccurrenceKey:
        return (self.entry, self.scheduled_ms, self.delivery.attempt)

    def __hash__(self) -> int:
        return hash((self.entry, self.scheduled_ms, self.delivery.attempt))

    def headers(self, key: bytes, *extra: tuple[str, bytes]) -> list[tuple[str, bytes]]:
        d = self.delivery
        return [
            (wire.JOB_ID, key),
            (wire.SCHEDULED_AT, str(self.scheduled_ms).encode()),
            d.attempt_header,
            (wire.OCCURRENCE, self.entry.encode()),
            *d.tail,
            self.marker,
            *extra,
        ]


def _fires_at(cls: type[Pending], field: str) -> None:
    # `slot_ms` is the descriptor of the field that holds the slot: reading it is a C-level
    # field read, where a property would run a Python function per entry.
    cls.slot_ms = cls.__dict__[field]


_fires_at(Pending, "scheduled_ms")
for _moved in (ShiftedPending, RecurringPending, RequestedPending):
    _fires_at(_moved, "_slot")


def pending(*, job_id: str, scheduled_ms: int, slot_ms: int, payload: bytes,
            delivery: Delivery, recurring: Recurring | None) -> Pending:
    if recurring is None:
        if slot_ms == scheduled_ms:
            return Pending(job_id=job_id, scheduled_ms=scheduled_ms, payload=payload,
                           delivery=delivery)
        return ShiftedPending(job_id=job_id, scheduled_ms=scheduled_ms, slot_ms=slot_ms,
                              payload=payload, delivery=delivery)
    return RecurringPending(job_id=job_id, scheduled_ms=scheduled_ms, slot_ms=slot_ms,
                            payload=payload, delivery=delivery, recurring=recurring)


def encode_headers(job_id: str, scheduled_ms: int, attempt: int, max_attempts: int,
                   backoff_ms: int, user: tuple[tuple[str, str], ...]) -> list[tuple[str, bytes]]:
    """The cw-* headers of an occurrence (all but cw-fired-at) followed by the job's own."""
    p = Pending(job_id=job_id, scheduled_ms=scheduled_ms, payload=b"",
                delivery=delivery("", attempt, user, max_attempts, backoff_ms))
    return p.headers(p.key)


def pending_from_row(row: DueRow) -> Pending:
    scheduled, slot = row.scheduled_ms, row.slot_ms
    if slot == scheduled:
        slot = scheduled  # one int object for both (most one-shots have no window)
    shared = delivery(row.topic, row.attempt, row.headers, row.max_attempts, row.backoff_ms)
    if row.origin:
        # Published as it is, like a one-shot: its job's schedule is not its business.
        marker = wire.TRIGGERED if row.origin == wire.TRIGGER_ORIGIN else wire.BACKFILL
        return RequestedPending(job_id=row.job_id, scheduled_ms=scheduled, slot_ms=slot,
                                payload=row.payload, delivery=shared, entry=row.entry,
                                marker=(marker, row.request_id.encode()))
    return pending(
        job_id=row.job_id, scheduled_ms=scheduled, slot_ms=slot, payload=row.payload,
        delivery=shared,
        recurring=None if row.spec is None else Recurring(row.spec, row.version),
    )


def with_schedule(p: Pending, scheduled_ms: int) -> Pending:
    """The same job's message for another scheduled instant (catch-up fires)."""
    return pending(
        job_id=p.job_id, scheduled_ms=scheduled_ms, slot_ms=p.slot_ms, payload=p.payload,
        delivery=p.delivery, recurring=p.recurring,
    )
