"""The adaptive spacing between node transactions (`node/spacing.py`): it grows while the
brokers' end times stand more than the target above their floor, settles where they are about
the target, and falls back to the least spacing once they return to the floor."""

from __future__ import annotations

import itertools

import pytest
from chronowheel.node.spacing import (
    CLIP_TARGETS,
    DECAY,
    FLOOR_WINDOW_MS,
    QUEUEING_TARGET_MS,
    Spacing,
)

T0 = 1_000_000


def feed(spacing: Spacing, end_ms: float, count: int, *, at: int = T0, every_ms: int = 10) -> int:
    """`count` transactions ending in `end_ms`, one every `every_ms`; returns the time after."""
    for i in range(count):
        spacing.ended(end_ms, at + i * every_ms)
    return at + count * every_ms


def test_end_times_at_their_floor_keep_transactions_back_to_back() -> None:
    spacing = Spacing(most_ms=200)
    feed(spacing, 4.0, 50)
    feed(spacing, 6.0, 50, at=T0 + 500)  # 2 ms over the floor: noise, not queueing
    assert spacing.floor_ms == 4.0
    assert spacing.ms == 0


def test_one_slow_end_does_not_space_transactions() -> None:
    spacing = Spacing(most_ms=200)
    now = feed(spacing, 4.0, 50)
    spacing.ended(150.0, now)  # a pause of the node's loop, once: taken as floor + 20 ms
    assert spacing.queueing_ms == pytest.approx(CLIP_TARGETS * QUEUEING_TARGET_MS / 8)
    now = feed(spacing, 4.0, 20, at=now + 10)
    assert spacing.ms == 0


def test_end_times_over_the_target_grow_the_spacing_by_their_distance_from_it() -> None:
    spacing = Spacing(most_ms=200)
    now = feed(spacing, 2.0, 50)
    grown = []
    for i in range(200):
        spacing.ended(12.0, now + i * 50)  # 10 ms of queueing once the average has caught up
        grown.append(spacing.ms)
    assert grown[0] == 0  # the average moved by 1.25 ms only
    assert all(b >= a for a, b in itertools.pairwise(grown))
    # Once the average has caught up: about 5 ms a transaction (10 - 5, rounded).
    steps = [b - a for a, b in itertools.pairwise(grown[25:41])]
    assert set(steps) <= {4, 5, 6}
    assert grown[-1] == 200  # capped at the most


def test_the_spacing_settles_where_the_queueing_is_the_target_and_decays_after() -> None:
    spacing = Spacing(most_ms=200)
    now = feed(spacing, 2.0, 50)
    now = feed(spacing, 12.0, 60, at=now, every_ms=50)
    held = spacing.ms
    assert held > 0
    # At the target exactly, it holds.
    now = feed(spacing, 2.0 + QUEUEING_TARGET_MS, 80, at=now, every_ms=200)
    assert abs(spacing.ms - held) <= 10
    held = spacing.ms
    # The load is gone: back at the floor, the spacing falls by a quarter a transaction.
    history = []
    well_under = None
    for i in range(80):
        spacing.ended(2.0, now + i * 200)
        history.append(spacing.ms)
        if well_under is None and spacing.queueing_ms < QUEUEING_TARGET_MS / 2:
            well_under = i
    assert all(b <= a for a, b in itertools.pairwise(history))
    assert well_under is not None
    # From there a quarter a transaction: under a millisecond, and so none, within 20.
    assert history[well_under + 1] == round(history[well_under] * DECAY) \
        or abs(history[well_under + 1] - history[well_under] * DECAY) <= 1
    assert history[well_under + 20] == 0


def test_the_floor_forgets_after_its_window() -> None:
    spacing = Spacing(most_ms=200)
    now = feed(spacing, 2.0, 10)
    # The cluster is slower for good (another broker leads now): 30 ms at best.
    now = feed(spacing, 30.0, 700, at=now, every_ms=100)
    assert now - T0 > FLOOR_WINDOW_MS + 10_000
    assert spacing.floor_ms == 30.0
    assert spacing.ms == 0


def test_a_least_spacing_is_kept_and_adapting_starts_above_it() -> None:
    spacing = Spacing(least_ms=50, most_ms=120)
    now = feed(spacing, 4.0, 20)
    assert spacing.ms == 50
    now = feed(spacing, 24.0, 30, at=now + 10)  # 20 ms of queueing: grows from 50
    assert spacing.ms == 120
    feed(spacing, 4.0, 200, at=now)
    assert spacing.ms == 50


def test_without_a_most_above_the_least_nothing_adapts() -> None:
    spacing = Spacing(least_ms=30, most_ms=0)
    feed(spacing, 4.0, 10)
    feed(spacing, 500.0, 50, at=T0 + 100)
    assert not spacing.adapts
    assert spacing.ms == 30


def test_negative_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="spacing bounds must be >= 0"):
        Spacing(least_ms=-1)
