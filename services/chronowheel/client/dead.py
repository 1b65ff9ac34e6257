"""Dead letters: list what `<ns>.dead` holds, and redrive the ones a selector picks.

A dead letter is the failed delivery as the worker received it (payload, the occurrence's
headers) plus why, when and where it failed (`cw-error`, `cw-failed-at`, `cw-source-*`;
docs/worker.md). Letters are read partition by partition from the beginning of `<ns>.dead`
(read_committed, no consumer group): a listing is ordered by (partition, offset) and a page
token is the position of the page's last letter, `<partition>@<offset>`. Letters carry no
tenant: a tenant filter looks up each letter's job in the jobs table.

Redriving a letter sends an ordinary `retry` command to `<ns>.submit` (with its `redrive_id`,
below): the same occurrence (`cw-scheduled-at`, so `cw-occurrence` is kept, a trigger's or a
backfill's key too), its payload and the job's own headers from the letter, the next attempt
(`cw-attempt` + 1, due now) and `max_attempts` raised to that attempt when it was the last, so
a redriven occurrence that fails again is dead-lettered again instead of retried.

Exactly once. Each letter's retry carries a `redrive_id` derived from the letter's own
coordinates, `redrive:<dead partition>:<offset>` (`redrive_wire_id`), and the node applies a
retry with a given `redrive_id` at most once (a `job_requests` row it writes with the retry's
due row, kept as long as that row): a second copy, from two redrives of the same letter
at the same moment in two processes or from a run that died after Kafka acknowledged the
retry, is acknowledged and changes nothing. Client side, as a fast skip, once Kafka
acknowledged a letter's retry a row of the letter's request id
`redrive:<dead partition>@<offset>` (`redrive_request_id`) is written to the job's requests
too (kind `redrive`; the node reads only backfill rows and its own), and a letter with that
row is not sent again by a later run. (A node older than the `redrive_id` field rejects the
retry to `<ns>.rejected`: upgrade the nodes first, docs/worker.md.)

A letter the worker could only dead-letter without its payload (the broker refused the full
one: `cw-original-bytes`, value `{"replaced": ...}`) cannot be redriven from the letter; it is
refused, naming its source record, which still holds the payload while the topic keeps it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chronowheel.client.bulk import BulkProgress, _instant
from chronowheel.core import wire
from chronowheel.core.model import MAX_ATTEMPTS
from chronowheel.core.shard import shard_of
from chronowheel.errors import ChronowheelError, ValidationError
from chronowheel.store.base import JobStore, RequestRow

REDRIVE_PREFIX = "redrive:"
REDRIVE_KIND = "redrive"
"""The `kind` of a redrive's row in `job_requests`."""
MAX_DEAD_LIMIT = 1000
TENANT_LOOKUP_BATCH = 200


def redrive_request_id(partition: int, offset: int) -> str:
    """The request id of the redrive of the dead letter at `<ns>.dead[partition]@offset`:
    the same for every run, so a letter is redriven once."""
    return f"{REDRIVE_PREFIX}{partition}@{offset}"


def redrive_wire_id(partition: int, offset: int) -> str:
    """The `redrive_id` the retry of that letter's redrive carries, which the node applies
    once: `redrive:<partition>:<offset>`, the same letter in a request id's characters
    (`@` is not one of them)."""
    return f"{REDRIVE_PREFIX}{partition}:{offset}"


_POSITION = re.compile(r"[0-9]+@[0-9]+")
_DECIMAL = re.compile(r"[0-9]+")  # not str.isdigit: it takes "²" (int() refuses) and "٣" (3)


def is_position(text: str) -> bool:
    """Whether `text` is `<partition>@<offset>` in ASCII digits (str.isdigit also takes "²",
    which int() refuses)."""
    return _POSITION.fullmatch(text) is not None


