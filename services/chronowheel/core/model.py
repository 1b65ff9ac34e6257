"""Wire model v1: the commands any Kafka producer may send to `<ns>.submit`.

This module holds the data types; parsing and validation live below them (`parse_command`).
"""

from __future__ import annotations

import base64
import binascii
import difflib
import re
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from functools import lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from chronowheel.core import limits, wire
from chronowheel.core.durations import format_duration, parse_duration
from chronowheel.errors import UNSAFE_CHARACTERS, ConfigError, ValidationError

if TYPE_CHECKING:
    from chronowheel.core.recurrence import Schedule
    from chronowheel.settings import Settings

CatchUp = Literal["coalesce", "all", "skip"]
DstPolicy = Literal["skip", "cron"]
JobStatus = Literal["scheduled", "paused", "finished", "cancelled"]
"""The state of a job as its jobs row stores it: `scheduled` (an occurrence is pending),
`paused` (its next occurrence is held back until a resume), `finished` (nothing left to fire),
`cancelled`."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job. Times are UTC epoch milliseconds; durations are milliseconds."""

    id: str
    topic: str
    payload: bytes
    at_ms: int | None = None
    cron: str | None = None
    every_ms: int | None = None
    tz: str = "UTC"
    start_ms: int | None = None
    end_ms: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    catch_up: CatchUp = "coalesce"
    max_catch_up: int = 100
    dst: DstPolicy = "skip"
    window_ms: int = 0
    max_attempts: int = wire.DEFAULT_MAX_ATTEMPTS
    backoff_ms: int = wire.DEFAULT_BACKOFF_MS
    tenant: str | None = None
    exclude_dates: frozenset[date] = frozenset()
    calendar: str | None = None
    concurrency: str = wire.CONCURRENCY_ALLOW
    max_lateness_ms: int | None = None
    """An occurrence not published within this long after its scheduled instant is dropped
    as missed (None: the namespace's default, `Settings.max_lateness_ms`, applies)."""
    pause_after_failures: int | None = None
    """Recurring jobs: the worker library pauses the job after this many consecutive failed
    runs (None: never)."""
    # The canonical JSON of the job as submitted (orjson, sorted keys): equal bytes = same spec,
    # which is what makes an identical re-submit a no-op.
    canonical: bytes = field(default=b"", compare=False)

    @property
    def recurring(self) -> bool:
        return self.at_ms is None

    @property
    def fired_headers(self) -> tuple[tuple[str, str], ...]:
        """The headers stored with each occurrence: the job's own, plus the overlap policy
        (`cw-concurrency`) when it is not the default, for the worker library, and the
        lateness bound (`cw-max-lateness-ms`) when the job has one: the due row carries it to
        the node that dispatches the occurrence (a one-shot's row has no spec to read it
        from), and the fired message to its consumers."""
        extra: tuple[tuple[str, str], ...] = ()
        if self.concurrency != wire.CONCURRENCY_ALLOW:
            extra += ((wire.CONCURRENCY, self.concurrency),)
        if self.max_lateness_ms is not None:
            extra += ((wire.MAX_LATENESS_MS, str(self.max_lateness_ms)),)
        if self.pause_after_failures is not None:
            extra += ((wire.PAUSE_AFTER_FAILURES, str(self.pause_after_failures)),)
        return (*self.headers, *extra) if extra else self.headers


@dataclass(frozen=True, slots=True)
class Upsert:
    job: JobSpec
    op: Literal["upsert"] = "upsert"


@dataclass(frozen=True, slots=True)
class Cancel:
    id: str
    op: Literal["cancel"] = "cancel"


@dataclass(frozen=True, slots=True)
class Retry:
    """Internal: a worker asks for one more delivery of an occurrence that failed.

    Wire: {"v":1,"op":"retry","id":..,"scheduled_at":ms,"attempt":n,"at":..,"topic":..,
           "payload_b64":..,"headers":{..},"max_attempts":n,"backoff":"10s"}
    Required: id, scheduled_at (epoch ms of the original occurrence), attempt (2..100, the
    delivery number this retry becomes), at (when to deliver: RFC 3339 with offset or epoch ms),
    topic (same allowlist as jobs), payload_b64 (the fired bytes, "" for none). Optional: headers
    (the job's own, no `cw-` names), max_attempts (1..100, at least attempt), backoff (duration),
    origin and request_id (both or neither: of a triggered or backfilled occurrence),
    pause_after_failures, concurrency (the job's overlap policy) and redrive_id (a dead
    letter's redrive: applied at most once).
    """

    id: str
    scheduled_ms: int
    attempt: int
    at_ms: int
    topic: str
    payload: bytes
    headers: tuple[tuple[str, str], ...] = ()
    max_attempts: int | None = None
    backoff_ms: int | None = None
    origin: str = ""
    """"trigger" or "backfill" when retrying an occurrence such a request published (it keeps
    that occurrence's key and marker header); "" otherwise."""
    request_id: str = ""
    pause_after_failures: int | None = None
    """The job's `pause_after_failures`, carried so that the retried delivery carries it too
    (`cw-pause-after-failures`): the worker decides on auto-pause at a run's last attempt."""
    concurrency: str = wire.CONCURRENCY_ALLOW
    """The job's overlap policy, carried so that the retried delivery carries it too
    (`cw-concurrency`, absent for `allow`, the default)."""
    redrive_id: str = ""
    """The request id of a dead letter's redrive ("" for a worker's own retry): the node
    applies a retry with one at most once (for the retention period); the same id again
    changes nothing. Not `request_id`, which names the trigger or backfill that published
    the occurrence."""
    op: Literal["retry"] = "retry"


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop publishing a job's occurrences until a `Resume` (wire: {"v":1,"op":"pause","id":..,
    "note":..,"request_id":..,"after_failures":n}; all but id optional)."""

    id: str
    note: str | None = None
    """Why: stored with the paused job and shown with it until a resume."""
    request_id: str | None = None
    """With one, the node applies this pause once: the same request id again (from any
    sender, also after a resume) changes nothing, for the retention period."""
    after_failures: int | None = None
    """Pause only if the job's last `after_failures` runs failed (its streak as run history
    records it, since the job was last stored or resumed): what the worker library sends
    for a job's `pause_after_failures`. Otherwise the command changes nothing."""
    op: Literal["pause"] = "pause"


@dataclass(frozen=True, slots=True)
class Resume:
    """Publish a paused job's occurrences again (wire: {"v":1,"op":"resume","id":..})."""

    id: str
    op: Literal["resume"] = "resume"


