"""`ingest_bench.py --cron-share`: the share of cron jobs is exact and evenly spread, and every
job the benchmark sends passes the node's own validation (a rejected job would be counted as
never stored and stall the run)."""

from __future__ import annotations

from typing import Any

import pytest
from chronowheel.core.model import Upsert, ValidationPolicy, encode_upsert, parse_command

from tests.unit.loadtest_modules import BENCH, load

NOW_MS = 1_796_000_000_000


@pytest.fixture(scope="module")
def ingest_bench() -> Any:
    return load("ingest_bench", BENCH)


@pytest.mark.parametrize("share", [0.0, 0.2, 0.5, 1.0])
def test_the_cron_share_is_exact_over_every_prefix(ingest_bench: Any, share: float) -> None:
    flags = [ingest_bench.is_cron(i, share) for i in range(1000)]
    for n in (10, 100, 1000):
        assert sum(flags[:n]) == int(n * share)


def test_every_job_validates_and_the_cron_jobs_spread_over_zones(ingest_bench: Any) -> None:
    policy = ValidationPolicy()
    zones: set[str] = set()
    crons = 0
    for i in range(400):
        spec = ingest_bench.job_spec("run", i, NOW_MS, 86_400, 29 * 86_400_000, 0.2)
        command = parse_command(encode_upsert(spec), key=spec["id"].encode(), policy=policy,
                                now_ms=NOW_MS)
        assert isinstance(command, Upsert)
        if "cron" in spec:
            crons += 1
            zones.add(spec["tz"])
        else:
            assert NOW_MS + 86_400_000 <= spec["at"] < NOW_MS + 30 * 86_400_000
    assert crons == 80
    assert len(zones) == len(ingest_bench.ZONES) == 20
