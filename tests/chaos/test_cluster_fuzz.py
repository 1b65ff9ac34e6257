"""The fuzz run of tests/fuzz on the cluster profile (three Cassandra nodes, three Kafka nodes,
replication 3): 100,000 raw submit commands at CHRONOWHEEL_CHAOS_SCALE=1 (5,000 at the default
0.05), good one-shots mixed with commands at and past every limit, sent to one node of a
two-shard namespace; the same invariants as tests/fuzz/test_e2e.py (the node keeps running,
every good job fires exactly once and never early, every other command is applied or on
<ns>.rejected with a cw-reason, no ERROR line without an error counter that rose).

CHRONOWHEEL_FUZZ_SEED repeats a run (default: a fresh seed, printed); CHRONOWHEEL_FUZZ_REPORT
names a file for the run's JSON summary.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from chronowheel.settings import Settings
from chronowheel.testing import drop_namespace

from testkit.chaos import ScenarioResult, chaos_scale, scaled
from testkit.cluster import LocalCluster
from tests.chaos.conftest import report
from tests.fuzz.test_e2e import run_fuzz

pytestmark = pytest.mark.chaos

SCALE = chaos_scale()
REPLICATION = "3"


async def test_fuzzed_commands_on_the_cluster(cluster: LocalCluster, tmp_path: Path) -> None:
    commands = scaled(100_000, SCALE, 5_000)
    raw = os.environ.get("CHRONOWHEEL_FUZZ_SEED", "")
    seed = int(raw) if raw else secrets.randbelow(2**31)
    print(f"\n[chaos] fuzz seed {seed} (CHRONOWHEEL_FUZZ_SEED={seed} repeats it), "
          f"{commands:,} commands", file=sys.stderr)
    cassandra, kafka = cluster.addresses()
    namespace = "chaosfuzz" + secrets.token_hex(4)
    try:
        summary = await run_fuzz(SimpleNamespace(cassandra=cassandra, kafka=kafka), namespace,
                                 tmp_path, commands, seed, replication=REPLICATION)
    finally:
        try:
            await asyncio.wait_for(drop_namespace(Settings(
                namespace=namespace, cassandra=cassandra, kafka=kafka,
                replication=REPLICATION)), 180)
        except Exception as exc:  # cleanup must not hide the run's own result
            print(f"dropping {namespace} failed: {exc!r}", file=sys.stderr)

    # run_fuzz has failed the test on any violation; what is left is the row of the report
    lateness = summary["good_lateness_ms"]
    outcomes = summary["outcomes"]
    fired = sum(kinds.get("fired", 0) for kinds in outcomes.values())
    rejected = sum(kinds.get("rejected", 0) for kinds in outcomes.values())
    applied = sum(kinds.get("applied", 0) for kinds in outcomes.values())
    report(ScenarioResult(
        scenario="fuzz", load=f"{summary['commands']:,} fuzzed commands (seed {seed})",
        accepted=fired, early=summary["early"], duplicates=summary["duplicates"],
        max_lateness_ms=lateness["max"],
        notes=[f"{rejected:,} rejected with a reason, {applied:,} applied, 0 dropped; "
               f"good jobs' lateness p50 {_ms(lateness['p50'])}, p99 {_ms(lateness['p99'])}; "
               f"sent in {summary['send_seconds']} s, {summary['total_seconds']} s in all; "
               f"{summary['error_log_lines']} ERROR lines, counters that rose "
               f"{summary['error_counters_rose']}"]))
    assert summary["violations"] == 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"