@dataclass(frozen=True, slots=True)
class Trigger:
    """Publish one occurrence of a recurring job now, its schedule untouched.

    Wire: {"v":1,"op":"trigger","id":..,"request_id":..}. The same request id again publishes
    nothing more (for the retention period).
    """

    id: str
    request_id: str
    op: Literal["trigger"] = "trigger"


@dataclass(frozen=True, slots=True)
class Backfill:
    """Publish a recurring job's occurrences scheduled in [from_ms, to_ms).

    Wire: {"v":1,"op":"backfill","id":..,"request_id":..,"from":..,"to":..}; from and to as
    RFC 3339 with offset or epoch ms, `to` not in the future. The same request id again
    publishes nothing more (for the retention period).
    """

    id: str
    request_id: str
    from_ms: int
    to_ms: int
    op: Literal["backfill"] = "backfill"


@dataclass(frozen=True, slots=True)
class PutCalendar:
    """Create or replace the named calendar of the namespace: dates on which the cron jobs that
    reference it (`calendar`) do not fire, read in each job's own zone."""

    name: str
    dates: frozenset[date]
    op: Literal["put_calendar"] = "put_calendar"


@dataclass(frozen=True, slots=True)
class DeleteCalendar:
    name: str
    op: Literal["delete_calendar"] = "delete_calendar"


Command = (Upsert | Cancel | Retry | Pause | Resume | Trigger | Backfill | PutCalendar
           | DeleteCalendar)
Control = Pause | Resume | Trigger | Backfill
"""Commands about an existing job (besides cancel): whether they apply depends on its row."""


def routing_key(cmd: Command) -> str:
    """What decides a command's shard: the job id, or the calendar name for calendar ops."""
    if isinstance(cmd, Upsert):
        return cmd.job.id
    return cmd.name if isinstance(cmd, PutCalendar | DeleteCalendar) else cmd.id


# --------------------------------------------------------------------------------------------
# Validation policy
# --------------------------------------------------------------------------------------------

DAY_MS: Final = 86_400_000
DEFAULT_RETENTION_MS: Final = 7 * DAY_MS
MAX_EPOCH_MS: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last RFC 3339 instant
MAX_ATTEMPTS: Final = 100
MAX_WINDOW_MS: Final = DAY_MS
MAX_BACKOFF_MS: Final = DAY_MS
MAX_TENANT_CHARS: Final = 128
MAX_CRON_CHARS: Final = 256
MAX_TZ_CHARS: Final = 64
MAX_REQUEST_ID_CHARS: Final = 128
REQUEST_ID_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,128}$"
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN[1:-1])

# Kafka's own rule for topic names (its Topic.validate): 1..249 of these characters.
TOPIC_PATTERN: Final = r"^[a-zA-Z0-9._-]{1,249}$"
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# IANA names look like Area/Location[/Sub]; this also keeps zoneinfo away from file paths.
TZ_PATTERN: Final = r"^[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*$"
_TZ = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")
# RFC 3339 date-time; field ranges are checked by datetime() so messages can be specific.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))?"
)
# Standard alphabet, padded, no whitespace: b64decode alone is laxer than this.
BASE64_PATTERN: Final = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_BASE64 = re.compile(BASE64_PATTERN[1:-1])

RESERVED_HEADER_PREFIX: Final = wire.RESERVED_HEADER_PREFIX


