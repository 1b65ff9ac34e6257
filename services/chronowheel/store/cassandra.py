"""Cassandra implementation of JobStore: prepared statements, async bridge, retriable errors."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Any, cast

from cassandra import (
    AuthenticationFailed,
    ConsistencyLevel,
    CoordinationFailure,
    InvalidRequest,
    OperationTimedOut,
    ReadTimeout,
    Unauthorized,
    Unavailable,
    WriteTimeout,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    ResultSet,
    Session,
)
from cassandra.connection import ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    PreparedStatement,
    tuple_factory,
)

from chronowheel.core import wire
from chronowheel.core.model import JobStatus
from chronowheel.errors import ConfigError, RetriableError, StoreRefused
from chronowheel.retry import STORE_POLICY, with_retries
from chronowheel.security import quiet_loggers, speaks_tls, ssl_context, tls_failure
from chronowheel.settings import Settings
from chronowheel.store.base import (
    LIST_SCAN_ROWS,
    Claim,
    DueRow,
    JobPage,
    JobQuery,
    JobRow,
    JobSummary,
    RequestRow,
    RetiredDue,
    RunLease,
    job_id_of_entry,
    retire_margin_ms,
    retired_hides,
)
from chronowheel.store.server_warnings import ServerWarnings, mute_driver_lines
from chronowheel.timeouts import within

log = logging.getLogger(__name__)

# CoordinationFailure (ReadFailure, WriteFailure): replicas answered the coordinator with a
# failure, which is what a replica that is dying, starting or overloaded does; a node must
# retry it like a timeout rather than stop. ConnectionException: a connection to a node that
# was just killed closed under the request.
_TRANSIENT = (OperationTimedOut, ReadTimeout, WriteTimeout, Unavailable, NoHostAvailable,
              CoordinationFailure, ConnectionException)
TRANSIENT_ERRORS = _TRANSIENT
"""The driver's errors that a retry may outlive (for callers outside this module)."""
HOUR_MS = 3_600_000
TUPLES = "tuples"
# Partition keys per `jobs` read of get_jobs.
JOBS_READ_GROUP = 50
# Requests in flight per put_jobs or add_bucket_counts call: each row or partition is its own
# request (no batch spans partitions), and a call must not queue thousands on a connection.
WRITES_IN_FLIGHT = 64
# Due rows `due_page` reads a request once it has met retired rows (it starts at its limit).
DUE_PAGE_SCAN = 1000
# Rows per page of a read of retired due rows (their rows are small: a key and a version).
RETIRED_PAGE_ROWS = 5000
# The smallest clustering key of a due bucket: below every slot, job id and attempt.
MIN_SLOT = -(2**63)
MIN_ATTEMPT = -(2**31)
_Clustering = tuple[int, str, int]
"""A due row's clustering key within its bucket: (slot_ms, entry, attempt)."""

SERVER_WARNINGS = ServerWarnings()
"""The warnings Cassandra sent with its answers to this process's requests: counted by kind,
logged at most once per kind per minute (store/server_warnings.py). Every CassandraStore of the
process feeds it; the node exports it with its metrics."""


REQUEST_COLUMNS = ("shard, job_id, request_id, kind, from_ms, to_ms, next_ms, total, handed, "
                   "spec")


def _retired_params(retired: RetiredDue) -> tuple[Any, ...]:
    return (*retired.key, retired.version, max(1, retired.ttl_s))


def _hidden(row: Sequence[Any], retired: Mapping[_Clustering, tuple[int, int]],
            margin_us: int) -> bool:
    """Whether a due row as read (`cols`: its clustering key at 2..4, its version at 6, its
    write time in microseconds last) is retired (`retired_hides`)."""
    hit = retired.get((row[2], row[3], row[4]))
    return hit is not None and retired_hides(hit[0], hit[1], row[6], row[-1], margin_us)


def _server_words(exc: InvalidRequest) -> str:
    """What the server said, without the driver's prefix."""
    text = str(exc)
    return text.split('message="', 1)[1].rstrip('"') if 'message="' in text else text


def _request(row: Sequence[Any]) -> RequestRow:
    shard, job_id, request_id, kind, from_ms, to_ms, next_ms, total, handed, spec = row
    return RequestRow(shard, job_id, request_id, kind or "", from_ms or 0, to_ms or 0, next_ms,
                      total or 0, handed or 0, spec or b"")


def _decode_paging(token: str | None) -> bytes | None:
    if token is None:
        return None
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"page token {token!r}: not a token of this store") from None


class CassandraError(RetriableError):
    """A transient Cassandra failure (timeout, unavailable replicas, no host)."""


class CassandraAccessError(ConfigError):
    """Cassandra refused this client (credentials, TLS): not retried."""


def security_options(settings: Settings) -> dict[str, Any]:
    """The Cluster arguments for authentication and TLS (checked here)."""
    opts: dict[str, Any] = {}
    if settings.cassandra_username or settings.cassandra_password is not None:
        if not settings.cassandra_username or settings.cassandra_password is None:
            raise ConfigError("Cassandra authentication needs both cassandra_username and a "
                              "password in CHRONOWHEEL_CASSANDRA_PASSWORD or "
                              "CHRONOWHEEL_CASSANDRA_PASSWORD_FILE")
        opts["auth_provider"] = PlainTextAuthProvider(
            username=settings.cassandra_username,
            password=settings.cassandra_password.reveal())
    if settings.cassandra_uses_ssl:
        opts["ssl_context"] = ssl_context(
            what="cassandra", cafile=settings.cassandra_ssl_cafile,
            certfile=settings.cassandra_ssl_certfile, keyfile=settings.cassandra_ssl_keyfile,
            key_password=settings.cassandra_ssl_key_password,
            check_hostname=settings.cassandra_ssl_check_hostname)
    return opts


