"""The locust kit (loadtest/locustfile.py) run headless against the local stack at a small size,
in one process and distributed over two (`--processes 2`): its jobs reach the node and fire,
and its summary adds up the processes' figures."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from chronowheel.testing import Collector, metric_sum

from tests.integration.harness import REPO, NodeProcess, make_namespace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOCUSTFILE = REPO / "loadtest" / "locustfile.py"


async def _locust(args: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args, env=env, cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        raise AssertionError(f"locust did not finish within {timeout_s}s:\n"
                             f"{out.decode(errors='replace')[-4000:]}") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.parametrize(("processes", "users"), [
    (1, ["SteadyUser", "LongHorizonUser"]),
    # steady users only: each worker gets two, so each has jobs that fire
    (2, ["SteadyUser"]),
])
async def test_a_short_headless_run_submits_fires_and_sums_up(
        stack, namespace, tmp_path: Path, processes: int, users: list[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=4)
    node = NodeProcess(settings, "node", tmp_path)
    node.start()
    try:
        await node.wait_ready()
        # the cluster comes from the environment, as for every command
        env = {**os.environ, "CHRONOWHEEL_KAFKA": stack.kafka,
               "CHRONOWHEEL_CASSANDRA": stack.cassandra, "CHRONOWHEEL_NAMESPACE": namespace}
        env.pop("CHRONOWHEEL_LOADTEST_ALLOW_REMOTE", None)
        csv = tmp_path / "run"
        code, out = await _locust(
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
        deadline = time.monotonic() + 60
        while (applied := metric_sum(node.metrics(), "chronowheel_ingested_total")) \
                < summary["submitted"]:
            assert time.monotonic() < deadline, (applied, summary["submitted"])
            await asyncio.sleep(0.2)
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
    finally:
        node.stop()
