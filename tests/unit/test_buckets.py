from __future__ import annotations

import itertools

import pytest
from chronowheel.core.buckets import (
    MINUTE_MS,
    bucket_key,
    minute_of,
    minutes_between,
    slot_for,
)
from hypothesis import given
from hypothesis import strategies as st

instants = st.integers(min_value=-(10**13), max_value=10**13)


def test_minute_of_examples() -> None:
    assert minute_of(0) == 0
    assert minute_of(59_999) == 0
    assert minute_of(60_000) == 60_000
    assert minute_of(-1) == -60_000
    assert minute_of(-60_000) == -60_000
    assert minute_of(-60_001) == -120_000
    # 2026-12-01T09:00:30.5Z
    assert minute_of(1_796_115_630_500) == 1_796_115_600_000


@given(instants)
def test_minute_of_is_floor(ms: int) -> None:
    m = minute_of(ms)
    assert m % MINUTE_MS == 0
    assert m <= ms < m + MINUTE_MS


def test_bucket_key() -> None:
    assert bucket_key(61_234, 5) == (60_000, 5)


def test_slot_for_zero_window_is_scheduled() -> None:
    assert slot_for("job", 1_000, 0) == 1_000


def test_slot_for_rejects_negative_window() -> None:
    with pytest.raises(ValueError):
        slot_for("job", 1_000, -1)


def test_slot_for_is_pinned() -> None:
    # Stability across versions: these values must never change (stored slots depend on them).
    assert slot_for("reminder-42", 1_796_115_600_000, 60_000) == 1_796_115_600_000 + 21_792
    assert slot_for("reminder-43", 1_796_115_600_000, 60_000) == 1_796_115_600_000 + 11_948


def test_slot_for_spreads_jobs() -> None:
    slots = {slot_for(f"job-{i}", 0, 1_000) for i in range(1_000)}
    assert len(slots) > 500


@given(st.text(max_size=50), instants, st.integers(min_value=0, max_value=10**9))
def test_slot_for_within_window_and_deterministic(job_id: str, t: int, window: int) -> None:
    s = slot_for(job_id, t, window)
    assert s == slot_for(job_id, t, window)
    if window == 0:
        assert s == t
    else:
        assert t <= s < t + window


def test_minutes_between_examples() -> None:
    assert list(minutes_between(0, 0)) == [0]
    assert list(minutes_between(59_999, 60_000)) == [0, 60_000]
    assert list(minutes_between(-1, 1)) == [-60_000, 0]
    assert list(minutes_between(10, 5)) == []


@given(instants, st.integers(min_value=0, max_value=20 * MINUTE_MS))
def test_minutes_between_covers_interval(a: int, span: int) -> None:
    b = a + span
    ms = list(minutes_between(a, b))
    assert ms[0] == minute_of(a)
    assert ms[-1] == minute_of(b)
    assert all(y - x == MINUTE_MS for x, y in itertools.pairwise(ms))