def explain_no_host(settings: Settings,
                    exc: NoHostAvailable) -> CassandraAccessError | CassandraError:
    """One line per contact point saying why it failed; access problems are not retriable."""
    errors: dict[Any, Any] = getattr(exc, "errors", None) or {}
    lines = []
    fatal = False
    for endpoint, err in errors.items():
        where = f"Cassandra at {endpoint}"
        tls = tls_failure(err) if isinstance(err, BaseException) else None
        text = f"{type(err).__name__}: {err}" if isinstance(err, BaseException) else str(err)
        if isinstance(err, AuthenticationFailed) or "Bad credentials" in text \
                or "AuthenticationFailed" in text:
            fatal = True
            lines.append(f"{where}: the credentials of user {settings.cassandra_username!r} "
                         "were refused (wrong user name or password?)")
        elif "requires authentication" in text or "AllowAllAuthenticator" in text \
                or "PasswordAuthenticator" in text:
            fatal = True
            lines.append(f"{where}: the server requires authentication: set "
                         "cassandra_username and CHRONOWHEEL_CASSANDRA_PASSWORD[_FILE]")
        elif tls is not None:
            fatal = True
            lines.append(f"{where}: {tls}")
        elif not settings.cassandra_uses_ssl and _closed_early(text) \
                and _endpoint_speaks_tls(endpoint):
            fatal = True
            lines.append(f"{where}: the port speaks TLS but this client does not: set "
                         "cassandra_ssl true (and cassandra_ssl_cafile)")
        else:
            lines.append(f"{where}: {text}")
    message = "; ".join(lines) or f"cannot reach Cassandra at {settings.cassandra}: {exc}"
    return CassandraAccessError(message) if fatal else CassandraError(message)


def _closed_early(text: str) -> bool:
    lowered = text.lower()
    return any(w in lowered for w in ("connection closed", "connectionshutdown",
                                      "connection reset", "eof"))


def _endpoint_speaks_tls(endpoint: Any) -> bool:
    host, _, port = str(endpoint).rpartition(":")
    return port.isdigit() and speaks_tls(host.strip("[]"), int(port))


def connect(settings: Settings, *, keyspace: str | None = None) -> tuple[Cluster, Session]:
    hosts = settings.cassandra_hosts()
    port = hosts[0][1]
    try:
        level = ConsistencyLevel.name_to_value[settings.consistency.upper()]
    except KeyError:
        raise ConfigError(f"consistency: unknown level {settings.consistency!r}") from None
    local_dc = settings.cassandra_local_dc or None
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=local_dc)),
        consistency_level=level, serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=10.0,
    )
    # Hot reads build plain tuples: the default named tuples cost a class per result set.
    tuples = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=local_dc)),
        consistency_level=level, serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=10.0, row_factory=tuple_factory,
    )
    cluster = Cluster(
        contact_points=[h for h, _ in hosts], port=port, protocol_version=5,
        connect_timeout=10, control_connection_timeout=10,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile, TUPLES: tuples},
        **security_options(settings),
    )
    try:
        with quiet_loggers("cassandra.cluster", "cassandra.connection", "cassandra.pool"):
            session = cluster.connect(keyspace)
    except NoHostAvailable as exc:
        cluster.shutdown()
        raise explain_no_host(settings, exc) from None
    except AuthenticationFailed:
        cluster.shutdown()
        raise CassandraAccessError(
            f"Cassandra at {settings.cassandra}: the credentials of user "
            f"{settings.cassandra_username!r} were refused") from None
    return cluster, session


class _Settler:
    """Hands the driver's answers to one event loop in batches.

    The driver answers in its I/O thread; waking the loop once per answer
    (`call_soon_threadsafe`: a lock, a deque append and a write to the loop's self-pipe) cost
    more of the node's CPU during ingest than the statements themselves. Answers are queued
    here instead, and the loop is woken only when the queue was empty: one wake settles every
    answer that arrived meanwhile.
    """

    __slots__ = ("__weakref__", "_lock", "_loop", "_queue", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._queue: deque[
            tuple[asyncio.Future[Any], ResponseFuture, Any, BaseException | None, str]] = deque()
        self._scheduled = False

    def put(self, fut: asyncio.Future[Any], rf: ResponseFuture, rows: Any,
            exc: BaseException | None, what: str) -> None:
        with self._lock:
            self._queue.append((fut, rf, rows, exc, what))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody waits for these answers any more
            with self._lock:
                self._scheduled = False
                self._queue.clear()

    def _drain(self) -> None:
        with self._lock:
            items = list(self._queue)
            self._queue.clear()
            self._scheduled = False
        for fut, rf, rows, exc, what in items:
            try:
                _settle(fut, rf, rows, exc, what)
            except Exception as bug:  # its waiter must hear of it, not hang
                # One answer that cannot be settled must neither leave its own waiter
                # waiting forever nor the other answers of this batch unsettled: a store
                # call that never returns stops its shard's ingest without a word.
                log.error("settling the answer to %s failed: %r", what or "a request", bug)
                if not fut.done():
                    fut.set_exception(bug)


_settlers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Settler] = \
    weakref.WeakKeyDictionary()


def _settler(loop: asyncio.AbstractEventLoop) -> _Settler:
    settler = _settlers.get(loop)
    if settler is None:
        settler = _settlers[loop] = _Settler(loop)
    return settler


def _await_future(rf: ResponseFuture, what: str = "") -> asyncio.Future[Any]:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    put = _settler(loop).put

    def ok(rows: object) -> None:
        put(fut, rf, rows, None, what)

    def err(exc: BaseException) -> None:
        put(fut, rf, None, exc, what)

    rf.add_callbacks(ok, err)
    return fut


def _settle(fut: asyncio.Future[Any], rf: ResponseFuture, rows: Any,
            exc: BaseException | None, what: str) -> None:
    # The driver may call back before it marks the request finished: `add_callbacks` on a
    # request whose answer has just arrived runs the callback at once, on this thread, while
    # the driver's I/O thread has yet to set the request's event. Until then the public
    # `warnings` raises and `result()` blocks, so neither is used: the warnings were stored
    # with the answer, before any callback, and the callback was handed the rows.
    # The answer first: what follows is bookkeeping, and a failure in it must not turn a
    # write Cassandra applied into an error. (The waiter resumes on a later turn of the loop,
    # after the cycles below are broken.)
    if not fut.done():
        if exc is None:
            fut.set_result(ResultSet(rf, rows))
        else:
            fut.set_exception(_translated(exc))
    try:
        warnings = stored_warnings(rf)
        _break_cycles(rf)
        if warnings:
            SERVER_WARNINGS.note(warnings, what)
    except Exception as bug:  # bookkeeping of an answer already handed over
        log.error("after the answer to %s: %r", what or "a request", bug)


