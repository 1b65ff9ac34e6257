"""What the node and the worker need from storage. Pure types and a Protocol: no driver here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from chronowheel.core import wire
from chronowheel.core.buckets import minute_of

if TYPE_CHECKING:
    from chronowheel.core.model import JobSpec, JobStatus, Retry
    from chronowheel.core.runs import RunRecord


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    shard: int
    spec: bytes
    version: int
    status: JobStatus
    scheduled_ms: int | None
    slot_ms: int | None
    # Seconds until the row expires (0 = never): finished one-shots and cancelled jobs are
    # remembered for the retention period, which bounds how long re-submits are no-ops.
    ttl_s: int = 0
    tenant: str | None = None
    """The job's `tenant`, copied out of the spec so that jobs can be listed by it."""
    note: str | None = None
    """Why the job is paused (a pause's `note`). Written as a three-way choice, so that the
    rows written at every fire cost nothing for it: None leaves what is stored, `CLEAR_NOTE`
    removes it, any other text replaces it. Read back as None when there is none."""
    since_ms: int | None = None
    """The scheduled instant this version of the job's schedule starts from (its first
    occurrence when stored, the withheld one when resumed): a streak of failed runs
    (`pause_after_failures`) counts runs from it on. None leaves what is stored."""


CLEAR_NOTE = ""
"""`JobRow.note` that removes a stored note (a resume, a cancel)."""


DueKey = tuple[int, int, int, str, int]
"""The primary key of a due row: (minute, shard, slot_ms, entry, attempt)."""


@dataclass(frozen=True, slots=True)
class RetiredDue:
    """A due row taken back before it was published (a cancel, an edit, a pause): reads of its
    bucket leave out the row at `key` while its version is at most `version`, so a row written
    there later by a newer version of the job (a re-submit after a cancel) is read again.

    Retiring writes a row of its own instead of deleting: a delete is a tombstone, and a hot
    minute in which most jobs were cancelled or moved would make the loader's read of it meet
    more tombstones than Cassandra warns of (1,000 per read) or serves (100,000)."""

    key: DueKey
    version: int
    ttl_s: int
    """How long the retirement must be kept: as long as the row it hides may live (its slot
    plus the retention period, counted from now)."""


def retire_margin_ms(retention_ms: int) -> int:
    """How much later than a retirement a row of its key and version may have been written and
    still be hidden by it (`retired_hides`): half the retention period. A job's versions start
    again only once its jobs row has expired, at least the retention period after its last
    change (every jobs row lives at least that long), so a re-submit is written at least that
    long after the retirement; half of it leaves the other half for clocks that disagree. (The
    clock check stops a node's dispatch beyond `max_clock_skew_ms`, not its writes: ingest goes
    on, so a node's writes may carry a clock well off.)"""
    return retention_ms // 2


def retired_hides(retired_version: int, retired_written: int, row_version: int,
                  row_written: int, margin: int) -> bool:
    """Whether a retirement hides a due row of its key (write times and margin in one unit).

    By version, since a job's versions grow with every change: a newer version written at the
    same key (a re-submit after a cancel) is read. But once a job's jobs row has expired (the
    retention period after a cancel), its versions start again at 1, while a retirement may
    live on until its row's slot plus retention; a re-submit for the same instant then writes
    the same key and version at least the retention period after the retirement. So a row
    written more than `margin` (`retire_margin_ms`) after the retirement is not hidden either.
    (Write times alone would be a delete's rule, last write wins, which the clocks of two nodes
    may get wrong for writes close together: those the versions order.)"""
    return row_version <= retired_version and row_written <= retired_written + margin


