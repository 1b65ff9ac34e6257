"""`run_bench.py --record-memory`: only the memory figure of measured.json changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.loadtest_modules import BENCH, load


@pytest.fixture(scope="module")
def report() -> Any:
    return load("report", BENCH)


MEASURED = {"fires_per_s_per_node": 4000, "ingest_jobs_per_s_per_node": 7532.8,
            "wheel_bytes_per_entry": 681.2, "measured_on": "2026-12-01T07:12:14+00:00",
            "command": "run_bench.py --preset quick"}
CLEAN = {"missing": 0, "duplicates": 0, "early_fired_at": 0, "early_received": 0}


def _run(per_entry: float | None, **checks: int) -> dict[str, Any]:
    return {"herd": {"jobs": 1_000_000, "wheel_bytes_per_entry": per_entry},
            "checks": {**CLEAN, **checks}, "started": "2026-12-02T06:08:00+00:00",
            "command": "run_bench.py --herd 1000000 --record-memory",
            "machine": {"nproc": 2, "cpu": "x", "memory_gib": 23.5, "os": "Linux",
                        "python": "3.11", "java": "17", "kafka": "4.4.0",
                        "cassandra": "5.0.9", "code": "abc1234",
                        "loadavg_start": (1.0, 1.0, 1.0), "loadavg_end": (2.0, 2.0, 2.0)}}


def test_the_memory_figure_and_its_provenance_replace_only_their_own_keys(
        report: Any, tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(MEASURED))
    said = report.record_memory(_run(371.6), path)
    doc = json.loads(path.read_text())
    assert doc["wheel_bytes_per_entry"] == 372
    assert doc["wheel_bytes_herd_jobs"] == 1_000_000
    assert doc["wheel_bytes_measured_on"] == "2026-12-02T06:08:00+00:00"
    assert doc["wheel_bytes_command"] == "run_bench.py --herd 1000000 --record-memory"
    assert {k: doc[k] for k in MEASURED if k != "wheel_bytes_per_entry"} == \
        {k: v for k, v in MEASURED.items() if k != "wheel_bytes_per_entry"}
    assert "wheel_bytes_per_entry 372" in said


@pytest.mark.parametrize(("per_entry", "checks", "why"), [
    (None, {}, "not all loaded"),
    (371.6, {"early_received": 1}, "failed its checks"),
])
def test_a_run_without_a_sound_figure_leaves_the_file_alone(
        report: Any, tmp_path: Path, per_entry: float | None, checks: dict[str, int],
        why: str) -> None:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(MEASURED))
    assert why in report.record_memory(_run(per_entry, **checks), path)
    assert json.loads(path.read_text()) == MEASURED
