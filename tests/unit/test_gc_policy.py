"""The node process's garbage-collector policy: the young threshold, the start-up freeze and
the pause histogram."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from chronowheel.errors import ConfigError
from chronowheel.node.gc_policy import GcPauses, tune_process
from chronowheel.node.metrics import NodeMetrics
from chronowheel.settings import Settings


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def _count(metrics: NodeMetrics, generation: str) -> float:
    value = metrics.registry.get_sample_value("chronowheel_gc_pause_seconds_count",
                                              {"generation": generation})
    return value or 0.0


@pytest.mark.usefixtures("restore_gc")
def test_tune_process_raises_the_young_threshold_and_freezes_what_exists() -> None:
    _, middle, old = gc.get_threshold()
    survivor = [object() for _ in range(10)]
    tune_process(50_000)
    assert gc.get_threshold() == (50_000, middle, old)
    assert gc.get_freeze_count() >= len(survivor)


@pytest.mark.usefixtures("restore_gc")
def test_zero_keeps_pythons_threshold() -> None:
    before = gc.get_threshold()
    tune_process(0)
    assert gc.get_threshold() == before


def test_every_collection_is_observed_by_generation_until_removed() -> None:
    metrics = NodeMetrics()
    pauses = GcPauses(metrics.gc_pause)
    pauses.install()
    try:
        gc.collect(0)
        gc.collect(2)
        assert _count(metrics, "0") >= 1
        assert _count(metrics, "2") >= 1
    finally:
        pauses.remove()
    full = _count(metrics, "2")
    gc.collect(2)
    assert _count(metrics, "2") == full
    pauses.remove()  # twice is harmless


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ConfigError, match="gc_young_threshold"):
        Settings(gc_young_threshold=-1)
