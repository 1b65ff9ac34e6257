"""The capacity model: formulas on hand-checkable inputs, invariants, the measured file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from chronowheel import cli
from chronowheel.cli import capacity
from chronowheel.cli.capacity import (
    BUCKET_COUNT_ROW_BYTES,
    DUE_ROW_FIXED_BYTES,
    MEASURED_KEYS,
    MEASURED_RELATIVE,
    PACKAGED_SOURCE,
    Measured,
    Storage,
    Workload,
    find_measured,
    load_measured,
    packaged_measured,
    plan,
    size,
)
from chronowheel.errors import ConfigError, ValidationError

REPO = Path(__file__).resolve().parents[2]
M = Measured(fires_per_s_per_node=10_000, ingest_jobs_per_s_per_node=1_000,
             wheel_bytes_per_entry=1_000, measured_on="test", command="test", source="test")


def test_registered() -> None:
    assert "chronowheel.cli.capacity" in cli.COMMAND_MODULES


def test_rates_and_demand() -> None:
    p = plan(Workload(jobs_per_day=86_400_000, peak_factor=10), M)  # 1000/s average
    r = p["rates"]
    assert (r["avg_fire_per_s"], r["peak_fire_per_s"]) == (1000, 10_000)
    assert (r["avg_submit_per_s"], r["peak_submit_per_s"]) == (1000, 1000)
    # 10,000 fires/s = 1 node at full measured speed, 1,000 submits/s = 1 more
    assert p["scheduler"]["demand_node_equivalents"] == pytest.approx(2.0)


def test_node_count_is_the_smallest_meeting_both_utilization_rules() -> None:
    w = Workload(jobs_per_day=86_400_000, peak_factor=10, utilization=0.5)
    s = plan(w, M)["scheduler"]
    shards, nodes, per_shard = s["shards"], s["nodes"], s["per_shard_node_fraction"]
    assert per_shard == pytest.approx(2.0 / shards)

    def fits(n: int) -> bool:
        return (math.ceil(shards / n) * per_shard <= 0.5
                and math.ceil(shards / (n - 1)) * per_shard <= 1.0)

    assert fits(nodes) and not fits(nodes - 1)
    assert s["busiest_node_utilization"] <= 0.5
    assert s["busiest_node_utilization_one_down"] <= 1.0


def test_shards_are_a_power_of_two_with_four_per_node_at_growth() -> None:
    s = plan(Workload(jobs_per_day=86_400_000, peak_factor=10, growth=3), M)["scheduler"]
    # demand 2 x growth 3 / utilization 0.5 = 12 nodes at growth -> 48 shards -> 64
    assert s["shards"] == 64
    small = plan(Workload(jobs_per_day=1000), M)["scheduler"]
    assert small["shards"] == 16 and small["nodes"] == 2  # floors: 16 shards, two nodes


def test_an_impossible_shard_is_refused() -> None:
    slow = Measured(1, 1, 1000, "t", "t", "t")
    with pytest.raises(ConfigError, match="cannot be placed"):
        plan(Workload(jobs_per_day=1e12), slow)


def test_memory_per_node() -> None:
    # 1000/s average, x10 for one minute; 16 shards; lookahead 120 s
    w = Workload(jobs_per_day=86_400_000, peak_factor=10, payload_bytes=200,
                 headers_bytes=50, hot_bucket_rows=100_000)
    p = plan(w, M)
    mem, shards = p["memory"], p["scheduler"]["shards"]
    assert mem["avg_rows_per_bucket"] == pytest.approx(60_000 / shards)
    assert not mem["ordinary_buckets_hot"] and mem["wheel_window_s"] == 120
    expected_entries = (1000 * 120 + 9000 * 60) / shards
    assert mem["entries_per_shard"] == pytest.approx(expected_entries)
    assert mem["bytes_per_entry"] == 1000 + 200 + 50
    assert mem["wheel_bytes_per_node"] == pytest.approx(
        expected_entries * mem["shards_per_node"] * 1250)
    assert mem["wheel_bytes_per_node_one_down"] >= mem["wheel_bytes_per_node"]


def test_busy_ordinary_buckets_are_flagged_and_a_threshold_recommended() -> None:
    w = Workload(jobs_per_day=86_400_000, peak_factor=10, hot_bucket_rows=100)
    mem = plan(w, M)["memory"]
    assert mem["ordinary_buckets_hot"] and mem["wheel_window_s"] == w.prewarm_s
    assert mem["recommended_hot_bucket_rows"] == math.ceil(2 * mem["avg_rows_per_bucket"])


def test_cassandra_rows_follow_littles_law_and_the_ttl() -> None:
    w = Workload(jobs_per_day=86_400, horizon_s=7 * 86_400, retention_s=86_400,
                 payload_bytes=100, headers_bytes=0, id_bytes=10, replication=3,
                 compression=0.5, disk_headroom=2)
    c = plan(w, M)["cassandra"]
    assert c["pending_due_rows"] == pytest.approx(7 * 86_400)   # 1/s x 7 days
    assert c["retained_fired_rows"] == pytest.approx(86_400)    # 1/s x 1 day
    assert c["jobs_rows"] == pytest.approx(8 * 86_400)          # horizon + retention
    # Without measured storage figures, a row is its fixed overhead and fields, compressed.
    assert c["due_row_bytes"] == (DUE_ROW_FIXED_BYTES + 10 + 100) * 0.5
    assert c["bytes_one_replica"] == pytest.approx(
        8 * 86_400 * c["due_row_bytes"] + 8 * 86_400 * c["job_row_bytes"]
        + c["bucket_count_rows_per_year"] * BUCKET_COUNT_ROW_BYTES)
    assert c["bytes_on_disk_replicated"] == pytest.approx(c["bytes_one_replica"] * 3)
    assert c["bytes_per_stored_job"] == pytest.approx(c["bytes_one_replica"] / (8 * 86_400))
    assert c["bytes_provisioned"] == pytest.approx(c["bytes_on_disk_replicated"] * 2)
    assert c["writes_per_s_peak"] == pytest.approx(3.0)          # 3 writes per submit
    assert c["nodes"] == 3                                       # never below replication


def test_kafka_partitions_and_disk() -> None:
    w = Workload(jobs_per_day=86_400, replication=2, kafka_retention_s=3 * 86_400)
    p = plan(w, M)
    k, shards = p["kafka"], p["scheduler"]["shards"]
    assert k["partitions"] == 3 * shards + 2
    assert k["partition_replicas"] == 2 * k["partitions"]
    per_day = 86_400 * (k["submit_record_bytes"] + k["fired_record_bytes"])
    assert k["bytes_per_day"] == pytest.approx(per_day)
    assert k["bytes_on_disk_replicated"] == pytest.approx(per_day * 3 * 2)


@pytest.mark.parametrize(("field", "value"), [
    ("jobs_per_day", 0), ("peak_factor", 0.5), ("utilization", 1.5), ("replication", 0)])
def test_bad_inputs(field: str, value: float) -> None:
    args: dict[str, Any] = {"jobs_per_day": 1000, field: value}
    with pytest.raises(ValidationError):
        plan(Workload(**args), M)


def test_size() -> None:
    assert size(512) == "512 B"
    assert size(1536) == "1.5 KiB"
    assert size(3 << 40) == "3.0 TiB"


def write_measured(path: Path, **override: Any) -> Path:
    doc = {"fires_per_s_per_node": 10_000, "ingest_jobs_per_s_per_node": 1_000,
           "wheel_bytes_per_entry": 1_000, "measured_on": "here", "command": "x"}
    doc.update(override)
    path.write_bytes(orjson.dumps(doc))
    return path


def test_load_measured(tmp_path: Path) -> None:
    m = load_measured(write_measured(tmp_path / "m.json"))
    assert (m.fires_per_s_per_node, m.wheel_bytes_per_entry) == (10_000, 1_000)
    for key in MEASURED_KEYS:
        with pytest.raises(ConfigError, match=key):
            load_measured(write_measured(tmp_path / "bad.json", **{key: 0}))
    with pytest.raises(ConfigError, match="cannot read"):
        load_measured(tmp_path / "missing.json")


def test_memory_per_entry_may_come_from_a_run_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = load_measured(write_measured(tmp_path / "same.json"))
    assert (same.wheel_bytes_measured_on, same.wheel_bytes_command) == ("here", "x")
    path = write_measured(tmp_path / "own.json", wheel_bytes_measured_on="later",
                          wheel_bytes_command="run_bench.py --herd 1000000 --record-memory")
    own = load_measured(path)
    assert (own.measured_on, own.wheel_bytes_measured_on) == ("here", "later")
    argv = ["capacity", "--jobs-per-day", "1e9", "--measured", str(path)]
    assert cli.main(argv) == 0
    assert ("bytes per wheel entry measured on later: run_bench.py --herd 1000000 "
            "--record-memory") in capsys.readouterr().out
    assert cli.main(["capacity", "--jobs-per-day", "1e9", "--measured",
                     str(tmp_path / "same.json")]) == 0
    assert "bytes per wheel entry measured on" not in capsys.readouterr().out


def test_the_repository_has_a_measured_file_with_the_keys() -> None:
    m = load_measured(find_measured(None))
    assert m.measured_on and m.command
    assert m.source == PACKAGED_SOURCE


def test_the_package_ships_the_benchmarks_measured_figures_unchanged() -> None:
    """The default figures are package data (an installed wheel has no loadtest/ folder), a
    copy of what the benchmark last wrote: after a benchmark run, copy the file over."""
    shipped = packaged_measured()
    assert shipped.parent == Path(capacity.__file__).parent
    assert find_measured(None) == shipped
    assert shipped.read_bytes() == (REPO / MEASURED_RELATIVE).read_bytes(), (
        f"{shipped} differs from {MEASURED_RELATIVE}: "
        f"cp {MEASURED_RELATIVE} {shipped.relative_to(REPO)}")


def test_a_missing_file_is_named_with_where_figures_come_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read measured figures .*missing\.json.*"
                                          r"shipped with the package"):
        load_measured(tmp_path / "missing.json")


def test_cli_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_measured(tmp_path / "m.json")
    argv = ["capacity", "--jobs-per-day", "1e9", "--peak-factor", "20", "--horizon", "7d",
            "--payload-bytes", "512", "--replication", "3", "--measured", str(path)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "1,000,000,000" in text and "231,481/s peak" in text
    assert cli.main([*argv, "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["rates"]["peak_fire_per_s"] == pytest.approx(1e9 / 86_400 * 20)
    assert doc["measured"]["source"] == str(path)
    assert f"nodes                        {doc['scheduler']['nodes']} " in text


def test_a_host_of_several_nodes_fails_as_a_whole() -> None:
    w = Workload(jobs_per_day=86_400_000, peak_factor=10, nodes_per_host=4)
    s = plan(w, M)["scheduler"]
    shards, nodes, per_shard = s["shards"], s["nodes"], s["per_shard_node_fraction"]
    assert math.ceil(shards / (nodes - 4)) * per_shard <= 1.0
    assert s["busiest_node_utilization_one_down"] == pytest.approx(
        math.ceil(shards / (nodes - 4)) * per_shard)
    assert nodes >= 5
    assert plan(Workload(jobs_per_day=1000, nodes_per_host=4), M)["scheduler"]["nodes"] == 5


ST = Storage(jobs_stored=10_000_000, jobs_row_bytes=150, due_row_bytes=80, retired_row_bytes=30,
             payload_bytes=70, id_bytes=25, compaction_peak_ratio=1.4,
             ingest_long_horizon_jobs_per_s_per_node=500, measured_on="then", command="scale")
MS = Measured(10_000, 1_000, 1_000, "test", "test", "test", storage=ST)


def test_measured_row_sizes_add_only_what_the_workload_stores_beyond_the_run() -> None:
    big = Workload(jobs_per_day=86_400, payload_bytes=170, headers_bytes=20, id_bytes=35,
                   compression=0.5)
    c = plan(big, MS)["cassandra"]
    extra, extra_id = (170 + 20 - 70) * 0.5, (35 - 25) * 0.5
    assert c["due_row_bytes"] == 80 + extra + extra_id
    assert c["job_row_bytes"] == 150 + extra + 2 * extra_id
    assert c["due_retired_row_bytes"] == 30 + extra_id
    small = plan(Workload(jobs_per_day=86_400, payload_bytes=10, headers_bytes=0,
                          id_bytes=8), MS)["cassandra"]
    assert (small["due_row_bytes"], small["job_row_bytes"]) == (80, 150)  # never less
    assert "measured with 10,000,000 jobs stored" in small["row_sizes_source"]


def test_changed_occurrences_keep_their_due_row_and_add_a_retired_one() -> None:
    w = Workload(jobs_per_day=86_400, horizon_s=10 * 86_400, retention_s=86_400,
                 changed_share=0.1, payload_bytes=70, headers_bytes=0, id_bytes=25)
    c = plan(w, MS)["cassandra"]
    pending, retained, jobs = 10 * 86_400, 86_400, 11 * 86_400
    # each kept until the changed occurrence's own TTL: up to horizon + retention
    changed = 0.1 * (pending + retained)
    assert c["due_retired_rows"] == pytest.approx(changed)
    assert c["bytes_one_replica"] == pytest.approx(
        (pending + retained + changed) * 80 + changed * 30 + jobs * 150
        + c["bucket_count_rows_per_year"] * BUCKET_COUNT_ROW_BYTES)
    unchanged = plan(Workload(jobs_per_day=86_400, horizon_s=10 * 86_400,
                              retention_s=86_400, payload_bytes=70, headers_bytes=0,
                              id_bytes=25), MS)["cassandra"]
    assert unchanged["due_retired_rows"] == 0
    assert c["bytes_per_stored_job"] > unchanged["bytes_per_stored_job"]
    with pytest.raises(ValidationError, match="changed-share"):
        plan(Workload(jobs_per_day=1000, changed_share=1.5), MS)


def test_long_horizons_plan_with_the_long_horizon_ingest_rate() -> None:
    far = plan(Workload(jobs_per_day=86_400_000, horizon_s=7 * 86_400), MS)["scheduler"]
    assert far["ingest_jobs_per_s_per_node"] == 500
    assert "long-horizon run" in far["ingest_source"]
    near = plan(Workload(jobs_per_day=86_400_000, horizon_s=600), MS)["scheduler"]
    assert near["ingest_jobs_per_s_per_node"] == 1_000
    # 1,000 fires/s of 10,000 per node + 1,000 submits/s of 500 (far) or 1,000 (near)
    assert far["demand_node_equivalents"] == pytest.approx(0.1 + 2.0)
    assert near["demand_node_equivalents"] == pytest.approx(0.1 + 1.0)
    assert plan(Workload(jobs_per_day=86_400_000, horizon_s=7 * 86_400),
                M)["scheduler"]["ingest_jobs_per_s_per_node"] == 1_000  # none measured


def test_storage_figures_are_read_checked_and_shown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {k: v for k, v in ST.__dict__.items()}
    path = write_measured(tmp_path / "m.json", storage=doc)
    assert load_measured(path).storage == ST
    for key in ("due_row_bytes", "compaction_peak_ratio",
                "ingest_long_horizon_jobs_per_s_per_node"):
        with pytest.raises(ConfigError, match=f"storage.{key} must be a positive number"):
            load_measured(write_measured(tmp_path / "bad.json", storage={**doc, key: 0}))
    unmeasured = write_measured(tmp_path / "nopeak.json",
                                storage={**doc, "compaction_peak_ratio": None})
    m = load_measured(unmeasured)
    assert m.storage is not None and m.storage.compaction_peak_ratio is None
    c = plan(Workload(jobs_per_day=1e6, disk_headroom=1.01), m)["cassandra"]
    assert not c["headroom_below_compaction_peak"]
    argv = ["capacity", "--jobs-per-day", "1e8", "--horizon", "30d", "--measured", str(path)]
    assert cli.main([*argv, "--disk-headroom", "1.2"]) == 0
    text = capsys.readouterr().out
    assert "ingested jobs/s per node from the long-horizon run" in text
    assert "peaked at x1.40 of its live sstables: --disk-headroom 1.2 is below that" in text
    assert "disk per stored job" in text and "with 3 replicas" in text
    assert cli.main(argv) == 0
    assert "is below that" not in capsys.readouterr().out
