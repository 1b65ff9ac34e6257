"""`SchedulerClient`: an async producer of wire-format v1 commands.

- Key = job id (UTF-8) and aiokafka's default partitioner (the Java client's murmur2), so every
  command lands directly on its job's shard partition of `<ns>.submit`.
- Each command is validated with the namespace's `ValidationPolicy` before it is sent: a
  `ValidationError` is raised by the call and nothing is sent. The node validates again at
  ingest (with its own clock and settings), so configure the client with the same
  `allowed_topics` / limits as the nodes, or a command accepted here may still be rejected to
  `<ns>.rejected`.
- Sends are batched: a call returns once the command is queued in the producer (it waits only
  when the producer's buffer is full), with a `Delivery` future for its acknowledgement.
  `flush()` and leaving the `async with` block wait for every acknowledgement and raise
  `DeliveryError` if any command could not be written.
- The producer is idempotent with acks=all: commands for one job keep their order.
- Schedule controls (`pause`, `resume`, `trigger`, `backfill`) are commands like the rest: the
  node applies them when it ingests them, and refuses those that do not fit the job's state
  (an unknown job, a one-shot to backfill) to `<ns>.rejected`.
- `list_jobs` reads the jobs table (Cassandra, opened on first use): it needs the
  `cassandra` setting besides `kafka`.
- `bulk` (and `bulk_pause`, `bulk_resume`, `bulk_cancel`, `bulk_trigger`) sends one command to
  every job a selector picks, listed like `list_jobs`: idempotent and resumable under an
  operation id (chronowheel.client.bulk).
- `dead_letters` lists `<ns>.dead` by job, tenant, failure time and reason; `redrive` sends each
  selected dead letter again as the next attempt of its occurrence, exactly once per letter
  (chronowheel.client.dead).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from chronowheel.core.model import (
    ValidationPolicy,
    encode_backfill,
    encode_cancel,
    encode_control,
    encode_delete_calendar,
    encode_put_calendar,
    encode_trigger,
    encode_upsert,
    instant_ms,
    parse_command,
    routing_key,
)
from chronowheel.core.runs import MAX_HISTORY_LIMIT, JobHistory, RunCounters
from chronowheel.errors import ChronowheelError, RetriableError, ValidationError
from chronowheel.ops.runs import open_history, read_counters, read_job_history
from chronowheel.settings import Settings
from chronowheel.store.base import (
    JOB_STATUSES,
    MAX_LIST_LIMIT,
    JobPage,
    JobQuery,
    JobStore,
    JobSummary,
    RunHistoryStore,
)

if TYPE_CHECKING:
    from chronowheel.client.bulk import BulkAction, BulkJournal, BulkProgress, BulkSummary
    from chronowheel.client.dead import DeadLetterPage, LetterReader, RedriveSummary

log = logging.getLogger(__name__)

Instant = datetime | int | str
"""An aware datetime, integer epoch milliseconds, or an RFC 3339 string with offset."""
Duration = timedelta | int | str
"""A timedelta, integer milliseconds, or a wire duration string like "1h30m"."""
Concurrency = Literal["allow", "forbid", "replace"]
"""A recurring job's overlap policy for workers (docs/worker.md, "Overlap policy")."""
Delivery = asyncio.Future[Any]
"""Resolves to the record's metadata (topic, partition, offset) once Kafka acknowledged it."""


class DeliveryError(ChronowheelError):
    """Some commands could not be written to Kafka. `failures` holds (job id, exception)."""

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        self.failures = failures
        first_id, first = failures[0]
        super().__init__(f"{len(failures)} command(s) not written to Kafka; first: "
                         f"{first_id!r}: {first!r}")


