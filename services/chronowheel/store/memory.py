"""An in-memory JobStore with the Cassandra store's contract (`store/base.py`), for tests and
tools that run a node without servers. Not durable; one event loop only.

Rows expire by their TTL when a clock is given (`clock`), never otherwise. `pause`, when given,
is awaited at the start of every call, and again between taking a read's result and returning
it: a test passes e.g. `lambda: asyncio.sleep(0)` so that tasks sharing the store interleave at
every storage call, and a read can be stale by the time its caller sees it, as on a real
database.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import date

from chronowheel.core import limits
from chronowheel.core.clock import Clock
from chronowheel.errors import StoreRefused
from chronowheel.store.base import (
    LIST_SCAN_ROWS,
    Claim,
    DueKey,
    DueRow,
    JobPage,
    JobQuery,
    JobRow,
    JobSummary,
    RequestRow,
    RetiredDue,
    RunLease,
    retire_margin_ms,
    retired_hides,
)

HOUR_MS = 3_600_000
_Key = tuple[int, str, int]  # clustering key of a due row: (slot_ms, job_id, attempt)


def _system_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryStore:
    def __init__(self, *, clock: Clock | None = None,
                 pause: Callable[[], Awaitable[None]] | None = None,
                 batch_fail_bytes: int = limits.CASSANDRA_BATCH_FAIL_BYTES,
                 batch_warn_bytes: int = limits.CASSANDRA_BATCH_WARN_BYTES,
                 retention_ms: int = 7 * 86_400_000) -> None:
        self.clock = clock
        self.retire_margin_ms = retire_margin_ms(retention_ms)
        """See `retired_hides`: the retention period sets it, as in Cassandra's store."""
        self.pause = pause
        self.batch_fail_bytes = batch_fail_bytes
        """Like Cassandra's batch_size_fail_threshold: a batch of several rows whose size
        (counted as `_rows_bytes` does) is larger is refused whole."""
        self.batch_warn_bytes = batch_warn_bytes
        self.warnings: list[str] = []
        """What Cassandra would have warned about, in its words: a logged batch of jobs' due
        and jobs rows (it spans at least a job's two partitions) larger than
        `batch_warn_bytes`, its batch_size_warn_threshold. The batch is written all the same.
        (Not judged for due rows written with a request row: `_rows_bytes` does not size
        those.)"""
        self.jobs: dict[str, tuple[JobRow, int | None]] = {}
        self.due: dict[tuple[int, int], dict[_Key, tuple[DueRow, int | None]]] = {}
        self.written: dict[DueKey, int] = {}
        """When each due row was last written (the store's clock, ms): `retired_hides`."""
        self.retired: dict[tuple[int, int], dict[_Key, tuple[int, int | None, int]]] = {}
        """(minute, shard) -> key -> (the version up to which that due row is retired, when
        the retirement expires, when it was written): `retire_due`."""
        self.counts: dict[tuple[int, int], int] = {}
        self.count_calls: list[int | None] = []
        """The `in_flight` of each add_bucket_counts call (what tests check)."""
        self.claims: dict[tuple[str, str], tuple[Claim, str, int | None]] = {}
        self.meta: dict[str, str] = {}
        self.requests: dict[tuple[int, str, str], tuple[RequestRow, int | None]] = {}
        self.calendars: dict[str, frozenset[date]] = {}
        self.runs: dict[tuple[str, str], tuple[RunLease, int | None]] = {}
        self.calls = 0
        """Storage calls made so far (tests read it to see that something was or was not
        read)."""

    # --- helpers -------------------------------------------------------------------------
    async def _enter(self) -> None:
        self.calls += 1
        if self.pause is not None:
            await self.pause()

    async def _return(self) -> None:
        if self.pause is not None:
            await self.pause()

    def _expiry(self, ttl_s: int) -> int | None:
        if ttl_s > limits.CASSANDRA_MAX_TTL_S:  # as Cassandra refuses it
            raise StoreRefused(f"ttl is too large. requested ({ttl_s}) maximum "
                               f"({limits.CASSANDRA_MAX_TTL_S})")
        if ttl_s <= 0 or self.clock is None:
            return None
        return self.clock.now_ms() + ttl_s * 1000

    def _alive(self, expires: int | None) -> bool:
        return expires is None or self.clock is None or self.clock.now_ms() < expires

    def _readable(self, row: DueRow, expires: int | None) -> bool:
        """Whether a stored due row is read: alive, and not retired (`retired_hides`)."""
        if not self._alive(expires):
            return False
        hit = self.retired.get((row.minute, row.shard), {}).get(
            (row.slot_ms, row.entry, row.attempt))
        return hit is None or not self._alive(hit[1]) or not retired_hides(
            hit[0], hit[2], row.version, self.written.get(row.key, 0), self.retire_margin_ms)

    def _now(self) -> int:
        return self.clock.now_ms() if self.clock is not None else _system_ms()

    def due_rows(self, shard: int | None = None) -> list[DueRow]:
        """Every due row a read would return (of one shard, when given), in no particular
        order."""
        return [row for (_, k), rows in self.due.items() if shard is None or k == shard
                for row, expires in rows.values() if self._readable(row, expires)]

    # --- jobs ----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> JobRow | None:
        await self._enter()
        hit = self.jobs.get(job_id)
        await self._return()
        if hit is None or not self._alive(hit[1]):
            return None
        return replace(hit[0], ttl_s=0)  # like Cassandra: the TTL is not read back

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRow]:
        await self._enter()
        hits = {job_id: self.jobs.get(job_id) for job_id in job_ids}
        await self._return()
        return {job_id: replace(hit[0], ttl_s=0) for job_id, hit in hits.items()
                if hit is not None and self._alive(hit[1])}

    async def put_job(self, row: JobRow) -> None:
        await self._enter()
        self._put_job(row)

    def _put_job(self, row: JobRow) -> None:
        # Like Cassandra's INSERT with unset columns: a note or since_ms of None leaves the
        # stored one; CLEAR_NOTE removes the note.
        hit = self.jobs.get(row.job_id)
        old = hit[0] if hit is not None and self._alive(hit[1]) else None
        note = row.note if row.note is not None else (old.note if old is not None else None)
        since = row.since_ms if row.since_ms is not None else (
            old.since_ms if old is not None else None)
        self.jobs[row.job_id] = (replace(row, ttl_s=0, note=note or None, since_ms=since),
                                 self._expiry(row.ttl_s))

    async def put_jobs(self, rows: Sequence[JobRow]) -> None:
        for row in rows:
            await self.put_job(row)

    # --- due rows ------------------------------------------------------------------------
    async def put_due(self, row: DueRow, ttl_s: int) -> None:
        await self._enter()
        self._put_due(row, ttl_s)

    def _put_due(self, row: DueRow, ttl_s: int) -> None:
        bucket = self.due.setdefault((row.minute, row.shard), {})
        bucket[(row.slot_ms, row.entry, row.attempt)] = (row, self._expiry(max(1, ttl_s)))
        self.written[row.key] = self._now()

    async def put_due_and_job(self, row: DueRow, ttl_s: int, job: JobRow,
                              replaces: RetiredDue | None = None) -> None:
        if replaces is None or replaces.key == row.key:
            await self.put_dues_and_jobs([(row, ttl_s, job)])
            return
        await self._enter()
        self._check_batch([(row, ttl_s, job)])
        self._expiry(max(1, ttl_s))
        self._expiry(job.ttl_s)
        self._expiry(max(1, replaces.ttl_s))
        self._retire(replaces)  # no await from here: atomic
        self._put_due(row, ttl_s)
        self._put_job(job)

    def _retire(self, retired: RetiredDue) -> None:
        minute, shard, slot_ms, entry, attempt = retired.key
        self.retired.setdefault((minute, shard), {})[(slot_ms, entry, attempt)] = (
            retired.version, self._expiry(max(1, retired.ttl_s)), self._now())

    async def put_dues_and_jobs(self, rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        await self._enter()
        self._check_batch(rows)
        for _row, ttl_s, job in rows:  # everything checked first: all or nothing
            self._expiry(max(1, ttl_s))
            self._expiry(job.ttl_s)
        for row, ttl_s, job in rows:  # no await in between: atomic
            self._put_due(row, ttl_s)
            self._put_job(job)

    def _check_batch(self, rows: Sequence[tuple[DueRow, int, JobRow | None]]) -> None:
        size = sum(_rows_bytes(due, job) for due, _ttl, job in rows)
        if size > self.batch_fail_bytes:
            # Cassandra's own words, so that tests and reasons read the same on both stores.
            raise StoreRefused(f"Batch too large ({size} bytes, batch_size_fail_threshold "
                               f"{self.batch_fail_bytes})")
        if size > self.batch_warn_bytes and all(job is not None for _d, _t, job in rows):
            self.warnings.append(f"Batch for [due, jobs] of {len(rows)} jobs is of size "
                                 f"{size}, exceeding specified threshold of "
                                 f"{self.batch_warn_bytes}")

    async def retire_due(self, retired: RetiredDue) -> None:
        await self._enter()
        self._retire(retired)

    async def read_bucket(self, minute: int, shard: int, *, from_slot_ms: int | None = None,
                          page_rows: int = 5000) -> AsyncIterator[list[DueRow]]:
        # Each page is read when it is asked for, from where the last one ended: rows written
        # meanwhile behind that point are seen, as with Cassandra's paging state.
        after: _Key | None = None
        while True:
            await self._enter()
            bucket = self.due.get((minute, shard), {})
            keys = sorted(k for k in bucket
                          if (from_slot_ms is None or k[0] >= from_slot_ms)
                          and (after is None or k > after) and self._alive(bucket[k][1]))
            page = keys[:page_rows]
            # As Cassandra's store does: a page of stored rows, then its retired ones left out.
            rows = [bucket[k][0] for k in page if self._readable(*bucket[k])]
            await self._return()
            if rows:
                yield rows
            if len(keys) <= page_rows:
                return
            after = page[-1]

    # --- bucket counts -------------------------------------------------------------------
    async def add_bucket_count(self, shard: int, minute: int, rows: int) -> None:
        await self._enter()
        self.counts[(shard, minute)] = self.counts.get((shard, minute), 0) + rows

    async def add_bucket_counts(self, shard: int, counts: Mapping[int, int],
                                in_flight: int | None = None) -> None:
        if in_flight is not None and in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, got {in_flight}")
        self.count_calls.append(in_flight)
        await self._enter()
        for minute, rows in counts.items():
            self.counts[(shard, minute)] = self.counts.get((shard, minute), 0) + rows

    async def bucket_counts(self, shard: int, from_minute: int, to_minute: int) -> dict[int, int]:
        await self._enter()
        counts = {m: n for (k, m), n in self.counts.items()
                  if k == shard and from_minute <= m <= to_minute}
        await self._return()
        return counts

    # --- clock, idempotency, meta --------------------------------------------------------
    async def clock_sample(self) -> tuple[int, int, int]:
        await self._enter()
        sent = _system_ms()
        # The "server" reads the store's clock: a node sharing that clock measures no skew.
        server = self.clock.now_ms() if self.clock is not None else sent
        return server, sent, sent

    async def swap_claim(self, consumer: str, occurrence: str, expected: Claim | None,
                         new: Claim, worker: str, ttl_s: int) -> tuple[bool, Claim | None]:
        await self._enter()
        hit = self.claims.get((consumer, occurrence))
        current = hit[0] if hit is not None and self._alive(hit[2]) else None
        if current != expected:
            return False, current
        self.claims[(consumer, occurrence)] = (new, worker, self._expiry(max(1, ttl_s)))
        return True, None

    async def release_claim(self, consumer: str, occurrence: str, owner: str) -> None:
        await self._enter()
        hit = self.claims.get((consumer, occurrence))
        if hit is not None and hit[0].state == "running" and hit[0].owner == owner:
            del self.claims[(consumer, occurrence)]

    # --- requests ----------------------------------------------------------------------
    async def get_request(self, shard: int, job_id: str, request_id: str) -> RequestRow | None:
        await self._enter()
        hit = self.requests.get((shard, job_id, request_id))
        await self._return()
        if hit is None or not self._alive(hit[1]):
            return None
        return replace(hit[0], ttl_s=0)

    async def shard_requests(self, shard: int) -> list[RequestRow]:
        await self._enter()
        rows = [replace(row, ttl_s=0) for (k, _, _), (row, expires) in sorted(
            self.requests.items()) if k == shard and self._alive(expires)]
        await self._return()
        return rows

    async def put_request(self, request: RequestRow,
                          dues: Sequence[tuple[DueRow, int]] = ()) -> None:
        await self._enter()
        if dues:
            self._check_batch([(row, ttl_s, None) for row, ttl_s in dues])
        self._expiry(request.ttl_s)
        for _row, ttl_s in dues:
            self._expiry(max(1, ttl_s))
        for row, ttl_s in dues:  # no await in between: atomic
            self._put_due(row, ttl_s)
        self.requests[(request.shard, request.job_id, request.request_id)] = (
            replace(request, ttl_s=0), self._expiry(request.ttl_s))

    # --- listing -------------------------------------------------------------------------
    async def list_jobs(self, query: JobQuery) -> JobPage:
        """In job id order; the page token is the last job id read."""
        await self._enter()
        after = _decode_token(query.page_token)
        ids = sorted(j for j in self.jobs if after is None or j > after)
        found: list[JobSummary] = []
        last = None
        for read, job_id in enumerate(ids, 1):
            row, expires = self.jobs[job_id]
            last = job_id
            if self._alive(expires) and _matches(row, query):
                found.append(JobSummary(row.job_id, row.shard, row.status, row.tenant,
                                        row.scheduled_ms, row.version, row.note))
            if len(found) >= query.limit or read >= LIST_SCAN_ROWS:
                break
        await self._return()
        more = last is not None and last != (ids[-1] if ids else None)
        return JobPage(found, _encode_token(last) if more and last is not None else None)

    async def get_meta(self, name: str) -> str | None:
        await self._enter()
        return self.meta.get(name)

    # --- overlap leases --------------------------------------------------------------------
    async def swap_run(self, scope: str, job_id: str, expected: RunLease | None,
                       new: RunLease, ttl_s: int) -> tuple[bool, RunLease | None]:
        await self._enter()
        hit = self.runs.get((scope, job_id))
        current = hit[0] if hit is not None and self._alive(hit[1]) else None
        if current != expected:
            return False, current
        self.runs[(scope, job_id)] = (new, self._expiry(max(1, ttl_s)))
        return True, None

    async def end_run(self, scope: str, job_id: str, owner: str) -> None:
        await self._enter()
        hit = self.runs.get((scope, job_id))
        if hit is not None and hit[0].owner == owner:
            del self.runs[(scope, job_id)]

    # --- calendars -------------------------------------------------------------------------
    async def get_calendar(self, name: str) -> frozenset[date] | None:
        await self._enter()
        dates = self.calendars.get(name)
        await self._return()
        return dates

    async def put_calendar(self, name: str, dates: frozenset[date]) -> None:
        await self._enter()
        self.calendars[name] = frozenset(dates)

    async def delete_calendar(self, name: str) -> None:
        await self._enter()
        self.calendars.pop(name, None)


def _rows_bytes(due: DueRow, job: JobRow | None) -> int:
    """What Cassandra would count for a due row and its jobs row in a batch (an estimate
    that errs high, as `limits.job_rows_bytes`)."""
    return limits.job_rows_bytes(
        job_id=due.job_id, topic=due.topic, payload_len=len(due.payload),
        spec_len=len(job.spec) if job is not None else 0,
        recurring=False, headers=due.headers) \
        + len(due.spec or b"")


def _matches(row: JobRow, query: JobQuery) -> bool:
    return (query.tenant is None or row.tenant == query.tenant) \
        and (query.status is None or row.status == query.status) \
        and (query.prefix is None or row.job_id.startswith(query.prefix)) \
        and (query.due_before_ms is None
             or (row.scheduled_ms is not None and row.scheduled_ms < query.due_before_ms)) \
        and (query.due_after_ms is None
             or (row.scheduled_ms is not None and row.scheduled_ms >= query.due_after_ms))


_TOKEN_PREFIX = "m1:"


def _encode_token(job_id: str) -> str:
    return _TOKEN_PREFIX + job_id.encode().hex()


def _decode_token(token: str | None) -> str | None:
    if token is None:
        return None
    try:
        if not token.startswith(_TOKEN_PREFIX):
            raise ValueError
        return bytes.fromhex(token[len(_TOKEN_PREFIX):]).decode()
    except ValueError:
        raise ValueError(f"page token {token!r}: not a token of this store") from None
