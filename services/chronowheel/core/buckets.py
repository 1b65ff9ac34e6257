"""Minute buckets and flexible-window slots: how an occurrence maps to a `due` partition.

A `due` row lives in partition (minute, shard) where minute is the start of its UTC minute in
epoch ms, and is keyed inside it by its slot: the effective firing instant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

MINUTE_MS = 60_000


def minute_of(ms: int) -> int:
    """Start (epoch ms) of the minute bucket holding `ms`; floors, so negative instants work."""
    return ms - ms % MINUTE_MS  # Python's % takes the divisor's sign: a true floor.


def bucket_key(ms: int, shard: int) -> tuple[int, int]:
    """The `due` partition key (minute_ms, shard) of an instant on a shard."""
    return (minute_of(ms), shard)


def slot_for(job_id: str, scheduled_ms: int, window_ms: int) -> int:
    """Effective firing instant in [scheduled, scheduled + window) for a flexible window.

    The offset is a fixed hash of (job id, scheduled instant): the same occurrence lands on the
    same slot in every process and every version, so a re-submit or a reload never moves it,
    while different jobs with the same time spread across the window.
    """
    if window_ms < 0:
        raise ValueError(f"window_ms must be >= 0, got {window_ms}")
    if window_ms == 0:
        return scheduled_ms
    digest = hashlib.blake2b(
        f"{job_id}\x00{scheduled_ms}".encode(), digest_size=8, person=b"cw-slot-v1"
    ).digest()
    return scheduled_ms + int.from_bytes(digest, "big") % window_ms


def minutes_between(a_ms: int, b_ms: int) -> Iterator[int]:
    """Start of every minute bucket that overlaps [a_ms, b_ms], in order; nothing if b < a."""
    if b_ms < a_ms:
        return
    last = minute_of(b_ms)
    minute = minute_of(a_ms)
    while minute <= last:
        yield minute
        minute += MINUTE_MS
