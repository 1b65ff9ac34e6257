"""What the store sends Cassandra and what it makes of Cassandra's warnings (issue 26): bucket
counts go one request per partition, never a counter batch across partitions; bulk writes are
bounded in flight; the server's warnings are counted by kind and logged once per kind per
interval, the driver's own line per warning muted. And the node's ingest, on the in-memory
store, builds no logged batch over Cassandra's batch_size_warn_threshold for jobs of ordinary
sizes, while every minute's bucket count stays exact."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest
from chronowheel.store import cassandra
from chronowheel.store.cassandra import HOUR_MS, _bounded, _settle, counts_by_partition
from chronowheel.store.memory import MemoryStore
from chronowheel.store.server_warnings import (
    DRIVER_LINE,
    OTHER,
    ServerWarnings,
    kind_of,
    mute_driver_lines,
)
from prometheus_client import CollectorRegistry, generate_latest

from tests.unit.node_rig import T0, NodeRig

# --- bucket counts: one request per partition -----------------------------------------------


def test_bucket_counts_are_grouped_per_partition_shard_and_hour() -> None:
    h0 = T0 - T0 % HOUR_MS
    counts = {h0 + 60_000: 3, h0 + 120_000: 1, h0 + HOUR_MS: 2, h0 + 5 * HOUR_MS + 60_000: 1,
              h0 + 180_000: 0}
    groups = counts_by_partition(7, counts)
    assert groups == [
        [(3, 7, h0, h0 + 60_000), (1, 7, h0, h0 + 120_000)],
        [(2, 7, h0 + HOUR_MS, h0 + HOUR_MS)],
        [(1, 7, h0 + 5 * HOUR_MS, h0 + 5 * HOUR_MS + 60_000)],
    ]
    # every update of a group is in the group's partition; nothing with nothing to add
    for group in groups:
        assert len({(shard, hour) for _, shard, hour, _ in group}) == 1
        assert all(minute - minute % HOUR_MS == hour for _, _, hour, minute in group)


async def test_bounded_writes_keep_at_most_the_limit_in_flight() -> None:
    in_flight = peak = done = 0

    async def write() -> None:
        nonlocal in_flight, peak, done
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        done += 1

    await _bounded((write() for _ in range(200)), limit=8)
    assert done == 200 and peak == 8


async def test_bounded_writes_stop_starting_writes_after_a_failure() -> None:
    started = 0

    async def write(i: int) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(0)
        if i == 3:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        await _bounded((write(i) for i in range(100)), limit=4)
    assert started < 100  # the rest were closed, not run (and no "never awaited" warning)


# --- server warnings ----------------------------------------------------------------------

WARNINGS = {
    "Unlogged batch covering 48 partitions detected against table [ns.bucket_counts]. You "
    "should use a logged batch for atomicity, or asynchronous writes for performance.":
        "unlogged_batch",
    "Batch for [ns.bucket_counts] is of size 5642, exceeding specified threshold of 5120 by "
    "522.": "batch_size",
    "Read 1000 live rows and 1500 tombstone cells for query SELECT * FROM ns.due WHERE ...":
        "tombstones",
    "Aggregation query used without partition key": "aggregation",
    "Guardrail partition_keys_in_select violated: 150 > 100": "guardrail",
    "Something new": OTHER,
}


@pytest.mark.parametrize(("message", "kind"), WARNINGS.items())
def test_a_warning_gets_one_of_a_few_kinds(message: str, kind: str) -> None:
    assert kind_of(message) == kind


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_warnings_are_counted_all_and_logged_once_per_kind_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logger = logging.getLogger("test.server_warnings")
    warnings = ServerWarnings(interval_s=60, clock=clock, logger=logger)
    unlogged, size = list(WARNINGS)[:2]
    with caplog.at_level(logging.WARNING, logger="test.server_warnings"):
        for _ in range(100):
            warnings.note([unlogged, size], "count 50 buckets")
            clock.now += 0.1  # 10 s in all: within the interval
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [
            "Cassandra warned (unlogged_batch) on count 50 buckets",
            "Cassandra warned (batch_size) on count 50 buckets"]
        caplog.clear()
        clock.now += 60
        warnings.note([unlogged], "count 50 buckets")
        (line,) = caplog.records
        assert "99 more of this kind since the last such line" in line.getMessage()
        assert "48 partitions" in line.getMessage()
    assert warnings.counts == {"unlogged_batch": 101, "batch_size": 100}
    assert warnings.total == 201
    assert warnings.latest()["batch_size"] == size

    registry = CollectorRegistry()
    registry.register(warnings)
    assert registry.get_sample_value("chronowheel_store_server_warnings_total",
                                     {"kind": "unlogged_batch"}) == 101
    assert b'chronowheel_store_server_warnings_total{kind="batch_size"} 100.0' \
        in generate_latest(registry)
    assert registry.get_sample_value("chronowheel_store_server_warnings_total",
                                     {"kind": "tombstones"}) == 0  # every kind, from the start


def test_the_drivers_own_line_per_warning_is_muted_and_nothing_else() -> None:
    mute_driver_lines()
    mute_driver_lines()  # idempotent
    logger = logging.getLogger("cassandra.protocol")
    assert len([f for f in logger.filters if type(f).__name__ == "_MuteDriverLine"]) == 1

    def record(msg: str) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, ("x",), None)

    assert not logger.filter(record(DRIVER_LINE))
    assert logger.filter(record("Unknown protocol flags set: %s. May cause problems."))


class FakeResponse:
    """A finished ResponseFuture as the driver hands it to the store's callbacks (the rows
    themselves are handed to the callback)."""

    def __init__(self, warnings: list[str] | None) -> None:
        self._warnings = warnings
        self._col_names = ["id"]
        self._col_types = None
        self._paging_state = None
        self.has_more_pages = False
        self._timer: Any = object()

    def clear_callbacks(self) -> None:
        pass


async def test_each_answer_s_warnings_are_noted_when_it_is_settled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    warnings = ServerWarnings(logger=logging.getLogger("test.server_warnings"))
    monkeypatch.setattr(cassandra, "SERVER_WARNINGS", warnings)
    loop = asyncio.get_running_loop()
    quiet, warned = loop.create_future(), loop.create_future()
    _settle(quiet, FakeResponse(None), [("a",)], None, "read jobs")
    _settle(warned, FakeResponse([list(WARNINGS)[1]]), [("b",)], None, "count 50 buckets")
    assert list(quiet.result()) == [("a",)] and list(warned.result()) == [("b",)]
    assert warnings.counts == {"batch_size": 1}


# --- the node's ingest on the in-memory store ---------------------------------------------


def assert_counts_exact(store: MemoryStore, jobs: int) -> None:
    """`jobs` due rows in all, and each minute's bucket count is exactly its due rows."""
    rows = Counter((shard, minute) for (minute, shard), bucket in store.due.items()
                   for _ in bucket)
    assert sum(rows.values()) == jobs
    assert {key: n for key, n in store.counts.items() if n} == dict(rows)