def parse_position(token: str, path: str = "page_token") -> tuple[int, int]:
    """`<partition>@<offset>` -> (partition, offset); ValidationError naming `path`."""
    if not is_position(token):
        raise ValidationError(path, "must be <partition>@<offset>", token)
    part, _, off = token.partition("@")
    return int(part), int(off)


# --- one letter ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeadLetterInfo:
    """A record of `<ns>.dead` with what its headers say (None: the header is absent)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    job_id: str | None
    scheduled_ms: int | None
    attempt: int | None
    failed_at_ms: int | None
    error: str | None
    reason: str | None
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    target_topic: str | None
    replaced: bool
    """The payload-less stand-in sent when the broker refused the full dead letter."""
    tenant: str | None = None
    """The job's tenant, from the jobs table (filled by a listing)."""

    @property
    def position(self) -> str:
        return f"{self.partition}@{self.offset}"

    @property
    def request_id(self) -> str:
        return redrive_request_id(self.partition, self.offset)

    @property
    def redrive_id(self) -> str:
        return redrive_wire_id(self.partition, self.offset)

    @property
    def source(self) -> str:
        """`topic[partition]@offset` of the failed record (`?` for a part not given)."""
        def part(v: object) -> str:
            return "?" if v is None else str(v)
        return (f"{part(self.source_topic)}[{part(self.source_partition)}]@"
                f"{part(self.source_offset)}")

    @property
    def topic(self) -> str | None:
        """The occurrence's topic: where it was delivered, or where it was to go."""
        return self.source_topic or self.target_topic

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "tenant": self.tenant, "topic": self.topic,
                "scheduled_ms": self.scheduled_ms, "failed_at_ms": self.failed_at_ms,
                "attempt": self.attempt, "error": self.error, "reason": self.reason,
                "source_topic": self.source_topic, "source_partition": self.source_partition,
                "source_offset": self.source_offset, "dead_partition": self.partition,
                "dead_offset": self.offset, "replaced": self.replaced,
                "request_id": self.request_id}


def parse_letter(partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes]] | None) -> DeadLetterInfo:
    raw = tuple((k, v or b"") for k, v in (headers or ()))
    text = {k: v.decode("utf-8", "replace") for k, v in raw}  # later duplicates win

    def num(name: str) -> int | None:
        v = text.get(name)
        return int(v) if v is not None and _DECIMAL.fullmatch(v) else None

    return DeadLetterInfo(
        partition, offset, key, value or b"", raw, text.get(wire.JOB_ID),
        num(wire.SCHEDULED_AT), num(wire.ATTEMPT), num(wire.FAILED_AT), text.get(wire.ERROR),
        text.get(wire.REASON), text.get(wire.SOURCE_TOPIC), num(wire.SOURCE_PARTITION),
        num(wire.SOURCE_OFFSET), text.get(wire.TARGET_TOPIC), wire.ORIGINAL_BYTES in text)


def refusal(letter: DeadLetterInfo) -> str | None:
    """Why `letter` cannot be redriven (None: it can)."""
    where = f"dead letter {letter.position}"
    if letter.replaced:
        return (f"{where} is the payload-less stand-in the worker sent when the broker "
                f"refused the full one ({letter.reason or 'no reason given'}); the payload "
                f"and the job's headers are only in the source record {letter.source}: read "
                f"it there and submit the work again")
    if letter.job_id is None or letter.scheduled_ms is None:
        return (f"{where} is not a chronowheel occurrence (no {wire.JOB_ID} or "
                f"{wire.SCHEDULED_AT}; source {letter.source}); there is no job to deliver "
                f"it to")
    if letter.topic is None:
        return f"{where} names no topic ({wire.SOURCE_TOPIC}) to deliver it to"
    if (letter.attempt or 1) >= MAX_ATTEMPTS:
        return (f"{where} failed on attempt {letter.attempt}, the last a retry may have "
                f"({MAX_ATTEMPTS})")
    return None


