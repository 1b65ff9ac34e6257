"""chronowheel.testing without servers: the lateness tally, message decoding, metrics parsing."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from chronowheel.settings import Settings
from chronowheel.testing import (
    Fired,
    LatenessTally,
    NodeProcess,
    metric_sum,
    parse_metrics,
    percentile,
)
from chronowheel.testing.node_process import PORT_MARKER


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([7.0], 99) == 7
    assert percentile([], 50) is None


def test_tally_counts_duplicates_once_and_early_on_every_delivery() -> None:
    t = LatenessTally()
    assert t.observe("a@1000", 1000, 1012.5, fired_ms=1004)
    assert t.observe("b@2000", 2000, 2030, fired_ms=2010, group="herd")
    assert not t.observe("a@1000", 1000, 1500, fired_ms=1004)  # a duplicate, not measured
    assert not t.observe("b@2000", 2000, 1999, fired_ms=2010, group="herd")  # early duplicate
    assert t.observe("c@3000", 3000, 3001, fired_ms=2999)  # stamped before it was due
    assert t.deliveries == 5 and t.distinct == 3 and t.duplicates == 2
    assert t.early_observed == 1 and t.early_fired == 1 and t.early == 2
    assert t.lateness_ms("") == [12.5, 1]
    assert t.lateness_ms("herd") == [30]
    assert sorted(t.lateness_ms()) == [1, 12.5, 30]
    herd = t.group("herd")
    assert herd.count == 1 and herd.fired_lateness_ms == [10.0]
    assert herd.last_observed_ms == 2030 and herd.last_fired_ms == 2010
    assert t.count("nothing") == 0 and t.group("nothing").count == 0
    assert t.missing(["c@3000", "d@4000", "a@1000", "e@5000"]) == ["d@4000", "e@5000"]
    s = t.summary()
    assert s == {"n": 3, "p50": 12.5, "p95": 30.0, "p99": 30.0, "max": 30}


def test_tally_without_a_fired_stamp_measures_only_the_observation() -> None:
    t = LatenessTally()
    t.observe("h@10", 10, 25)  # e.g. a handler start
    assert t.group().fired_lateness_ms == [] and t.group().last_fired_ms is None
    assert t.percentile(50) == 15


def record(topic: str, partition: int, offset: int, timestamp: int, key: bytes | None,
           value: bytes | None, headers: list[tuple[str, bytes]]) -> Any:
    """A fetched record as the Kafka client gives it (the fields Fired reads)."""
    return SimpleNamespace(topic=topic, partition=partition, offset=offset, timestamp=timestamp,
                           key=key, value=value, headers=headers)


def test_fired_decodes_the_headers_of_a_record() -> None:
    fetched = record("ns.fired", 3, 41, 1_700_000_000_123, b"job-1", b'{"x":1}', [
        ("cw-job-id", b"job-1"), ("cw-scheduled-at", b"1700000000000"),
        ("cw-fired-at", b"1700000000100"), ("cw-occurrence", b"job-1@1700000000000")])
    f = Fired.from_record(fetched, 1_700_000_000_150.5)
    assert (f.topic, f.partition, f.offset, f.key, f.value) == (
        "ns.fired", 3, 41, b"job-1", b'{"x":1}')
    assert f.job_id == "job-1" and f.occurrence == "job-1@1700000000000"
    assert f.scheduled_ms == 1_700_000_000_000 and f.fired_ms == 1_700_000_000_100
    assert f.received_ms == 1_700_000_000_150.5 and f.timestamp_ms == 1_700_000_000_123


def test_fired_of_a_message_without_cw_headers_fails_only_when_asked() -> None:
    f = Fired.from_record(record("ns.rejected", 0, 0, 0, None, None, []), 1.0)
    assert f.value == b"" and f.headers == {}
    with pytest.raises(KeyError):
        _ = f.occurrence


def test_metrics_are_parsed_by_name_and_labels() -> None:
    text = "\n".join([
        "# HELP chronowheel_fired_total occurrences published",
        "# TYPE chronowheel_fired_total counter",
        'chronowheel_fired_total{shard="0"} 5.0',
        'chronowheel_fired_total{shard="1"} 7.0',
        'chronowheel_lateness_seconds_bucket{le="+Inf"} 12.0',
        "chronowheel_wheel_entries 3e3",
        "",
        "garbage line",
    ])
    m = parse_metrics(text)
    assert m['chronowheel_fired_total{shard="1"}'] == 7.0
    assert metric_sum(m, "chronowheel_fired_total") == 12.0
    assert metric_sum(m, "chronowheel_wheel_entries") == 3000.0
    assert metric_sum(m, "chronowheel_lateness_seconds") == 0.0  # only _bucket samples
    assert "garbage" not in " ".join(m)


def test_node_process_reads_only_its_own_run_of_an_appended_log(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(f"old run\n{PORT_MARKER}1111\n")
    # `chronowheel --help` stands for a node: same environment, log and stop.
    proc = NodeProcess(Settings(namespace="unit"), log, name="a", args=("--help",))
    proc.start()
    assert proc.wait(60) == 0
    assert not proc.alive()
    assert "usage" in proc.log_text() and proc.log_text().startswith("old run")
    assert proc.http_port() is None  # the old run's port is not this run's
    with log.open("a") as f:
        f.write(f"... INFO chronowheel.node.http {PORT_MARKER}2222\n")
    assert proc.http_port() == 2222
    assert proc.stop() == 0  # already exited: its code


def test_stop_after_a_sigterm_sends_no_second_one(tmp_path: Path) -> None:
    """A node takes a second SIGTERM as "abort now": `stop` after `signal(SIGTERM)` (a test
    that stops a node and then waits with `stop`) must not turn the graceful stop into one."""
    script = tmp_path / "graceful.py"
    script.write_text(
        "import signal, sys, time\n"
        "seen = []\n"
        "def on_term(*_):\n"
        "    seen.append(1)\n"
        "    if len(seen) > 1:\n"
        "        sys.exit(3)  # the second signal: abort\n"
        "    print('stopping', flush=True)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "while not seen:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(0.3)  # a graceful stop takes a moment\n"
        "sys.exit(0)\n")
    proc = NodeProcess(Settings(namespace="unit"), tmp_path / "g.log", name="g")
    proc.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert proc.proc.stdout is not None and proc.proc.stdout.readline() == b"ready\n"
    proc.signal(signal.SIGTERM)
    assert proc.proc.stdout.readline() == b"stopping\n"  # the first SIGTERM was taken
    assert proc.stop(30) == 0