async def test_ingest_of_ordinary_jobs_makes_no_batch_cassandra_would_warn_of() -> None:
    """Jobs of mixed horizons and payloads up to 1,500 bytes (about 3.5 KB of rows each),
    cron jobs among them: no logged batch over batch_size_warn_threshold, and each minute's
    bucket count is exactly its due rows."""
    rig = NodeRig(shards=2)
    try:
        await rig.start()
        for i in range(600):
            size = 1500 if i % 10 == 3 else 600 if i % 10 == 7 else 100
            fields: dict[str, Any] = {"payload": {"i": i, "pad": "x" * size}}
            if i % 5 == 4:
                fields.update(cron="30 * * * *", tz=("UTC", "Europe/Berlin")[i % 2])
            else:
                fields["at"] = T0 + 120_000 + (i * 104_729_311) % (30 * 86_400_000)
            rig.upsert(f"j{i:04d}", **fields)
        await rig.settle()
        store = rig.store
        assert len(store.jobs) == 600
        assert store.warnings == []
        assert_counts_exact(store, 600)
    finally:
        await rig.stop_all()


async def test_ingest_counts_buckets_with_its_own_few_requests_in_flight() -> None:
    """A long-horizon herd makes about one counter request per job (one per (shard, hour) a
    step touches): ingest asks the store to keep `ingest_counts_in_flight` of them in flight,
    not the store's default, and the counts stay exact."""
    rig = NodeRig(shards=1, ingest_counts_in_flight=3)
    try:
        await rig.start()
        for i in range(200):
            rig.upsert(f"j{i:04d}", at=T0 + 120_000 + (i * 104_729_311) % (30 * 86_400_000))
        await rig.settle()
        store = rig.store
        assert store.count_calls and set(store.count_calls) == {3}
        assert_counts_exact(store, 200)
    finally:
        await rig.stop_all()


async def test_a_herds_rows_are_counted_before_they_are_written() -> None:
    """The loader, far behind, skips minutes counted zero: a due row must never be stored in a
    minute whose count does not cover it yet, whatever the counts' bound in flight."""
    rig = NodeRig(shards=1, ingest_counts_in_flight=1)
    store = rig.store
    written: Counter[tuple[int, int]] = Counter()
    uncovered: list[tuple[int, int]] = []
    put = store.put_dues_and_jobs

    async def checked(rows: Any) -> None:
        for due, _ttl, _job in rows:
            key = (due.shard, due.minute)
            written[key] += 1
            if store.counts.get(key, 0) < written[key]:
                uncovered.append(key)
        await put(rows)

    store.put_dues_and_jobs = checked  # type: ignore[method-assign]
    try:
        await rig.start()
        for i in range(300):
            rig.upsert(f"j{i:04d}", at=T0 + 120_000 + (i * 104_729_311) % (30 * 86_400_000))
        await rig.settle()
        assert sum(written.values()) == 300
        assert uncovered == []
        assert_counts_exact(store, 300)
    finally:
        await rig.stop_all()


async def test_a_job_whose_rows_alone_exceed_the_warning_size_is_written_and_warned_of() -> None:
    rig = NodeRig(shards=1)
    try:
        await rig.start()
        rig.upsert("big", at=T0 + 3_600_000, payload={"pad": "x" * 3000})
        rig.upsert("small", at=T0 + 3_600_000, payload={"pad": "x"})
        await rig.settle()
        assert {"big", "small"} <= set(rig.store.jobs)
        (warning,) = rig.store.warnings  # its own batch: the small job is not in it
        assert "of 1 jobs" in warning
    finally:
        await rig.stop_all()