@dataclass(frozen=True)
class ValidationPolicy:
    """The configurable limits of one namespace (docs/design.md, section "Wire format")."""

    namespace: str = "chronowheel"
    # Extra target topics, as a regex that must match the whole name; "" allows none extra.
    allowed_topic_pattern: str = ""
    max_id_bytes: int = 256
    max_payload_bytes: int = 262_144
    max_horizon_ms: int = 3653 * DAY_MS
    max_max_catch_up: int = 10_000
    # Names plus values of a job's own headers, UTF-8: they ride on every fired message.
    max_headers_bytes: int = 16_384
    # Shortest `every` and cron period (a cron's is counted within a day, see
    # recurrence.cron_period_ms).
    min_period_ms: int = limits.DEFAULT_MIN_PERIOD_MS
    # Most bytes a job's due row and jobs row may count in their one logged batch
    # (limits.job_rows_bytes): Cassandra's batch_size_fail_threshold.
    max_stored_bytes: int = limits.CASSANDRA_BATCH_FAIL_BYTES
    # How long fired due rows are kept (their TTL runs this long past the slot).
    retention_ms: int = DEFAULT_RETENTION_MS
    # Furthest ahead a recurring job's first occurrence may be; None: as far as a due row's
    # TTL can reach (limits.max_ttl_reach_ms of retention_ms). max_horizon_ms is clamped to it.
    max_reach_ms: int | None = None
    _allowed: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _TOPIC.fullmatch(self.namespace) or len(self.namespace) > 200:
            raise ConfigError(f"namespace {self.namespace!r}: must be 1..200 of [a-zA-Z0-9._-]")
        try:
            allowed = re.compile(self.allowed_topic_pattern) if self.allowed_topic_pattern else None
        except re.error as exc:
            raise ConfigError(
                f"allowed topic pattern {self.allowed_topic_pattern!r}: not a regex ({exc})"
            ) from None
        object.__setattr__(self, "_allowed", allowed)
        for name in ("max_id_bytes", "max_payload_bytes", "max_horizon_ms", "max_max_catch_up",
                     "min_period_ms", "max_stored_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.retention_ms < limits.CASSANDRA_MAX_TTL_S * 1000:
            raise ConfigError(
                f"retention_ms must be between 0 and Cassandra's 20-year TTL limit "
                f"({limits.CASSANDRA_MAX_TTL_S * 1000} ms), got {self.retention_ms}"
            )
        if self.max_reach_ms is not None and self.max_reach_ms < 1:
            raise ConfigError(f"max_reach_ms must be at least 1, got {self.max_reach_ms}")
        # A one-shot further ahead than the reach would need a due row whose TTL Cassandra
        # refuses: the horizon never goes beyond it.
        if self.max_horizon_ms > self.reach_ms:
            object.__setattr__(self, "max_horizon_ms", self.reach_ms)

    @classmethod
    def from_settings(cls, settings: Settings) -> ValidationPolicy:
        return cls(
            namespace=settings.namespace,
            allowed_topic_pattern=settings.allowed_topics,
            max_id_bytes=settings.max_id_bytes,
            max_payload_bytes=settings.max_payload_bytes,
            max_horizon_ms=settings.max_horizon_ms,
            min_period_ms=settings.min_period_ms,
            max_stored_bytes=settings.store_batch_fail_bytes,
            retention_ms=settings.retention_ms,
        )

    @property
    def reach_ms(self) -> int:
        """How far ahead of now a recurring job's first occurrence may be."""
        if self.max_reach_ms is not None:
            return self.max_reach_ms
        return limits.max_ttl_reach_ms(self.retention_ms)

    @property
    def fired_topic(self) -> str:
        return wire.fired_topic(self.namespace)

    @property
    def internal_topics(self) -> frozenset[str]:
        """Topics the scheduler itself writes or reads; no job may ever target them."""
        return internal_topics(self.namespace)

    def topic_problem(self, topic: str) -> str | None:
        """Why `topic` may not be a target, or None if it may."""
        if not _TOPIC.fullmatch(topic):
            return "must be 1..249 characters of a-z A-Z 0-9 . _ -"
        if topic in (".", ".."):
            return "'.' and '..' are not valid Kafka topic names"
        if topic in self.internal_topics:
            return f"is an internal topic of namespace {self.namespace!r}"
        if topic.startswith("__"):
            return "names starting with '__' are reserved for Kafka's own topics"
        if topic == self.fired_topic:
            return None
        if self._allowed is not None and self._allowed.fullmatch(topic):
            return None
        return f"not allowed: must be {self.fired_topic!r} or match the allowed topics pattern"


internal_topics = wire.internal_topics


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_MISSING: Final = object()

UPSERT_FIELDS: Final = frozenset({"v", "op", "job"})
CANCEL_FIELDS: Final = frozenset({"v", "op", "id"})
RETRY_FIELDS: Final = frozenset(
    {"v", "op", "id", "scheduled_at", "attempt", "at", "topic", "payload_b64", "headers"}
    | {"max_attempts", "backoff", "origin", "request_id", "pause_after_failures"}
    | {"concurrency", "redrive_id"}
)
PUT_CALENDAR_FIELDS: Final = frozenset({"v", "op", "name", "dates"})
DELETE_CALENDAR_FIELDS: Final = frozenset({"v", "op", "name"})
JOB_FIELDS: Final = frozenset(
    {"id", "at", "cron", "tz", "every", "start", "end", "topic", "payload", "payload_b64"}
    | {"headers", "catch_up", "max_catch_up", "dst", "window", "max_attempts", "backoff"}
    | {"tenant", "exclude_dates", "calendar", "concurrency", "max_lateness"}
    | {"pause_after_failures"}
)
PAUSE_FIELDS: Final = frozenset({"v", "op", "id", "note", "request_id", "after_failures"})
RESUME_FIELDS: Final = frozenset({"v", "op", "id"})
TRIGGER_FIELDS: Final = frozenset({"v", "op", "id", "request_id"})
BACKFILL_FIELDS: Final = frozenset({"v", "op", "id", "request_id", "from", "to"})
_OPS: Final = {"upsert": UPSERT_FIELDS, "cancel": CANCEL_FIELDS, "retry": RETRY_FIELDS,
               "pause": PAUSE_FIELDS, "resume": RESUME_FIELDS, "trigger": TRIGGER_FIELDS,
               "backfill": BACKFILL_FIELDS, wire.OP_PUT_CALENDAR: PUT_CALENDAR_FIELDS,
               wire.OP_DELETE_CALENDAR: DELETE_CALENDAR_FIELDS}
_OP_NAMES: Final = ", ".join(_OPS)
_CATCH_UP: Final = ("coalesce", "all", "skip")
_DST: Final = ("skip", "cron")
_RECURRING_ONLY: Final = ("start", "end", "catch_up", "max_catch_up", "concurrency",
                          "pause_after_failures")
_CRON_ONLY: Final = ("tz", "dst", "exclude_dates", "calendar")
# Calendar names: like topic names, so they are safe in keys, logs and CLI arguments.
CALENDAR_NAME_PATTERN: Final = r"^[a-zA-Z0-9._-]{1,128}$"
_CALENDAR_NAME = re.compile(CALENDAR_NAME_PATTERN[1:-1])
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def parse_command(
    raw: bytes, *, key: bytes | None, policy: ValidationPolicy, now_ms: int
) -> Command:
    """Parse and validate one `<ns>.submit` record value; raise ValidationError on any fault.

    `key` is the record key (None if the producer sent none); when present it must equal the
    UTF-8 job id. `now_ms` anchors the horizon checks. The first fault found is reported.
    """
    doc = _load(raw, max_depth=limits.MAX_JSON_DEPTH)
    if not isinstance(doc, dict):
        raise ValidationError("$", "must be a JSON object", doc)
    version = doc.get("v", _MISSING)
    if version is _MISSING:
        raise ValidationError("v", "required")
    if type(version) is not int or version != 1:
        raise ValidationError("v", "unsupported version (this scheduler speaks v 1)", version)
    op = doc.get("op", _MISSING)
    if op is _MISSING:
        raise ValidationError("op", f"required (one of {_OP_NAMES})")
    if not isinstance(op, str) or op not in _OPS:
        raise ValidationError("op", f"must be one of {_OP_NAMES}", op)
    _reject_unknown(doc, _OPS[op], "")
    if op == "upsert":
        return Upsert(_parse_job(_required(doc, "job", ""), key, policy, now_ms))
    if op in wire.CALENDAR_OPS:
        return _parse_calendar_op(doc, op, key)
    job_id = _job_id(_required(doc, "id", ""), "id", policy)
    _check_key(key, job_id)
    if op == "cancel":
        return Cancel(job_id)
    if op == "pause":
        note = _note(doc["note"]) if "note" in doc else None
        request_id = _request_id(doc["request_id"]) if "request_id" in doc else None
        after = None
        if "after_failures" in doc:
            after = _integer(doc["after_failures"], "after_failures", 1,
                             limits.MAX_PAUSE_AFTER_FAILURES)
        return Pause(job_id, note, request_id, after)
    if op == "resume":
        return Resume(job_id)
    if op == "trigger":
        return Trigger(job_id, _request_id(_required(doc, "request_id", "")))
    if op == "backfill":
        return _parse_backfill(doc, job_id, now_ms)
    return _parse_retry(doc, job_id, policy, now_ms)


def decode_stored_job(spec: bytes, *, policy: ValidationPolicy, now_ms: int) -> JobSpec:
    """A job as stored (`JobSpec.canonical`, the job object of its upsert) back to a JobSpec,
    validated as on submit; raises ValidationError when the bytes are not a job.

    The depth limit is not applied: the spec was accepted before, perhaps under a looser one.
    """
    return _parse_job(_load(spec, max_depth=None), None, policy, now_ms)


# A JSON string literal, escapes included: what the depth scan skips.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Opening brackets to +1, closing ones to -1 (as signed bytes), everything else dropped.
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_DEPTH_CHUNK = 65_536


def _too_deep(raw: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects more than `limit` deep, outside strings.

    Cheap: with no more than `limit` opening brackets it cannot; otherwise the running depth
    is summed in C, a chunk at a time, stopping at the first chunk that goes too deep. Text
    that is not JSON may get either answer; the parser rejects it anyway.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    data = _JSON_STRING.sub(b"", raw) if b'"' in raw else raw
    steps = data.translate(_BRACKET_STEPS, _NOT_BRACKETS)
    depth = 0
    for at in range(0, len(steps), _DEPTH_CHUNK):
        running = list(accumulate(array("b", steps[at:at + _DEPTH_CHUNK]), initial=depth))
        if max(running) > limit:
            return True
        depth = running[-1]
    return False


def _load(raw: bytes, *, max_depth: int | None) -> Any:
    data = raw if isinstance(raw, bytes) else bytes(raw)
    if max_depth is not None and _too_deep(data, max_depth):
        raise ValidationError("$", f"nested deeper than {max_depth} levels", data)
    try:
        return orjson.loads(data)
    except (orjson.JSONDecodeError, ValueError, TypeError, RecursionError) as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError("$", "not valid UTF-8", data) from None
        raise ValidationError("$", f"not valid JSON ({exc})", data) from None


def _dumps(value: Any, path: str, option: int | None = None) -> bytes:
    """orjson.dumps, its refusals (nesting beyond its own limit, say) as ValidationError."""
    try:
        return orjson.dumps(value, option=option)
    except (orjson.JSONEncodeError, TypeError, ValueError, RecursionError) as exc:
        raise ValidationError(path, f"cannot be serialised ({exc})") from None


def _parse_job(job: object, key: bytes | None, policy: ValidationPolicy, now_ms: int) -> JobSpec:
    if not isinstance(job, dict):
        raise ValidationError("job", "must be a JSON object", job)
    _reject_unknown(job, JOB_FIELDS, "job.")
    job_id = _job_id(_required(job, "id", "job."), "job.id", policy)
    _check_key(key, job_id)

    kinds = [kind for kind in ("at", "cron", "every") if kind in job]
    if len(kinds) != 1:
        raise ValidationError("job", "exactly one of at, cron, every", kinds or None)
    kind = kinds[0]
    if kind != "cron":
        for name in _CRON_ONLY:
            if name in job:
                raise ValidationError(f"job.{name}", "only allowed with cron", job[name])
    if kind == "at":
        for name in _RECURRING_ONLY:
            if name in job:
                raise ValidationError(
                    f"job.{name}", "only allowed for recurring jobs (cron or every)", job[name]
                )

    at_ms = cron = every_ms = start_ms = end_ms = None
    tz = "UTC"
    dst: DstPolicy = "skip"
    if kind == "at":
        at_ms = _instant(job["at"], "job.at")
        _within_horizon(at_ms, job["at"], "job.at", policy, now_ms)
    elif kind == "cron":
        cron = _string(job["cron"], "job.cron", 1, MAX_CRON_CHARS)
        if "tz" in job:
            tz = _time_zone(job["tz"], "job.tz")
        if "dst" in job:
            dst = _enum(job["dst"], "job.dst", _DST)  # type: ignore[assignment]
    else:
        every_ms = _duration(job["every"], "job.every")
        if every_ms == 0:
            raise ValidationError("job.every", "must be greater than 0s", job["every"])
        if every_ms < policy.min_period_ms:
            raise ValidationError(
                "job.every",
                f"must be at least {format_duration(policy.min_period_ms)} (the namespace's "
                "min_period_ms)",
                job["every"],
            )
        if every_ms > policy.max_horizon_ms:
            raise ValidationError(
                "job.every",
                f"must be at most {format_duration(policy.max_horizon_ms)}",
                job["every"],
            )
    if "start" in job:
        start_ms = _instant(job["start"], "job.start")
        _within_horizon(start_ms, job["start"], "job.start", policy, now_ms)
    if "end" in job:
        end_ms = _instant(job["end"], "job.end")
        if start_ms is not None and end_ms <= start_ms:
            raise ValidationError("job.end", "must be after start", job["end"])

    topic = policy.fired_topic
    if "topic" in job:
        topic = _topic(job["topic"], "job.topic", policy)
    payload = _job_payload(job, policy)
    headers = _headers(job["headers"], "job.headers", policy) if "headers" in job else ()

    catch_up: CatchUp = "coalesce"
    if "catch_up" in job:
        catch_up = _enum(job["catch_up"], "job.catch_up", _CATCH_UP)  # type: ignore[assignment]
    max_catch_up = 100
    if "max_catch_up" in job:
        max_catch_up = _integer(job["max_catch_up"], "job.max_catch_up", 1, policy.max_max_catch_up)
    window_ms = 0
    if "window" in job:
        window_ms = _duration(job["window"], "job.window")
        if window_ms > MAX_WINDOW_MS:
            raise ValidationError("job.window", "must be at most 1d", job["window"])
        # A window as long as the period would let jitter reorder consecutive occurrences.
        if every_ms is not None and window_ms >= every_ms:
            raise ValidationError("job.window", "must be shorter than every", job["window"])
    max_attempts = wire.DEFAULT_MAX_ATTEMPTS
    if "max_attempts" in job:
        max_attempts = _integer(job["max_attempts"], "job.max_attempts", 1, MAX_ATTEMPTS)
    backoff_ms = wire.DEFAULT_BACKOFF_MS
    if "backoff" in job:
        backoff_ms = _backoff(job["backoff"], "job.backoff")
    tenant = None
    if "tenant" in job:
        tenant = _string(job["tenant"], "job.tenant", 1, MAX_TENANT_CHARS)
    exclude_dates: frozenset[date] = frozenset()
    if "exclude_dates" in job:
        exclude_dates = _dates(job["exclude_dates"], "job.exclude_dates", wire.MAX_EXCLUDE_DATES)
    calendar = None
    if "calendar" in job:
        calendar = _calendar_name(job["calendar"], "job.calendar")
    concurrency = wire.CONCURRENCY_ALLOW
    if "concurrency" in job:
        concurrency = _enum(job["concurrency"], "job.concurrency", wire.CONCURRENCY_POLICIES)
    max_lateness_ms = None
    if "max_lateness" in job:
        max_lateness_ms = _max_lateness(job["max_lateness"], window_ms)
    pause_after_failures = None
    if "pause_after_failures" in job:
        pause_after_failures = _pause_after_failures(job["pause_after_failures"],
                                                     "job.pause_after_failures", max_attempts)

    if kind != "at":
        schedule = _compile_recurrence(cron, every_ms, tz, start_ms, end_ms, dst, exclude_dates)
        _check_recurrence(schedule, policy, now_ms)

    spec = JobSpec(
        id=job_id,
        topic=topic,
        payload=payload,
        at_ms=at_ms,
        cron=cron,
        every_ms=every_ms,
        tz=tz,
        start_ms=start_ms,
        end_ms=end_ms,
        headers=headers,
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        dst=dst,
        window_ms=window_ms,
        max_attempts=max_attempts,
        backoff_ms=backoff_ms,
        tenant=tenant,
        exclude_dates=exclude_dates,
        calendar=calendar,
        concurrency=concurrency,
        max_lateness_ms=max_lateness_ms,
        pause_after_failures=pause_after_failures,
        canonical=kept(_dumps(job, "job", orjson.OPT_SORT_KEYS)),
    )
    _check_stored_size(spec, policy)
    return spec


def _check_stored_size(spec: JobSpec, policy: ValidationPolicy) -> None:
    """The job's due row and jobs row go in one logged batch: over Cassandra's
    batch_size_fail_threshold the batch, and with it the shard's whole write, is refused."""
    size = limits.job_rows_bytes(
        job_id=spec.id, topic=spec.topic, payload_len=len(spec.payload),
        spec_len=len(spec.canonical), recurring=spec.recurring,
        headers=[(name, value.encode()) for name, value in spec.fired_headers],
    )
    if size > policy.max_stored_bytes:
        twice = "the payload is stored twice, in the due row and in the spec"
        if spec.recurring:
            twice += ", and a recurring job's due row carries the spec too"
        raise ValidationError(
            "job",
            f"its rows would take {size} bytes in one store batch, over the limit of "
            f"{policy.max_stored_bytes} bytes (setting store_batch_fail_bytes, Cassandra's "
            f"batch_size_fail_threshold): {twice}",
            f"{size} bytes",
        )


def _check_recurrence(schedule: Schedule, policy: ValidationPolicy, now_ms: int) -> None:
    """Minimum period, then the first occurrence after now: found within the step budget and
    within the reach of a due row's TTL."""
    from chronowheel.core.recurrence import cron_period_ms, next_after

    period = cron_period_ms(schedule)
    # A cron's period is counted within a day, so a daily one meets any minimum.
    minimum = min(policy.min_period_ms, DAY_MS)
    if period is not None and period < minimum:
        raise ValidationError(
            "job.cron",
            f"fires as often as every {format_duration(period)}; must be at least "
            f"{format_duration(minimum)} apart (the namespace's min_period_ms)",
            schedule.cron,
        )
    first = next_after(schedule, now_ms, max_steps=limits.MAX_RECURRENCE_STEPS)
    if first is not None and first - now_ms > policy.reach_ms:
        when = datetime.fromtimestamp(first / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        raise ValidationError(
            "job.cron" if schedule.cron is not None else "job.every",
            f"its first occurrence after now is {when}, more than "
            f"{format_duration(policy.reach_ms)} ahead: its due row would need a TTL beyond "
            f"Cassandra's largest, 20 years ({limits.CASSANDRA_MAX_TTL_S} s), as the row is "
            "kept retention_ms past its slot",
            schedule.cron if schedule.cron is not None else schedule.every_ms,
        )


def _compile_recurrence(
    cron: str | None,
    every_ms: int | None,
    tz: str,
    start_ms: int | None,
    end_ms: int | None,
    dst: DstPolicy,
    exclude_dates: frozenset[date],
) -> Schedule:
    # Imported here: recurrence may import this module's types, and a cycle at import time
    # would break whichever module loads first.
    from chronowheel.core.recurrence import compile_schedule

    try:
        return compile_schedule(
            cron=cron, every_ms=every_ms, tz=tz, start_ms=start_ms, end_ms=end_ms, dst=dst,
            exclude_dates=exclude_dates,
        )
    except ValueError as exc:
        # Only ValidationError is expected; a stray ValueError still means the input is bad,
        # and must become a rejection rather than stop ingest.
        if cron is not None:
            raise ValidationError("job.cron", str(exc), cron) from None
        raise ValidationError("job.every", str(exc), every_ms) from None


def _parse_backfill(doc: dict[str, Any], job_id: str, now_ms: int) -> Backfill:
    request_id = _request_id(_required(doc, "request_id", ""))
    from_ms = _instant(_required(doc, "from", ""), "from")
    to_ms = _instant(_required(doc, "to", ""), "to")
    if to_ms <= from_ms:
        raise ValidationError("to", "must be after from (the range is [from, to))", doc["to"])
    if to_ms > now_ms:
        # An occurrence published before its scheduled instant would be early.
        raise ValidationError(
            "to", "must not be in the future: occurrences are never published early", doc["to"])
    return Backfill(job_id, request_id, from_ms, to_ms)


def _request_id(value: object, path: str = "request_id") -> str:
    text = _string(value, path, 1, MAX_REQUEST_ID_CHARS)
    if not _REQUEST_ID.fullmatch(text):
        raise ValidationError(path, "must be 1..128 of A-Z a-z 0-9 . _ : -", value)
    return text
def _parse_calendar_op(doc: dict[str, Any], op: str, key: bytes | None) -> Command:
    name = _calendar_name(_required(doc, "name", ""), "name")
    if key is not None and key != name.encode():
        raise ValidationError("key", f"record key must equal the calendar name {name!r}", key)
    if op == wire.OP_DELETE_CALENDAR:
        return DeleteCalendar(name)
    return PutCalendar(name, _dates(_required(doc, "dates", ""), "dates", wire.MAX_CALENDAR_DATES))


def _calendar_name(value: object, path: str) -> str:
    if not isinstance(value, str) or not _CALENDAR_NAME.fullmatch(value):
        raise ValidationError(
            path,
            f"must be a calendar name: 1..{wire.MAX_CALENDAR_NAME_CHARS} characters of "
            "a-z A-Z 0-9 . _ -",
            value,
        )
    return value


def _dates(value: object, path: str, limit: int) -> frozenset[date]:
    """A JSON array of `YYYY-MM-DD` strings (local calendar dates, no time, no zone)."""
    if not isinstance(value, list):
        raise ValidationError(path, "must be an array of dates like \"2026-12-25\"", value)
    if len(value) > limit:
        raise ValidationError(path, f"must list at most {limit} dates", f"{len(value)} dates")
    out: set[date] = set()
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, str) or not _DATE.fullmatch(item):
            raise ValidationError(where, "must be a date like \"2026-12-25\" (YYYY-MM-DD)", item)
        try:
            day = date.fromisoformat(item)
        except ValueError as exc:
            raise ValidationError(where, f"not a valid date ({exc})", item) from None
        if day.year < 1970:
            raise ValidationError(where, "must not be before 1970", item)
        out.add(day)
    return frozenset(out)


def _parse_retry(doc: dict[str, Any], job_id: str, policy: ValidationPolicy, now_ms: int) -> Retry:
    scheduled_at = _required(doc, "scheduled_at", "")
    if type(scheduled_at) is not int:
        raise ValidationError("scheduled_at", "must be integer epoch milliseconds", scheduled_at)
    scheduled_ms = _instant_ms(scheduled_at, "scheduled_at")
    attempt = _integer(_required(doc, "attempt", ""), "attempt", 2, MAX_ATTEMPTS)
    at_ms = _instant(_required(doc, "at", ""), "at")
    _within_horizon(at_ms, doc["at"], "at", policy, now_ms)
    topic = _topic(_required(doc, "topic", ""), "topic", policy)
    payload = _base64(_required(doc, "payload_b64", ""), "payload_b64", policy)
    headers = _headers(doc["headers"], "headers", policy) if "headers" in doc else ()
    max_attempts = None
    if "max_attempts" in doc:
        max_attempts = _integer(doc["max_attempts"], "max_attempts", 1, MAX_ATTEMPTS)
        if attempt > max_attempts:
            raise ValidationError(
                "attempt", f"must not exceed max_attempts ({max_attempts})", attempt
            )
    backoff_ms = _backoff(doc["backoff"], "backoff") if "backoff" in doc else None
    origin = request_id = ""
    if "origin" in doc or "request_id" in doc:
        origin = _enum(_required(doc, "origin", ""), "origin",
                       (wire.TRIGGER_ORIGIN, wire.BACKFILL_ORIGIN))
        request_id = _request_id(_required(doc, "request_id", ""))
    pause_after_failures = None
    if "pause_after_failures" in doc:
        pause_after_failures = _pause_after_failures(
            doc["pause_after_failures"], "pause_after_failures",
            wire.DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts)
    concurrency = wire.CONCURRENCY_ALLOW
    if "concurrency" in doc:
        concurrency = _enum(doc["concurrency"], "concurrency", wire.CONCURRENCY_POLICIES)
    redrive_id = _request_id(doc["redrive_id"], "redrive_id") if "redrive_id" in doc else ""
    return Retry(
        id=job_id,
        scheduled_ms=scheduled_ms,
        attempt=attempt,
        at_ms=at_ms,
        topic=topic,
        payload=payload,
        headers=headers,
        max_attempts=max_attempts,
        backoff_ms=backoff_ms,
        origin=origin,
        request_id=request_id,
        pause_after_failures=pause_after_failures,
        concurrency=concurrency,
        redrive_id=redrive_id,
    )


# --- field checks ----------------------------------------------------------------------------


def _required(obj: dict[str, Any], name: str, prefix: str) -> Any:
    value = obj.get(name, _MISSING)
    if value is _MISSING:
        raise ValidationError(prefix + name, "required")
    return value


def _reject_unknown(obj: dict[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for name, value in obj.items():
        if name not in allowed:
            close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValidationError(prefix + name, "unknown field" + hint, value)


def _check_key(key: bytes | None, job_id: str) -> None:
    if key is not None and key != job_id.encode():
        raise ValidationError("key", f"record key must equal the job id {job_id!r}", key)


def _job_id(value: object, path: str, policy: ValidationPolicy) -> str:
    if not isinstance(value, str):
        raise ValidationError(path, "must be a string", value)
    size = len(value.encode())
    if size == 0:
        raise ValidationError(path, "must not be empty", value)
    if size > policy.max_id_bytes:
        raise ValidationError(
            path, f"must be at most {policy.max_id_bytes} UTF-8 bytes (is {size})", value
        )
    if not UNSAFE_CHARACTERS.isdisjoint(value):
        raise ValidationError(
            path, "must not contain control, line-separator or bidirectional-control "
                  "characters", value)
    return value


def _string(value: object, path: str, min_chars: int, max_chars: int) -> str:
    if not isinstance(value, str):
        raise ValidationError(path, "must be a string", value)
    if not min_chars <= len(value) <= max_chars:
        raise ValidationError(path, f"must be {min_chars}..{max_chars} characters long", value)
    return value


def _integer(value: object, path: str, low: int, high: int) -> int:
    # JSON true/false arrive as bool, a subclass of int; 5.0 arrives as float. Neither counts.
    if type(value) is not int:
        raise ValidationError(path, "must be an integer", value)
    if not low <= value <= high:
        raise ValidationError(path, f"must be between {low} and {high}", value)
    return value


def _enum(value: object, path: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValidationError(path, "must be one of " + ", ".join(options), value)
    return value


def _duration(value: object, path: str) -> int:
    return parse_duration(value, path=path)  # type: ignore[arg-type]  # it checks the type


def _backoff(value: object, path: str) -> int:
    backoff_ms = _duration(value, path)
    if backoff_ms > MAX_BACKOFF_MS:
        raise ValidationError(path, "must be at most 1d", value)
    return backoff_ms


def _max_lateness(value: object, window_ms: int) -> int:
    path = "job.max_lateness"
    bound = _duration(value, path)
    low, high = limits.MIN_MAX_LATENESS_MS, limits.MAX_MAX_LATENESS_MS
    if not low <= bound <= high:
        raise ValidationError(
            path, f"must be between {format_duration(low)} and {format_duration(high)} "
                  "(limits.MIN_MAX_LATENESS_MS, limits.MAX_MAX_LATENESS_MS)", value)
    # Lateness counts from the scheduled instant, and a window fires an occurrence anywhere
    # up to `window` after it: a bound within the window would drop occurrences on time.
    if bound <= window_ms:
        raise ValidationError(path, f"must be longer than window ({format_duration(window_ms)})",
                              value)
    return bound


def _pause_after_failures(value: object, path: str, max_attempts: int) -> int:
    n = _integer(value, path, 1, limits.MAX_PAUSE_AFTER_FAILURES)
    # The worker looks for the streak in one read of the job's newest runs, and each failed
    # run may take max_attempts of them.
    if n * max_attempts > limits.AUTO_PAUSE_RUNS:
        raise ValidationError(
            path, f"times max_attempts ({max_attempts}) must be at most "
                  f"{limits.AUTO_PAUSE_RUNS} (limits.AUTO_PAUSE_RUNS: the runs the worker "
                  "reads to find the streak)", value)
    return n


def _note(value: object) -> str:
    text = _string(value, "note", 1, limits.MAX_PAUSE_NOTE_CHARS)
    if not UNSAFE_CHARACTERS.isdisjoint(text):
        raise ValidationError("note", "must not contain control, line-separator or "
                                      "bidirectional-control characters", value)
    return text


def _time_zone(value: object, path: str) -> str:
    tz = _string(value, path, 1, MAX_TZ_CHARS)
    if not _TZ.fullmatch(tz) or not _zone_exists(tz):
        raise ValidationError(path, "unknown time zone", value)
    return tz


@lru_cache(maxsize=1024)
def _zone_exists(name: str) -> bool:
    # These name the host's own configuration, not a zone: nodes could disagree about them.
    if name in ("localtime", "posixrules"):
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _topic(value: object, path: str, policy: ValidationPolicy) -> str:
    if not isinstance(value, str):
        raise ValidationError(path, "must be a string", value)
    problem = policy.topic_problem(value)
    if problem is not None:
        raise ValidationError(path, problem, value)
    return value


def instant_ms(value: object, path: str) -> int:
    """Epoch ms of a wire time (RFC 3339 with offset, or integer epoch ms); ValidationError
    naming `path` otherwise. For tools that take times the way the wire does."""
    return _instant(value, path)


def _instant(value: object, path: str) -> int:
    """Epoch ms of an RFC 3339 string with offset or of integer epoch ms (1970 .. 9999)."""
    if isinstance(value, str):
        return _rfc3339_ms(value, path)
    return _instant_ms(value, path)


def _instant_ms(value: object, path: str) -> int:
    if type(value) is not int:
        raise ValidationError(
            path, "must be an RFC 3339 time with offset or integer epoch milliseconds", value
        )
    if not 0 <= value <= MAX_EPOCH_MS:
        raise ValidationError(
            path, f"epoch milliseconds must be between 0 and {MAX_EPOCH_MS}", value
        )
    return value


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def _rfc3339_ms(text: str, path: str) -> int:
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValidationError(
            path, "must be an RFC 3339 time like 2026-12-01T09:00:00Z or epoch milliseconds", text
        )
    year, month, day, hour, minute, second, frac, zulu, sign, off_h, off_m = match.groups()
    if zulu is None and sign is None:
        raise ValidationError(
            path, "needs a UTC offset ('Z' or +hh:mm): naive times are ambiguous", text
        )
    if second == "60":
        raise ValidationError(path, "leap seconds (:60) are not supported", text)
    try:
        offset = timedelta(0)
        if sign is not None:
            if int(off_h) > 23 or int(off_m) > 59:
                raise ValueError("offset out of range")
            offset = timedelta(hours=int(off_h), minutes=int(off_m))
            offset = -offset if sign == "-" else offset
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            tzinfo=timezone(offset),
        )
    except ValueError as exc:
        raise ValidationError(path, f"not a valid date and time ({exc})", text) from None
    # Round sub-millisecond fractions up: rounding down would fire up to 1 ms early.
    frac = frac or ""
    extra_ms = int(frac[:3].ljust(3, "0")) + (1 if frac[3:].strip("0") else 0)
    epoch_ms = (moment - _EPOCH) // _ONE_MS + extra_ms
    if epoch_ms < 0:
        raise ValidationError(path, "must not be before 1970-01-01T00:00:00Z", text)
    if epoch_ms > MAX_EPOCH_MS:
        raise ValidationError(path, "must not be after 9999-12-31T23:59:59.999Z", text)
    return epoch_ms


def _within_horizon(
    epoch_ms: int, value: object, path: str, policy: ValidationPolicy, now_ms: int
) -> None:
    if epoch_ms - now_ms > policy.max_horizon_ms:
        raise ValidationError(
            path, f"must be at most {format_duration(policy.max_horizon_ms)} ahead of now", value
        )


def kept(data: bytes) -> bytes:
    """An exact-size copy of bytes made by orjson.dumps, for bytes that are kept.

    orjson allocates at least 4 KiB for its output and does not give the rest back: a
    90-byte payload held by a parsed job, a wheel entry or a queue costs 4 KiB of memory
    (measured with tracemalloc). Short-lived results (a message sent at once) need no copy.
    """
    return memoryview(data).tobytes()


def _job_payload(job: dict[str, Any], policy: ValidationPolicy) -> bytes:
    if "payload" in job and "payload_b64" in job:
        raise ValidationError("job", "at most one of payload, payload_b64", None)
    if "payload_b64" in job:
        return _base64(job["payload_b64"], "job.payload_b64", policy)
    if "payload" not in job:
        return b""
    payload = kept(_dumps(job["payload"], "job.payload"))
    if len(payload) > policy.max_payload_bytes:
        raise ValidationError(
            "job.payload",
            f"must be at most {policy.max_payload_bytes} bytes once serialised",
            f"{len(payload)} bytes",
        )
    return payload


def _base64(value: object, path: str, policy: ValidationPolicy) -> bytes:
    if not isinstance(value, str):
        raise ValidationError(path, "must be a base64 string", value)
    if not _BASE64.fullmatch(value):
        raise ValidationError(path, "must be standard padded base64 (A-Z a-z 0-9 + / and =)", value)
    try:
        payload = base64.b64decode(value, validate=True)
    except binascii.Error as exc:  # the pattern should make this unreachable
        raise ValidationError(path, f"not valid base64 ({exc})", value) from None
    if len(payload) > policy.max_payload_bytes:
        raise ValidationError(
            path,
            f"must decode to at most {policy.max_payload_bytes} bytes",
            f"{len(payload)} bytes",
        )
    return payload


def _headers(value: object, path: str, policy: ValidationPolicy) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValidationError(path, "must be an object of string to string", value)
    size = 0
    for name, text in value.items():
        where = f"{path}.{name}"
        if name == "":
            raise ValidationError(where, "header names must not be empty", text)
        if not UNSAFE_CHARACTERS.isdisjoint(name):
            raise ValidationError(
                where, "header names must not contain control, line-separator or "
                       "bidirectional-control characters", name)
        if name[: len(RESERVED_HEADER_PREFIX)].lower() == RESERVED_HEADER_PREFIX:
            raise ValidationError(where, "names starting with 'cw-' are reserved", name)
        if not isinstance(text, str):
            raise ValidationError(where, "header values must be strings", text)
        size += len(name.encode()) + len(text.encode())
    if size > policy.max_headers_bytes:
        raise ValidationError(
            path, f"must total at most {policy.max_headers_bytes} UTF-8 bytes", f"{size} bytes"
        )
    # Sorted, so that key order in the submitted JSON does not make two specs differ.
    return tuple(sorted(value.items()))


# --------------------------------------------------------------------------------------------
# Encoding (client side): build wire bytes that parse_command accepts
# --------------------------------------------------------------------------------------------

_INSTANT_FIELDS: Final = ("at", "start", "end")
_DURATION_FIELDS: Final = ("every", "window", "backoff", "max_lateness")


def encode_upsert(job_fields: Mapping[str, Any]) -> bytes:
    """Wire bytes of an upsert. Values pass through as given, except these conveniences:
    at/start/end as an aware datetime become RFC 3339 UTC strings; every/window/backoff as
    int milliseconds or timedelta become duration strings; a bytes payload becomes payload_b64;
    headers may be any mapping. Validation is the parser's job (at ingest, or call it first).
    """
    job: dict[str, Any] = {}
    for name, value in job_fields.items():
        if name in _INSTANT_FIELDS and isinstance(value, datetime):
            job[name] = _wire_datetime(value, name)
        elif name in _DURATION_FIELDS and _is_duration_value(value):
            job[name] = _wire_duration(value, name)
        elif name == "payload" and isinstance(value, bytes | bytearray | memoryview):
            job["payload_b64"] = base64.b64encode(bytes(value)).decode("ascii")
        elif name == "headers" and isinstance(value, Mapping):
            job[name] = dict(value)
        else:
            job[name] = value
    return orjson.dumps({"v": 1, "op": "upsert", "job": job})


def encode_put_calendar(name: str, dates: Iterable[date | str]) -> bytes:
    """Wire bytes of a put_calendar; dates as `date` objects or `YYYY-MM-DD` strings."""
    days = sorted({d.isoformat() if isinstance(d, date) else d for d in dates})
    return orjson.dumps({"v": 1, "op": wire.OP_PUT_CALENDAR, "name": name, "dates": days})


def encode_delete_calendar(name: str) -> bytes:
    """Wire bytes of a delete_calendar."""
    return orjson.dumps({"v": 1, "op": wire.OP_DELETE_CALENDAR, "name": name})


def encode_cancel(id: str) -> bytes:
    """Wire bytes of a cancel of job `id`."""
    return orjson.dumps({"v": 1, "op": "cancel", "id": id})


def encode_control(op: str, id: str, *, note: str | None = None,
                   request_id: str | None = None, after_failures: int | None = None) -> bytes:
    """Wire bytes of a pause or resume of job `id`; a pause may carry a `note` (why), a
    `request_id` (applied once) and `after_failures` (only after that many failed runs)."""
    if op not in ("pause", "resume"):
        raise ValueError(f"op must be pause or resume, got {op!r}")
    doc: dict[str, Any] = {"v": 1, "op": op, "id": id}
    if op == "resume" and (note, request_id, after_failures) != (None, None, None):
        raise ValueError("a resume carries no note, request_id nor after_failures")
    if after_failures is not None:
        doc["after_failures"] = after_failures
    if note is not None:
        doc["note"] = note
    if request_id is not None:
        doc["request_id"] = request_id
    return orjson.dumps(doc)


def encode_trigger(id: str, request_id: str) -> bytes:
    """Wire bytes of a trigger of job `id`; `request_id` makes a re-send harmless."""
    return orjson.dumps({"v": 1, "op": "trigger", "id": id, "request_id": request_id})


def encode_backfill(id: str, request_id: str, start: datetime | int | str,
                    end: datetime | int | str) -> bytes:
    """Wire bytes of a backfill of job `id` over [start, end): aware datetimes, epoch ms, or
    RFC 3339 strings (passed through)."""
    doc: dict[str, Any] = {"v": 1, "op": "backfill", "id": id, "request_id": request_id}
    for name, value in (("from", start), ("to", end)):
        doc[name] = _wire_datetime(value, name) if isinstance(value, datetime) else value
    return orjson.dumps(doc)


def encode_retry(
    *,
    id: str,
    scheduled_ms: int,
    attempt: int,
    at_ms: int,
    topic: str,
    payload: bytes,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    max_attempts: int | None = None,
    backoff_ms: int | None = None,
    origin: str = "",
    request_id: str = "",
    pause_after_failures: int | None = None,
    concurrency: str = wire.CONCURRENCY_ALLOW,
    redrive_id: str = "",
) -> bytes:
    """Wire bytes of a retry (what a worker sends); parses back to the equal Retry. The
    default `concurrency` (allow) and an empty `redrive_id` are left out of the bytes."""
    doc: dict[str, Any] = {
        "v": 1,
        "op": "retry",
        "id": id,
        "scheduled_at": scheduled_ms,
        "attempt": attempt,
        "at": at_ms,
        "topic": topic,
        "payload_b64": base64.b64encode(payload).decode("ascii"),
    }
    header_map = dict(headers.items() if isinstance(headers, Mapping) else headers)
    if header_map:
        doc["headers"] = header_map
    if max_attempts is not None:
        doc["max_attempts"] = max_attempts
    if backoff_ms is not None:
        doc["backoff"] = format_duration(backoff_ms)
    if origin or request_id:
        doc["origin"] = origin
        doc["request_id"] = request_id
    if pause_after_failures is not None:
        doc["pause_after_failures"] = pause_after_failures
    if concurrency != wire.CONCURRENCY_ALLOW:
        doc["concurrency"] = concurrency
    if redrive_id:
        doc["redrive_id"] = redrive_id
    return orjson.dumps(doc)


def _is_duration_value(value: object) -> bool:
    return isinstance(value, timedelta) or type(value) is int


def _wire_duration(value: int | timedelta, name: str) -> str:
    if isinstance(value, timedelta):
        ms, rest = divmod(value, _ONE_MS)
        if rest or ms < 0:
            raise ValueError(f"{name}: a duration must be whole, non-negative milliseconds")
        return format_duration(ms)
    return format_duration(value)


def _wire_datetime(value: datetime, name: str) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name}: naive datetime; give it a tzinfo (the wire needs an offset)")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