class _Producer(Protocol):
    """The part of aiokafka's AIOKafkaProducer the client uses (a fake one in unit tests)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   **kw: Any) -> Awaitable[Any]: ...


@dataclass(frozen=True)
class SubmitProgress:
    """Passed to submit_many's progress callback."""

    queued: int      # handed to the producer
    acked: int       # acknowledged by Kafka
    invalid: int     # refused by validation (skipped)
    failed: int      # not written (delivery errors)
    elapsed_s: float


@dataclass
class SubmitReport:
    """What submit_many did. `invalid` holds (index in the iterable, error)."""

    queued: int = 0
    acked: int = 0
    invalid: list[tuple[int, ValidationError]] = field(default_factory=list)
    failed: list[tuple[str, BaseException]] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.invalid and not self.failed


class SchedulerClient:
    """Use as `async with SchedulerClient(settings) as client:`, or start()/close().

    `settings` default to Settings.from_env() (CHRONOWHEEL_NAMESPACE, CHRONOWHEEL_KAFKA,
    CHRONOWHEEL_ALLOWED_TOPICS, ...). A `producer` passed in (anything with aiokafka's
    start/send/stop) is started but not stopped by the client: its owner stops it. A `store`
    passed in (a JobStore) is what `list_jobs` and `bulk` read instead of the namespace's
    Cassandra keyspace; its owner closes it. `dead_letters` (a
    chronowheel.client.dead.LetterReader) is what `dead_letters` and `redrive` read instead of
    the namespace's `<ns>.dead` topic.
    """

    def __init__(self, settings: Settings | None = None, *,
                 policy: ValidationPolicy | None = None, validate: bool = True,
                 linger_ms: int = 5, producer: _Producer | None = None,
                 now_ms: Callable[[], int] | None = None,
                 store: JobStore | None = None,
                 dead_letters: LetterReader | None = None,
                 history: RunHistoryStore | None = None) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self.policy = policy if policy is not None else ValidationPolicy.from_settings(
            self.settings)
        self.topic = self.settings.submit_topic
        self._validate = validate
        self._linger_ms = linger_ms
        self._producer = producer
        self._own_producer = producer is None
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._started = False
        self._closed = False
        self._pending: set[asyncio.Future[Any]] = set()
        self._failures: list[tuple[str, BaseException]] = []
        self.acked = 0
        self._store: JobStore | None = store
        self._own_store = store is None
        self._dead_read: LetterReader | None = dead_letters
        self._history: RunHistoryStore | None = history

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> SchedulerClient:
        if self._started:
            return self
        if self._producer is None:
            # Imported here so that validation-only use needs no Kafka library at import.
            from chronowheel.bus.kafka import plain_producer

            self._producer = plain_producer(self.settings, linger_ms=self._linger_ms)
        try:
            await self._producer.start()
        except Exception as exc:
            if self._own_producer:
                with contextlib.suppress(Exception):
                    await self._producer.stop()
                self._producer = None
            if getattr(exc, "retriable", False) or isinstance(exc, OSError):
                raise RetriableError(f"cannot reach Kafka at {self.settings.kafka}: "
                                     f"{exc}") from exc
            raise
        self._started = True
        return self

    async def close(self) -> None:
        """Wait for outstanding acknowledgements, then stop the producer (if the client made
        it). Raises DeliveryError after stopping if some command was not written."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            if self._store is not None and self._own_store:
                close = getattr(self._store, "close", None)
                if close is not None:
                    await asyncio.to_thread(close)
                self._store = None
            if self._started and self._own_producer and self._producer is not None:
                await self._producer.stop()

    async def __aenter__(self) -> SchedulerClient:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            await self.close()
            return
        try:  # an error is already on its way out: do not let a delivery error replace it
            await self.close()
        except DeliveryError as err:
            log.error("while handling %r: %s", exc, err)

    # --- commands -------------------------------------------------------------------------
    async def schedule(self, id: str, at: Instant, payload: Any = None, *,
                       topic: str | None = None, headers: Mapping[str, str] | None = None,
                       payload_b64: str | None = None, window: Duration | None = None,
                       max_attempts: int | None = None, backoff: Duration | None = None,
                       tenant: str | None = None,
                       max_lateness: Duration | None = None) -> Delivery:
        """A one-shot job: fire once at `at`. `payload` is any JSON value, or bytes (sent as
        payload_b64); None means an empty message value. With `max_lateness` it is not
        published at all if it cannot be within that long after `at` (recorded as missed)."""
        return await self.submit(_job_fields(
            id, {"at": at}, payload, topic=topic, headers=headers, payload_b64=payload_b64,
            window=window, max_attempts=max_attempts, backoff=backoff, tenant=tenant,
            max_lateness=max_lateness))

    async def cron(self, id: str, expr: str, tz: str = "UTC", payload: Any = None, *,
                   dst: Literal["skip", "cron"] | None = None, start: Instant | None = None,
                   end: Instant | None = None,
                   catch_up: Literal["coalesce", "all", "skip"] | None = None,
                   max_catch_up: int | None = None, topic: str | None = None,
                   headers: Mapping[str, str] | None = None, payload_b64: str | None = None,
                   window: Duration | None = None, max_attempts: int | None = None,
                   backoff: Duration | None = None, tenant: str | None = None,
                   exclude_dates: Iterable[date | str] | None = None,
                   calendar: str | None = None,
                   concurrency: Concurrency | None = None,
                   max_lateness: Duration | None = None,
                   pause_after_failures: int | None = None) -> Delivery:
        """A cron job read in IANA zone `tz` (5 fields, 6 with seconds first, or @daily...).

        `exclude_dates` (dates or `YYYY-MM-DD` strings) and the named `calendar`'s dates are
        local dates in `tz` on which it does not fire. `concurrency` is the workers' overlap
        policy (allow, forbid, replace; docs/worker.md). An occurrence that cannot be
        published within `max_lateness` of its instant is missed, not published. With
        `pause_after_failures` N the job is paused after N consecutive failed runs."""
        kind: dict[str, Any] = {"cron": expr}
        if tz != "UTC":  # the wire default: leaving it out keeps the canonical spec minimal
            kind["tz"] = tz
        days = None if exclude_dates is None else sorted(
            {d.isoformat() if isinstance(d, date) else d for d in exclude_dates})
        return await self.submit(_job_fields(
            id, kind, payload, topic=topic, headers=headers, payload_b64=payload_b64,
            window=window, max_attempts=max_attempts, backoff=backoff, tenant=tenant,
            dst=dst, start=start, end=end, catch_up=catch_up, max_catch_up=max_catch_up,
            exclude_dates=days, calendar=calendar, concurrency=concurrency,
            max_lateness=max_lateness, pause_after_failures=pause_after_failures))

    async def every(self, id: str, interval: Duration, payload: Any = None, *,
                    start: Instant | None = None, end: Instant | None = None,
                    catch_up: Literal["coalesce", "all", "skip"] | None = None,
                    max_catch_up: int | None = None, topic: str | None = None,
                    headers: Mapping[str, str] | None = None, payload_b64: str | None = None,
                    window: Duration | None = None, max_attempts: int | None = None,
                    backoff: Duration | None = None, tenant: str | None = None,
                    concurrency: Concurrency | None = None,
                    max_lateness: Duration | None = None,
                    pause_after_failures: int | None = None) -> Delivery:
        """A fixed-interval job (first occurrence at `start`, or when the node ingests it);
        `max_lateness` and `pause_after_failures` as for `cron`."""
        return await self.submit(_job_fields(
            id, {"every": interval}, payload, topic=topic, headers=headers,
            payload_b64=payload_b64, window=window, max_attempts=max_attempts, backoff=backoff,
            tenant=tenant, start=start, end=end, catch_up=catch_up, max_catch_up=max_catch_up,
            concurrency=concurrency, max_lateness=max_lateness,
            pause_after_failures=pause_after_failures))

    async def cancel(self, id: str) -> Delivery:
        """Cancel job `id`: no occurrence not yet published will fire."""
        if not isinstance(id, str):
            raise ValidationError("id", "must be a string", id)
        return await self._send(id, encode_cancel(id))

    async def pause(self, id: str, *, note: str | None = None) -> Delivery:
        """Pause job `id`: it publishes nothing until `resume`. `note` (why) is shown with
        the paused job (`job show`, `jobs list`) until it is resumed."""
        _check_id(id)
        return await self._send(id, encode_control("pause", id, note=note))

    async def resume(self, id: str) -> Delivery:
        """Resume paused job `id`; what the pause missed follows the job's catch_up policy
        (a one-shot past due fires at once)."""
        return await self._control("resume", id)

    async def trigger(self, id: str, *, request_id: str) -> Delivery:
        """Publish one occurrence of recurring job `id` now (header cw-triggered). Sending
        the same `request_id` again publishes nothing more."""
        _check_id(id)
        return await self._send(id, encode_trigger(id, request_id))

    async def backfill(self, id: str, start: Instant, end: Instant, *,
                       request_id: str) -> Delivery:
        """Publish the occurrences of recurring job `id` scheduled in [start, end) (at most
        10000; end not in the future), header cw-backfill.
        Sending the same `request_id` again publishes nothing more."""
        _check_id(id)
        try:
            raw = encode_backfill(id, request_id, start, end)
        except ValueError as exc:  # a naive datetime
            raise ValidationError("from", str(exc)) from None
        return await self._send(id, raw)

    async def _control(self, op: str, id: str) -> Delivery:
        _check_id(id)
        return await self._send(id, encode_control(op, id))

    # --- queries --------------------------------------------------------------------------
    async def list_jobs(self, *, tenant: str | None = None, status: str | None = None,
                        prefix: str | None = None, due_before: Instant | None = None,
                        limit: int = 100, page_token: str | None = None,
                        due_after: Instant | None = None) -> JobPage:
        """One page of jobs matching every given filter (see JobQuery); pass the page's
        `next_token` back, with the same filters, for the next one. A page may hold fewer
        than `limit` jobs, even none, and still have a next_token. `due_after` is
        inclusive, `due_before` exclusive."""
        query = job_query(tenant=tenant, status=status, prefix=prefix, due_before=due_before,
                          limit=limit, page_token=page_token, due_after=due_after)
        store = await self._job_store()
        try:
            return await store.list_jobs(query)
        except ValueError as exc:
            raise ValidationError("page_token", str(exc), page_token) from None

    async def iter_jobs(self, **filters: Any) -> AsyncIterator[JobSummary]:
        """Every job matching `filters` (as list_jobs takes them), page after page."""
        token = None
        while True:
            page = await self.list_jobs(**filters, page_token=token)
            for job in page.jobs:
                yield job
            token = page.next_token
            if token is None:
                return

    async def job_history(self, id: str, *, limit: int | None = None) -> JobHistory:
        """The job's last `limit` runs (default: the `history_limit` setting), newest first by
        scheduled instant, each with fired-at, lateness, node, handler start and end, outcome,
        attempt and worker, and its counters (fired, succeeded, failed, dead-lettered,
        skipped, missed, last outcome). A job with no recorded run has an empty history."""
        _check_id(id)
        n = self.settings.history_limit if limit is None else limit
        if not isinstance(n, int) or not 1 <= n <= MAX_HISTORY_LIMIT:
            raise ValidationError("limit", f"must be an integer 1..{MAX_HISTORY_LIMIT}", n)
        return await read_job_history(await self._history_store(), id, n)

    async def job_counters(self, ids: Sequence[str]) -> dict[str, RunCounters]:
        """Each job's counters and last outcome (zeros for a job with none)."""
        for id in ids:
            _check_id(id)
        counters, _ = await read_counters(await self._history_store(), list(ids))
        return counters

    async def _history_store(self) -> RunHistoryStore:
        if self._history is None:
            self._history = await open_history(await self._job_store(), self.settings)
        return self._history

    async def _job_store(self) -> JobStore:
        if self._store is None:
            from chronowheel.ops.cluster import open_store

            self._store = await open_store(self.settings)
        return self._store

    # --- bulk operations --------------------------------------------------------------------
    async def bulk(self, action: BulkAction, *, tenant: str | None = None,
                   status: str | None = None, prefix: str | None = None,
                   due_after: Instant | None = None, due_before: Instant | None = None,
                   operation_id: str | None = None, dry_run: bool = False,
                   journal: BulkJournal | None = None, window: int = 1000,
                   wait: float | None = None,
                   progress: Callable[[BulkProgress], None] | None = None,
                   progress_interval_s: float = 0.5) -> BulkSummary:
        """Send `action` (pause, resume, cancel or trigger) to every job matching every given
        filter (as `list_jobs` takes them, plus `due_after`, inclusive), listed through the
        store page by page, at most `window` commands unacknowledged at a time. Returns once
        every command is acknowledged (with `wait`: and applied by the nodes, at most `wait`
        seconds, the nodes' refusals read back from `<ns>.rejected`).

        Jobs already in the target state get nothing (a trigger: its request applied before),
        nor do jobs whose state the command does not fit (reported as refused, with the
        node's reason). `operation_id` (default: a new one, in the summary) names the
        operation: a trigger's request id is derived from it (`bulk:<operation id>`), and
        with a `journal` a second run of the same id (same action and filters) skips every
        job the first one had done. `dry_run` lists and sorts the jobs but sends nothing.
        Delivery failures are in the summary (`failed`), not raised."""
        from chronowheel.client import bulk as b

        selector = b.job_selector(tenant=tenant, status=status, prefix=prefix,
                                  due_after=due_after, due_before=due_before)
        op_id = b.check_operation_id(operation_id) if operation_id is not None \
            else b.new_operation_id(self._now_ms())
        if action not in b.ACTIONS:
            raise ValidationError("action", "must be one of " + ", ".join(b.ACTIONS), action)
        if wait is not None and (not isinstance(wait, int | float) or wait <= 0):
            raise ValidationError("wait", "must be a positive number of seconds", wait)

        async def send(job_id: str) -> Delivery:
            if action == "trigger":
                return await self.trigger(job_id, request_id=b.request_id_for(op_id, job_id))
            if action == "cancel":
                return await self.cancel(job_id)
            return await self._control(action, job_id)

        confirm: b.Confirm | None = None
        if wait is not None and not dry_run:
            from chronowheel.ops import applied

            since = await applied.rejected_ends(self.settings)
            timeout_s = float(wait)

            async def confirm(sent: Sequence[b.SentCommand]) -> Mapping[str, str]:
                where = {(c.partition, c.offset): c.job_id for c in sent
                         if c.partition is not None and c.offset is not None}
                await applied.wait_applied(self.settings, set(where), timeout_s=timeout_s)
                reasons = await applied.refusals(self.settings, set(where), since)
                return {where[at]: reason for at, reason in reasons.items()}

        operation = b.BulkOperation(
            action=action, selector=selector, operation_id=op_id,
            namespace=self.settings.namespace, store=await self._job_store(), send=send,
            journal=journal, dry_run=dry_run, window=window, progress=progress,
            progress_interval_s=progress_interval_s, confirm=confirm, now_ms=self._now_ms)
        failed0 = len(self._failures)
        try:
            return await operation.run()
        finally:
            del self._failures[failed0:]  # in the summary: flush() must not raise them again

    async def bulk_pause(self, **kw: Any) -> BulkSummary:
        """`bulk("pause", ...)`: pause every selected job."""
        return await self.bulk("pause", **kw)

    async def bulk_resume(self, **kw: Any) -> BulkSummary:
        """`bulk("resume", ...)`: resume every selected paused job."""
        return await self.bulk("resume", **kw)

    async def bulk_cancel(self, **kw: Any) -> BulkSummary:
        """`bulk("cancel", ...)`: cancel every selected job."""
        return await self.bulk("cancel", **kw)

    async def bulk_trigger(self, **kw: Any) -> BulkSummary:
        """`bulk("trigger", ...)`: one occurrence now of every selected recurring job."""
        return await self.bulk("trigger", **kw)

    # --- dead letters -----------------------------------------------------------------------
    async def dead_letters(self, *, job_id: str | None = None, tenant: str | None = None,
                           failed_after: Instant | None = None,
                           failed_before: Instant | None = None, reason: str | None = None,
                           letter: str | None = None, limit: int = 100,
                           page_token: str | None = None) -> DeadLetterPage:
        """One page of the dead letters of `<ns>.dead` matching every given filter, in
        (partition, offset) order: `failed_after` (inclusive) and `failed_before` (exclusive)
        bound `cw-failed-at`, `reason` is a substring (any case) of `cw-error` or `cw-reason`,
        `tenant` is looked up in the jobs table, `letter` is one letter's position
        (`<partition>@<offset>`, read from there alone). Pass the page's `next_token` back,
        with the same filters, for the next one (chronowheel.client.dead)."""
        from chronowheel.client import dead as d

        selector = d.dead_selector(job_id=job_id, tenant=tenant, failed_after=failed_after,
                                   failed_before=failed_before, reason=reason, letter=letter)
        return await d.list_page(self._dead_reader(), selector,
                                 d.store_tenants(await self._job_store()), limit=limit,
                                 page_token=page_token)

    async def redrive(self, *, job_id: str | None = None, tenant: str | None = None,
                      failed_after: Instant | None = None, failed_before: Instant | None = None,
                      reason: str | None = None, letter: str | None = None,
                      dry_run: bool = False, window: int = 100,
                      limit: int | None = None,
                      progress: Callable[[BulkProgress], None] | None = None,
                      progress_interval_s: float = 0.5) -> RedriveSummary:
        """Redrive every dead letter matching the filters (as `dead_letters` takes them; at
        most `limit`): one `retry` command each, the next attempt of its occurrence with the
        letter's payload and headers, due now. Exactly once per letter: the retry carries the
        letter's `redrive_id`, `redrive:<dead partition>:<offset>`, which a node applies once
        (two redrives of the letter at once deliver it once); its request id
        `redrive:<dead partition>@<offset>` is recorded once Kafka acknowledged the retry, and
        letters recorded before are skipped (`already`), by any later run. Letters that cannot
        be redriven (a payload-less stand-in, not an occurrence) are in `refused` with the
        reason. `dry_run` selects and sorts but sends nothing. Delivery failures are in the
        summary (`failed`), not raised. `letter="<partition>@<offset>"` selects that one
        letter (the console's redrive of a letter)."""
        from chronowheel.client import dead as d

        selector = d.dead_selector(job_id=job_id, tenant=tenant, failed_after=failed_after,
                                   failed_before=failed_before, reason=reason, letter=letter)

        async def send(job: str, value: bytes) -> Delivery:
            return await self._send(job, value)

        def check(value: bytes) -> object:
            return parse_command(value, key=None, policy=self.policy, now_ms=self._now_ms())

        run = d.Redrive(selector=selector, read=self._dead_reader(),
                        store=await self._job_store(), send=send,
                        shards=await self._shard_count(),
                        retention_s=max(1, self.settings.retention_ms // 1000),
                        dry_run=dry_run, window=window, limit=limit, progress=progress,
                        progress_interval_s=progress_interval_s, now_ms=self._now_ms,
                        check=check if self._validate else None)
        failed0 = len(self._failures)
        try:
            return await run.run()
        finally:
            del self._failures[failed0:]  # in the summary: flush() must not raise them again

    async def _shard_count(self) -> int:
        """The namespace's shards: the partitions of `<ns>.submit` (a redrive's request row
        goes to its job's shard, whatever `settings.shards` says); `settings.shards` when the
        client was given its producer (tests)."""
        if not self._own_producer:
            return self.settings.shards
        from chronowheel.bus.kafka import open_admin, partition_counts

        admin = await open_admin(self.settings)
        try:
            found = (await partition_counts(admin, [self.topic])).get(self.topic)
        finally:
            await admin.close()
        return found or self.settings.shards

    def _dead_reader(self) -> LetterReader:
        if self._dead_read is None:
            from chronowheel.client.dead import kafka_reader

            self._dead_read = kafka_reader(self.settings)
        return self._dead_read

    # --- calendars --------------------------------------------------------------------------
    async def put_calendar(self, name: str, dates: Iterable[date | str]) -> Delivery:
        """Create or replace the namespace's calendar `name`: the cron jobs that name it in
        `calendar` do not fire on these dates (read in each job's zone)."""
        if not isinstance(name, str):
            raise ValidationError("name", "must be a string", name)
        return await self._send(name, encode_put_calendar(name, dates))

    async def delete_calendar(self, name: str) -> Delivery:
        """Delete calendar `name`; jobs naming it then exclude nothing (docs/design.md)."""
        if not isinstance(name, str):
            raise ValidationError("name", "must be a string", name)
        return await self._send(name, encode_delete_calendar(name))

    async def submit(self, job_fields: Mapping[str, Any]) -> Delivery:
        """Upsert a job given as the wire's `job` object. Conveniences as in encode_upsert:
        datetimes for at/start/end, timedelta or int ms for every/window/backoff, bytes
        payload."""
        try:
            raw = encode_upsert(job_fields)
        except ValueError as exc:  # naive datetime, negative timedelta
            raise ValidationError("job", str(exc)) from None
        except TypeError as exc:  # orjson: a payload that is not JSON
            raise ValidationError("job.payload", f"not JSON-serialisable ({exc})") from None
        job_id = job_fields.get("id")
        return await self._send(job_id if isinstance(job_id, str) else None, raw)

    async def send_command(self, command: Mapping[str, Any]) -> Delivery:
        """Send a full wire command ({"v": 1, "op": ...}) as given, keyed by its job id."""
        try:
            raw = orjson.dumps(command)
        except TypeError as exc:
            raise ValidationError("$", f"not JSON-serialisable ({exc})") from None
        job = command.get("job")
        job_id = job.get("id") if isinstance(job, Mapping) else command.get("id")
        return await self._send(job_id if isinstance(job_id, str) else None, raw)

    async def submit_many(
        self, items: Iterable[Mapping[str, Any]], *,
        progress: Callable[[SubmitProgress], None] | None = None,
        on_invalid: Literal["raise", "skip"] | Callable[[int, ValidationError], None] = "raise",
        progress_interval_s: float = 0.2,
    ) -> SubmitReport:
        """Send many jobs (job objects) or full commands (mappings with "op"), pipelined.

        Items are validated and queued one at a time, in order. Returns once every queued
        command is acknowledged or failed. A validation error raises (on_invalid="raise",
        after waiting for what was queued before), or the item is skipped and the error kept
        in the report with the item's index ("skip", or a callable, which is also called with
        (index, error) before the next item is taken). Delivery failures are collected in the
        report, not raised. `progress` is called at most every `progress_interval_s` and once
        at the end.
        """
        report = SubmitReport()
        t0 = time.monotonic()
        acked0, failed0 = self.acked, len(self._failures)
        last = t0

        def tell(now: float) -> None:
            if progress is not None:
                progress(SubmitProgress(report.queued, self.acked - acked0, len(report.invalid),
                                        len(self._failures) - failed0, now - t0))

        try:
            for index, item in enumerate(items):
                try:
                    if "op" in item or "v" in item:
                        await self.send_command(item)
                    else:
                        await self.submit(item)
                except ValidationError as exc:
                    if on_invalid == "raise":
                        raise
                    report.invalid.append((index, exc))
                    if callable(on_invalid):
                        on_invalid(index, exc)
                else:
                    report.queued += 1
                now = time.monotonic()
                if now - last >= progress_interval_s:
                    last = now
                    tell(now)
        finally:
            await self._drain()
        tell(time.monotonic())
        report.acked = self.acked - acked0
        report.failed = self._failures[failed0:]
        del self._failures[failed0:]  # reported here: flush() must not raise them again
        report.elapsed_s = time.monotonic() - t0
        return report

    async def flush(self) -> None:
        """Wait until Kafka acknowledged (or refused) every command sent so far; raise
        DeliveryError listing the refused ones (each is reported once)."""
        await self._drain()
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryError(failures)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # --- internals ------------------------------------------------------------------------
    async def _send(self, job_id: str | None, raw: bytes) -> Delivery:
        if self._closed:
            raise ChronowheelError("SchedulerClient is closed")
        if not self._started:
            raise ChronowheelError("SchedulerClient not started: use `async with` or start()")
        if self._validate:
            cmd = parse_command(raw, key=None, policy=self.policy, now_ms=self._now_ms())
            job_id = routing_key(cmd)
        if job_id is None:
            raise ValidationError("id", "required (a job id is the record key)")
        assert self._producer is not None
        fut = await self._producer.send(self.topic, raw, key=job_id.encode("utf-8"))
        delivery = asyncio.ensure_future(fut)
        self._pending.add(delivery)
        delivery.add_done_callback(functools.partial(self._settled, job_id))
        return delivery

    def _settled(self, job_id: str, fut: asyncio.Future[Any]) -> None:
        self._pending.discard(fut)
        if fut.cancelled():
            self._failures.append((job_id, asyncio.CancelledError()))
        elif fut.exception() is not None:  # also marks the exception as retrieved
            self._failures.append((job_id, fut.exception()))  # type: ignore[arg-type]
        else:
            self.acked += 1

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.wait(list(self._pending))


def _job_fields(id: str, kind: Mapping[str, Any], payload: Any, *,
                payload_b64: str | None, **options: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"id": id, **kind}
    if payload is not None:
        job["payload"] = payload
    if payload_b64 is not None:
        job["payload_b64"] = payload_b64
    for name, value in options.items():
        if value is not None:  # unset options stay off the wire: the node's defaults apply
            job[name] = value
    return job


def _check_id(id: object) -> None:
    if not isinstance(id, str):
        raise ValidationError("id", "must be a string", id)


def job_query(*, tenant: str | None = None, status: str | None = None,
              prefix: str | None = None, due_before: Instant | None = None,
              limit: int = 100, page_token: str | None = None,
              due_after: Instant | None = None) -> JobQuery:
    """A validated JobQuery (ValidationError names the bad filter)."""
    if status is not None and status not in JOB_STATUSES:
        raise ValidationError("status", "must be one of " + ", ".join(JOB_STATUSES), status)
    if type(limit) is not int or not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValidationError("limit", f"must be an integer between 1 and {MAX_LIST_LIMIT}",
                              limit)
    if prefix == "":
        prefix = None
    before = _query_instant(due_before, "due_before")
    after = _query_instant(due_after, "due_after")
    if after is not None and before is not None and after >= before:
        raise ValidationError("due_after", f"must be before due_before ({before})", after)
    return JobQuery(tenant=tenant, status=status, prefix=prefix, due_before_ms=before,
                    limit=limit, page_token=page_token, due_after_ms=after)


def _query_instant(value: Instant | None, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValidationError(path, "naive datetime; give it a tzinfo", value)
        return int(value.timestamp() * 1000)
    return instant_ms(value, path)

