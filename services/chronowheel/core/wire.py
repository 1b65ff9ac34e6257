"""The wire contract in one place: topic names, the headers of fired messages and of the
messages chronowheel writes about them, the retry defaults, the occurrence key.

Everything a producer, a node, a worker or a reader in another language must agree on is named
here once; docs/design.md (section "Wire format") and schema/README.md describe it for people.
Pure: no driver imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

# --- topics of a namespace -----------------------------------------------------------------


def submit_topic(namespace: str) -> str:
    """Commands in (upsert, cancel, retry, pause, resume, trigger, backfill); one partition
    per shard."""
    return f"{namespace}.submit"


def state_topic(namespace: str) -> str:
    """Compacted; one record per shard with its watermark and owner (internal): StateRecord."""
    return f"{namespace}.state"


def fired_topic(namespace: str) -> str:
    """Where occurrences fire unless a job names another allowed topic."""
    return f"{namespace}.fired"


def rejected_topic(namespace: str) -> str:
    """Commands that failed validation, with the reason."""
    return f"{namespace}.rejected"


def dead_topic(namespace: str) -> str:
    """Occurrences a worker gave up on, and occurrences whose target topic was missing."""
    return f"{namespace}.dead"


# The node group's membership check (`SubmitGroup.check_membership`) commits this offset, with
# this metadata, on partition 0 of the state topic: a group offset nothing reads. Never on the
# submit topic, whose offsets a process that is no longer a member may still be committing
# through its transactions: a commit of an older one there would move a shard's offset back.
MEMBERSHIP_PROBE_PARTITION: Final = 0
MEMBERSHIP_PROBE_OFFSET: Final = 0
MEMBERSHIP_PROBE_METADATA: Final = "chronowheel: group membership check"


def internal_topics(namespace: str) -> frozenset[str]:
    """Topics the scheduler itself writes or reads: no job may ever target them."""
    return frozenset({submit_topic(namespace), state_topic(namespace),
                      rejected_topic(namespace), dead_topic(namespace)})


def min_insync_replicas(replication: int) -> int:
    """`min.insync.replicas` of a namespace's topics: every replica but one, at least one.

    With the producers' acks=all, an acknowledged record is then on at least two brokers
    whenever replication is 3 or more, and writes go on while one broker is down.
    """
    return max(1, replication - 1)


# --- headers of a fired message ------------------------------------------------------------

RESERVED_HEADER_PREFIX: Final = "cw-"
"""A job's own headers may not start so."""

JOB_ID: Final = "cw-job-id"
SCHEDULED_AT: Final = "cw-scheduled-at"
"""the scheduled instant, epoch ms, decimal ASCII"""
FIRED_AT: Final = "cw-fired-at"
"""when the node published this delivery, epoch ms"""
ATTEMPT: Final = "cw-attempt"
"""1 for the first delivery; a worker's retries count up"""
OCCURRENCE: Final = "cw-occurrence"
"""`<job id>@<scheduled ms>`: the idempotency key"""
MAX_ATTEMPTS: Final = "cw-max-attempts"
BACKOFF_MS: Final = "cw-backoff-ms"

TRIGGERED: Final = "cw-triggered"
"""on an occurrence published by a `trigger` command: that command's request id"""
BACKFILL: Final = "cw-backfill"
"""on an occurrence published by a `backfill` command: that command's request id"""
CONCURRENCY: Final = "cw-concurrency"
"""the job's overlap policy for workers, `forbid` or `replace`; absent means `allow`"""
MAX_LATENESS_MS: Final = "cw-max-lateness-ms"
"""the job's lateness bound (`max_lateness`) in milliseconds, decimal ASCII; absent: the job
has none of its own. An occurrence dispatched later than this after its scheduled instant is
not published (missed)"""
PAUSE_AFTER_FAILURES: Final = "cw-pause-after-failures"
"""the job's `pause_after_failures` (N), decimal ASCII; absent: the job has none. The worker
library pauses the job after N consecutive failed runs (docs/worker.md, "Auto-pause")"""
CONCURRENCY_ALLOW: Final = "allow"
CONCURRENCY_FORBID: Final = "forbid"
CONCURRENCY_REPLACE: Final = "replace"
CONCURRENCY_POLICIES: Final = (CONCURRENCY_ALLOW, CONCURRENCY_FORBID, CONCURRENCY_REPLACE)
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
"""W3C trace context. Not reserved: a submitter puts them among the job's own headers, so they
are stored with the job and ride on every fired message; nodes and workers that trace
(OpenTelemetry, `chronowheel.observe.tracing`) continue that trace."""

FIRED_REQUIRED: Final = (JOB_ID, SCHEDULED_AT, FIRED_AT, ATTEMPT, OCCURRENCE)
"""Without these a record is not an occurrence (a worker dead-letters it)."""

# --- headers chronowheel adds to rejected commands and dead letters --------------------------

