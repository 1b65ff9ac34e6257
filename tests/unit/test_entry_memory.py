"""Memory of a loaded occurrence, counted with tracemalloc (allocations, not time or RSS, so
the bound holds on a busy machine). The goal is payload + 300 B per entry; the job id, which
is the user's data like the payload, is counted beside it."""

from __future__ import annotations

import pytest
from chronowheel.testing.entry_memory import loaded_entry_cost

JOB_PREFIX = "orders-2026.herd."  # + 7 digits: 24-character job ids
ID_CHARS = len(JOB_PREFIX) + 7


@pytest.mark.parametrize("spread_ms", [0, 60_000], ids=["herd", "one-minute"])
def test_a_loaded_occurrence_costs_its_payload_and_id_plus_at_most_300_bytes(
        spread_ms: int) -> None:
    cost = loaded_entry_cost(50_000, payload_bytes=90, spread_ms=spread_ms,
                             job_prefix=JOB_PREFIX)
    assert cost.overhead_per_entry - ID_CHARS <= 300, cost


def test_the_payload_is_held_once() -> None:
    small = loaded_entry_cost(20_000, payload_bytes=100, job_prefix=JOB_PREFIX)
    large = loaded_entry_cost(20_000, payload_bytes=2_100, job_prefix=JOB_PREFIX)
    # 2,000 more payload bytes cost 2,000 more bytes per entry (pymalloc/alignment aside),
    # not a multiple: no str copy, no second bytes copy kept.
    assert 1_990 <= large.bytes_per_entry - small.bytes_per_entry <= 2_040, (small, large)
