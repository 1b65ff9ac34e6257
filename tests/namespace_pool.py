"""Namespaces prepared ahead of the tests that use them, and dropped behind them.

Creating a namespace's keyspace (a keyspace, ten tables, three indexes: sixteen schema changes,
each waiting for the nodes to agree) took 3 to 10 s per integration test on the local stack,
and dropping it 1 to 2 s more: a large share of the whole suite's time, spent waiting. The
pool does that work on a thread of its own while other tests run (the unit tests first, see
tests/conftest.py), so a test's `namespace` is a name whose keyspace already holds every
table of the current schema:

- only the Cassandra schema is prepared. The `meta` row that records the shard count, the
  topics (whose partition count is the shard count) and the first watermarks are left to the
  test's own `chronowheel init` (`init_namespace`), which therefore still runs in full and
  still decides the shard count; its schema statements (all `IF NOT EXISTS`) find their work
  done and return at once. A test that needs a namespace with no keyspace at all does not
  request `namespace` but makes a name of its own.
- a test's namespace is dropped (keyspace and `<ns>.*` topics) on the pool's thread after the
  test, and the session waits for those drops at its end.

The pool never prepares more namespaces than the collected tests ask for, and keeps at most
`ahead` of them ready once the integration tests have begun, so as not to compete with them
for the servers' two cores.
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

PREPARE_TIMEOUT_S = 300.0
"""How long a test waits for a prepared namespace before it is told why there is none."""


def new_name() -> str:
    """`t` + 10 hex digits: valid both as a keyspace name and as a Kafka topic prefix."""
    return "t" + secrets.token_hex(5)


@dataclass
class PoolStats:
    prepared: int = 0
    handed_out: int = 0
    dropped: int = 0
    prepare_s: float = 0.0
    drop_s: float = 0.0
    waited_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class NamespacePool:
    """Prepares keyspaces on a thread of its own; see the module's text."""

    def __init__(self, cassandra: str, kafka: str, *, demand: int, ahead: int = 3,
                 warm_ahead: int = 12, log: Callable[[str], None] | None = None) -> None:
        self.cassandra, self.kafka = cassandra, kafka
        self.demand = demand
        self.ahead, self.warm_ahead = ahead, warm_ahead
        self.stats = PoolStats()
        self._log = log or (lambda text: print(f"[namespaces] {text}", file=sys.stderr))
        self._ready: queue.Queue[str] = queue.Queue()
        self._drops: queue.Queue[str | None] = queue.Queue()
        self._wake = threading.Condition()
        self._started_using = False
        self._closing = False
        self._failure: BaseException | None = None
        self._outstanding = 0  # prepared and not yet handed out
        self._waiting = 0  # tests waiting in take()
        self._paused = 0  # paused() blocks in force
        self._working = True  # the thread is not parked in _wait_while_paused
        self._thread = threading.Thread(target=self._run, name="namespace-pool", daemon=True)
        self._thread.start()

    # --- the test side -------------------------------------------------------------------------

    def take(self) -> str:
        """A prepared namespace; waits for one (never longer than PREPARE_TIMEOUT_S)."""
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
                    name = self._ready.get(timeout=1.0)
                    break
                except queue.Empty:
                    if time.monotonic() - t0 > PREPARE_TIMEOUT_S:
                        raise TimeoutError(
                            f"no namespace prepared within {PREPARE_TIMEOUT_S:.0f} s "
                            f"({self.stats.prepared} prepared so far)") from None
        finally:
            with self._wake:
                self._waiting -= 1
        with self._wake:
            self._outstanding -= 1
            self.stats.handed_out += 1
            self.stats.waited_s += time.monotonic() - t0
            self._wake.notify_all()
        return name

    def give_back(self, name: str) -> None:
        """Drop `name` (keyspace and topics) on the pool's thread."""
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
        """Drop what is left (prepared and given back) and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._log(f"still dropping namespaces after {timeout_s:.0f} s; left behind")
        s = self.stats
        self._log(f"{s.prepared} prepared in {s.prepare_s:.0f} s, {s.handed_out} used "
                  f"(tests waited {s.waited_s:.0f} s for them), {s.dropped} dropped in "
                  f"{s.drop_s:.0f} s" + (f"; errors: {s.errors}" if s.errors else ""))

    # --- the pool's thread ---------------------------------------------------------------------

    def _want_more(self) -> bool:
        if self._outstanding < self._waiting:  # a test is waiting: whatever the counts say
            return True
        if self.stats.prepared >= self.demand:
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
        from chronowheel.admin import apply_schema
        from chronowheel.schema import cql_statements
        from chronowheel.settings import Settings
        from chronowheel.store.cassandra import connect

        base = Settings(cassandra=self.cassandra, kafka=self.kafka)
        cluster, session = await asyncio.to_thread(connect, base)
        try:
            while True:
                await asyncio.to_thread(self._wait_while_paused)
                drop = self._next_drop()
                if drop is not None:
                    await self._drop(session, drop)
                    continue
                with self._wake:
                    closing = self._closing
                    want = not closing and self._want_more()
                if closing:
                    break
                if want:
                    name = new_name()
                    t0 = time.monotonic()
                    settings = Settings(namespace=name, cassandra=self.cassandra,
                                        kafka=self.kafka)
                    statements = cql_statements(settings.keyspace,
                                                settings.cassandra_replication())
                    await apply_schema(cluster, session, statements)
                    with self._wake:
                        self.stats.prepared += 1
                        self.stats.prepare_s += time.monotonic() - t0
                        self._outstanding += 1
                    self._ready.put(name)
                    continue
                await asyncio.to_thread(self._sleep_until_wanted)
            # the end of the session: what was given back, then what nobody used
            while (drop := self._next_drop()) is not None:
                await self._drop(session, drop)
            while True:
                try:
                    unused = self._ready.get_nowait()
                except queue.Empty:
                    break
                await self._drop(session, unused)
        finally:
            cluster.shutdown()

    def _next_drop(self) -> str | None:
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

    async def _drop(self, session: object, name: str) -> None:
        from chronowheel.bus.kafka import open_admin
        from chronowheel.settings import Settings

        t0 = time.monotonic()
        settings = Settings(namespace=name, cassandra=self.cassandra, kafka=self.kafka)
        try:
            admin = await open_admin(settings)
            try:
                prefix = name + "."
                mine = [t for t in await admin.list_topics() if t.startswith(prefix)]
                if mine:
                    await admin.delete_topics(mine, timeout_ms=60_000)
            finally:
                await admin.close()
            await asyncio.to_thread(
                session.execute,  # type: ignore[attr-defined]
                f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
        except Exception as exc:  # cleanup must not fail the tests
            self.stats.errors.append(f"{name}: {exc!r}")
        self.stats.dropped += 1
        self.stats.drop_s += time.monotonic() - t0
