"""What a handler receives: one fired occurrence, read from a Kafka record's key, value, headers."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from chronowheel.core import wire
from chronowheel.core.wire import RESERVED_HEADER_PREFIX

# Defaults of a job's retry policy, for messages fired before nodes sent these headers.
DEFAULT_MAX_ATTEMPTS = wire.DEFAULT_MAX_ATTEMPTS
DEFAULT_BACKOFF_MS = wire.DEFAULT_BACKOFF_MS

_REQUIRED = wire.FIRED_REQUIRED
_REQUIRED_SET = frozenset(_REQUIRED)


class MalformedOccurrence(ValueError):
    """A record on a worker's topic that is not a chronowheel occurrence (dead-lettered)."""


@dataclass(frozen=True)
class Occurrence:
    job_id: str
    scheduled_ms: int
    fired_ms: int
    attempt: int
    max_attempts: int
    backoff_ms: int
    occurrence: str
    """`cw-occurrence`, `<job id>@<scheduled ms>`: the idempotency key."""
    topic: str
    partition: int
    offset: int
    payload: bytes
    headers: dict[str, str]
    """Every header of the message, the `cw-*` ones included."""
    raw_headers: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    concurrency: str = wire.CONCURRENCY_ALLOW
    """The job's overlap policy (`cw-concurrency`): allow, forbid or replace."""
    pause_after_failures: int | None = None
    """The job's `pause_after_failures` (`cw-pause-after-failures`), None without one."""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def cancelled(self) -> bool:
        """True once a newer occurrence of the job replaced this one (`concurrency: replace`):
        a plain-function handler, which cannot be interrupted, may check it and return."""
        return self._stop.is_set()

    def json(self) -> Any:
        """The payload parsed as JSON (raises on a payload that is not JSON)."""
        return orjson.loads(self.payload)

    @property
    def job_headers(self) -> dict[str, str]:
        """The job's own headers (those not starting with `cw-`)."""
        return {k: v for k, v in self.headers.items()
                if not k.lower().startswith(RESERVED_HEADER_PREFIX)}

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @classmethod
    def from_record(cls, topic: str, partition: int, offset: int, value: bytes | None,
                    headers: Iterable[tuple[str, bytes]] | None) -> Occurrence:
        raw = tuple(headers) if headers else ()
        # Later duplicates win, as for most header readers; the node never repeats a name.
        text: dict[str, str] = {}
        has_none = False
        for k, v in raw:
            if v is None:
                has_none = True
                text[k] = ""
            else:
                text[k] = v.decode("utf-8", "replace")
        if has_none:
            raw = tuple((k, v or b"") for k, v in raw)
        if not text.keys() >= _REQUIRED_SET:
            missing = [h for h in _REQUIRED if h not in text]
            raise MalformedOccurrence(f"not a chronowheel occurrence: missing header "
                                      f"{', '.join(missing)}")
        return cls(
            job_id=text[wire.JOB_ID],
            scheduled_ms=_int(text, wire.SCHEDULED_AT, None, 0),
            fired_ms=_int(text, wire.FIRED_AT, None, 0),
            attempt=_int(text, wire.ATTEMPT, None, 1),
            max_attempts=_int(text, wire.MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS, 1),
            backoff_ms=_int(text, wire.BACKOFF_MS, DEFAULT_BACKOFF_MS, 0),
            occurrence=text[wire.OCCURRENCE],
            topic=topic, partition=partition, offset=offset,
            payload=value or b"", headers=text, raw_headers=raw,
            concurrency=overlap_policy(text.get(wire.CONCURRENCY)),
            pause_after_failures=optional_count(text.get(wire.PAUSE_AFTER_FAILURES)),
        )


def overlap_policy(raw: str | None) -> str:
    """The overlap policy a `cw-concurrency` header names: allow when absent, and an unknown
    one (from a newer node) falls back to the default, allow, too."""
    return raw if raw in wire.CONCURRENCY_POLICIES else wire.CONCURRENCY_ALLOW


def optional_count(raw: str | None) -> int | None:
    """A positive decimal count, None when absent or not one (an auto-pause is an aid: a bad
    header turns it off for the record rather than dead-lettering it)."""
    # isdigit alone takes '²' (which int() refuses) and '٣' (which it reads as 3)
    if raw is None or not raw.isascii() or not raw.isdigit():
        return None
    value = int(raw)
    return value if value >= 1 else None


def _int(headers: dict[str, str], name: str, default: int | None, low: int) -> int:
    raw = headers.get(name)
    if raw is None:
        if default is not None:
            return default
        raw = ""
    try:
        value = int(raw, 10)
    except ValueError:
        raise MalformedOccurrence(f"header {name}: not a decimal integer ({raw!r:.40})") from None
    if value < low:
        raise MalformedOccurrence(f"header {name}: must be at least {low} (got {value})")
    return value