def stored_warnings(rf: ResponseFuture) -> list[str] | None:
    """The server's warnings of an answer, as the driver stored them with it before calling
    back (the public `warnings` raises until the driver has also marked the request
    finished, which may come after a callback: see `_settle`)."""
    warnings: list[str] | None = getattr(rf, "_warnings", None)
    return warnings


def _break_cycles(rf: ResponseFuture) -> None:
    """A finished request's future still refers to our callbacks (which refer to it) and to
    its cancelled timeout timer (whose callback is its own bound method): two reference
    cycles, about 30 objects a request that only the cyclic collector could free, and they
    made the node's full collections frequent (see node/gc_policy.py). Drop both links."""
    rf.clear_callbacks()
    rf._timer = None  # cancelled before the callbacks ran; the driver never uses it again


def _settle_value(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _settle_error(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(_translated(exc))


def _translated(exc: BaseException) -> BaseException:
    """The driver's error as this package's: transient ones retriable, a refusal of what a
    write holds (`InvalidRequest`: batch too large, TTL too large) a `StoreRefused`, which
    is permanent for the one command that made the write; anything else as it is."""
    if isinstance(exc, _TRANSIENT):
        return CassandraError(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, Unauthorized):  # a grant is missing: for the operator, not one command
        return ConfigError(f"Cassandra refused for want of a permission: {exc}")
    if isinstance(exc, InvalidRequest) and _REFUSED_CONTENT.search(str(exc)):
        return StoreRefused(f"Cassandra refused the write: {exc}")
    return exc  # another InvalidRequest (a missing table, a bad statement): for the operator


# What Cassandra says of a write it refuses for its content: "Batch too large", "ttl is too
# large", "Mutation of N bytes is too large", "Key length of N is longer than maximum of N".
_MISSING_SCHEMA = re.compile(r"unconfigured table|undefined column name|keyspace .* does not "
                             r"exist", re.IGNORECASE)
_REFUSED_CONTENT = re.compile(r"too large|longer than maximum|exceeds", re.IGNORECASE)


def counts_by_partition(shard: int,
                        counts: Mapping[int, int]) -> list[list[tuple[int, int, int, int]]]:
    """The counter updates (rows, shard, hour, minute) of `counts` (minute -> rows), one list
    per partition (shard, hour) of `bucket_counts`, in the order their hours first appear;
    minutes with nothing to add are left out."""
    parts: dict[int, list[tuple[int, int, int, int]]] = {}
    for minute, rows in counts.items():
        if rows:
            hour = minute - minute % HOUR_MS
            parts.setdefault(hour, []).append((rows, shard, hour, minute))
    return list(parts.values())


async def _bounded(writes: Iterable[Coroutine[Any, Any, None]],
                   limit: int = WRITES_IN_FLIGHT) -> None:
    """Await every write, at most `limit` at a time. After a failure no further write is
    started (those not started are closed) and the failure is raised."""
    todo = list(writes)
    if len(todo) <= limit:
        await asyncio.gather(*todo)
        return
    queue = iter(todo)

    async def lane() -> None:
        for write in queue:
            try:
                await write
            except Exception:
                for rest in queue:
                    rest.close()
                raise

    await asyncio.gather(*(lane() for _ in range(limit)))


async def execute(session: Session, stmt: PreparedStatement, params: Sequence[Any], what: str,
                  **kw: Any) -> Any:
    """Run a prepared statement from the event loop, retrying transient failures."""
    async def once() -> Any:
        return await _await_future(session.execute_async(stmt, params, **kw), what)

    return await with_retries(once, what, STORE_POLICY)


def recorded_meta(session: Session, keyspace: str) -> dict[str, str]:
    """What init recorded in the keyspace's `meta` table (blocking): `shards` (the shard
    count) and `namespace` (the namespace it holds; absent in a keyspace initialised before
    init recorded it). Empty for a keyspace never initialised."""
    rows = session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,))
    if "meta" not in {r.table_name for r in rows}:
        return {}
    return {r.name: str(r.value) for r in session.execute(f"SELECT name, value FROM "
                                                          f"{keyspace}.meta")}


def check_keyspace_owner(owner: str | None, settings: Settings) -> None:
    """Refuse a keyspace that init recorded for another namespace: two namespaces in one
    keyspace would read and fire each other's jobs."""
    if owner is not None and owner != settings.namespace:
        raise ConfigError(f"cassandra_keyspace: keyspace {settings.keyspace!r} holds namespace "
                          f"{owner!r}, not {settings.namespace!r} (one keyspace holds one "
                          "namespace)")


def check_recorded_owner(meta: Mapping[str, str], settings: Settings) -> None:
    """Refuse a keyspace whose `meta` rows (`recorded_meta`) say it holds another namespace:
    the one recorded, or, for a keyspace initialised before init recorded it, the namespace
    it is named after (the only one its init could have been for)."""
    owner = meta.get("namespace")
    check_keyspace_owner(owner, settings)
    if owner is None and "shards" in meta and settings.keyspace != settings.derived_keyspace:
        raise ConfigError(
            f"cassandra_keyspace: keyspace {settings.keyspace!r} was initialised (with "
            f"{meta['shards']} shards) before init recorded which namespace it holds; run this "
            "version's `chronowheel init` for that namespace first, which records it")