@dataclass(frozen=True, slots=True)
class DueRow:
    """One pending occurrence, with everything needed to publish it."""

    minute: int
    shard: int
    slot_ms: int
    job_id: str
    attempt: int
    scheduled_ms: int
    version: int
    topic: str
    payload: bytes
    headers: tuple[tuple[str, str], ...]
    spec: bytes | None  # recurring jobs only
    max_attempts: int = wire.DEFAULT_MAX_ATTEMPTS
    backoff_ms: int = wire.DEFAULT_BACKOFF_MS
    origin: str = ""
    """"" for the schedule's own occurrences (and retries); `wire.TRIGGER_ORIGIN` or
    `wire.BACKFILL_ORIGIN` for one a command asked for."""
    request_id: str = ""
    """The request id of that command (with an origin only)."""

    @property
    def entry(self) -> str:
        """What tells this row apart from other rows of the job at the same slot and attempt:
        the job id, or for a requested occurrence its own occurrence key (stored in the
        `job_id` column, so that any number of them can share a slot)."""
        if not self.origin:
            return self.job_id
        return wire.requested_occurrence_id(self.job_id, self.scheduled_ms, self.origin,
                                            self.request_id)

    @property
    def key(self) -> DueKey:
        """This row's primary key."""
        return (self.minute, self.shard, self.slot_ms, self.entry, self.attempt)

    @classmethod
    def for_job(cls, job: JobSpec, *, shard: int, slot_ms: int, scheduled_ms: int,
                version: int, spec: bytes | None = None) -> DueRow:
        """One of the job's own occurrences (its first delivery), published at `slot_ms`: with
        the headers every occurrence carries (`JobSpec.fired_headers`) and, for a recurring
        job, the spec its next occurrence is computed from (`spec`, the stored bytes, when the
        caller has them; else the job's canonical JSON)."""
        spec = (job.canonical if spec is None else spec) if job.recurring else None
        return cls(minute_of(slot_ms), shard, slot_ms, job.id, 1, scheduled_ms, version,
                   job.topic, job.payload, job.fired_headers, spec, job.max_attempts,
                   job.backoff_ms)

    @classmethod
    def for_request(cls, job: JobSpec, *, shard: int, slot_ms: int, scheduled_ms: int,
                    version: int, origin: str, request_id: str) -> DueRow:
        """An occurrence a trigger or a backfill asked for (`origin`, `request_id`): the job's
        own headers, and no spec (nothing is scheduled after it)."""
        return cls(minute_of(slot_ms), shard, slot_ms, job.id, 1, scheduled_ms, version,
                   job.topic, job.payload, job.headers, None, job.max_attempts,
                   job.backoff_ms, origin, request_id)

    @classmethod
    def for_retry(cls, cmd: Retry, *, shard: int, slot_ms: int) -> DueRow:
        """The delivery a worker's retry command asks for, published at `slot_ms`: the job's
        own headers, and the job's fields the retry carries as the headers a first delivery
        has them in (`cw-concurrency` when not allow, `cw-pause-after-failures`)."""
        extra: tuple[tuple[str, str], ...] = ()
        if cmd.concurrency != wire.CONCURRENCY_ALLOW:
            extra += ((wire.CONCURRENCY, cmd.concurrency),)
        if cmd.pause_after_failures is not None:
            extra += ((wire.PAUSE_AFTER_FAILURES, str(cmd.pause_after_failures)),)
        return cls(minute_of(slot_ms), shard, slot_ms, cmd.id, cmd.attempt, cmd.scheduled_ms,
                   0, cmd.topic, cmd.payload, (*cmd.headers, *extra) if extra else cmd.headers,
                   None,
                   wire.DEFAULT_MAX_ATTEMPTS if cmd.max_attempts is None else cmd.max_attempts,
                   wire.DEFAULT_BACKOFF_MS if cmd.backoff_ms is None else cmd.backoff_ms,
                   cmd.origin, cmd.request_id)


def job_id_of_entry(entry: str, scheduled_ms: int, origin: str, request_id: str) -> str:
    """The job id inside `DueRow.entry` (the inverse of `requested_occurrence_id`)."""
    if not origin:
        return entry
    suffix = f"@{scheduled_ms}/{origin}/{request_id}"
    if not entry.endswith(suffix):
        raise ValueError(f"due row entry {entry!r} does not end with {suffix!r}")
    return entry[: -len(suffix)]


@dataclass(frozen=True, slots=True)
class RequestRow:
    """A trigger or backfill request of one job, or a dead letter's redrive (table
    `job_requests`).

    Its presence makes a re-sent request a no-op. A backfill hands its occurrences to the due
    table in chunks: `next_ms` is the first scheduled instant not handed over yet (None when
    all are), written in the same logged batch as the chunk's due rows.
    """

    shard: int
    job_id: str
    request_id: str
    kind: str  # wire.TRIGGER_ORIGIN | wire.BACKFILL_ORIGIN | "redrive" (client.dead)
    from_ms: int
    to_ms: int
    next_ms: int | None
    total: int
    handed: int
    """Occurrences handed to the due table so far."""
    spec: bytes
    """The job's spec when the request was applied: topic, payload and headers come from it."""
    ttl_s: int = 0


