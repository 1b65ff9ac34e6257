"""Bulk operations: one pause, resume, cancel or trigger command for every job a selector picks.

The jobs are listed through the store the way `list_jobs` reads them (tenant, status, id prefix,
due range) and each one gets one ordinary command on `<ns>.submit`, keyed by its job id, with a
bounded number unacknowledged at a time. Nothing here is a new wire form: a bulk operation is
only many commands.

Idempotent and resumable. A bulk operation has an id (`new_operation_id()`, or one of the
caller's). A trigger's request id is derived from it (`request_id_for`), so the node, which
keeps a job's trigger request ids for its retention period (7 days by default, table
`job_requests`), publishes nothing for a trigger sent again. Pause, resume and cancel carry no
request id on the wire; they are idempotent by the job's state (pausing a paused job, resuming
a scheduled one, cancelling a cancelled one changes nothing), and jobs already in the target
state are not sent anything. A journal (`FileJournal`, `MemoryJournal`) records the operation's
selector and every job whose command Kafka acknowledged: running the same operation id again
skips those, so after an interruption each job gets its command once (a command acknowledged
but not yet journaled when the process died is sent again, which the rules above make a no-op).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from chronowheel.errors import ChronowheelError, ValidationError
from chronowheel.store.base import JOB_STATUSES, MAX_LIST_LIMIT, JobQuery, JobStore, JobSummary

BulkAction = Literal["pause", "resume", "cancel", "trigger"]
ACTIONS: tuple[BulkAction, ...] = ("pause", "resume", "cancel", "trigger")

OPERATION_ID_PATTERN = r"[A-Za-z0-9._:-]{1,100}"
_OPERATION_ID = re.compile(OPERATION_ID_PATTERN)
REQUEST_ID_PREFIX = "bulk:"
"""A bulk trigger's request id is this prefix and the operation id (`request_id_for`)."""

TARGET_STATE: dict[str, str] = {"pause": "paused", "resume": "scheduled", "cancel": "cancelled"}
"""The status each control leaves a job in (trigger leaves it as it is)."""


@dataclass(frozen=True)
class JobSelector:
    """Which jobs a bulk operation acts on: every filter given must hold (None: any).

    `due_after_ms` (inclusive) and `due_before_ms` (exclusive) bound the job's pending
    occurrence (`scheduled_ms`; for a paused job the first one it withholds). The store
    serves tenant, status and the due range through its indexes; prefix is applied to the
    rows it reads.
    """

    tenant: str | None = None
    status: str | None = None
    prefix: str | None = None
    due_after_ms: int | None = None
    due_before_ms: int | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.tenant, self.status, self.prefix,
                                       self.due_after_ms, self.due_before_ms))

    def query(self, page_token: str | None, limit: int = MAX_LIST_LIMIT) -> JobQuery:
        return JobQuery(tenant=self.tenant, status=self.status, prefix=self.prefix,
                        due_before_ms=self.due_before_ms, limit=limit, page_token=page_token,
                        due_after_ms=self.due_after_ms)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("tenant", self.tenant), ("status", self.status),
                                  ("prefix", self.prefix), ("due_after_ms", self.due_after_ms),
                                  ("due_before_ms", self.due_before_ms)) if v is not None}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobSelector:
        return cls(**{k: doc.get(k) for k in ("tenant", "status", "prefix", "due_after_ms",
                                              "due_before_ms")})

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.to_json().items()]
        return " ".join(parts) if parts else "every job"


def job_selector(*, tenant: str | None = None, status: str | None = None,
                 prefix: str | None = None, due_after: datetime | int | str | None = None,
                 due_before: datetime | int | str | None = None) -> JobSelector:
    """A validated selector; ValidationError names the filter, the rule and the value."""
    if tenant is not None and (not isinstance(tenant, str) or not 1 <= len(tenant) <= 128):
        raise ValidationError("tenant", "must be 1..128 characters", tenant)
    if status is not None and status not in JOB_STATUSES:
        raise ValidationError("status", "must be one of " + ", ".join(JOB_STATUSES), status)
    if prefix is not None and not isinstance(prefix, str):
        raise ValidationError("prefix", "must be a string", prefix)
    after = _instant(due_after, "due_after")
    before = _instant(due_before, "due_before")
    if after is not None and before is not None and after >= before:
        raise ValidationError("due_after", f"must be before due_before ({before})", after)
    return JobSelector(tenant, status, prefix or None, after, before)


