"""The capacity test (loadtest/locust_capacity.py) run headless against the local stack with one
node: a few short steps, every kind of command in the mix, a rate ceiling so that it ends
quickly; it judges each step, reports the knee and appends it, with the cluster's size, to the
knees file that `chronowheel capacity --cluster` then reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chronowheel import cli

from testkit.locust import run_locust
from tests.integration.harness import REPO
from tests.integration.test_locust_kit import served_namespace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CAPACITY = REPO / "loadtest" / "locust_capacity.py"


async def test_a_short_ladder_writes_its_knee(stack, namespace, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    async with served_namespace(stack, namespace, tmp_path) as (_, _, env):
        knees = tmp_path / "knees.json"
        code, out = await run_locust(
            CAPACITY,
            ["--headless", "-u", "2", "--only-summary",
             "--cw-nodes", "1", "--cw-slo", "p99<2s", "--cw-steps", "20,40,80",
             "--cw-step-s", "4", "--cw-warmup-s", "2", "--cw-lead-s", "1.5",
             "--cw-grace-s", "2",
             "--cw-herd-every-s", "3", "--cw-mix", "steady=70,herd=10,horizon=15,cancel=5",
             "--cw-knee-file", str(knees), "--cw-max-runtime-s", "120"],
            env, timeout_s=200)
    assert code == 0, out[-4000:]
    assert "capacity: knee recorded in" in out, out[-4000:]
    doc = json.loads(knees.read_text())
    [rec] = doc["knees"]
    assert rec["cluster"] == {"nodes": 1, "shards": 4, "cassandra_nodes": 1,
                              "kafka_nodes": 1}, rec["cluster"]
    assert rec["namespace"] == namespace and rec["code"] and rec["measured_on"]
    assert "--cw-steps 20,40,80" in rec["command"]
    # every step held (a 2 s bound at these rates): the ceiling is a lower bound
    assert (rec["stopped_by"], rec["lower_bound"]) == ("ceiling", True), rec["reason"]
    assert [s["rate"] for s in rec["steps"]] == [20, 40, 80]
    # the warm-up ran at the first step's rate before it, judged apart, and is not a step
    warm = rec["warmup"]
    assert warm["step"] == -1 and warm["rate"] == 20 and warm["held"], warm
    assert warm["received"] == warm["expected_fires"] > 0 and warm["missing"] == 0, warm
    assert "warm-up (lateness not judged) (20 commands/s" in out
    for s in rec["steps"]:
        assert s["held"] and s["received"] == s["expected_fires"] > 0, s
        assert (s["missing"], s["early"], s["duplicates"]) == (0, 0, 0), s
    knee = rec["knee"]
    assert knee["step"] == 2 and knee["fires_per_s"] == 64  # 80/s, 80 % of it fires
    for measure in ("received", "cw_fired_at"):
        assert knee["lateness_ms"][measure]["n"] == knee["expected_fires"]
        assert knee["lateness_ms"][measure]["p99"] <= 2000
    assert "capacity: knee (a lower bound): step 2, 80 commands/s" in out
    # the kit's summary is still there, and `chronowheel capacity` takes the knee
    assert "chronowheel summary: " in out
    capsys.readouterr()
    assert cli.main(["capacity", "--jobs-per-day", "1e6", "--knees", str(knees),
                     "--cluster", "nodes=1,shards=4,cassandra=1,kafka=1"]) == 0
    text = capsys.readouterr().out
    assert "64 fires/s" in text.splitlines()[0]
    assert "fires/s per node from the measured knee of 1 node(s), 4 shards" in text
