"""`scale_bench.py --record-storage`: per-row disk from a run's end, the compaction peak from
its samples, the median ingest rate; measured.json keeps its other figures and loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chronowheel.cli.capacity import load_measured

from tests.unit.loadtest_modules import BENCH, load

MIB = 2**20


@pytest.fixture(scope="module")
def scale_bench() -> Any:
    return load("scale_bench", BENCH)


def _run(**fire: int) -> dict[str, Any]:
    return {
        "namespace": "scale1", "jobs": 1_000_000, "shards": 16,
        "started": "2026-12-04T12:25:00+00:00", "machine": "2 CPUs",
        "per_million": [{"jobs_per_s": 2000, "commands_per_s": 2200}],
        "fire": {"occurrences": 100_000, "lost": 0, "duplicates": 0, "early": 0, **fire},
        # 100 s apart: the 16 probes wrote 1,600 due rows meanwhile
        "samples": [{"t": 1000, "dir_bytes": 50 * MIB, "live_mib": 10},  # too small to count
                    {"t": 1050, "dir_bytes": 260 * MIB, "live_mib": 200},
                    {"t": 1100, "dir_bytes": 330 * MIB, "live_mib": 300}],
        "cassandra_end": {"disk_mib": {"jobs": 110, "due": 90, "due_retired": 3,
                                       "bucket_counts": 11}},
    }


def test_storage_figures_divide_each_table_by_the_rows_the_workload_stored(
        scale_bench: Any) -> None:
    f = scale_bench.storage_figures(_run())
    jobs = 1_000_000 + 100_000 + 16
    due = 1_000_000 + 50_000 + 100_000 + 16 * 100   # moved jobs keep their old row
    assert f["rows"] == {"jobs": jobs, "due": due, "due_retired": 100_000}
    assert f["jobs_row_bytes"] == round(110 * MIB / jobs, 1)
    assert f["due_row_bytes"] == round(90 * MIB / due, 1)
    assert f["retired_row_bytes"] == round(3 * MIB / 100_000, 1)
    assert f["compaction_peak_ratio"] == 1.3     # 260/200; 50/10 is below the floor
    assert f["ingest_long_horizon_jobs_per_s_per_node"] == 2200  # commands, as capacity counts
    assert f["id_bytes"] == len("scale1.000000000")


def test_record_storage_keeps_the_other_figures_and_capacity_reads_them(
        scale_bench: Any, tmp_path: Path) -> None:
    paths = (tmp_path / "a.json", tmp_path / "b.json")
    base = {"fires_per_s_per_node": 4000, "ingest_jobs_per_s_per_node": 7500,
            "wheel_bytes_per_entry": 346, "measured_on": "then", "command": "run_bench.py"}
    for p in paths:
        p.write_text(json.dumps(base))
    said = scale_bench.record_storage({**_run(), "command": "scale_bench.py --jobs 1000000"},
                                      "scale_bench.py --record-storage-from run.json", paths)
    assert "1,100,016 jobs" in said
    docs = [json.loads(p.read_text()) for p in paths]
    assert docs[0] == docs[1]
    assert {k: docs[0][k] for k in base} == base
    storage = load_measured(paths[0]).storage
    # The run's own command, not the one that recorded it afterwards.
    assert storage is not None and storage.command == "scale_bench.py --jobs 1000000"
    assert storage.compaction_peak_ratio == 1.3


def test_a_run_that_lost_or_duplicated_records_nothing(scale_bench: Any,
                                                       tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{}")
    said = scale_bench.record_storage(_run(lost=1), "x", (path,))
    assert "nothing recorded" in said and path.read_text() == "{}"


def test_a_run_without_ingest_or_with_an_unreadable_table_records_nothing(
        scale_bench: Any, tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{}")
    said = scale_bench.record_storage({**_run(), "per_million": []}, "x", (path,))
    assert "phases-only" in said and "nothing recorded" in said
    no_retired = _run()
    no_retired["cassandra_end"]["disk_mib"]["due_retired"] = 0  # rounded down: too small
    said = scale_bench.record_storage(no_retired, "x", (path,))
    assert "storage.retired_row_bytes must be a positive number" in said
    assert path.read_text() == "{}"


def test_without_the_data_directory_the_compaction_peak_is_not_guessed(
        scale_bench: Any) -> None:
    run = _run()
    for sample in run["samples"]:
        sample["dir_bytes"] = None
    assert scale_bench.storage_figures(run)["compaction_peak_ratio"] is None
