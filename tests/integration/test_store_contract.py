"""The JobStore contract (tests/contract/job_store.py) against Cassandra."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace
from typing import Any

import pytest
from chronowheel.admin import init_namespace
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow, RetiredDue
from chronowheel.store.cassandra import SERVER_WARNINGS, CassandraStore

from tests.conftest import Stack
from tests.contract.job_store import JobStoreContract
from tests.namespace_pool import keyspace_of

pytestmark = pytest.mark.integration


# One store in one namespace for the module: the contract's tests keep to ids of their own
# (tests/contract/job_store.py).
@pytest.fixture(scope="module")
async def store(stack: Stack, shared_namespace: str) -> AsyncIterator[CassandraStore]:
    settings = Settings(namespace=shared_namespace,
                        cassandra_keyspace=keyspace_of(shared_namespace),
                        cassandra=stack.cassandra,
                        kafka=stack.kafka, shards=2)
    await init_namespace(settings)
    store = CassandraStore.open(settings)
    try:
        yield store
    finally:
        store.close()


class TestCassandraStoreContract(JobStoreContract):
    pass


@pytest.mark.usefixtures("quiet_namespace_pool")  # its thread's requests leave garbage too
async def test_finished_requests_leave_no_cyclic_garbage(stack: Stack, namespace: str) -> None:
    # Every object of a finished request must be freed by reference counting: cyclic garbage
    # made the node's full collections (event-loop pauses) frequent (node/gc_policy.py).
    settings = Settings(namespace=namespace, cassandra_keyspace=keyspace_of(namespace),
                        cassandra=stack.cassandra, kafka=stack.kafka, shards=2)
    await init_namespace(settings)
    store = CassandraStore.open(settings)
    ids = [f"job-{i}" for i in range(120)]
    try:
        await store.get_jobs(ids)  # prepared statements and connections settle first
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(5):
                await store.get_jobs(ids)
                await asyncio.gather(*(store.get_job(i) for i in ids[:40]))
            gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        store.close()
    driver = {k: n for k, n in kinds.items()
              if k in ("ResponseFuture", "ExecuteMessage", "ResultSet", "Timer", "Future")}
    assert driver == {}, kinds.most_common(10)


async def test_a_minute_of_mostly_retired_rows_reads_without_tombstones(
        store: CassandraStore) -> None:
    # Issue 26's hot minute in small: 2,500 rows in one bucket, 2,000 of them taken back (a
    # run of 1,500 and every other one of the rest). A delete per row would leave 2,000
    # tombstones, and a read of the bucket would meet twice Cassandra's warning threshold
    # (tombstone_warn_threshold, 1,000); a retired row is a live row of its own table.
    shard, minute = 7, 1_796_115_600_000 + 40 * 60_000  # ids no contract test uses
    rows = [DueRow(minute, shard, minute + i * 20, f"hot-{i:05}", 1, minute + i * 20, 2,
                   "orders.fired", b"{}", (), None) for i in range(2_500)]
    retired = [r for i, r in enumerate(rows) if 500 <= i < 2_000 or (i >= 2_000 and i % 2)
               or (i < 500 and i % 2)]
    taken_back = set(retired)
    kept = [r for r in rows if r not in taken_back]
    assert (len(retired), len(kept)) == (2_000, 500)
    await _in_chunks([store.put_due(r, 3600) for r in rows])
    await _in_chunks([store.retire_due(RetiredDue(r.key, r.version, 3600)) for r in retired])
    before = SERVER_WARNINGS.counts.get("tombstones", 0)
    read = [r for page_rows in (5_000, 300)
            async for page in store.read_bucket(minute, shard, page_rows=page_rows)
            for r in page]
    assert read == kept + kept
    paged: list[DueRow] = []
    after: tuple[int, str, int] | None = None
    while page := await store.due_page(minute, shard, after, 100):
        assert len(page) == 100 or len(paged) + len(page) == 500  # full pages till the end
        paged += page
        after = (page[-1].slot_ms, page[-1].entry, page[-1].attempt)
    assert paged == kept
    assert SERVER_WARNINGS.counts.get("tombstones", 0) == before


async def _in_chunks(writes: list[Coroutine[Any, Any, None]], size: int = 64) -> None:
    for i in range(0, len(writes), size):
        await asyncio.gather(*writes[i:i + size])


async def test_due_deletes_also_deletes_what_it_retires_for_older_nodes(
        store: CassandraStore) -> None:
    # During an upgrade from a version that reads `due` alone, a retired row must be gone
    # from `due` as well, or an older node taking the shard over would fire it.
    both = CassandraStore(replace(store.settings, due_deletes=True), store.cluster,
                          store.session)
    shard, minute = 8, 1_796_115_600_000 + 41 * 60_000
    old, moved, cancelled = (DueRow(minute, shard, minute + i, name, 1, minute + i, 1,
                                    "orders.fired", b"{}", (), None)
                             for i, name in enumerate(("old", "moved", "cancelled")))
    for row in (old, moved, cancelled):
        await both.put_due(row, 3600)
    new = replace(moved, slot_ms=minute + 9, scheduled_ms=minute + 9, version=2)
    await both.put_due_and_job(new, 3600, JobRow("moved", shard, b"{}", 2, "scheduled",
                                                 new.scheduled_ms, new.slot_ms),
                               RetiredDue(moved.key, 1, 3600))
    await both.retire_due(RetiredDue(cancelled.key, 1, 3600))
    read = [r async for page in both.read_bucket(minute, shard) for r in page]
    assert read == [old, new]
    raw = await asyncio.to_thread(lambda: [r.job_id for r in store.session.execute(
        f"SELECT job_id FROM {store.settings.keyspace}.due WHERE minute = %s AND shard = %s",
        (minute, shard))])
    assert raw == ["old", "moved"]  # the new row of "moved"; its old row and "cancelled" gone


async def test_a_retirement_hides_only_rows_written_before_it_or_soon_after(
        store: CassandraStore) -> None:
    # A job's versions start again at 1 once its cancelled jobs row has expired (retention),
    # so a row of the retired key and version written that much later is a re-submit and is
    # read; one written within half the retention period is still hidden (clocks of two nodes
    # may disagree that much). Write times set here with USING TIMESTAMP, not waited for.
    shard, minute = 9, 1_796_115_600_000 + 42 * 60_000
    ks = store.settings.keyspace
    insert = (f"INSERT INTO {ks}.due (minute, shard, slot_ms, job_id, attempt, scheduled_ms, "
              f"version, topic, payload, headers) VALUES (%s, %s, %s, %s, 1, %s, 1, 'o', "
              f"0x7b7d, []) USING TIMESTAMP %s")
    half_retention_us = store.settings.retention_ms // 2 * 1000
    rows = {name: DueRow(minute, shard, minute + i, name, 1, minute + i, 1, "o", b"{}", (),
                         None) for i, name in enumerate(("again", "skewed"))}
    for row in rows.values():
        await store.put_due(row, 3600)
        await store.retire_due(RetiredDue(row.key, 1, 3600))
    assert [r async for page in store.read_bucket(minute, shard) for r in page] == []
    now_us = time.time_ns() // 1000
    for name, later_us in (("again", half_retention_us + 60_000_000), ("skewed", 60_000_000)):
        row = rows[name]
        await asyncio.to_thread(store.session.execute, insert, (
            minute, shard, row.slot_ms, name, row.scheduled_ms, now_us + later_us))
    assert [r.job_id async for page in store.read_bucket(minute, shard)
            for r in page] == ["again"]