REASON: Final = "cw-reason"
"""<ns>.rejected: why the command was refused"""
SOURCE_TOPIC: Final = "cw-source-topic"
SOURCE_PARTITION: Final = "cw-source-partition"
SOURCE_OFFSET: Final = "cw-source-offset"
ORIGINAL_BYTES: Final = "cw-original-bytes"
"""<ns>.rejected: present when the original value was too large to republish beside the
headers; the value is then `{"original_bytes": n, "original_sha256": "..."}`"""
ERROR: Final = "cw-error"
"""<ns>.dead: `Type: message` of the last failure"""
FAILED_AT: Final = "cw-failed-at"
TARGET_TOPIC: Final = "cw-target-topic"
"""<ns>.dead: the target topic that did not exist"""

# --- calendars (named sets of excluded dates, per namespace) --------------------------------

OP_PUT_CALENDAR: Final = "put_calendar"
"""Submit op: create or replace a calendar, {"v":1,"op":"put_calendar","name":..,"dates":[..]}"""
OP_DELETE_CALENDAR: Final = "delete_calendar"
"""Submit op: delete a calendar, {"v":1,"op":"delete_calendar","name":..}"""
CALENDAR_OPS: Final = (OP_PUT_CALENDAR, OP_DELETE_CALENDAR)
MAX_EXCLUDE_DATES: Final = 1_000
"""Dates a job's own `exclude_dates` may list."""
MAX_CALENDAR_DATES: Final = 10_000
"""Dates one named calendar may hold."""
MAX_CALENDAR_NAME_CHARS: Final = 128

# --- retry policy defaults (a job's `max_attempts` and `backoff`) ----------------------------

DEFAULT_MAX_ATTEMPTS: Final = 5
DEFAULT_BACKOFF_MS: Final = 10_000


# --- schedule controls ------------------------------------------------------------------------

MAX_BACKFILL_OCCURRENCES: Final = 10_000
"""A backfill whose range holds more occurrences than this is rejected."""
TRIGGER_ORIGIN: Final = "trigger"
BACKFILL_ORIGIN: Final = "backfill"
"""Origins of occurrences a command asked for, besides the schedule's own ones."""


def occurrence_id(job_id: str, scheduled_ms: int) -> str:
    """The occurrence key carried in `cw-occurrence`."""
    return f"{job_id}@{scheduled_ms}"


def requested_occurrence_id(job_id: str, scheduled_ms: int, origin: str, request_id: str) -> str:
    """The occurrence key of an occurrence a trigger or backfill asked for:
    `<job id>@<scheduled ms>/<origin>/<request id>`. It differs from the key of the schedule's
    own occurrence at that instant (a backfill re-runs work a worker may have done already) and
    from that of another request, while a re-submitted request maps to the same keys."""
    return f"{job_id}@{scheduled_ms}/{origin}/{request_id}"


# --- the state record (`<ns>.state`) ----------------------------------------------------------


def claimer_transactional_id(namespace: str, shard: int) -> str:
    """The shard's own transactional id, `<ns>-shard-<k>`: the producer a takeover commits its
    claim of the shard with (which serialises claims of the shard). Before node transactions
    it also published the shard's records, so a state record without `owner` names it."""
    return f"{namespace}-shard-{shard}"


class StateRecordError(ValueError):
    """A value in `<ns>.state` that is not a state record."""


_STATE_KEY_PREFIX: Final = "shard-"


Ahead = tuple[tuple[int, int], ...]
"""The ranges (cut, high] a shard catching up has published beyond its watermark, in order."""


def _pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
        return value[0], value[1]
    return None


def _ahead(value: object, watermark: int, shard: int) -> Ahead | None:
    """The `ahead` ranges of a state record: absent, one [cut, high], or a list of them
    [[cut, high], ...], with watermark <= cut < high < next cut. Anything else is refused,
    not ignored: reading past it would publish twice."""
    if value is None:
        return None
    one = _pair(value)
    pairs = [one] if one is not None else \
        [_pair(v) for v in value] if isinstance(value, list) and value else [None]
    ranges: list[tuple[int, int]] = []
    low = watermark
    for pair in pairs:
        if pair is None or not low <= pair[0] < pair[1] or (ranges and pair[0] == low):
            raise StateRecordError(
                f"state record of shard {shard}: ahead must be [cut, high] or a list of them, "
                f"with watermark {watermark} <= cut < high < the next cut, got {value!r}")
        ranges.append(pair)
        low = pair[1]
    return tuple(ranges)


def _opt_int(doc: dict[str, Any], name: str) -> int | None:
    v = doc.get(name)
    return v if type(v) is int else None


