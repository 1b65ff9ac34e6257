"""The node's bulk histogram observation: the same samples as observing one by one."""

from __future__ import annotations

import pytest
from chronowheel.node.metrics import LATENESS_BUCKETS, observe_many
from prometheus_client import CollectorRegistry, Histogram


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    one, many = CollectorRegistry(), CollectorRegistry()
    return (one, Histogram("late", "x", buckets=LATENESS_BUCKETS, registry=one),
            many, Histogram("late", "x", buckets=LATENESS_BUCKETS, registry=many))


@pytest.mark.parametrize("amount", [0.0, 0.001, 0.0015, 0.3, 4.9, 300.0, 1e6])
def test_observe_many_equals_repeated_observe(amount: float) -> None:
    one_reg, one, many_reg, many = _pair()
    for _ in range(7):
        one.observe(amount)
    one.observe(0.02)
    observe_many(many, amount, 7)
    observe_many(many, 0.02, 1)
    observe_many(many, 5.0, 0)  # nothing observed
    assert _samples(one_reg) == pytest.approx(_samples(many_reg))


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    # Bucket counts and the count are integers (compared exactly by approx); the sum may
    # differ in its last bits (n * x is not x added n times in floating point).
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for metric in registry.collect() for s in metric.samples
            if not s.name.endswith("_created")}