def owned_meta(session: Session, settings: Settings) -> dict[str, str] | None:
    """`recorded_meta`, refusing a keyspace that holds another namespace (blocking;
    `check_recorded_owner`). None, with a warning, when the session's role may not read
    `meta` (a role granted before workers read it: `chronowheel acl --apply` adds it), so
    nothing was checked."""
    try:
        meta = recorded_meta(session, settings.keyspace)
    except Unauthorized:
        log.warning("the keyspace's owner not checked: this role may not read %s.meta (run "
                    "`chronowheel acl --apply` to grant it)", settings.keyspace)
        return None
    check_recorded_owner(meta, settings)
    return meta


def shard_count(session: Session, settings: Settings) -> int:
    """The shard count stored at init (blocking); a node refuses a namespace never
    initialised, and a keyspace init recorded for another namespace."""
    meta = recorded_meta(session, settings.keyspace)
    check_recorded_owner(meta, settings)
    if "shards" not in meta:
        raise ConfigError(f"namespace {settings.namespace!r} is not initialised: run "
                          f"`chronowheel init --namespace {settings.namespace}"
                          f"{settings.keyspace_flag} --shards N`")
    return int(meta["shards"])


def read_shard_count(settings: Settings) -> int:
    """`shard_count` on a connection of its own (blocking), for a node given its store."""
    cluster, session = connect(settings)
    try:
        return shard_count(session, settings)
    finally:
        cluster.shutdown()


PREPARE_THREADS = 8
"""Statements a store prepares at once at its start (see `prepare_concurrently`)."""


def prepare_concurrently(session: Session, declare: Callable[[Callable[[str], Any]], None],
                         threads: int = PREPARE_THREADS) -> None:
    """Run `declare(p)`, in which each statement is `p(cql)`, twice: once to collect the
    statements' text, which are then prepared `threads` at a time, and once more with `p`
    handing out the prepared statements. The driver's `prepare` blocks for a round trip to one
    host and then one to each other host; one after another, a node's start on three busy
    hosts spent most of its Cassandra step on them. Raises the first statement's error."""
    texts: list[str] = []

    def collect(cql: str) -> None:
        texts.append(cql)

    declare(collect)
    with ThreadPoolExecutor(threads, thread_name_prefix="cw-prepare") as pool:
        prepared = dict(zip(texts, pool.map(session.prepare, texts), strict=True))
    declare(prepared.__getitem__)


def prepare_tables(session: Session, declare: Callable[[Callable[[str], Any]], None],
                   keyspace: str, tables: str) -> None:
    """`prepare_concurrently`, with a statement that the keyspace refuses (a table or column
    it lacks) reported as a namespace to initialise again; `tables` names what was sought."""
    try:
        prepare_concurrently(session, declare)
    except InvalidRequest as exc:
        raise ConfigError(
            f"keyspace {keyspace} has no {tables} tables ({exc}): run `chronowheel init` for "
            f"this namespace once more (it is idempotent and adds missing tables)") from exc