@dataclass(frozen=True)
class StateRecord:
    """A shard's record in the compacted `<ns>.state` topic: key `shard-<k>` on partition k, a
    JSON object as value (docs/design.md, "The state record").

    Written by a node inside the transaction that publishes the shard's occurrences (and by a
    takeover's claim, and once by `init`); read back by the next owner (watermark, whom to
    fence) and by the status views (the diagnostics).
    """

    shard: int
    watermark: int
    """everything due up to this instant (epoch ms) is published"""
    owner: str | None = None
    """the transactional id that may publish for the shard from this record on; None: released
    by a graceful stop, or never owned"""
    node: str | None = None
    """id of the node that wrote it (`init` for the first record)"""
    at: int | None = None
    """when it was written, epoch ms by the writer's clock"""
    horizon: int | None = None
    """how far ahead the writer's wheel was loaded, epoch ms"""
    wheel: int | None = None
    """entries in the writer's wheel"""
    skew_ms: int | None = None
    """the writer's last measured clock skew to Cassandra (`skew`), None when unknown"""
    blocked: bool | None = None
    """whether that skew stopped the writer's dispatch; None: the record says nothing of the
    clock (then `skew` is absent too)"""
    claim: bool = False
    """a takeover's claim: only the owner changes, the watermark is the one it read"""
    ahead: Ahead | None = None
    """((cut, high), ...) while the shard catches up at a paced rate: the slots in each
    (cut, high] are published too, beyond `watermark` (the late ones between the ranges and
    at or before the first cut still wait); None otherwise. Encoded as [cut, high] when there
    is one range (as the first version that wrote it), [[cut, high], ...] when there are more
    (a takeover in the middle of a catch-up that found more late work). A version that
    ignores the field publishes those ranges again: twice, never lost (docs/design.md,
    "Lateness and catch-up", on rolling upgrades)"""
    without_owner: bool = False
    """the old form, with no `owner` field: written by the per-shard producer of versions from
    before node transactions, which may still publish with the shard's claimer id"""

    @staticmethod
    def key(shard: int) -> bytes:
        """Key of shard k's record (its partition is k)."""
        return f"{_STATE_KEY_PREFIX}{shard}".encode()

    @staticmethod
    def shard_of_key(key: bytes | None) -> int | None:
        """The shard a key is the state record key of; None for any other key."""
        if key is None or not key.startswith(_STATE_KEY_PREFIX.encode()):
            return None
        digits = key[len(_STATE_KEY_PREFIX):]
        return int(digits) if digits.isdigit() and digits.isascii() else None

    def encode(self) -> bytes:
        doc: dict[str, object] = {"shard": self.shard, "watermark": self.watermark,
                                  "node": self.node}
        if not self.without_owner:
            doc["owner"] = self.owner
        doc["at"] = self.at
        if self.horizon is not None:
            doc["horizon"] = self.horizon
        if self.wheel is not None:
            doc["wheel"] = self.wheel
        if self.blocked is not None:
            doc["skew"], doc["blocked"] = self.skew_ms, self.blocked
        if self.claim:
            doc["claim"] = True
        if self.ahead is not None:
            doc["ahead"] = list(self.ahead[0]) if len(self.ahead) == 1 else \
                [list(r) for r in self.ahead]
        return orjson.dumps(doc)

    @classmethod
    def parse(cls, value: bytes, *, shard: int) -> StateRecord:
        """The record read for `shard` (its partition and key say which shard, not the value).
        The watermark is required; a diagnostic field of another type reads as absent.
        Raises StateRecordError when the value is not a JSON object with a watermark."""
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise StateRecordError(f"state record of shard {shard} is not JSON: "
                                   f"{value[:200]!r}") from exc
        if not isinstance(doc, dict):
            raise StateRecordError(f"state record of shard {shard} is not a JSON object: "
                                   f"{value[:200]!r}")
        raw = doc.get("watermark")
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise StateRecordError(f"state record of shard {shard} has no watermark: "
                                   f"{value[:200]!r}")
        try:
            watermark = int(raw)
        except (ValueError, OverflowError) as exc:
            raise StateRecordError(f"state record of shard {shard} has no watermark: "
                                   f"{value[:200]!r}") from exc
        owner = doc.get("owner")
        node = doc.get("node")
        blocked = doc.get("blocked")
        return cls(shard=shard, watermark=watermark,
                   owner=None if owner is None else str(owner),
                   node=node if isinstance(node, str) else None,
                   at=_opt_int(doc, "at"), horizon=_opt_int(doc, "horizon"),
                   wheel=_opt_int(doc, "wheel"), skew_ms=_opt_int(doc, "skew"),
                   blocked=blocked if isinstance(blocked, bool) else None,
                   claim=doc.get("claim") is True, without_owner="owner" not in doc,
                   ahead=_ahead(doc.get("ahead"), watermark, shard))

    def publisher(self, namespace: str) -> str | None:
        """The transactional id that may still publish for the shard according to this record
        (when it is the last committed one): its owner; for the old form, the shard's claimer
        id; None when the shard was released or never owned."""
        if self.without_owner:
            return claimer_transactional_id(namespace, self.shard)
        return self.owner