def retry_value(letter: DeadLetterInfo, now_ms: int) -> bytes:
    """The `retry` command of `letter`'s redrive: its occurrence, payload and job headers,
    the next attempt, due now, and whatever else of the job a worker's own retry carries
    (`worker.policy.next_attempt`; the letter must have no `refusal`)."""
    from chronowheel.worker.occurrence import Occurrence, optional_count, overlap_policy
    from chronowheel.worker.policy import next_attempt

    assert letter.job_id is not None and letter.scheduled_ms is not None
    topic = letter.topic
    assert topic is not None
    text = {k: v.decode("utf-8", "replace") for k, v in letter.headers}
    occ = Occurrence(
        job_id=letter.job_id, scheduled_ms=letter.scheduled_ms, fired_ms=0,
        attempt=letter.attempt or 1,
        max_attempts=_int_header(letter, wire.MAX_ATTEMPTS, wire.DEFAULT_MAX_ATTEMPTS),
        backoff_ms=_int_header(letter, wire.BACKOFF_MS, wire.DEFAULT_BACKOFF_MS),
        occurrence="", topic=topic, partition=letter.source_partition or 0,
        offset=letter.source_offset or 0, payload=letter.value,
        headers=text, raw_headers=letter.headers,
        concurrency=overlap_policy(text.get(wire.CONCURRENCY)),
        pause_after_failures=optional_count(text.get(wire.PAUSE_AFTER_FAILURES)))
    return next_attempt(occ, at_ms=now_ms,
                        max_attempts=max(min(occ.max_attempts, MAX_ATTEMPTS), occ.attempt + 1),
                        redrive_id=letter.redrive_id)


def _int_header(letter: DeadLetterInfo, name: str, default: int) -> int:
    for k, v in reversed(letter.headers):
        if k == name and v.isdigit():
            return int(v)
    return default


# --- selection -------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeadSelector:
    """Which dead letters: every filter given must hold (None: any). `failed_after_ms`
    (inclusive) and `failed_before_ms` (exclusive) bound `cw-failed-at`; `reason` is a
    substring (any case) of `cw-error` or `cw-reason`; `letter` is one letter's position in
    `<ns>.dead`, (partition, offset): reading starts there and stops after it."""

    job_id: str | None = None
    tenant: str | None = None
    failed_after_ms: int | None = None
    failed_before_ms: int | None = None
    reason: str | None = None
    letter: tuple[int, int] | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.to_json().values())

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("job_id", self.job_id), ("tenant", self.tenant),
                                  ("failed_after_ms", self.failed_after_ms),
                                  ("failed_before_ms", self.failed_before_ms),
                                  ("reason", self.reason),
                                  ("letter", None if self.letter is None
                                   else f"{self.letter[0]}@{self.letter[1]}"))
                if v is not None}

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.to_json().items()]
        return " ".join(parts) if parts else "every dead letter"

    def matches_letter(self, letter: DeadLetterInfo) -> bool:
        """Every filter but the tenant (which needs the jobs table)."""
        if self.letter is not None and (letter.partition, letter.offset) != self.letter:
            return False
        if self.job_id is not None and letter.job_id != self.job_id:
            return False
        at = letter.failed_at_ms
        if self.failed_after_ms is not None and (at is None or at < self.failed_after_ms):
            return False
        if self.failed_before_ms is not None and (at is None or at >= self.failed_before_ms):
            return False
        if self.reason is not None:
            needle = self.reason.lower()
            if not any(needle in (t or "").lower() for t in (letter.error, letter.reason)):
                return False
        return True