LIST_SCAN_ROWS = 5_000
"""A listing page stops after reading this many rows (a `prefix` filter is applied to what
the store reads: a rare prefix must not make one page read the whole table)."""
MAX_LIST_LIMIT = 1_000
JOB_STATUSES: tuple[JobStatus, ...] = ("scheduled", "paused", "finished", "cancelled")


@dataclass(frozen=True, slots=True)
class JobQuery:
    """Filters of a job listing; None means any. `due_before_ms` keeps jobs whose pending
    occurrence (`scheduled_ms`) is before it, `due_after_ms` those whose pending occurrence
    is at or after it; `prefix` keeps job ids starting with it."""

    tenant: str | None = None
    status: str | None = None
    prefix: str | None = None
    due_before_ms: int | None = None
    limit: int = 100
    page_token: str | None = None
    due_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class JobSummary:
    job_id: str
    shard: int
    status: str
    tenant: str | None
    scheduled_ms: int | None
    version: int
    note: str | None = None
    """Why the job is paused (`JobRow.note`), None when there is no note."""


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobSummary]
    next_token: str | None
    """Pass as `page_token` (with the same filters) for the next page; None: no more."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's idempotency record of one occurrence (table `processed`).

    `state` is "running" (a lease), "failed" or "done"; `attempt` is the delivery it is about;
    `owner` is a random token of the handling that wrote it, so a compare-and-set on the whole
    record is also a check of who holds the lease.
    """

    state: str
    attempt: int
    owner: str


@dataclass(frozen=True, slots=True)
class RunLease:
    """The running occurrence of a job under an overlap policy (table `job_runs`)."""

    occurrence: str
    owner: str
    worker: str
    cancel: bool = False


