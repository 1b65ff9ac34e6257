"""Namespaces prepared ahead of the tests that use them, their keyspaces emptied behind them.

Creating a namespace's keyspace (a keyspace, thirteen tables and their indexes: twenty schema
changes, each waiting for the nodes to agree) took 3 to 10 s per integration test on the local
stack, and dropping it 1 to 2 s more; in CI about 4.4 s of Cassandra's CPU each, and 1.5 s
for the drop, for a hundred tests. So the pool keeps keyspaces apart from namespaces (the
`cassandra_keyspace` setting) and reuses them:

- a test's `namespace` is a new name every time (its topics, groups and transactional ids in
  Kafka are its own), and `keyspace_of(namespace)` names the keyspace the pool gave it, which
  already holds every table of the current schema and no rows. Tests pass it on as
  `cassandra_keyspace` (`Settings(..., cassandra_keyspace=keyspace_of(ns))`, or
  CHRONOWHEEL_CASSANDRA_KEYSPACE to a child process). The `meta` rows (the shard count and
  the namespace the keyspace holds), the topics and the first watermarks are left to the
  test's own `chronowheel init`, which still runs in full; its schema statements (all
  `IF NOT EXISTS`) find their work done.
- after the test, on the pool's thread: the namespace's `<ns>.*` topics are deleted, and its
  keyspace is emptied (`TRUNCATE` of each table, about 0.6 s of Cassandra's CPU) and handed
  out again, unless its schema is no longer the one the pool made (a test altered or dropped
  something), in which case it is dropped. A keyspace named after the namespace (one a child
  process made without being told the pool's) is dropped too.
- a test that needs a namespace with no keyspace at all does not request `namespace` but
  `bare_namespace`; what it made is dropped after it. At the end of the session every keyspace
  is dropped, and the session waits for that.

The pool never prepares more keyspaces than the collected tests ask for, keeps at most `ahead`
ready once the integration tests have begun (so as not to compete with them for the servers'
two cores), and prefers an emptied keyspace to a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PREPARE_TIMEOUT_S = 300.0
"""How long a test waits for a prepared namespace before it is told why there is none."""

_KEYSPACES: dict[str, str] = {}
"""The keyspace the pool gave each namespace it handed out (this process's)."""


def new_name() -> str:
    """`t` + 10 hex digits: valid both as a keyspace name and as a Kafka topic prefix."""
    return "t" + secrets.token_hex(5)


def new_keyspace_name() -> str:
    """`k` + 10 hex digits: never a namespace's own keyspace name (those start with `t`)."""
    return "k" + secrets.token_hex(5)


def keyspace_of(namespace: str) -> str:
    """The keyspace the pool gave `namespace`, to pass as `cassandra_keyspace`; "" (the
    keyspace named after the namespace) for a name the pool did not hand out."""
    return _KEYSPACES.get(namespace, "")


@dataclass
class PoolStats:
    prepared: int = 0
    handed_out: int = 0
    reused: int = 0
    dropped: int = 0
    prepare_s: float = 0.0
    empty_s: float = 0.0
    drop_s: float = 0.0
    waited_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class NamespacePool:
    """Prepares keyspaces on a thread of its own, and empties them for reuse; see the module's
    text."""

    def __init__(self, cassandra: str, kafka: str, *, demand: int, ahead: int = 3,
                 warm_ahead: int = 12, log: Callable[[str], None] | None = None) -> None:
        self.cassandra, self.kafka = cassandra, kafka
        self.demand = demand
        self.ahead, self.warm_ahead = ahead, warm_ahead
        self.stats = PoolStats()
        self._log = log or (lambda text: print(f"[namespaces] {text}", file=sys.stderr))
        self._ready: queue.Queue[str] = queue.Queue()  # empty keyspaces
        self._drops: queue.Queue[str] = queue.Queue()  # namespaces the tests are done with
        self._wake = threading.Condition()
        self._started_using = False
        self._closing = False
        self._failure: BaseException | None = None
        self._outstanding = 0  # keyspaces ready and not yet handed out
        self._waiting = 0  # tests waiting in take()
        self._paused = 0  # paused() blocks in force
        self._working = True  # the thread is not parked in _wait_while_paused
        self._schema: frozenset[tuple[str, ...]] | None = None  # what the pool's keyspaces hold
        self._no_reuse: set[str] = set()  # namespaces whose keyspace is to be dropped
        self._thread = threading.Thread(target=self._run, name="namespace-pool", daemon=True)
        self._thread.start()

    # --- the test side -------------------------------------------------------------------------

    def take(self) -> str:
        """A new namespace whose keyspace (`keyspace_of`) is prepared and empty; waits for one
        (never longer than PREPARE_TIMEOUT_S)."""
        t0 = time.monotonic()
        with self._wake:
            self._started_using = True
            self._waiting += 1
            self._wake.notify_all()
        try:
            while True:
                if self._failure is not None:
                    raise RuntimeError(f"the namespace pool stopped: {self._failure!r}")
                try:
                    keyspace = self._ready.get(timeout=1.0)
                    break
                except queue.Empty:
                    if time.monotonic() - t0 > PREPARE_TIMEOUT_S:
                        raise TimeoutError(
                            f"no namespace prepared within {PREPARE_TIMEOUT_S:.0f} s "
                            f"({self.stats.prepared} prepared so far)") from None
        finally:
            with self._wake:
                self._waiting -= 1
        name = new_name()
        _KEYSPACES[name] = keyspace
        with self._wake:
            self._outstanding -= 1
            self.stats.handed_out += 1
            self.stats.waited_s += time.monotonic() - t0
            self._wake.notify_all()
        return name

    def give_back(self, name: str, *, reuse: bool = True) -> None:
        """Delete the namespace `name`'s topics, and empty its keyspace for another test (or
        drop it: `reuse` false, or its schema changed), on the pool's thread."""
        if not reuse:
            self._no_reuse.add(name)
        self._drops.put(name)
        with self._wake:
            self._wake.notify_all()

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 120.0) -> Iterator[None]:
        """No work on the pool's thread meanwhile (the schema change or drop under way is
        finished first): for a test that measures what its own process does, such as the
        garbage its requests leave."""
        with self._wake:
            self._paused += 1
            self._wake.notify_all()
            if not self._wake.wait_for(lambda: not self._working, timeout=timeout_s):
                self._paused -= 1
                raise TimeoutError(f"the namespace pool is still busy after {timeout_s:.0f} s")
        try:
            yield
        finally:
            with self._wake:
                self._paused -= 1
                self._wake.notify_all()

    def close(self, timeout_s: float = 180.0) -> None:
        """Drop every keyspace (ready and given back) and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._log(f"still dropping namespaces after {timeout_s:.0f} s; left behind")
        s = self.stats
        self._log(f"{s.prepared} keyspaces prepared in {s.prepare_s:.0f} s, {s.handed_out} "
                  f"handed out (tests waited {s.waited_s:.0f} s for them), {s.reused} emptied "
                  f"for reuse in {s.empty_s:.0f} s, {s.dropped} dropped in {s.drop_s:.0f} s"
                  + (f"; errors: {s.errors}" if s.errors else ""))

    # --- the pool's thread ---------------------------------------------------------------------

    def _want_more(self) -> bool:
        if self._outstanding < self._waiting:  # a test is waiting: whatever the counts say
            return True
        # Every keyspace given back comes back emptied: no more than the tests ask for in all.
        if self.stats.handed_out + self._outstanding + self._drops.qsize() >= self.demand:
            return False
        limit = self.ahead if self._started_using else self.warm_ahead
        return self._outstanding < self._waiting + limit

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the next test that asks
            self._failure = exc
            self._log(f"stopped: {exc!r}")
        finally:
            with self._wake:
                self._working = False
                self._wake.notify_all()

    async def _serve(self) -> None:
        from chronowheel.store.cassandra import connect

        cluster, session = await asyncio.to_thread(connect, self._settings())
        keyspaces: set[str] = set()  # every keyspace the pool made and has not dropped
        try:
            while True:
                await asyncio.to_thread(self._wait_while_paused)
                done = self._next_done()
                if done is not None:
                    keyspace = await self._clean_up(session, done)
                    if keyspace is not None and (done in self._no_reuse
                                                 or not await self._empty(session, keyspace)):
                        await self._drop_keyspace(session, keyspace)
                        keyspaces.discard(keyspace)
                    continue
                with self._wake:
                    closing = self._closing
                    want = not closing and self._want_more()
                if closing:
                    break
                if want:
                    keyspaces.add(await self._prepare(cluster, session))
                    continue
                await asyncio.to_thread(self._sleep_until_wanted)
            # the end of the session: what was given back, then every keyspace
            while (done := self._next_done()) is not None:
                await self._clean_up(session, done)
            for keyspace in sorted(keyspaces):
                await self._drop_keyspace(session, keyspace)
        finally:
            cluster.shutdown()

    def _settings(self, namespace: str = "chronowheel", keyspace: str = "") -> Any:
        from chronowheel.settings import Settings

        return Settings(namespace=namespace, cassandra_keyspace=keyspace,
                        cassandra=self.cassandra, kafka=self.kafka)

    async def _prepare(self, cluster: Any, session: Any) -> str:
        """A new keyspace holding the current schema, put in the ready queue."""
        from chronowheel.admin import apply_schema
        from chronowheel.schema import cql_statements

        keyspace = new_keyspace_name()
        t0 = time.monotonic()
        settings = self._settings(keyspace=keyspace)
        await apply_schema(cluster, session,
                           cql_statements(keyspace, settings.cassandra_replication()))
        if self._schema is None:
            self._schema = await asyncio.to_thread(_schema_of, session, keyspace)
        with self._wake:
            self.stats.prepared += 1
            self.stats.prepare_s += time.monotonic() - t0
            self._outstanding += 1
        self._ready.put(keyspace)
        return keyspace

    async def _empty(self, session: Any, keyspace: str) -> bool:
        """Empty `keyspace` and put it in the ready queue; False (and nothing done) when its
        schema is not the one the pool made, or emptying it failed."""
        t0 = time.monotonic()
        try:
            schema = await asyncio.to_thread(_schema_of, session, keyspace)
            if schema != self._schema:
                return False
            tables = sorted({row[1] for row in schema if row[0] == "table"})
            for table in tables:
                await asyncio.to_thread(session.execute, f"TRUNCATE {keyspace}.{table}",
                                        timeout=120)
        except Exception as exc:  # cleanup must not fail the tests: drop it instead
            self.stats.errors.append(f"emptying {keyspace}: {exc!r}")
            return False
        with self._wake:
            self.stats.reused += 1
            self.stats.empty_s += time.monotonic() - t0
            self._outstanding += 1
            self._wake.notify_all()
        self._ready.put(keyspace)
        return True

    def _next_done(self) -> str | None:
        try:
            return self._drops.get_nowait()
        except queue.Empty:
            return None

    def _sleep_until_wanted(self) -> None:
        with self._wake:
            self._wake.wait_for(
                lambda: self._closing or self._paused > 0 or not self._drops.empty()
                or self._want_more(),
                timeout=5.0)

    def _wait_while_paused(self) -> None:
        with self._wake:
            if self._paused and not self._closing:
                self._working = False
                self._wake.notify_all()
                self._wake.wait_for(lambda: not self._paused or self._closing)
            self._working = True

    async def _clean_up(self, session: Any, name: str) -> str | None:
        """Delete namespace `name`'s topics, and drop a keyspace named after it if there is
        one; the keyspace the pool gave it, to be emptied (None: it had none)."""
        from chronowheel.bus.kafka import open_admin

        t0 = time.monotonic()
        settings = self._settings(namespace=name)
        try:
            admin = await open_admin(settings)
            try:
                prefix = name + "."
                mine = [t for t in await admin.list_topics() if t.startswith(prefix)]
                if mine:
                    await admin.delete_topics(mine, timeout_ms=60_000)
            finally:
                await admin.close()
            own = settings.keyspace  # a bare namespace's, or one made without the pool's
            exists = await asyncio.to_thread(
                lambda: session.execute(
                    "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
                    (own,)).one())
            if exists is not None:
                await asyncio.to_thread(session.execute, f"DROP KEYSPACE IF EXISTS {own}",
                                        timeout=120)
        except Exception as exc:  # cleanup must not fail the tests
            self.stats.errors.append(f"{name}: {exc!r}")
        self.stats.drop_s += time.monotonic() - t0
        return _KEYSPACES.pop(name, None)

    async def _drop_keyspace(self, session: Any, keyspace: str) -> None:
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(session.execute, f"DROP KEYSPACE IF EXISTS {keyspace}",
                                    timeout=120)
        except Exception as exc:  # cleanup must not fail the tests
            self.stats.errors.append(f"dropping {keyspace}: {exc!r}")
        self.stats.dropped += 1
        self.stats.drop_s += time.monotonic() - t0


def _schema_of(session: Any, keyspace: str) -> frozenset[tuple[str, ...]]:
    """What a keyspace holds (blocking): its replication, its tables' columns and types, and
    its indexes, each as a tuple."""
    rows: set[tuple[str, ...]] = set()
    ks = session.execute("SELECT replication FROM system_schema.keyspaces "
                         "WHERE keyspace_name = %s", (keyspace,)).one()
    rows.add(("replication", repr(sorted((ks.replication if ks else {}).items()))))
    for r in session.execute("SELECT table_name FROM system_schema.tables "
                             "WHERE keyspace_name = %s", (keyspace,)):
        rows.add(("table", r.table_name))
    for r in session.execute("SELECT table_name, column_name, type, kind FROM "
                             "system_schema.columns WHERE keyspace_name = %s", (keyspace,)):
        rows.add(("column", r.table_name, r.column_name, r.type, r.kind))
    for r in session.execute("SELECT table_name, index_name, options FROM "
                             "system_schema.indexes WHERE keyspace_name = %s", (keyspace,)):
        rows.add(("index", r.table_name, r.index_name, repr(sorted(r.options.items()))))
    # A column dropped and added again is back in `columns`, but Cassandra still hides the
    # column's values written before the drop's time: not a keyspace like a new one.
    for r in session.execute("SELECT table_name, column_name FROM system_schema.dropped_columns "
                             "WHERE keyspace_name = %s", (keyspace,)):
        rows.add(("dropped", r.table_name, r.column_name))
    for r in session.execute("SELECT type_name FROM system_schema.types "
                             "WHERE keyspace_name = %s", (keyspace,)):
        rows.add(("type", r.type_name))
    for r in session.execute("SELECT view_name FROM system_schema.views "
                             "WHERE keyspace_name = %s", (keyspace,)):
        rows.add(("view", r.view_name))
    return frozenset(rows)
