"""The locust kit (loadtest/locustfile.py) run headless against the local stack at a small size,
in one process and distributed over two (`--processes 2`): its jobs reach the node and fire,
and its summary adds up the processes' figures."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from chronowheel.settings import Settings
from chronowheel.testing import Collector, metric_sum

from testkit.fleet import until
from testkit.locust import cluster_env, run_locust
from tests.integration.harness import REPO, NodeProcess, make_namespace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOCUSTFILE = REPO / "loadtest" / "locustfile.py"


@contextlib.asynccontextmanager
async def served_namespace(stack: Any, namespace: str, log_dir: Path,
                           ) -> AsyncIterator[tuple[Settings, NodeProcess, dict[str, str]]]:
    """A namespace of 4 shards served by one node process (stopped on the way out), and the
    environment that points a locust file at it."""
    settings = await make_namespace(stack, namespace, shards=4)
    node = NodeProcess(settings, "node", log_dir)
    node.start()
    try:
        await node.wait_ready()
        yield settings, node, cluster_env(kafka=stack.kafka, cassandra=stack.cassandra,
                                          namespace=namespace,
                                          cassandra_keyspace=settings.cassandra_keyspace)
    finally:
        node.stop()


@pytest.mark.parametrize(("processes", "users"), [
    (1, ["SteadyUser", "LongHorizonUser"]),
    # steady users only: each worker gets two, so each has jobs that fire
    (2, ["SteadyUser"]),
])
async def test_a_short_headless_run_submits_fires_and_sums_up(
        stack, namespace, tmp_path: Path, processes: int, users: list[str]) -> None:
    # the cluster comes from the environment, as for every command
    async with served_namespace(stack, namespace, tmp_path) as (settings, node, env):
        csv = tmp_path / "run"
        code, out = await run_locust(
            LOCUSTFILE,
            ["--headless", "-u", "4", "-r", "4", "-t", "15s", "--cw-rate", "20",
             "--cw-lead-s", "1.5", "--csv", str(csv), "--only-summary",
             *(["--processes", str(processes)] if processes > 1 else []),
             *users], env, timeout_s=150)
        assert code == 0, out[-4000:]
        assert f"about to load namespace {namespace}; Kafka {stack.kafka}" in out
        summary = json.loads((tmp_path / "run_chronowheel.json").read_text())
        assert summary["processes"] == processes, summary
        assert len(set(summary["prefixes"])) == processes
        assert summary["submitted"] > 0 and summary["submit_failed"] == 0, summary
        assert summary["expected_fires"] > 0, summary
        # every steady job fired once, on time by the node's clock, none early or twice
        assert summary["received"] == summary["expected_fires"], summary
        assert (summary["missing"], summary["duplicates"], summary["early_fired"],
                summary["early_received"]) == (0, 0, 0, 0), summary
        assert summary["lateness_ms"]["received"]["n"] == summary["expected_fires"]
        assert summary["lateness_ms"]["cw_fired_at"]["n"] == summary["expected_fires"]
        offsets = summary["clock_offset_ms"]
        assert len(offsets["last"]) == processes and offsets["measurements"] >= processes
        # one machine: its clock and Cassandra's agree within the measurement's uncertainty
        assert max(-offsets["min"], offsets["max"]) <= offsets["uncertainty_max"] + 50, offsets
        assert "lateness, received" in out and "lateness, cw-fired-at" in out

        # Independently of the kit: the node applied every command it sent (upserts and
        # cancels) ...
        await until(lambda: metric_sum(node.metrics(), "chronowheel_ingested_total")
                    >= summary["submitted"], 60,
                    f"the node to apply the {summary['submitted']} commands the kit sent",
                    thread=True)
        # ... and <ns>.fired holds one occurrence per expected fire, from each process.
        fired = Collector(settings, (settings.fired_topic,), key_prefix=b"lc")
        await fired.start()
        try:
            await fired.read_to_end()
            by_prefix: dict[str, int] = {}
            for m in fired.messages:
                prefix = next(p for p in summary["prefixes"] if m.job_id.startswith(p))
                by_prefix[prefix] = by_prefix.get(prefix, 0) + 1
        finally:
            await fired.stop()
        assert len({m.occurrence for m in fired.messages}) == summary["expected_fires"]
        assert len(by_prefix) == processes, by_prefix