class CassandraStore:
    """JobStore over one keyspace. Create with `open()`; close with `close()`."""

    def __init__(self, settings: Settings, cluster: Cluster, session: Session) -> None:
        self.settings = settings
        self.cluster = cluster
        self.session = session
        self.server_warnings = SERVER_WARNINGS
        mute_driver_lines()  # counted and logged by SERVER_WARNINGS instead, a line per kind
        self._listings: dict[tuple[bool, bool, bool, bool], PreparedStatement] = {}
        prepare_concurrently(session, self._declare_statements)

    def _declare_statements(self, p: Callable[[str], Any]) -> None:
        """Every statement of the store, each from `p(cql)` (see `prepare_concurrently`)."""
        ks = self.settings.keyspace
        self._get_job = p(f"SELECT job_id, shard, spec, version, status, scheduled_ms, slot_ms, "
                          f"tenant, note, since_ms FROM {ks}.jobs WHERE job_id = ?")
        self._get_jobs = p(f"SELECT job_id, shard, spec, version, status, scheduled_ms, "
                           f"slot_ms, tenant, note, since_ms FROM {ks}.jobs WHERE job_id IN ?")
        self._put_job = p(f"INSERT INTO {ks}.jobs (job_id, shard, spec, version, status, "
                          f"scheduled_ms, slot_ms, tenant, note, since_ms, updated_at) VALUES "
                          f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, toTimestamp(now())) USING TTL ?")
        self._put_due = p(f"INSERT INTO {ks}.due (minute, shard, slot_ms, job_id, attempt, "
                          f"scheduled_ms, version, topic, payload, headers, spec, max_attempts, "
                          f"backoff_ms, origin, request_id) "
                          f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        self._get_request = p(f"SELECT {REQUEST_COLUMNS} FROM {ks}.job_requests "
                              f"WHERE shard = ? AND job_id = ? AND request_id = ?")
        self._shard_requests = p(f"SELECT {REQUEST_COLUMNS} FROM {ks}.job_requests "
                                 f"WHERE shard = ?")
        self._put_request = p(f"INSERT INTO {ks}.job_requests ({REQUEST_COLUMNS}) "
                              f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        # Only with `due_deletes` (nodes of older versions about): see RetiredDue.
        self._del_due = p(f"DELETE FROM {ks}.due WHERE minute = ? AND shard = ? AND slot_ms = ? "
                          f"AND job_id = ? AND attempt = ?")
        self._retire_due = p(f"INSERT INTO {ks}.due_retired (minute, shard, slot_ms, job_id, "
                             f"attempt, version) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?")
        # Both bounds inclusive: the retired rows among a page of due rows just read.
        self._read_retired = p(f"SELECT slot_ms, job_id, attempt, version, WRITETIME(version) "
                               f"FROM {ks}.due_retired "
                               f"WHERE minute = ? AND shard = ? "
                               f"AND (slot_ms, job_id, attempt) >= (?, ?, ?) "
                               f"AND (slot_ms, job_id, attempt) <= (?, ?, ?)")
        # The write time last: a retirement hides only a row written before it (_hidden).
        cols = ("minute, shard, slot_ms, job_id, attempt, scheduled_ms, version, topic, payload, "
                "headers, spec, max_attempts, backoff_ms, origin, request_id, "
                "WRITETIME(version)")
        self._read_bucket = p(f"SELECT {cols} FROM {ks}.due WHERE minute = ? AND shard = ?")
        self._read_bucket_from = p(f"SELECT {cols} FROM {ks}.due WHERE minute = ? AND shard = ? "
                                   f"AND slot_ms >= ?")
        # Keyset paging for the console: one page of a bucket after a given row, without
        # reading the rows before it (a herd puts 100,000 rows on one millisecond).
        self._due_first = p(f"SELECT {cols} FROM {ks}.due WHERE minute = ? AND shard = ? "
                            f"LIMIT ?")
        self._due_after = p(f"SELECT {cols} FROM {ks}.due WHERE minute = ? AND shard = ? "
                            f"AND (slot_ms, job_id, attempt) > (?, ?, ?) LIMIT ?")
        self._add_count = p(f"UPDATE {ks}.bucket_counts SET rows = rows + ? "
                            f"WHERE shard = ? AND hour = ? AND minute = ?")
        self._read_counts = p(f"SELECT minute, rows FROM {ks}.bucket_counts "
                              f"WHERE shard = ? AND hour = ? AND minute >= ? AND minute <= ?")
        self._read_counts_hours = p(f"SELECT minute, rows FROM {ks}.bucket_counts "
                                    f"WHERE shard = ? AND hour IN ? AND minute >= ? "
                                    f"AND minute <= ?")
        self._now = p("SELECT toUnixTimestamp(now()) FROM system.local")
        # UPDATE only, never INSERT: without a row marker the row vanishes with its cells' TTL,
        # and `IF state = null ...` also matches a row that does not exist.
        self._swap_claim = p(f"UPDATE {ks}.processed USING TTL ? SET state = ?, attempt = ?, "
                             f"owner = ?, worker = ? WHERE consumer = ? AND occurrence = ? "
                             f"IF state = ? AND attempt = ? AND owner = ?")
        self._release_claim = p(f"DELETE FROM {ks}.processed WHERE consumer = ? AND "
                                f"occurrence = ? IF state = 'running' AND owner = ?")
        self._get_meta = p(f"SELECT value FROM {ks}.meta WHERE name = ?")
        # UPDATE only (see _swap_claim): `IF ... = null` then also matches a missing row.
        self._swap_run = p(f"UPDATE {ks}.job_runs USING TTL ? SET occurrence = ?, owner = ?, "
                           f"worker = ?, cancel = ? WHERE scope = ? AND job_id = ? "
                           f"IF occurrence = ? AND owner = ? AND worker = ? AND cancel = ?")
        self._end_run = p(f"DELETE FROM {ks}.job_runs WHERE scope = ? AND job_id = ? "
                          f"IF owner = ?")
        self._get_calendar = p(f"SELECT dates FROM {ks}.calendars WHERE name = ?")
        # INSERT (not UPDATE): the row marker keeps a calendar with no dates readable as empty.
        self._put_calendar = p(f"INSERT INTO {ks}.calendars (name, dates, updated_at) "
                               f"VALUES (?, ?, toTimestamp(now()))")
        self._del_calendar = p(f"DELETE FROM {ks}.calendars WHERE name = ?")

    @classmethod
    def open(cls, settings: Settings) -> CassandraStore:
        """A worker's or a command's store (blocking): the keyspace's owner is checked before
        anything is prepared (a worker or a command of another namespace would share its
        claims, list its jobs, write its requests); a role that may not read `meta` is let
        through with a warning, as before the check existed."""
        cluster, session = connect(settings)
        try:
            owned_meta(session, settings)
        except BaseException:
            cluster.shutdown()
            raise
        return cls.over(settings, cluster, session)

    @classmethod
    def open_counting_shards(cls, settings: Settings) -> tuple[CassandraStore, int]:
        """A node's start (blocking): one connection, on which the namespace's shard count is
        read first (refusing a namespace never initialised), then the store's statements are
        prepared."""
        cluster, session = connect(settings)
        try:
            shards = shard_count(session, settings)
        except BaseException:
            cluster.shutdown()
            raise
        return cls.over(settings, cluster, session), shards

    @classmethod
    def over(cls, settings: Settings, cluster: Cluster, session: Session) -> CassandraStore:
        """The store on a connection just made; the connection is closed if that fails."""
        try:
            return cls(settings, cluster, session)
        except InvalidRequest as exc:
            cluster.shutdown()
            words = _server_words(exc)
            if not _MISSING_SCHEMA.search(words):
                raise
            # A statement of this version that the keyspace cannot take (a missing table or
            # column): a keyspace set up by an older version and not migrated yet, or never
            # set up (or a coordinator that has not caught up with a schema change just made).
            raise ConfigError(
                f"keyspace {settings.keyspace} does not have this version's tables ({words}): "
                f"run `chronowheel init --namespace {settings.namespace}"
                f"{settings.keyspace_flag}` (it adds what is "
                f"missing and changes nothing else; a keyspace set up by an older chronowheel "
                f"is migrated so)") from exc
        except Exception:
            cluster.shutdown()
            raise

    def close(self) -> None:
        self.cluster.shutdown()

    async def _run(self, stmt: PreparedStatement, params: Sequence[Any], what: str,
                   **kw: Any) -> Any:
        return await execute(self.session, stmt, params, what, **kw)

    # --- jobs ---------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> JobRow | None:
        rs = await self._run(self._get_job, (job_id,), "read job", execution_profile=TUPLES)
        row = rs.one()
        if row is None:
            return None
        job, shard, spec, version, status, scheduled_ms, slot_ms, tenant, note, since = row
        return JobRow(job, shard, spec or b"", version or 0, cast(JobStatus, status or ""),
                      scheduled_ms, slot_ms, 0, tenant, note or None, since)

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRow]:
        # A few dozen partition keys per request: one request (and one answer to settle)
        # for many rows, while each stays a small read for the coordinator.
        ids = list(dict.fromkeys(job_ids))
        groups = [ids[i:i + JOBS_READ_GROUP] for i in range(0, len(ids), JOBS_READ_GROUP)]
        results = await asyncio.gather(*(
            self._run(self._get_jobs, (group,), "read jobs", execution_profile=TUPLES)
            for group in groups))
        out: dict[str, JobRow] = {}
        for rs in results:
            for job, shard, spec, version, status, scheduled_ms, slot_ms, tenant, note, \
                    since in rs.current_rows:
                out[job] = JobRow(job, shard, spec or b"", version or 0,
                                  cast(JobStatus, status or ""), scheduled_ms, slot_ms, 0,
                                  tenant, note or None, since)
        return out

    async def put_job(self, row: JobRow) -> None:
        await self._run(self._put_job, self._job_params(row), "write job")

    async def put_jobs(self, rows: Sequence[JobRow]) -> None:
        # One request per row, WRITES_IN_FLIGHT at a time: each row is its own partition, and
        # an unlogged batch across partitions makes one coordinator do every replica's work
        # (Cassandra warns of it from 10 partitions on). No atomicity is promised.
        await _bounded(self._put_job_row(row) for row in rows)

    async def _put_job_row(self, row: JobRow) -> None:
        await self._run(self._put_job, self._job_params(row), "write job")

    @staticmethod
    def _job_params(row: JobRow) -> tuple[Any, ...]:
        # Unset, not null, for a note or since_ms of None: the rows written at every fire
        # leave them as stored and write no tombstone; CLEAR_NOTE ("") binds a null.
        note = UNSET_VALUE if row.note is None else (row.note or None)
        return (row.job_id, row.shard, row.spec, row.version, row.status, row.scheduled_ms,
                row.slot_ms, UNSET_VALUE if row.tenant is None else row.tenant, note,
                UNSET_VALUE if row.since_ms is None else row.since_ms, row.ttl_s)

    # --- due rows -----------------------------------------------------------------------
    async def put_due(self, row: DueRow, ttl_s: int) -> None:
        await self._run(self._put_due, self._due_params(row, ttl_s), "write due row")

    @staticmethod
    def _due_params(row: DueRow, ttl_s: int) -> tuple[Any, ...]:
        return (row.minute, row.shard, row.slot_ms, row.entry, row.attempt, row.scheduled_ms,
                row.version, row.topic, row.payload, list(row.headers),
                # a bound null is a tombstone; one-shot rows leave `spec` unset instead
                UNSET_VALUE if row.spec is None else row.spec,
                row.max_attempts, row.backoff_ms,
                row.origin or UNSET_VALUE, row.request_id or UNSET_VALUE, max(1, ttl_s))

    async def put_due_and_job(self, row: DueRow, ttl_s: int, job: JobRow,
                              replaces: RetiredDue | None = None) -> None:
        batch = BatchStatement(batch_type=BatchType.LOGGED)
        batch.add(self._put_due, self._due_params(row, ttl_s))
        batch.add(self._put_job, self._job_params(job))
        if replaces is not None and replaces.key != row.key:
            # The same key is overwritten by the new row (whose version is higher) instead.
            batch.add(self._retire_due, _retired_params(replaces))
            if self.settings.due_deletes:
                batch.add(self._del_due, replaces.key)
        await self._run_batch(batch, "write due and job rows")

    async def put_dues_and_jobs(self, rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        # One logged batch: the batch log makes all of it or none of it durable, so no job's
        # due row can exist without its jobs row (or the other way round) after a crash.
        batch = BatchStatement(batch_type=BatchType.LOGGED)
        for row, ttl_s, job in rows:
            batch.add(self._put_due, self._due_params(row, ttl_s))
            batch.add(self._put_job, self._job_params(job))
        await self._run_batch(batch, f"write due and job rows of {len(rows)} jobs")

    async def _run_batch(self, batch: BatchStatement, what: str) -> None:
        async def once() -> Any:
            return await _await_future(self.session.execute_async(batch), what)

        await with_retries(once, what, STORE_POLICY)

    async def retire_due(self, retired: RetiredDue) -> None:
        if not self.settings.due_deletes:
            await self._run(self._retire_due, _retired_params(retired), "retire due row")
            return
        # For nodes of older versions, which read `due` alone: the delete too, in one logged
        # batch with the retirement.
        batch = BatchStatement(batch_type=BatchType.LOGGED)
        batch.add(self._retire_due, _retired_params(retired))
        batch.add(self._del_due, retired.key)
        await self._run_batch(batch, "retire and delete due row")

    async def read_bucket(self, minute: int, shard: int, *, from_slot_ms: int | None = None,
                          page_rows: int = 5000) -> AsyncIterator[list[DueRow]]:
        if from_slot_ms is None:
            bound = self._read_bucket.bind((minute, shard))
        else:
            bound = self._read_bucket_from.bind((minute, shard, from_slot_ms))
        bound.fetch_size = page_rows
        low: _Clustering = (MIN_SLOT if from_slot_ms is None else from_slot_ms, "", MIN_ATTEMPT)
        paging_state: bytes | None = None
        while True:
            rs = await self._page(bound, paging_state)
            raw = rs.current_rows
            if raw:
                high: _Clustering = (raw[-1][2], raw[-1][3], raw[-1][4])
                rows = await self._unretired(minute, shard, raw, low, high)
                low = high
                if rows:
                    yield rows
            paging_state = rs.paging_state
            if not paging_state:
                return

    async def due_page(self, minute: int, shard: int, after: tuple[int, str, int] | None,
                       limit: int) -> list[DueRow]:
        """At most `limit` due rows of bucket (minute, shard) whose key (slot_ms, job_id,
        attempt) is greater than `after` (from the first row when None), in key order,
        retired rows left out (fewer than `limit` only at the bucket's end)."""
        out: list[DueRow] = []
        scan = limit
        while len(out) < limit:
            if after is None:
                rs = await self._run(self._due_first, (minute, shard, scan), "read due page",
                                     execution_profile=TUPLES)
            else:
                rs = await self._run(self._due_after, (minute, shard, *after, scan),
                                     "read due page", execution_profile=TUPLES)
            raw = rs.current_rows
            if not raw:
                break
            high: _Clustering = (raw[-1][2], raw[-1][3], raw[-1][4])
            kept = await self._unretired(minute, shard, raw,
                                         after or (MIN_SLOT, "", MIN_ATTEMPT), high)
            out += kept
            if len(raw) < scan:
                break
            after = high
            if len(kept) < len(raw):  # among retired rows: read more a request from here on
                scan = max(scan, DUE_PAGE_SCAN)
        return out[:limit]

    async def _unretired(self, minute: int, shard: int, raw: Sequence[tuple[Any, ...]],
                         low: _Clustering, high: _Clustering) -> list[DueRow]:
        """The rows of `raw` (a page of due rows, clustering keys from `low` to `high`) that
        no retirement hides (`_hidden`)."""
        retired: dict[_Clustering, tuple[int, int]] = {}
        bound = self._read_retired.bind((minute, shard, *low, *high))
        bound.fetch_size = RETIRED_PAGE_ROWS
        paging_state: bytes | None = None
        while True:
            rs = await self._page(bound, paging_state, "read retired due rows")
            for slot, entry, attempt, version, written in rs.current_rows:
                retired[(slot, entry, attempt)] = (version, written)
            paging_state = rs.paging_state
            if not paging_state:
                break
        if not retired:
            return [self._due_row(r) for r in raw]
        margin_us = retire_margin_ms(self.settings.retention_ms) * 1000
        return [self._due_row(r) for r in raw if not _hidden(r, retired, margin_us)]

    @staticmethod
    def _due_row(r: tuple[Any, ...]) -> DueRow:
        """A row of the `due` table as selected by the statements of this store (`cols`)."""
        (minute, shard, slot, entry, attempt, scheduled, version, topic, payload, headers, spec,
         max_attempts, backoff, origin, request_id) = r[:15]
        return DueRow(minute, shard, slot,
                      job_id_of_entry(entry, scheduled, origin or "", request_id or ""),
                      attempt, scheduled, version, topic,
                      payload or b"", tuple(headers or ()), spec,
                      wire.DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts,
                      wire.DEFAULT_BACKOFF_MS if backoff is None else backoff,
                      origin or "", request_id or "")

    async def _page(self, bound: Any, paging_state: bytes | None,
                    what: str = "read bucket page") -> Any:
        async def once() -> Any:
            return await _await_future(self.session.execute_async(
                bound, paging_state=paging_state, execution_profile=TUPLES), what)

        return await with_retries(once, what, STORE_POLICY)

    # --- bucket counts ------------------------------------------------------------------
    async def add_bucket_count(self, shard: int, minute: int, rows: int) -> None:
        hour = minute - minute % HOUR_MS
        await self._run(self._add_count, (rows, shard, hour, minute), "count bucket")

    async def add_bucket_counts(self, shard: int, counts: Mapping[int, int],
                                in_flight: int | None = None) -> None:
        # One request per partition (shard, hour), `in_flight` at a time (the node's
        # ingest_counts_in_flight; WRITES_IN_FLIGHT when not given): the minutes of
        # one hour go in one counter batch, which is a single mutation of a single partition
        # (no batch log, no coordinator fan-out, no warning at any size). A counter batch
        # across partitions made one coordinator do every replica's work, and Cassandra warned
        # of it on every call (issue 26). Not atomic across hours, and need not be: a count
        # is an upper bound that a retry may raise further.
        await _bounded((self._count(updates) for updates in counts_by_partition(shard, counts)),
                       in_flight or WRITES_IN_FLIGHT)

    async def _count(self, updates: list[tuple[int, int, int, int]]) -> None:
        if len(updates) == 1:
            await self._run(self._add_count, updates[0], "count bucket")
            return
        batch = BatchStatement(batch_type=BatchType.COUNTER)
        for params in updates:
            batch.add(self._add_count, params)
        await self._run_batch(batch, f"count {len(updates)} minutes of one hour")

    async def bucket_counts(self, shard: int, from_minute: int, to_minute: int) -> dict[int, int]:
        out: dict[int, int] = {}
        hour = from_minute - from_minute % HOUR_MS
        while hour <= to_minute:
            rs = await self._run(self._read_counts, (shard, hour, from_minute, to_minute),
                                 "read bucket counts", execution_profile=TUPLES)
            for minute, rows in rs.current_rows:
                out[minute] = rows
            hour += HOUR_MS
        return out

    async def bucket_counts_wide(self, shard: int, from_minute: int,
                                 to_minute: int) -> dict[int, int]:
        """As `bucket_counts`, in one request naming every hour partition of the window: for
        windows of many hours (the console's 24), where a request per hour costs more than
        the reads themselves."""
        hours = list(range(from_minute - from_minute % HOUR_MS, to_minute + 1, HOUR_MS))
        rs = await self._run(self._read_counts_hours, (shard, hours, from_minute, to_minute),
                             "read bucket counts", execution_profile=TUPLES)
        return {minute: rows for minute, rows in rs.current_rows}

    # --- clock, idempotency, meta -------------------------------------------------------
    async def clock_sample(self) -> tuple[int, int, int]:
        # The answer is timestamped in the driver's I/O thread, not when this coroutine
        # resumes: a busy event loop must not look like a skewed clock.
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, int]] = loop.create_future()

        def ok(rows: Any) -> None:
            received = time.time_ns() // 1_000_000
            warnings = stored_warnings(rf)
            if warnings:
                SERVER_WARNINGS.note(warnings, "sample the clock")
            loop.call_soon_threadsafe(_settle_value, fut, (rows, received))

        def err(exc: BaseException) -> None:
            loop.call_soon_threadsafe(_settle_error, fut, exc)

        sent = time.time_ns() // 1_000_000
        rf = self.session.execute_async(self._now, (), execution_profile=TUPLES)
        rf.add_callbacks(ok, err)
        rows, received = await within(fut, 10)
        return int(rows[0][0]), sent, received

    async def swap_claim(self, consumer: str, occurrence: str, expected: Claim | None,
                         new: Claim, worker: str, ttl_s: int) -> tuple[bool, Claim | None]:
        """Compare-and-set the whole record; on a mismatch, also return what is there."""
        old = (None, None, None) if expected is None else (
            expected.state, expected.attempt, expected.owner)
        rs = await self._run(self._swap_claim, (
            max(1, ttl_s), new.state, new.attempt, new.owner, worker, consumer, occurrence, *old,
        ), "swap claim")
        row = rs.one()
        if row[0]:
            return True, None
        state = getattr(row, "state", None)
        if state is None:
            return False, None
        return False, Claim(state, int(row.attempt or 0), row.owner or "")

    async def release_claim(self, consumer: str, occurrence: str, owner: str) -> None:
        await self._run(self._release_claim, (consumer, occurrence, owner), "release claim")

    # --- trigger and backfill requests ----------------------------------------------------
    async def get_request(self, shard: int, job_id: str, request_id: str) -> RequestRow | None:
        rs = await self._run(self._get_request, (shard, job_id, request_id), "read request",
                             execution_profile=TUPLES)
        row = rs.one()
        return None if row is None else _request(row)

    async def shard_requests(self, shard: int) -> list[RequestRow]:
        # One partition, kept small by the rows' TTL (the retention period).
        rs = await self._run(self._shard_requests, (shard,), "read requests",
                             execution_profile=TUPLES)
        return [_request(row) for row in rs]

    async def put_request(self, request: RequestRow,
                          dues: Sequence[tuple[DueRow, int]] = ()) -> None:
        params = (request.shard, request.job_id, request.request_id, request.kind,
                  request.from_ms, request.to_ms, request.next_ms, request.total, request.handed,
                  request.spec, request.ttl_s)
        if not dues:
            await self._run(self._put_request, params, "write request")
            return
        batch = BatchStatement(batch_type=BatchType.LOGGED)
        for row, ttl_s in dues:
            batch.add(self._put_due, self._due_params(row, ttl_s))
        batch.add(self._put_request, params)
        await self._run_batch(batch, f"write request and {len(dues)} due rows")

    # --- listing --------------------------------------------------------------------------
    async def list_jobs(self, query: JobQuery) -> JobPage:
        """Served by the SAI indexes on tenant, status and scheduled_ms (rows come in token
        order); `prefix` is applied to the rows read. The page token is the driver's paging
        state, base64."""
        stmt = self._listing(query.tenant is not None, query.status is not None,
                             query.due_before_ms is not None, query.due_after_ms is not None)
        params = [v for v in (query.tenant, query.status, query.due_before_ms,
                              query.due_after_ms) if v is not None]
        paging_state = _decode_paging(query.page_token)
        found: list[JobSummary] = []
        read = 0
        while True:
            bound = stmt.bind(params)
            # Never more than still fits: the paging state points after the last row read,
            # so every row read is either returned or filtered out, never skipped.
            bound.fetch_size = min(query.limit - len(found), LIST_SCAN_ROWS - read)
            rs = await self._list_page(bound, paging_state)
            for job_id, shard, status, tenant, scheduled_ms, version, note in rs.current_rows:
                read += 1
                if query.prefix is None or job_id.startswith(query.prefix):
                    found.append(JobSummary(job_id, shard, status or "", tenant, scheduled_ms,
                                            version or 0, note or None))
            paging_state = rs.paging_state
            if not paging_state or len(found) >= query.limit or read >= LIST_SCAN_ROWS:
                break
        token = base64.urlsafe_b64encode(paging_state).decode() if paging_state else None
        return JobPage(found, token)

    def _listing(self, tenant: bool, status: bool, due: bool,
                 due_after: bool = False) -> PreparedStatement:
        key = (tenant, status, due, due_after)
        stmt = self._listings.get(key)
        if stmt is None:
            where = [w for w, on in (("tenant = ?", tenant), ("status = ?", status),
                                     ("scheduled_ms < ?", due),
                                     ("scheduled_ms >= ?", due_after)) if on]
            cql = (f"SELECT job_id, shard, status, tenant, scheduled_ms, version, note "
                   f"FROM {self.settings.keyspace}.jobs")
            if where:
                cql += " WHERE " + " AND ".join(where)
            stmt = self._listings[key] = self.session.prepare(cql)
        return stmt

    async def _list_page(self, bound: Any, paging_state: bytes | None) -> Any:
        async def once() -> Any:
            return await _await_future(self.session.execute_async(
                bound, paging_state=paging_state, execution_profile=TUPLES), "list jobs")

        return await with_retries(once, "list jobs")

    async def get_meta(self, name: str) -> str | None:
        rs = await self._run(self._get_meta, (name,), "read meta")
        row = rs.one()
        return None if row is None else str(row.value)

    # --- overlap leases -----------------------------------------------------------------
    async def swap_run(self, scope: str, job_id: str, expected: RunLease | None,
                       new: RunLease, ttl_s: int) -> tuple[bool, RunLease | None]:
        old = (None, None, None, None) if expected is None else (
            expected.occurrence, expected.owner, expected.worker, expected.cancel)
        rs = await self._run(self._swap_run, (
            max(1, ttl_s), new.occurrence, new.owner, new.worker, new.cancel, scope, job_id,
            *old), "swap run lease")
        row = rs.one()
        if row[0]:
            return True, None
        owner = getattr(row, "owner", None)
        if owner is None:
            return False, None
        return False, RunLease(row.occurrence or "", owner, row.worker or "",
                               bool(row.cancel))

    async def end_run(self, scope: str, job_id: str, owner: str) -> None:
        await self._run(self._end_run, (scope, job_id, owner), "end run lease")

    # --- calendars ----------------------------------------------------------------------
    async def get_calendar(self, name: str) -> frozenset[date] | None:
        rs = await self._run(self._get_calendar, (name,), "read calendar")
        row = rs.one()
        if row is None:
            return None
        return frozenset(date.fromisoformat(d) for d in (row.dates or ()))

    async def put_calendar(self, name: str, dates: frozenset[date]) -> None:
        await self._run(self._put_calendar, (name, {d.isoformat() for d in dates}),
                        "write calendar")

    async def delete_calendar(self, name: str) -> None:
        await self._run(self._del_calendar, (name,), "delete calendar")