def dead_selector(*, job_id: str | None = None, tenant: str | None = None,
                  failed_after: datetime | int | str | None = None,
                  failed_before: datetime | int | str | None = None,
                  reason: str | None = None, letter: str | None = None) -> DeadSelector:
    """A validated selector; ValidationError names the filter, the rule and the value.
    `letter` is one letter's position, `<partition>@<offset>`."""
    for path, v in (("job_id", job_id), ("tenant", tenant), ("reason", reason),
                    ("letter", letter)):
        if v is not None and (not isinstance(v, str) or v == ""):
            raise ValidationError(path, "must be a non-empty string", v)
    position = None if letter is None else parse_position(letter, "letter")
    after = _instant(failed_after, "failed_after")
    before = _instant(failed_before, "failed_before")
    if after is not None and before is not None and after >= before:
        raise ValidationError("failed_after", f"must be before failed_before ({before})", after)
    return DeadSelector(job_id, tenant, after, before, reason, position)


# --- reading ---------------------------------------------------------------------------------

LetterReader = Callable[[tuple[int, int] | None], AsyncIterator[Any]]
"""Yields the records of `<ns>.dead` in (partition, offset) order, from the given position
(inclusive; None: the beginning) to the end as it was when reading began."""


def kafka_reader(settings: Any) -> LetterReader:
    """A LetterReader of the namespace's `<ns>.dead` on Kafka."""

    async def read(start: tuple[int, int] | None) -> AsyncIterator[Any]:
        from aiokafka import TopicPartition

        from chronowheel.bus.kafka import open_admin, partition_counts, reader

        topic = settings.dead_topic
        admin = await open_admin(settings)
        try:
            parts = (await partition_counts(admin, [topic])).get(topic)
        finally:
            await admin.close()
        if parts is None:
            raise ChronowheelError(f"topic {topic} does not exist (run `chronowheel init` "
                                   f"first)")
        consumer = reader(settings, isolation_level="read_committed",
                          auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(parts)]
            ends = await consumer.end_offsets(tps)
            first = 0 if start is None else start[0]
            for tp in tps[first:]:
                end = ends[tp]
                consumer.assign([tp])
                at = start[1] if start is not None and tp.partition == start[0] else 0
                consumer.seek(tp, at)
                while await consumer.position(tp) < end:
                    batch = await consumer.getmany(tp, timeout_ms=1000, max_records=500)
                    for rec in batch.get(tp, ()):
                        if rec.offset >= end:
                            break
                        yield rec
        finally:
            await consumer.stop()

    return read


def memory_reader(records: Sequence[Any]) -> LetterReader:
    """A LetterReader over records (with partition, offset, key, value, headers): tests."""

    async def read(start: tuple[int, int] | None) -> AsyncIterator[Any]:
        for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
            if start is None or (rec.partition, rec.offset) >= start:
                yield rec

    return read


TenantLookup = Callable[[Sequence[str]], Awaitable[Mapping[str, str | None]]]


def store_tenants(store: JobStore) -> TenantLookup:
    async def lookup(job_ids: Sequence[str]) -> Mapping[str, str | None]:
        rows = await store.get_jobs(list(dict.fromkeys(job_ids)))
        return {j: r.tenant for j, r in rows.items()}
    return lookup


async def select(read: LetterReader, selector: DeadSelector, tenants: TenantLookup, *,
                 start: tuple[int, int] | None = None) -> AsyncGenerator[DeadLetterInfo, None]:
    """The letters `selector` picks, in (partition, offset) order, with their tenants. A
    selector of one `letter` reads from that letter and stops after it."""
    batch: list[DeadLetterInfo] = []
    one = selector.letter
    if one is not None and (start is None or start < one):
        start = one

    async def resolved() -> list[DeadLetterInfo]:
        ids = [x.job_id for x in batch if x.job_id is not None]
        found = await tenants(ids) if ids else {}
        out = []
        for x in batch:
            t = found.get(x.job_id) if x.job_id is not None else None
            if selector.tenant is None or t == selector.tenant:
                out.append(_with_tenant(x, t))
        batch.clear()
        return out

    records = read(start)
    try:
        async for rec in records:
            if one is not None and (rec.partition, rec.offset) > one:
                break
            letter = parse_letter(rec.partition, rec.offset, rec.key, rec.value, rec.headers)
            if not selector.matches_letter(letter):
                continue
            batch.append(letter)
            if len(batch) >= TENANT_LOOKUP_BATCH:
                for x in await resolved():
                    yield x
    finally:  # stopped early (one letter, a full page): the reader stops its consumer now
        close = getattr(records, "aclose", None)
        if close is not None:
            await close()
    for x in await resolved():
        yield x