def _instant(value: datetime | int | str | None, path: str) -> int | None:
    from chronowheel.client.scheduler import _query_instant  # it imports this module

    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return _query_instant(value, path)


def new_operation_id(now_ms: int | None = None) -> str:
    """A fresh operation id: the UTC start time and a random part, e.g.
    `20261203T070112Z-3fa9c1`."""
    at = datetime.fromtimestamp((now_ms if now_ms is not None else time.time_ns() // 1_000_000)
                                / 1000, UTC)
    return f"{at:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def check_operation_id(op_id: object) -> str:
    if not isinstance(op_id, str) or not _OPERATION_ID.fullmatch(op_id):
        raise ValidationError("operation_id", "must be 1..100 of A-Z a-z 0-9 . _ : -", op_id)
    return op_id


def request_id_for(operation_id: str, job_id: str) -> str:
    """The request id of a bulk trigger's command for `job_id`: the same for every run of
    the operation, so the node publishes a job's triggered occurrence once. The node keys a
    request by (job, request id), so the job id need not be in it: `bulk:<operation id>`."""
    del job_id  # part of the request's key already
    return REQUEST_ID_PREFIX + operation_id


# --- the journal -------------------------------------------------------------------------

@dataclass
class JournalState:
    """What a journal holds: the operation's definition and the jobs done so far."""

    operation_id: str
    namespace: str
    action: str
    selector: JobSelector
    started_ms: int
    done: set[str] = field(default_factory=set)
    finished: dict[str, Any] | None = None


class BulkJournal(Protocol):
    """Where a bulk operation records its definition and progress."""

    def load(self, operation_id: str) -> JournalState | None:
        """The state of `operation_id`, None when it never ran here."""
        ...

    def begin(self, state: JournalState) -> None:
        """Record a new operation (its definition; `done` is empty)."""
        ...

    def record(self, operation_id: str, job_ids: Sequence[str]) -> None:
        """Jobs whose command Kafka acknowledged (or that needed none)."""
        ...

    def finish(self, operation_id: str, summary: Mapping[str, Any]) -> None:
        ...


class MemoryJournal:
    """A journal in a dict (tests, or a caller that keeps state itself)."""

    def __init__(self) -> None:
        self.states: dict[str, JournalState] = {}

    def load(self, operation_id: str) -> JournalState | None:
        state = self.states.get(operation_id)
        if state is None:
            return None
        return JournalState(state.operation_id, state.namespace, state.action, state.selector,
                            state.started_ms, set(state.done), state.finished)

    def begin(self, state: JournalState) -> None:
        self.states[state.operation_id] = JournalState(
            state.operation_id, state.namespace, state.action, state.selector,
            state.started_ms)

    def record(self, operation_id: str, job_ids: Sequence[str]) -> None:
        self.states[operation_id].done.update(job_ids)

    def finish(self, operation_id: str, summary: Mapping[str, Any]) -> None:
        self.states[operation_id].finished = dict(summary)


def default_journal_dir() -> Path:
    """`$XDG_STATE_HOME/chronowheel/bulk` (default `~/.local/state/chronowheel/bulk`)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "chronowheel" / "bulk"


class FileJournal:
    """One JSON-lines file per operation, `<dir>/<namespace>/<operation id>.jsonl`: the
    operation's definition first, then lines of job ids done, appended and flushed as Kafka
    acknowledges them, and a summary when a run ends."""

    def __init__(self, directory: Path | str, namespace: str) -> None:
        self.directory = Path(directory) / namespace

    def path(self, operation_id: str) -> Path:
        return self.directory / f"{check_operation_id(operation_id)}.jsonl"

    def load(self, operation_id: str) -> JournalState | None:
        path = self.path(operation_id)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        state: JournalState | None = None
        for n, line in enumerate(lines, 1):
            try:
                doc = json.loads(line)
            except ValueError:
                if n == len(lines):  # a last line cut short by a crash: what it held is redone
                    break
                raise ChronowheelError(f"{path}: line {n} is not JSON") from None
            if state is None:
                state = JournalState(doc["operation_id"], doc["namespace"], doc["action"],
                                     JobSelector.from_json(doc.get("selector", {})),
                                     int(doc["started_ms"]))
            elif "done" in doc:
                state.done.update(doc["done"])
            elif "summary" in doc:
                state.finished = doc["summary"]
        return state

    def begin(self, state: JournalState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._append(state.operation_id, {
            "operation_id": state.operation_id, "namespace": state.namespace,
            "action": state.action, "selector": state.selector.to_json(),
            "started_ms": state.started_ms}, new=True)

    def record(self, operation_id: str, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._append(operation_id, {"done": list(job_ids)})

    def finish(self, operation_id: str, summary: Mapping[str, Any]) -> None:
        self._append(operation_id, {"summary": dict(summary)})

    def _append(self, operation_id: str, doc: Mapping[str, Any], new: bool = False) -> None:
        # A new operation replaces what a crash may have left of its first line.
        with self.path(operation_id).open("w" if new else "a", encoding="utf-8") as f:
            f.write(json.dumps(doc, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())


# --- progress and summary -------------------------------------------------------------------

@dataclass(frozen=True)
class BulkProgress:
    """Passed to a bulk operation's progress callback."""

    listed: int        # jobs the selector matched so far
    listing_done: bool  # False while more pages may come: `listed` is a lower bound
    to_send: int       # of those, jobs that need a command (so far)
    acked: int         # commands Kafka acknowledged in this run
    skipped: int       # jobs that needed none (already in the state, done earlier, refused)
    elapsed_s: float

    @property
    def done(self) -> int:
        return self.acked + self.skipped

    @property
    def rate(self) -> float:
        """Commands acknowledged per second."""
        return self.acked / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds until every command is acknowledged, at the current rate (None while the
        listing goes on or before any acknowledgement)."""
        if not self.listing_done or self.rate <= 0:
            return None
        return max(0, self.to_send - self.acked) / self.rate


@dataclass
class BulkSummary:
    """What a bulk operation did (or, with `dry_run`, would do)."""

    operation_id: str
    action: str
    selector: JobSelector
    dry_run: bool = False
    matched: int = 0
    """Jobs the selector picked."""
    changed: list[str] = field(default_factory=list)
    """Jobs sent a command in this run and acknowledged by Kafka (with `dry_run`: jobs that
    would be); after a wait, those the node refused are moved to `refused`."""
    already: list[str] = field(default_factory=list)
    """Jobs already in the target state (a trigger: its request applied before)."""
    done_before: list[str] = field(default_factory=list)
    """Jobs an earlier run of this operation did (from the journal)."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(job id, reason): jobs whose state the command does not fit (as the node would refuse
    them), and, after a wait, those the node refused."""
    failed: list[tuple[str, BaseException]] = field(default_factory=list)
    """Commands Kafka did not take (sent again by the next run of the operation)."""
    waited: bool = False
    """Whether the node was seen to apply every command sent (`wait`)."""
    wait_error: str | None = None
    """Why the wait ended before the nodes were seen to apply every command."""
    elapsed_s: float = 0.0
    sent: list[SentCommand] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        """Every command written and, when waited for, seen applied."""
        return not self.failed and self.wait_error is None

    def refusal_counts(self) -> dict[str, int]:
        """Reason -> number of jobs, the job id taken out of each reason."""
        counts: dict[str, int] = {}
        for job_id, reason in self.refused:
            general = reason.replace(repr(job_id), "<job>")
            counts[general] = counts.get(general, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_json(self, sample: int = 20) -> dict[str, Any]:
        return {
            "operation_id": self.operation_id, "action": self.action,
            "selector": self.selector.to_json(), "dry_run": self.dry_run,
            "matched": self.matched,
            "changed": len(self.changed), "changed_ids": self.changed[:sample],
            "already": len(self.already), "done_before": len(self.done_before),
            "refused": len(self.refused), "refused_reasons": self.refusal_counts(),
            "refused_ids": [j for j, _r in self.refused[:sample]],
            "failed": len(self.failed),
            "failed_ids": [j for j, _e in self.failed[:sample]],
            "waited": self.waited, "wait_error": self.wait_error,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass(frozen=True)
class SentCommand:
    """A command of a bulk operation as Kafka took it: where, to find the node's verdict."""

    job_id: str
    partition: int | None
    offset: int | None