class JobStore(Protocol):
    """Storage of jobs, due rows, bucket counts, worker claims and namespace facts.

    Implementations: `store/cassandra.py` (production), `store/memory.py` (tests); one contract
    suite (tests/contract/job_store.py) runs against both.

    Every method retries transient failures itself and, once they are exhausted, raises a
    `RetriableError` (Cassandra: `CassandraError`) naming the operation; nothing else is
    raised on purpose. A write that raised may or may not have been applied. Writes are
    upserts: writing a row whose key exists replaces it. A TTL of 0 means "never expires";
    other TTLs are at least one second.
    """

    async def get_job(self, job_id: str) -> JobRow | None:
        """The jobs row of `job_id`, None when there is none (or it expired). The returned
        row's `ttl_s` is always 0: the remaining TTL is not read back."""
        ...

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRow]:
        """job id -> jobs row for those of `job_ids` that have one (as `get_job` returns it);
        ids without a row are absent. Read in few requests: for applying many commands."""
        ...

    async def put_job(self, row: JobRow) -> None:
        """Write (replace) the jobs row of `row.job_id`, expiring after `row.ttl_s`."""
        ...

    async def put_jobs(self, rows: Sequence[JobRow]) -> None:
        """`put_job` of every row, in few requests (bulk loads and tools). Not atomic: after a
        failure some rows may be written."""
        ...

    async def put_due(self, row: DueRow, ttl_s: int) -> None:
        """Write (replace) the due row keyed (minute, shard, slot_ms, job_id, attempt),
        expiring after `ttl_s` seconds (at least 1)."""
        ...

    async def put_due_and_job(self, row: DueRow, ttl_s: int, job: JobRow,
                              replaces: RetiredDue | None = None) -> None:
        """Both rows, atomically (a logged batch): never one without the other. `replaces`,
        the job's previous due row, is retired in the same batch (unless it has the new row's
        own key, which the new row overwrites), so a write the store refuses leaves the
        previous row as it was."""
        ...

    async def put_dues_and_jobs(self, rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        """Every (due row, its TTL in seconds, jobs row) of `rows`, atomically (one logged
        batch): all of them or none. The caller keeps the group small (Cassandra warns about
        and refuses batches over its batch size thresholds)."""
        ...

    async def retire_due(self, retired: RetiredDue) -> None:
        """Take one due row back (see `RetiredDue`): reads of its bucket no longer return it.
        Retiring a row that does not exist, or twice, is fine."""
        ...

    async def add_bucket_count(self, shard: int, minute: int, rows: int) -> None:
        """Add `rows` to the counter of bucket (minute, shard). Not idempotent: a retried
        call may count twice (counts are an upper bound, used to skip empty minutes)."""
        ...

    async def add_bucket_counts(self, shard: int, counts: Mapping[int, int],
                                in_flight: int | None = None) -> None:
        """`add_bucket_count(shard, minute, rows)` for every minute -> rows of `counts`, in
        few requests, at most `in_flight` at a time (None: the store's own bound). Not atomic
        and not idempotent either: after a failure some minutes may be counted (an upper
        bound stays an upper bound)."""
        ...

    async def bucket_counts(self, shard: int, from_minute: int, to_minute: int) -> dict[int, int]:
        """minute -> count for every counted minute of `shard` in [from_minute, to_minute],
        both ends inclusive; minutes never counted are absent."""
        ...

    def read_bucket(self, minute: int, shard: int, *, from_slot_ms: int | None = None,
                    page_rows: int = 5000) -> AsyncIterator[list[DueRow]]:
        """The due rows of bucket (minute, shard) with slot_ms >= from_slot_ms (inclusive;
        all when None), ordered by (slot_ms, job_id, attempt), in non-empty pages of at most
        `page_rows`. Each page is read when asked for, continuing after the last row of the
        previous one: a row written meanwhile after that point is seen, one before it is not.
        Retired rows (`retire_due`) are left out; a page may then hold fewer rows.
        Close the iterator (`contextlib.aclosing`) when stopping early."""
        ...

    async def clock_sample(self) -> tuple[int, int, int]:
        """(Cassandra's now() in epoch ms, local ms when sent, local ms when answered)."""
        ...

    async def swap_claim(self, consumer: str, occurrence: str, expected: Claim | None,
                         new: Claim, worker: str, ttl_s: int) -> tuple[bool, Claim | None]:
        """Compare-and-set the claim of (consumer, occurrence): when the stored claim equals
        `expected` (None: there is none) store `new` for `ttl_s` seconds and return
        (True, None); otherwise change nothing and return (False, the stored claim or None)."""
        ...

    async def release_claim(self, consumer: str, occurrence: str, owner: str) -> None:
        """Delete the claim when it is a "running" lease held by `owner`; else do nothing."""
        ...

    async def get_request(self, shard: int, job_id: str, request_id: str) -> RequestRow | None:
        """The request row, None when there is none (or it expired); `ttl_s` reads as 0."""
        ...

    async def shard_requests(self, shard: int) -> list[RequestRow]:
        """Every live request row of `shard` (a backfill in progress has `next_ms` set)."""
        ...

    async def put_request(self, request: RequestRow,
                          dues: Sequence[tuple[DueRow, int]] = ()) -> None:
        """Write (replace) the request row and the due rows of `dues` (each with its TTL in
        seconds) atomically, in one logged batch. The caller keeps `dues` small."""
        ...

    async def list_jobs(self, query: JobQuery) -> JobPage:
        """One page of jobs rows matching every filter of `query`: at most `query.limit`
        (possibly fewer, even none, with a `next_token` when more may follow: a page stops
        after reading a bounded number of rows). Order is the store's own, stable across
        pages. Raises ValueError for a page token that is not one this store gave."""
        ...

    async def get_meta(self, name: str) -> str | None:
        """A namespace fact written at init (e.g. "shards"), None when absent."""
        ...

    async def swap_run(self, scope: str, job_id: str, expected: RunLease | None,
                       new: RunLease, ttl_s: int) -> tuple[bool, RunLease | None]:
        """Compare-and-set the running lease of (scope, job): when the stored lease equals
        `expected` (None: there is none) store `new` for `ttl_s` seconds and return (True,
        None); otherwise change nothing and return (False, the stored lease or None)."""
        ...

    async def end_run(self, scope: str, job_id: str, owner: str) -> None:
        """Delete the running lease of (scope, job) when `owner` holds it; else nothing."""
        ...

    async def get_calendar(self, name: str) -> frozenset[date] | None:
        """The dates of the named calendar, None when there is no such calendar (a calendar
        put with no dates reads back as an empty set, not None)."""
        ...

    async def put_calendar(self, name: str, dates: frozenset[date]) -> None:
        """Create or replace the named calendar."""
        ...

    async def delete_calendar(self, name: str) -> None:
        """Delete the named calendar; deleting one that does not exist is fine."""
        ...


# --- the worker's storage --------------------------------------------------------------------
# What the worker library (`worker/`) keeps: per-partition leases and outcome marks (MarkStore),
# per-occurrence claims of retries (ClaimStore) and per-job run leases of the overlap policy
# (RunStore). Implementations: `store/cassandra_marks.py` and `store/cassandra.py` (Cassandra),
# `store/memory_worker.py` and `store/memory.py` (memory); one contract suite
# (tests/contract/worker_store.py) runs against both.

BLOCK_BITS = 16
"""Marks are stored in blocks of 2**16 offsets (one Cassandra partition each)."""


class Mark(NamedTuple):
    """The outcome of one handled record: `state` is "done", "failed", "skipped" or "dead";
    `occurrence` is its `cw-occurrence` (or `topic:partition@offset` for a malformed record)."""

    offset: int
    state: str
    occurrence: str


def block_of(offset: int) -> int:
    """The block (stored row group) of an offset's mark."""
    return offset >> BLOCK_BITS


class MarkRow(NamedTuple):
    """The marks of one partition in one write: ascending offsets, all in one block."""

    topic: str
    partition: int
    marks: Sequence[Mark]


MARK_WRITE_PARTITIONS = 10
"""The most mark rows (Cassandra partitions) one request writes: Cassandra warns about an
unlogged batch over more (its unlogged_batch_across_partitions_warn_threshold, 10)."""
MARK_WRITE_BYTES = 4_000
"""About the most bytes of mark rows in one request (their JSON and keys): under Cassandra's
`batch_size_warn_threshold` (5 KiB). A single row larger than that is written alone."""


class MarkStore(Protocol):
    """Where a worker's partition leases and outcome marks live.

    A lease is a TTL'd compare-and-set register per (scope, topic, partition) naming its
    owner; marks are plain writes, read back by offset range.
    """

    async def acquire_lease(self, scope: str, topic: str, partition: int, owner: str,
                            ttl_s: int) -> str | None:
        """Take the lease if nobody holds it. None when taken, else the current owner."""
        ...

    async def renew_lease(self, scope: str, topic: str, partition: int, owner: str,
                          ttl_s: int) -> str | None:
        """Extend a lease `owner` holds. None when extended, else the current owner ("" = none)."""
        ...

    async def release_lease(self, scope: str, topic: str, partition: int, owner: str) -> None:
        """Drop the lease if `owner` still holds it."""
        ...

    async def write_marks(self, scope: str, rows: Sequence[MarkRow], ttl_s: int) -> int:
        """Store each row's marks (ascending offsets, all in one block; one row per partition
        and block) durably for `ttl_s` seconds; returns the requests it took. Rows of several
        partitions may go in one request, so a worker's round of marks costs one request per
        `MARK_WRITE_PARTITIONS` rows rather than one per partition. A failure may leave some
        rows written (harmless: a mark only lets a redelivery be skipped)."""
        ...

    async def read_marks(self, scope: str, topic: str, partition: int, from_offset: int,
                         to_offset: int) -> list[Mark]:
        """Every stored mark with offset >= from_offset, in any order. `to_offset` is the end
        of the partition as the caller knows it; marks past it must be returned too (up to
        the first whole block without marks)."""
        ...


class ClaimStore(Protocol):
    """The per-occurrence ledger of retries (table `processed`); see `JobStore.swap_claim`."""

    async def swap_claim(self, consumer: str, occurrence: str, expected: Claim | None,
                         new: Claim, worker: str, ttl_s: int) -> tuple[bool, Claim | None]:
        """Compare-and-set the claim of (consumer, occurrence): when the stored claim equals
        `expected` (None: there is none) store `new` for `ttl_s` seconds and return
        (True, None); otherwise change nothing and return (False, the stored claim or None)."""
        ...

    async def release_claim(self, consumer: str, occurrence: str, owner: str) -> None:
        """Delete the claim when it is a "running" lease held by `owner`; else do nothing."""
        ...


class RunStore(Protocol):
    """The running occurrence of each job under an overlap policy (table `job_runs`)."""

    async def swap_run(self, scope: str, job_id: str, expected: RunLease | None,
                       new: RunLease, ttl_s: int) -> tuple[bool, RunLease | None]:
        """Compare-and-set the running lease of (scope, job): when the stored lease equals
        `expected` (None: there is none) store `new` for `ttl_s` seconds and return (True,
        None); otherwise change nothing and return (False, the stored lease or None)."""
        ...

    async def end_run(self, scope: str, job_id: str, owner: str) -> None:
        """Delete the running lease of (scope, job) when `owner` holds it; else nothing."""
        ...


RUN_WRITE_JOBS = 10
"""The most jobs (partitions) one run history request writes: Cassandra warns about an
unlogged or counter batch over more partitions (its unlogged_batch_across_partitions_warn_
threshold, 10). Ten jobs' rows in one request cost the writing process about a fifth of the
CPU of ten requests (loadtest/RESULTS.md, "Run history's cost on the worker")."""
RUN_WRITE_BYTES = 4_000
"""About the most bytes of run rows in one request (strings and integers): under Cassandra's
`batch_size_warn_threshold` (5 KiB)."""


T = TypeVar("T")


def by_replicas(items: Sequence[T], replicas_of: Callable[[T], Any]) -> list[list[T]]:
    """`items` in groups whose partitions have the same replicas, in their order; an item whose
    replicas are unknown goes alone. `replicas_of`: an item's partition replicas (the driver's
    token map; hosts with an `endpoint`, or any values)."""
    groups: dict[Any, list[T]] = {}
    for i, item in enumerate(items):
        try:
            hosts = replicas_of(item)
        except Exception:  # no token map yet: alone is always right
            hosts = None
        key = frozenset(str(getattr(h, "endpoint", h)) for h in hosts) if hosts else None
        groups.setdefault(key if key else ("alone", i), []).append(item)
    return list(groups.values())


def same_replicas(job_ids: Sequence[str],
                  replicas_of: Callable[[bytes], Any]) -> list[list[str]]:
    """`job_ids` in groups whose partitions (keyed by the job id alone) have the same replicas
    (`by_replicas`); `replicas_of` takes the partition key."""
    return by_replicas(job_ids, lambda job_id: replicas_of(job_id.encode()))


Permits = AbstractAsyncContextManager[Any]
"""What bounds the run history requests in flight (the writer's `asyncio.Semaphore` of
`history_writes_in_flight`): a store enters it once per request, for as long as the request
is in flight."""


def permit(permits: Permits | None) -> Permits:
    """`async with permit(permits)` around one request: a hold on `permits` (None: no bound)."""
    return nullcontext() if permits is None else permits


class RunHistoryStore(Protocol):
    """Run history and per-job counters (tables `run_history`, `run_counters`; pure types in
    `core/runs.py`). Implementations: `store/cassandra_history.py` and
    `store/memory_history.py`; one contract suite (tests/contract/run_history.py) runs against
    both. Written in batches off the hot path by `history.RunRecorder`; errors as for
    `JobStore` (a retriable error once retries are exhausted)."""

    async def write_runs(self, job_id: str, runs: Sequence[RunRecord], ttl_s: int) -> None:
        """Upsert `runs` (all of job `job_id`: one partition) keyed by `RunRecord.key`,
        setting only the fields each record knows (not None), so the node's and the worker's
        records of one run combine in either order; every written field expires after
        `ttl_s` seconds (at least 1)."""
        ...

    async def add_run_counts(self, job_id: str, counts: Mapping[str, int]) -> None:
        """Add `counts` (a name of `core.runs.COUNTERS` -> n) to the job's counters. Not
        idempotent (a retried call may count twice) and never expiring."""
        ...

    async def write_runs_of_jobs(self, runs: Mapping[str, Sequence[RunRecord]], ttl_s: int,
                                 permits: Permits | None = None) -> int:
        """`write_runs` of several jobs (job id -> its runs; at most `RUN_WRITE_JOBS` of
        them) in one request per group of jobs with the same replicas (`same_replicas`: one
        on a single node), each holding one of `permits` while in flight (`permit`), so a
        caller's bound on requests in flight holds however the write splits; returns the
        requests made (what `history_writes_per_s` counts)."""
        ...

    async def add_run_counts_of_jobs(self, counts: Mapping[str, Mapping[str, int]],
                                     permits: Permits | None = None) -> int:
        """`add_run_counts` of several jobs (job id -> its counts; at most `RUN_WRITE_JOBS`)
        in one request per group of jobs with the same replicas, each holding one of
        `permits` while in flight; returns the requests made (0 when every count is 0)."""
        ...

    async def job_runs(self, job_id: str, limit: int) -> list[RunRecord]:
        """The job's newest `limit` runs: by scheduled instant, newest first (then attempt,
        highest first)."""
        ...

    async def run_counts(self, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """job id -> its counters, for those of `job_ids` with any."""
        ...

    async def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        """job id -> its newest run (as `job_runs(job_id, 1)`), for those with any."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerStores:
    """Everything a worker with idempotency keeps, named explicitly (no capability guessing).

    `runs` None: the store keeps no run leases, so the overlap policy (`concurrency` forbid or
    replace) is not enforced; the worker logs that and runs such occurrences.
    """

    marks: MarkStore
    claims: ClaimStore
    runs: RunStore | None
    history: RunHistoryStore | None = None
    """Where the worker records each run's outcome (None: it records none)."""
