"""The JobStore contract (`chronowheel.store.base.JobStore`), once for every implementation.

A test module subclasses `JobStoreContract` and provides a `store` fixture: the unit tests run
it against the in-memory store, the integration tests against Cassandra. Each test uses its own
shard and job ids (`ids`), so a store may be shared by the tests of one module.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest
from chronowheel.core import limits, wire
from chronowheel.errors import StoreRefused
from chronowheel.store.base import (
    CLEAR_NOTE,
    Claim,
    DueRow,
    JobQuery,
    JobRow,
    JobStore,
    JobSummary,
    RequestRow,
    RetiredDue,
    RunLease,
)

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z, on an hour boundary
_shards = itertools.count(100)


@dataclass(frozen=True)
class Ids:
    shard: int
    prefix: str

    def job(self, name: str) -> str:
        return f"{self.prefix}-{name}"


def due(ids: Ids, name: str, slot_ms: int, *, attempt: int = 1, minute: int | None = None,
        spec: bytes | None = None, **fields: Any) -> DueRow:
    values: dict[str, Any] = dict(
        minute=slot_ms - slot_ms % MINUTE_MS if minute is None else minute, shard=ids.shard,
        slot_ms=slot_ms, job_id=ids.job(name), attempt=attempt, scheduled_ms=slot_ms - 7,
        version=3, topic="orders.fired", payload=b"\x00payload", headers=(("h", "v"),),
        spec=spec, max_attempts=4, backoff_ms=2_500)
    values.update(fields)
    return DueRow(**values)


async def read_all(store: JobStore, minute: int, shard: int, **kw: Any) -> list[list[DueRow]]:
    pages = []
    async for page in store.read_bucket(minute, shard, **kw):
        pages.append(page)
    return pages


class JobStoreContract:
    @pytest.fixture
    def ids(self) -> Ids:
        return Ids(next(_shards), "j" + secrets.token_hex(4))

    # --- jobs -------------------------------------------------------------------------
    async def test_a_job_row_reads_back_as_written_and_a_write_replaces_it(
            self, store: JobStore, ids: Ids) -> None:
        assert await store.get_job(ids.job("a")) is None
        row = JobRow(ids.job("a"), ids.shard, b'{"id":"a"}', 1, "scheduled", T0, T0 + 5)
        await store.put_job(row)
        assert await store.get_job(ids.job("a")) == row
        finished = JobRow(ids.job("a"), ids.shard, b'{"id":"a"}', 2, "finished", None, None,
                          ttl_s=3600)
        await store.put_job(finished)
        # The TTL is not read back: a returned row always says 0.
        assert await store.get_job(ids.job("a")) == JobRow(
            ids.job("a"), ids.shard, b'{"id":"a"}', 2, "finished", None, None, 0)

    async def test_a_note_and_since_are_kept_by_writes_without_them_and_a_note_is_cleared(
            self, store: JobStore, ids: Ids) -> None:
        # What a recurring fire writes (neither) leaves them as stored; CLEAR_NOTE removes
        # the note (a resume, a cancel); a listing shows the note.
        j = ids.job("n")
        spec = b'{"id":"n","every":"1s"}'
        await store.put_job(JobRow(j, ids.shard, spec, 1, "scheduled", T0, T0, since_ms=T0))
        await store.put_job(JobRow(j, ids.shard, spec, 2, "paused", T0 + 1000, None,
                                   note="why: it failed"))
        row = await store.get_job(j)
        assert row is not None and (row.note, row.since_ms) == ("why: it failed", T0)
        assert (await store.get_jobs([j]))[j] == row
        page = await store.list_jobs(JobQuery(prefix=j, status="paused", limit=10))
        assert [(s.job_id, s.note) for s in page.jobs] == [(j, "why: it failed")]
        await store.put_job(JobRow(j, ids.shard, spec, 3, "scheduled", T0 + 1000, T0 + 1000,
                                   note=CLEAR_NOTE, since_ms=T0 + 1000))
        await store.put_job(JobRow(j, ids.shard, spec, 3, "scheduled", T0 + 2000, T0 + 2000))
        assert await store.get_job(j) == JobRow(j, ids.shard, spec, 3, "scheduled", T0 + 2000,
                                                T0 + 2000, since_ms=T0 + 1000)

    async def test_jobs_rows_read_together_as_get_job_reads_them(
            self, store: JobStore, ids: Ids) -> None:
        rows = [JobRow(ids.job(f"g{i}"), ids.shard, b'{"i":%d}' % i, i + 1, "scheduled",
                       T0 + i, T0 + 2 * i, ttl_s=3600 if i % 2 else 0) for i in range(120)]
        for row in rows:
            await store.put_job(row)
        wanted = [r.job_id for r in rows] + [ids.job("missing"), rows[0].job_id]
        got = await store.get_jobs(wanted)
        # every stored row, as get_job returns it (TTL not read back); none for a missing id
        assert got == {r.job_id: await store.get_job(r.job_id) for r in rows}
        assert all(row.ttl_s == 0 for row in got.values())
        assert await store.get_jobs([]) == {}

    # --- due rows ---------------------------------------------------------------------
    async def test_a_bucket_reads_in_slot_job_attempt_order_with_every_field(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 5 * MINUTE_MS
        rows = [due(ids, "b", m + 10), due(ids, "a", m + 10, attempt=2),
                due(ids, "a", m + 10), due(ids, "c", m + 1, spec=b'{"id":"c","every":"1m"}'),
                due(ids, "z", m + 59_999)]
        for row in rows:
            await store.put_due(row, 3600)
        pages = await read_all(store, m, ids.shard)
        got = [r for page in pages for r in page]
        assert got == sorted(rows, key=lambda r: (r.slot_ms, r.job_id, r.attempt))
        assert got[0].spec == b'{"id":"c","every":"1m"}' and got[1].spec is None

    async def test_buckets_are_separate_per_minute_and_shard(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 6 * MINUTE_MS
        await store.put_due(due(ids, "a", m + 1), 3600)
        await store.put_due(due(ids, "b", m + MINUTE_MS + 1), 3600)
        await store.put_due(due(ids, "c", m + 2, shard=ids.shard + 1000), 3600)
        assert [[r.job_id for r in p] for p in await read_all(store, m, ids.shard)] == \
            [[ids.job("a")]]
        assert await read_all(store, m - MINUTE_MS, ids.shard) == []

    async def test_from_slot_is_inclusive_and_pages_are_bounded_and_non_empty(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 7 * MINUTE_MS
        for i in range(7):
            await store.put_due(due(ids, f"r{i}", m + i), 3600)
        pages = await read_all(store, m, ids.shard, from_slot_ms=m + 2, page_rows=2)
        assert [[r.slot_ms - m for r in p] for p in pages] == [[2, 3], [4, 5], [6]]
        assert await read_all(store, m, ids.shard, from_slot_ms=m + 7) == []

    async def test_a_page_is_read_when_asked_for_and_continues_after_the_last_row(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 8 * MINUTE_MS
        for i in (10, 20, 30):
            await store.put_due(due(ids, f"r{i}", m + i), 3600)
        pages = store.read_bucket(m, ids.shard, page_rows=2)
        async with contextlib.aclosing(pages):  # type: ignore[type-var]
            first = await anext(pages)
            assert [r.slot_ms - m for r in first] == [10, 20]
            await store.put_due(due(ids, "before", m + 15), 3600)  # behind the page: unseen
            await store.put_due(due(ids, "after", m + 25), 3600)
            second = await anext(pages)
        assert [r.slot_ms - m for r in second] == [25, 30]

    async def test_retiring_hides_exactly_one_row_and_tolerates_a_missing_one(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 9 * MINUTE_MS
        await store.put_due(due(ids, "a", m + 1), 3600)
        await store.put_due(due(ids, "a", m + 1, attempt=2), 3600)
        await store.retire_due(RetiredDue((m, ids.shard, m + 1, ids.job("a"), 1), 3, 3600))
        await store.retire_due(RetiredDue((m, ids.shard, m + 1, ids.job("a"), 1), 3, 3600))
        await store.retire_due(RetiredDue((m, ids.shard, m + 99, ids.job("nothing"), 1), 1, 60))
        assert [(r.job_id, r.attempt) for p in await read_all(store, m, ids.shard)
                for r in p] == [(ids.job("a"), 2)]

    async def test_a_retired_row_hides_its_versions_up_to_the_retired_one_only(
            self, store: JobStore, ids: Ids) -> None:
        # A job cancelled and submitted again lands on the same key with a newer version: its
        # new row is read, the retirement of the old one notwithstanding.
        m = T0 + 17 * MINUTE_MS
        key = (m, ids.shard, m + 5, ids.job("a"), 1)
        await store.put_due(due(ids, "a", m + 5, version=4), 3600)
        await store.retire_due(RetiredDue(key, 4, 3600))
        assert await read_all(store, m, ids.shard) == []
        older = due(ids, "a", m + 5, version=3)  # an older version read again stays hidden
        await store.put_due(older, 3600)
        assert await read_all(store, m, ids.shard) == []
        newer = due(ids, "a", m + 5, version=5)
        await store.put_due(newer, 3600)
        assert await read_all(store, m, ids.shard) == [[newer]]
        await store.retire_due(RetiredDue(key, 5, 3600))
        assert await read_all(store, m, ids.shard) == []

    async def test_pages_leave_retired_rows_out_and_go_on_past_a_page_of_them(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 18 * MINUTE_MS
        rows = [due(ids, f"r{i:02}", m + i) for i in range(12)]
        for row in rows:
            await store.put_due(row, 3600)
        kept = {0, 7, 11}  # rows 1-6 fill two whole pages of 3 and are all retired
        for i, row in enumerate(rows):
            if i not in kept:
                await store.retire_due(RetiredDue(row.key, row.version, 3600))
        pages = await read_all(store, m, ids.shard, page_rows=3)
        assert all(0 < len(p) <= 3 for p in pages)
        assert [r.slot_ms - m for p in pages for r in p] == sorted(kept)
        pages = await read_all(store, m, ids.shard, from_slot_ms=m + 1, page_rows=3)
        assert [r.slot_ms - m for p in pages for r in p] == [7, 11]

    async def test_a_due_row_write_replaces_the_row_with_the_same_key(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 10 * MINUTE_MS
        await store.put_due(due(ids, "a", m + 1, version=1), 3600)
        await store.put_due(due(ids, "a", m + 1, version=2, payload=b"new"), 3600)
        [[row]] = await read_all(store, m, ids.shard)
        assert (row.version, row.payload) == (2, b"new")

    async def test_due_and_job_rows_are_written_together(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 11 * MINUTE_MS
        row = due(ids, "a", m + 3)
        job = JobRow(ids.job("a"), ids.shard, b"{}", 3, "scheduled", m - 4, m + 3)
        await store.put_due_and_job(row, 3600, job)
        assert await store.get_job(ids.job("a")) == job
        assert await read_all(store, m, ids.shard) == [[row]]

    async def test_several_jobs_due_and_job_rows_are_written_together(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 12 * MINUTE_MS
        n = T0 + 13 * MINUTE_MS
        group = [(due(ids, f"a{i}", (m if i % 2 else n) + i, version=i + 1), 3600,
                  JobRow(ids.job(f"a{i}"), ids.shard, b"{}", i + 1, "scheduled", m, m + i,
                         ttl_s=7200))
                 for i in range(6)]
        await store.put_dues_and_jobs(group)
        for row, _ttl, job in group:
            assert await store.get_job(row.job_id) == JobRow(
                job.job_id, job.shard, job.spec, job.version, job.status, job.scheduled_ms,
                job.slot_ms, 0)
        assert [r for page in await read_all(store, m, ids.shard) for r in page] == \
            [row for row, _, _ in group if row.minute == m]
        assert [r for page in await read_all(store, n, ids.shard) for r in page] == \
            [row for row, _, _ in group if row.minute == n]

    async def test_a_batch_over_cassandras_size_limit_is_refused_whole(
            self, store: JobStore, ids: Ids) -> None:
        # Cassandra's default batch_size_fail_threshold is 50 KiB: a 60 KB payload, stored in
        # the due row and again in the spec, takes more than twice that.
        m = T0 + 14 * MINUTE_MS
        small = (due(ids, "small", m + 1), 3600,
                 JobRow(ids.job("small"), ids.shard, b"{}", 1, "scheduled", m, m + 1))
        big = (due(ids, "big", m + 2, payload=b"x" * 60_000), 3600,
               JobRow(ids.job("big"), ids.shard, b"y" * 60_000, 1, "scheduled", m, m + 2))
        with pytest.raises(StoreRefused, match="Batch too large"):
            await store.put_dues_and_jobs([small, big])
        with pytest.raises(StoreRefused, match="Batch too large"):
            await store.put_due_and_job(*big)
        assert await store.get_job(ids.job("small")) is None  # nothing of it was written
        assert await read_all(store, m, ids.shard) == []
        await store.put_dues_and_jobs([small])
        assert await store.get_job(ids.job("small")) is not None

    async def test_a_new_due_row_replaces_the_old_one_in_the_same_batch(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 16 * MINUTE_MS
        old = due(ids, "a", m + 1)
        job = JobRow(ids.job("a"), ids.shard, b"{}", 1, "scheduled", m, m + 1)
        await store.put_due_and_job(old, 3600, job)
        new = due(ids, "a", m + 2, version=2)
        await store.put_due_and_job(new, 3600, JobRow(ids.job("a"), ids.shard, b"{}", 2,
                                                      "scheduled", m, m + 2),
                                    RetiredDue(old.key, old.version, 3600))
        assert await read_all(store, m, ids.shard) == [[new]]
        # Replacing a row by one with the same key keeps the new one.
        same = due(ids, "a", m + 2, version=3)
        await store.put_due_and_job(same, 3600, JobRow(ids.job("a"), ids.shard, b"{}", 3,
                                                       "scheduled", m, m + 2),
                                    RetiredDue(new.key, new.version, 3600))
        assert await read_all(store, m, ids.shard) == [[same]]
        # A replacement the store refuses leaves the old row and the old jobs row as they were.
        big = due(ids, "a", m + 3, version=4, payload=b"x" * 60_000)
        with pytest.raises(StoreRefused):
            await store.put_due_and_job(big, 3600, JobRow(ids.job("a"), ids.shard,
                                                          b"y" * 60_000, 4, "scheduled", m,
                                                          m + 3),
                                        RetiredDue(same.key, same.version, 3600))
        assert await read_all(store, m, ids.shard) == [[same]]
        stored = await store.get_job(ids.job("a"))
        assert stored is not None and stored.version == 3

    async def test_a_ttl_over_20_years_is_refused(self, store: JobStore, ids: Ids) -> None:
        m = T0 + 15 * MINUTE_MS
        with pytest.raises(StoreRefused, match="ttl is too large"):
            await store.put_due(due(ids, "far", m), limits.CASSANDRA_MAX_TTL_S + 1)
        with pytest.raises(StoreRefused, match="ttl is too large"):
            await store.put_job(JobRow(ids.job("far"), ids.shard, b"{}", 1, "cancelled", None,
                                       None, ttl_s=limits.CASSANDRA_MAX_TTL_S + 1))
        await store.put_due(due(ids, "far", m), limits.CASSANDRA_MAX_TTL_S)  # the limit: fine
        assert len(await read_all(store, m, ids.shard)) == 1

    # --- bucket counts ----------------------------------------------------------------
    async def test_counts_add_up_per_minute_and_ranges_include_both_ends_across_hours(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + HOUR_MS - 2 * MINUTE_MS  # two minutes before the next hour
        minutes = [m + i * MINUTE_MS for i in range(5)]  # spans two hour partitions
        await store.add_bucket_count(ids.shard, minutes[0], 2)
        await store.add_bucket_count(ids.shard, minutes[0], 3)
        await store.add_bucket_count(ids.shard, minutes[2], 1)
        await store.add_bucket_count(ids.shard, minutes[4], 7)
        await store.add_bucket_count(ids.shard + 1000, minutes[1], 9)
        assert await store.bucket_counts(ids.shard, minutes[0], minutes[4]) == {
            minutes[0]: 5, minutes[2]: 1, minutes[4]: 7}
        assert await store.bucket_counts(ids.shard, minutes[1], minutes[3]) == {minutes[2]: 1}
        assert await store.bucket_counts(ids.shard, minutes[4], minutes[4]) == {minutes[4]: 7}
        assert await store.bucket_counts(ids.shard, minutes[4] + MINUTE_MS,
                                         minutes[4] + HOUR_MS) == {}

    async def test_counts_added_together_add_up_like_single_additions(
            self, store: JobStore, ids: Ids) -> None:
        m = T0 + 2 * HOUR_MS - 2 * MINUTE_MS
        minutes = [m + i * MINUTE_MS for i in range(4)]  # two hour partitions
        await store.add_bucket_count(ids.shard, minutes[0], 1)
        await store.add_bucket_counts(ids.shard, {minutes[0]: 2, minutes[1]: 3, minutes[3]: 4})
        await store.add_bucket_counts(ids.shard, {minutes[3]: 1})
        await store.add_bucket_counts(ids.shard, {minutes[1]: 1, minutes[2]: 2}, in_flight=1)
        await store.add_bucket_counts(ids.shard, {})
        assert await store.bucket_counts(ids.shard, minutes[0], minutes[3]) == {
            minutes[0]: 3, minutes[1]: 4, minutes[2]: 2, minutes[3]: 5}

    # --- claims, meta, clock ----------------------------------------------------------
    async def test_a_claim_is_a_compare_and_set_register(self, store: JobStore,
                                                         ids: Ids) -> None:
        occ, consumer = f"{ids.job('a')}@{T0}", f"group-{ids.prefix}"
        running = Claim("running", 1, "owner-1")
        assert await store.swap_claim(consumer, occ, None, running, "w1", 60) == (True, None)
        assert await store.swap_claim(consumer, occ, None, Claim("running", 1, "owner-2"),
                                      "w2", 60) == (False, running)
        done = Claim("done", 1, "owner-1")
        assert await store.swap_claim(consumer, occ, running, done, "w1", 600) == (True, None)
        assert await store.swap_claim(consumer, occ, running, done, "w1", 600) == (False, done)
        other = f"{ids.job('b')}@{T0}"
        assert await store.swap_claim(consumer, other, running, done, "w1", 60) == (False, None)

    async def test_a_claim_is_released_only_by_its_running_owner(
            self, store: JobStore, ids: Ids) -> None:
        occ, consumer = f"{ids.job('a')}@{T0}", f"group-{ids.prefix}"
        running = Claim("running", 2, "owner-1")
        assert (await store.swap_claim(consumer, occ, None, running, "w1", 60))[0]
        await store.release_claim(consumer, occ, "owner-2")
        assert await store.swap_claim(consumer, occ, None, running, "w1", 60) == \
            (False, running)
        await store.release_claim(consumer, occ, "owner-1")
        assert await store.swap_claim(consumer, occ, None, running, "w1", 60) == (True, None)

    # --- requested occurrences and requests -----------------------------------------------
    async def test_requested_occurrences_share_a_slot_with_the_jobs_own_row(
            self, store: JobStore, ids: Ids) -> None:
        slot = T0 + 40
        own = due(ids, "r", slot, scheduled_ms=slot)
        triggered = due(ids, "r", slot, scheduled_ms=slot, spec=None,
                        origin=wire.TRIGGER_ORIGIN, request_id="t-1")
        backfilled = [due(ids, "r", slot, scheduled_ms=T0 - 60_000 * i,
                          origin=wire.BACKFILL_ORIGIN, request_id="b-1") for i in range(3)]
        await store.put_due(own, 60)
        await store.put_request(
            RequestRow(ids.shard, ids.job("r"), "b-1", wire.BACKFILL_ORIGIN, T0 - 200_000, T0,
                       T0 - 30_000, 4, 3, b"{}"),
            [(triggered, 60), *((row, 60) for row in backfilled)])
        rows = [r for page in await read_all(store, T0, ids.shard) for r in page]
        assert sorted(rows, key=lambda r: r.entry) == sorted(
            [own, triggered, *backfilled], key=lambda r: r.entry)
        assert triggered.entry == f"{ids.job('r')}@{slot}/trigger/t-1"
        # Retiring the job's own row leaves the requested ones.
        await store.retire_due(RetiredDue(own.key, own.version, 60))
        rows = [r for page in await read_all(store, T0, ids.shard) for r in page]
        assert own not in rows and len(rows) == 4

    async def test_a_request_row_reads_back_and_a_write_replaces_it(
            self, store: JobStore, ids: Ids) -> None:
        assert await store.get_request(ids.shard, ids.job("q"), "r1") is None
        first = RequestRow(ids.shard, ids.job("q"), "r1", wire.BACKFILL_ORIGIN, T0, T0 + 9,
                           T0, 10, 0, b'{"id":"q"}', ttl_s=3600)
        await store.put_request(first)
        assert await store.get_request(ids.shard, ids.job("q"), "r1") == RequestRow(
            ids.shard, ids.job("q"), "r1", wire.BACKFILL_ORIGIN, T0, T0 + 9, T0, 10, 0,
            b'{"id":"q"}')
        done = RequestRow(ids.shard, ids.job("q"), "r1", wire.BACKFILL_ORIGIN, T0, T0 + 9,
                          None, 10, 10, b'{"id":"q"}')
        other = RequestRow(ids.shard, ids.job("p"), "r1", wire.TRIGGER_ORIGIN, T0, T0, None, 1,
                           1, b"{}")
        await store.put_request(done)
        await store.put_request(other)
        await store.put_request(RequestRow(ids.shard + 1000, ids.job("q"), "r9",
                                           wire.TRIGGER_ORIGIN, T0, T0, None, 1, 1, b"{}"))
        assert await store.shard_requests(ids.shard) == [other, done]  # (job, request) order

    async def test_jobs_rows_written_in_bulk_read_back_one_by_one(
            self, store: JobStore, ids: Ids) -> None:
        rows = [JobRow(ids.job(f"bulk{i}"), ids.shard, b"{}", i + 1, "scheduled", T0 + i, None,
                       0, "acme" if i % 2 else None) for i in range(45)]
        await store.put_jobs(rows)
        assert await store.get_jobs([r.job_id for r in rows]) == {r.job_id: r for r in rows}

    async def test_a_jobs_tenant_reads_back(self, store: JobStore, ids: Ids) -> None:
        row = JobRow(ids.job("t"), ids.shard, b"{}", 1, "paused", T0, None, 0, "acme")
        await store.put_job(row)
        assert await store.get_job(ids.job("t")) == row
        assert (await store.get_jobs([ids.job("t")]))[ids.job("t")] == row

    async def test_jobs_list_by_tenant_status_prefix_and_due_in_pages(
            self, store: JobStore, ids: Ids) -> None:
        tenant, other = "t" + ids.prefix, "u" + ids.prefix
        statuses = ("scheduled", "paused", "finished", "cancelled")
        rows = []
        for i in range(30):
            status = statuses[i % 4]
            scheduled = None if status in ("finished", "cancelled") else T0 + i * 1000
            name = ("a-" if i % 3 else "b-") + str(i)
            rows.append(JobRow(ids.job(name), ids.shard, b"{}", i + 1, status, scheduled,
                               None, 0, tenant if i < 25 else other))
        for row in rows:
            await store.put_job(row)

        async def listed(limit: int, **filters: Any) -> list[JobSummary]:
            seen: list[JobSummary] = []
            token = None
            for _ in range(100):
                page = await store.list_jobs(JobQuery(limit=limit, page_token=token, **filters))
                assert len(page.jobs) <= limit
                seen.extend(page.jobs)
                token = page.next_token
                if token is None:
                    return seen
            raise AssertionError("paging did not end")

        def expect(pred: Any) -> list[str]:
            return sorted(r.job_id for r in rows if pred(r))

        mine = await listed(4, tenant=tenant)
        assert sorted(s.job_id for s in mine) == expect(lambda r: r.tenant == tenant)
        assert len({s.job_id for s in mine}) == len(mine)  # no row on two pages
        some = mine[0]
        assert some == JobSummary(some.job_id, ids.shard, rows[_index(rows, some.job_id)].status,
                                  tenant, rows[_index(rows, some.job_id)].scheduled_ms,
                                  rows[_index(rows, some.job_id)].version)
        paused = await listed(3, tenant=tenant, status="paused")
        assert sorted(s.job_id for s in paused) == expect(
            lambda r: r.tenant == tenant and r.status == "paused")
        prefixed = await listed(5, tenant=tenant, prefix=ids.job("b-"))
        assert sorted(s.job_id for s in prefixed) == expect(
            lambda r: r.tenant == tenant and r.job_id.startswith(ids.job("b-")))
        due_soon = await listed(2, tenant=tenant, status="scheduled", due_before_ms=T0 + 12_000)
        assert sorted(s.job_id for s in due_soon) == expect(
            lambda r: r.tenant == tenant and r.status == "scheduled" and
            r.scheduled_ms is not None and r.scheduled_ms < T0 + 12_000)
        assert due_soon  # the filters select something, so the check above can fail
        between = await listed(3, tenant=tenant, due_after_ms=T0 + 6_000,
                               due_before_ms=T0 + 20_000)
        assert sorted(s.job_id for s in between) == expect(
            lambda r: r.tenant == tenant and r.scheduled_ms is not None
            and T0 + 6_000 <= r.scheduled_ms < T0 + 20_000)
        later = await listed(4, tenant=tenant, due_after_ms=T0 + 20_000)
        assert sorted(s.job_id for s in later) == expect(
            lambda r: r.tenant == tenant and r.scheduled_ms is not None
            and r.scheduled_ms >= T0 + 20_000)
        assert between and later
        with pytest.raises(ValueError, match="page token"):
            await store.list_jobs(JobQuery(tenant=tenant, page_token="not a token!"))

    async def test_an_unknown_meta_name_is_none(self, store: JobStore, ids: Ids) -> None:
        assert await store.get_meta(f"nothing-{ids.prefix}") is None

    async def test_a_clock_sample_is_sent_before_it_is_answered(self, store: JobStore) -> None:
        server, sent, received = await store.clock_sample()
        assert sent <= received
        assert abs(server - sent) < 86_400_000  # an epoch-ms instant, not seconds or ns

    # --- calendars ----------------------------------------------------------------------
    async def test_a_calendar_reads_back_is_replaced_and_deleted(
            self, store: JobStore, ids: Ids) -> None:
        name = f"cal-{ids.prefix}"
        assert await store.get_calendar(name) is None
        first = frozenset({date(2026, 12, 25), date(2027, 1, 1)})
        await store.put_calendar(name, first)
        assert await store.get_calendar(name) == first
        await store.put_calendar(name, frozenset({date(2026, 11, 26)}))  # replaces, no merge
        assert await store.get_calendar(name) == {date(2026, 11, 26)}
        await store.delete_calendar(name)
        assert await store.get_calendar(name) is None
        await store.delete_calendar(name)  # deleting a missing one is fine

    async def test_a_calendar_without_dates_exists_and_is_empty(
            self, store: JobStore, ids: Ids) -> None:
        name = f"empty-{ids.prefix}"
        await store.put_calendar(name, frozenset())
        assert await store.get_calendar(name) == frozenset()
        assert await store.get_calendar(f"other-{ids.prefix}") is None

    # --- overlap leases -----------------------------------------------------------------
    async def test_a_run_lease_is_compare_and_set_and_ends_only_by_its_owner(
            self, store: JobStore, ids: Ids) -> None:
        scope, job = f"scope-{ids.prefix}", ids.job("runs")
        first = RunLease("job@1", "owner-1", "w1")
        assert await store.swap_run(scope, job, None, first, 60) == (True, None)
        second = RunLease("job@2", "owner-2", "w2")
        assert await store.swap_run(scope, job, None, second, 60) == (False, first)
        # Asking the holder to stop is a swap of its own lease with `cancel` set.
        asked = RunLease("job@1", "owner-1", "w1", cancel=True)
        assert await store.swap_run(scope, job, first, asked, 60) == (True, None)
        assert await store.swap_run(scope, job, first, first, 60) == (False, asked)
        await store.end_run(scope, job, "owner-2")  # not the owner: nothing happens
        assert await store.swap_run(scope, job, None, second, 60) == (False, asked)
        await store.end_run(scope, job, "owner-1")
        assert await store.swap_run(scope, job, None, second, 60) == (True, None)
        # Another scope (consumer group) has its own lease for the same job.
        assert await store.swap_run(f"other-{ids.prefix}", job, None, first, 60) == (True, None)


def _index(rows: list[JobRow], job_id: str) -> int:
    return next(i for i, r in enumerate(rows) if r.job_id == job_id)