def _with_tenant(letter: DeadLetterInfo, tenant: str | None) -> DeadLetterInfo:
    from dataclasses import replace
    return replace(letter, tenant=tenant)


@dataclass
class DeadLetterPage:
    letters: list[DeadLetterInfo]
    next_token: str | None
    """`<partition>@<offset>` to pass back for the next page; None at the end."""


async def list_page(read: LetterReader, selector: DeadSelector, tenants: TenantLookup, *,
                    limit: int = 100, page_token: str | None = None) -> DeadLetterPage:
    """At most `limit` letters `selector` picks, after the position `page_token`."""
    if type(limit) is not int or not 1 <= limit <= MAX_DEAD_LIMIT:
        raise ValidationError("limit", f"must be an integer between 1 and {MAX_DEAD_LIMIT}",
                              limit)
    start = None
    if page_token is not None:
        p, o = parse_position(page_token)
        start = (p, o + 1)
    out: list[DeadLetterInfo] = []
    gen = select(read, selector, tenants, start=start)
    try:
        async for letter in gen:
            if len(out) == limit:
                return DeadLetterPage(out, out[-1].position)
            out.append(letter)
    finally:
        await gen.aclose()
    return DeadLetterPage(out, None)


# --- redrive ---------------------------------------------------------------------------------

@dataclass
class RedriveSummary:
    """What a redrive did (or, with `dry_run`, would do). Letters are named by their
    position in `<ns>.dead`, `<partition>@<offset>`."""

    selector: DeadSelector
    dry_run: bool = False
    matched: int = 0
    redriven: list[str] = field(default_factory=list)
    """Letters whose retry Kafka acknowledged in this run (with `dry_run`: would be sent)."""
    already: list[str] = field(default_factory=list)
    """Letters redriven before (their request row exists)."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(letter, reason): letters that cannot be redriven."""
    failed: list[tuple[str, BaseException]] = field(default_factory=list)
    """Retries Kafka did not take, or whose request row was not written (sent again by the
    next run)."""
    unrecorded: list[str] = field(default_factory=list)
    """Of `failed`: letters whose retry Kafka took but whose request row was not written. The
    next run sends a second copy, which a node ignores (the same `redrive_id`, within its
    retention period)."""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self, sample: int = 20) -> dict[str, Any]:
        return {"selector": self.selector.to_json(), "dry_run": self.dry_run,
                "matched": self.matched, "redriven": len(self.redriven),
                "redriven_letters": self.redriven[:sample], "already": len(self.already),
                "refused": len(self.refused),
                "refused_letters": [{"letter": p, "reason": r}
                                    for p, r in self.refused[:sample]],
                "failed": len(self.failed),
                "failed_letters": [{"letter": p, "error": repr(e)}
                                   for p, e in self.failed[:sample]],
                "unrecorded": len(self.unrecorded),
                "unrecorded_letters": self.unrecorded[:sample],
                "elapsed_s": round(self.elapsed_s, 3)}


Send = Callable[[str, bytes], Awaitable["asyncio.Future[Any]"]]
"""Sends a retry command (job id, value); returns its Delivery."""


