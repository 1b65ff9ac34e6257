"""Ingest sends Cassandra nothing it warns about (issue 26): no counter batch across
partitions, no unlogged batch across partitions, no batch over `batch_size_warn_threshold`
(5 KiB), for a backlog of a few thousand jobs of mixed horizons and payload sizes, cron jobs
in several zones among them. The warnings are the ones the server sent with its answers to the
node's requests (`ResponseFuture.warnings`, counted by the store). The bucket counts stay
exact: every minute counts exactly the due rows written into it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from chronowheel.core.model import encode_backfill
from chronowheel.store.cassandra import SERVER_WARNINGS, CassandraStore

from testkit.fleet import until
from tests.integration.harness import make_namespace, now_ms, produce, running_node, upsert

pytestmark = pytest.mark.integration

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo")  # whole-hour offsets


def workload(n: int, now: int) -> list[tuple[bytes, bytes]]:
    """n upserts: 40 % due within the hour, 40 % over the next 30 days, 20 % hourly cron jobs
    in several zones; payloads of about 100 bytes, 10 % of about 600 and 10 % of about
    1,500. The cron minute is half an hour from now, so no occurrence comes due while the
    test runs (a step that crossed one would count the job's next occurrence twice)."""
    cron_minute = (time.gmtime(now / 1000).tm_min + 30) % 60
    records = []
    for i in range(n):
        size = 1500 if i % 10 == 3 else 600 if i % 10 == 7 else 100
        fields: dict[str, Any] = {"payload": {"i": i, "pad": "x" * size}}
        kind = i % 5
        if kind in (0, 1):  # within the hour, 2..60 min ahead
            fields["at"] = now + 120_000 + (i * 7919) % 3_480_000
        elif kind in (2, 3):  # over the next 30 days
            fields["at"] = now + 3_600_000 + (i * 104_729_311) % (30 * 86_400_000)
        else:
            fields["cron"] = f"{cron_minute} * * * *"
            fields["tz"] = ZONES[i % len(ZONES)]
        records.append(upsert(f"w{i:05d}", **fields))
    return records


async def test_ingest_draws_no_server_warning_and_counts_stay_exact(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=4)
    n = 3000
    await produce(settings, workload(n, now_ms()))
    before = SERVER_WARNINGS.counts
    async with running_node(settings) as node:
        def stored() -> bool:
            assert node.failure is None, node.failure
            return node.metrics.ingested.labels("upsert", "stored")._value.get() >= n

        await until(stored, 240, f"the node to apply the backlog of {n} jobs")
        # the node exports the store's count (every kind, 0 until one comes)
        exported = {kind: node.metrics.registry.get_sample_value(
            "chronowheel_store_server_warnings_total", {"kind": kind})
            for kind in ("unlogged_batch", "batch_size")}
        counted = SERVER_WARNINGS.counts
    assert exported == {kind: counted.get(kind, 0) for kind in exported}, exported
    after = SERVER_WARNINGS.counts
    new = {kind: count - before.get(kind, 0) for kind, count in after.items()
           if count > before.get(kind, 0)}
    assert not new, (f"Cassandra warned during ingest: {new}; latest of each kind: "
                     f"{SERVER_WARNINGS.latest()}")

    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        ks = settings.keyspace
        due, counts, jobs = await asyncio.to_thread(lambda: (
            Counter((r[0], r[1]) for r in store.session.execute(
                f"SELECT shard, minute FROM {ks}.due")),
            {(r[0], r[1]): r[2] for r in store.session.execute(
                f"SELECT shard, minute, rows FROM {ks}.bucket_counts")},
            sum(1 for _ in store.session.execute(f"SELECT job_id FROM {ks}.jobs"))))
    finally:
        await asyncio.to_thread(store.close)
    assert jobs == n and sum(due.values()) == n
    assert len(due) > 1000, "the workload should spread over many minutes"
    wrong = {key: (counts.get(key), rows) for key, rows in due.items()
             if counts.get(key) != rows}
    extra = {key: count for key, count in counts.items() if key not in due}
    assert not wrong and not extra, (f"bucket counts differ from the rows written: "
                                     f"(count, rows) {dict(list(wrong.items())[:10])}, "
                                     f"counted but empty {dict(list(extra.items())[:10])}")


async def test_a_backfill_s_chunks_draw_no_server_warning(stack: Any, namespace: str) -> None:
    """A backfill's chunk (its due rows and its request row, which carries the job's spec, in
    one logged batch) stays under batch_size_warn_threshold: sized by its rows alone, with too
    small a figure per row, a chunk of this job was about 6 KB."""
    settings = await make_namespace(stack, namespace, shards=1, backfill_rows_per_cycle=500)
    now = now_ms()
    start = now - now % 60_000 - 3 * 3_600_000
    job, request_id = "reports.daily-summary.eu-west-1", "backfill-2026-12-03-incident-4711"
    await produce(settings, [upsert(job, cron="* * * * *", payload={"pad": "x" * 60})])
    before = SERVER_WARNINGS.total
    async with running_node(settings) as node:
        def stored() -> bool:
            assert node.failure is None, node.failure
            return node.metrics.ingested.labels("upsert", "stored")._value.get() >= 1

        took_s = await until(stored, 120, "the job to be stored")
        await produce(settings, [(job.encode(), encode_backfill(job, request_id, start,
                                                                 start + 3 * 3_600_000))])

        async def handed_over() -> bool:  # 180 occurrences, in chunks
            assert node.failure is None, node.failure
            request = await node.store.get_request(0, job, request_id)
            return request is not None and request.handed >= 180

        # both waits within the one bound of 120 s
        await until(handed_over, 120 - took_s, "the backfill to hand over its 180 occurrences")
    assert SERVER_WARNINGS.total == before, SERVER_WARNINGS.latest()