Send = Callable[[str], Awaitable["asyncio.Future[Any]"]]
"""Sends the operation's command for one job id; returns its Delivery."""
Confirm = Callable[[Sequence[SentCommand]], Awaitable[Mapping[str, str]]]
"""Waits until the node applied the commands given; returns job id -> reason for those it
refused."""


def refusal(action: str, job: JobSummary) -> str | None:
    """Why the node would refuse `action` for a job in `job.status` (its own words), None if
    it would not. A one-shot asked to trigger is refused by the node only (the listing does
    not say which jobs are one-shots)."""
    verb = action
    if action == "cancel":
        if job.status == "finished":
            return f"id: job {job.job_id!r} is finished; there is nothing to cancel"
        return None
    if job.status in ("finished", "cancelled"):
        return f"id: job {job.job_id!r} is {job.status}; there is nothing to {verb}"
    if action == "trigger" and job.status == "paused":
        return f"id: job {job.job_id!r} is paused; resume it before it can be triggered"
    return None


class BulkOperation:
    """One run of a bulk operation. `run()` lists, sends and returns the summary."""

    def __init__(self, *, action: str, selector: JobSelector, operation_id: str,
                 namespace: str, store: JobStore, send: Send,
                 journal: BulkJournal | None = None, dry_run: bool = False,
                 window: int = 1000, progress: Callable[[BulkProgress], None] | None = None,
                 progress_interval_s: float = 0.5, confirm: Confirm | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        if action not in ACTIONS:
            raise ValidationError("action", "must be one of " + ", ".join(ACTIONS), action)
        if type(window) is not int or window < 1:
            raise ValidationError("window", "must be an integer of at least 1", window)
        self.action = action
        self.selector = selector
        self.operation_id = check_operation_id(operation_id)
        self.namespace = namespace
        self.store = store
        self.send = send
        self.journal = journal
        self.dry_run = dry_run
        self.window = window
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.confirm = confirm
        self.now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.summary = BulkSummary(self.operation_id, action, selector, dry_run)
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._unjournaled: list[str] = []
        self._to_send = 0
        self._listing_done = False
        self._t0 = 0.0
        self._last_tell = 0.0

    def resume_state(self) -> JournalState | None:
        """The journal's record of this operation id, checked against this run: the same
        namespace, action and selector (else ValidationError saying what differs)."""
        if self.journal is None:
            return None
        state = self.journal.load(self.operation_id)
        if state is None:
            return None
        for what, was, now in (("namespace", state.namespace, self.namespace),
                               ("action", state.action, self.action),
                               ("selector", state.selector.describe(),
                                self.selector.describe())):
            if was != now:
                raise ValidationError(
                    "operation_id", f"operation {self.operation_id} was started with "
                                    f"{what} {was!r}, not {now!r}; use a new operation id "
                                    f"or the same {what}", self.operation_id)
        return state

    async def run(self) -> BulkSummary:
        self._t0 = self._last_tell = time.monotonic()
        state = self.resume_state()
        done: set[str] = set() if state is None else state.done
        if state is None and self.journal is not None and not self.dry_run:
            self.journal.begin(JournalState(self.operation_id, self.namespace, self.action,
                                            self.selector, self.now_ms()))
        try:
            token: str | None = None
            page_task = asyncio.ensure_future(self.store.list_jobs(self.selector.query(None)))
            while True:
                try:
                    page = await page_task
                except ValueError as exc:
                    raise ValidationError("page_token", str(exc), token) from None
                token = page.next_token
                if token is not None:  # the next page is read while this one is sent
                    page_task = asyncio.ensure_future(
                        self.store.list_jobs(self.selector.query(token)))
                else:
                    self._listing_done = True
                await self._page(page.jobs, done)
                if token is None:
                    break
            await self._drain()
        finally:
            if not self._listing_done:
                page_task.cancel()
            if self._in_flight:  # interrupted: what Kafka acknowledged still counts
                await asyncio.shield(self._drain())
            self._journal_flush()
            self.summary.elapsed_s = time.monotonic() - self._t0
        self._tell()
        if self.confirm is not None and self.summary.sent and not self.dry_run:
            try:
                refused = await self.confirm(self.summary.sent)
            except ChronowheelError as exc:
                self.summary.wait_error = str(exc)
            else:
                if refused:
                    self.summary.changed = [j for j in self.summary.changed
                                            if j not in refused]
                    self.summary.refused.extend(refused.items())
                self.summary.waited = True
        self.summary.elapsed_s = time.monotonic() - self._t0
        if self.journal is not None and not self.dry_run:
            self.journal.finish(self.operation_id, self.summary.to_json(sample=0))
        return self.summary

    async def _page(self, jobs: list[JobSummary], done: set[str]) -> None:
        s = self.summary
        s.matched += len(jobs)
        todo: list[JobSummary] = []
        for job in jobs:
            reason = refusal(self.action, job)
            if job.job_id in done:
                s.done_before.append(job.job_id)
            elif reason is not None:
                s.refused.append((job.job_id, reason))
            elif TARGET_STATE.get(self.action) == job.status:
                s.already.append(job.job_id)
            else:
                todo.append(job)
        if self.action == "trigger" and todo:
            todo = await self._untriggered(todo)
        self._to_send += len(todo)
        if self.dry_run:
            s.changed.extend(j.job_id for j in todo)
        else:
            for job in todo:
                while len(self._in_flight) >= self.window:
                    await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
                    self._periodic()
                delivery = await self.send(job.job_id)
                self._in_flight.add(delivery)
                delivery.add_done_callback(functools.partial(self._settled, job.job_id))
                self._periodic()
        self._periodic()

    async def _untriggered(self, jobs: list[JobSummary]) -> list[JobSummary]:
        """Those of `jobs` whose trigger of this operation the node has not applied (its
        request row, kept for the retention period, is the node's own dedup)."""
        gate = asyncio.Semaphore(64)

        async def applied(job: JobSummary) -> bool:
            async with gate:
                rid = request_id_for(self.operation_id, job.job_id)
                return await self.store.get_request(job.shard, job.job_id, rid) is not None

        seen = await asyncio.gather(*(applied(j) for j in jobs))
        out = []
        for job, was in zip(jobs, seen, strict=True):
            if was:
                self.summary.already.append(job.job_id)
            else:
                out.append(job)
        return out

    def _settled(self, job_id: str, fut: asyncio.Future[Any]) -> None:
        self._in_flight.discard(fut)
        if fut.cancelled():
            self.summary.failed.append((job_id, asyncio.CancelledError()))
            return
        exc = fut.exception()
        if exc is not None:
            self.summary.failed.append((job_id, exc))
            return
        meta = fut.result()
        self.summary.changed.append(job_id)
        self.summary.sent.append(SentCommand(job_id, getattr(meta, "partition", None),
                                             getattr(meta, "offset", None)))
        self._unjournaled.append(job_id)

    async def _drain(self) -> None:
        while self._in_flight:
            await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
            self._periodic()

    def _periodic(self) -> None:
        now = time.monotonic()
        if now - self._last_tell >= self.progress_interval_s:
            self._last_tell = now
            self._journal_flush()
            self._tell()

    def _journal_flush(self) -> None:
        if self.journal is not None and self._unjournaled and not self.dry_run:
            ids, self._unjournaled = self._unjournaled, []
            self.journal.record(self.operation_id, ids)

    def _tell(self) -> None:
        if self.progress is None:
            return
        s = self.summary
        skipped = len(s.already) + len(s.done_before) + len(s.refused)
        acked = len(s.changed) if not self.dry_run else 0
        self.progress(BulkProgress(s.matched, self._listing_done, self._to_send, acked,
                                   skipped, time.monotonic() - self._t0))