class Redrive:
    """One run of a redrive. `run()` reads, sends and returns the summary."""

    def __init__(self, *, selector: DeadSelector, read: LetterReader, store: JobStore,
                 send: Send, shards: int, retention_s: int, dry_run: bool = False,
                 window: int = 100, limit: int | None = None,
                 progress: Callable[[BulkProgress], None] | None = None,
                 progress_interval_s: float = 0.5,
                 now_ms: Callable[[], int] | None = None,
                 check: Callable[[bytes], object] | None = None) -> None:
        if type(window) is not int or window < 1:
            raise ValidationError("window", "must be an integer of at least 1", window)
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValidationError("limit", "must be an integer of at least 1", limit)
        self.selector = selector
        self.read = read
        self.store = store
        self.send = send
        self.shards = shards
        self.retention_s = retention_s
        self.dry_run = dry_run
        self.window = window
        self.limit = limit
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.check = check
        """Validates a retry command (raises ValidationError), also in a dry run."""
        self.summary = RedriveSummary(selector, dry_run)
        self._gate = asyncio.Semaphore(window)
        self._tasks: set[asyncio.Task[None]] = set()
        self._to_send = 0
        self._listing_done = False
        self._t0 = self._last_tell = 0.0

    async def run(self) -> RedriveSummary:
        self._t0 = self._last_tell = time.monotonic()
        s = self.summary
        try:
            gen = select(self.read, self.selector, store_tenants(self.store))
            try:
                async for letter in gen:
                    if self.limit is not None and s.matched >= self.limit:
                        break
                    s.matched += 1
                    await self._one(letter)
                    self._periodic()
            finally:
                await gen.aclose()
            self._listing_done = True
            if self._tasks:
                await asyncio.gather(*self._tasks)
        finally:
            if self._tasks:  # interrupted: what was sent is still recorded
                await asyncio.shield(asyncio.gather(*self._tasks, return_exceptions=True))
            s.elapsed_s = time.monotonic() - self._t0
        self._tell()
        return s

    async def _one(self, letter: DeadLetterInfo) -> None:
        s = self.summary
        reason = refusal(letter)
        if reason is not None:
            s.refused.append((letter.position, reason))
            return
        assert letter.job_id is not None
        shard = shard_of(letter.job_id, self.shards)
        if await self.store.get_request(shard, letter.job_id, letter.request_id) is not None:
            s.already.append(letter.position)
            return
        value = retry_value(letter, self.now_ms())
        try:
            if self.check is not None:
                self.check(value)
        except ValidationError as exc:  # the client's checks: the node would refuse it too
            s.refused.append((letter.position, f"its retry is invalid: {exc}"))
            return
        self._to_send += 1
        if self.dry_run:
            s.redriven.append(letter.position)
            return
        await self._gate.acquire()
        try:
            delivery = await self.send(letter.job_id, value)
        except BaseException:
            self._gate.release()
            raise
        task = asyncio.ensure_future(self._settle(letter, shard, delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, letter: DeadLetterInfo, shard: int,
                      delivery: asyncio.Future[Any]) -> None:
        """Once Kafka acknowledged the retry, record the request (a later run skips it)."""
        sent = False
        try:
            await delivery
            sent = True
            now = self.now_ms()
            assert letter.job_id is not None
            await self.store.put_request(RequestRow(
                shard, letter.job_id, letter.request_id, REDRIVE_KIND, now, now, None, 1, 1,
                b"", self.retention_s))
        except Exception as exc:
            self.summary.failed.append((letter.position, exc))
            if sent:
                self.summary.unrecorded.append(letter.position)
        else:
            self.summary.redriven.append(letter.position)
        finally:
            self._gate.release()

    def _periodic(self) -> None:
        now = time.monotonic()
        if now - self._last_tell >= self.progress_interval_s:
            self._last_tell = now
            self._tell()

    def _tell(self) -> None:
        if self.progress is None:
            return
        s = self.summary
        acked = 0 if self.dry_run else len(s.redriven)
        self.progress(BulkProgress(s.matched, self._listing_done, self._to_send, acked,
                                   len(s.already) + len(s.refused),
                                   time.monotonic() - self._t0))
