"""The worker's storage (`store/base.py`, "the worker's storage") over Cassandra: the MarkStore of
its per-partition idempotency (`worker/partitions.py`), leases in `worker_leases` (LWT) and
outcome marks in `worker_marks` (plain writes, one row per flush); claims and run leases are
`CassandraStore`'s."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from cassandra.cluster import Session
from cassandra.protocol import InvalidRequest
from cassandra.query import PreparedStatement

from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.base import BLOCK_BITS, Mark, WorkerStores, block_of
from chronowheel.store.cassandra import TUPLES, CassandraStore, execute
from chronowheel.store.cassandra_history import CassandraRunHistory

log = logging.getLogger(__name__)


class CassandraMarks:
    """MarkStore over one keyspace's `worker_leases` and `worker_marks`."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        ks = keyspace
        try:
            p = session.prepare
            # UPDATE only: no row marker, so an expired or deleted lease reads as owner = null,
            # and `IF owner = null` also matches a lease row that does not exist.
            self._acquire = p(f"UPDATE {ks}.worker_leases USING TTL ? SET owner = ? "
                              f"WHERE scope = ? AND topic = ? AND partition = ? IF owner = null")
            self._renew = p(f"UPDATE {ks}.worker_leases USING TTL ? SET owner = ? "
                            f"WHERE scope = ? AND topic = ? AND partition = ? IF owner = ?")
            self._release = p(f"DELETE FROM {ks}.worker_leases WHERE scope = ? AND topic = ? "
                              f"AND partition = ? IF owner = ?")
            self._write = p(f"INSERT INTO {ks}.worker_marks (scope, topic, partition, block, "
                            f"last_offset, marks) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?")
            self._read = p(f"SELECT marks FROM {ks}.worker_marks WHERE scope = ? AND topic = ? "
                           f"AND partition = ? AND block = ? AND last_offset >= ?")
        except InvalidRequest as exc:
            raise ConfigError(
                f"keyspace {ks} has no worker lease tables ({exc}): run `chronowheel init` "
                f"for this namespace once more (it is idempotent and adds missing tables)"
            ) from exc

    async def _run(self, stmt: PreparedStatement, params: Sequence[Any], what: str) -> Any:
        return await execute(self.session, stmt, params, what, execution_profile=TUPLES)

    async def acquire_lease(self, scope: str, topic: str, partition: int, owner: str,
                            ttl_s: int) -> str | None:
        rs = await self._run(self._acquire, (max(1, ttl_s), owner, scope, topic, partition),
                             "take a worker lease")
        row = rs.one()
        if row[0]:
            return None
        return str(row[1]) if len(row) > 1 and row[1] is not None else ""

    async def renew_lease(self, scope: str, topic: str, partition: int, owner: str,
                          ttl_s: int) -> str | None:
        rs = await self._run(self._renew, (max(1, ttl_s), owner, scope, topic, partition, owner),
                             "renew a worker lease")
        row = rs.one()
        if row[0]:
            return None
        return str(row[1]) if len(row) > 1 and row[1] is not None else ""

    async def release_lease(self, scope: str, topic: str, partition: int, owner: str) -> None:
        await self._run(self._release, (scope, topic, partition, owner), "release a worker lease")

    async def write_marks(self, scope: str, topic: str, partition: int, marks: Sequence[Mark],
                          ttl_s: int) -> None:
        if not marks:
            return
        blob = orjson.dumps([list(m) for m in marks])
        await self._run(self._write, (scope, topic, partition, block_of(marks[0].offset),
                                      marks[-1].offset, blob, max(1, ttl_s)), "write done marks")

    async def read_marks(self, scope: str, topic: str, partition: int, from_offset: int,
                         to_offset: int) -> list[Mark]:
        """Marks in [from_offset, to_offset], and past to_offset as long as blocks have rows:
        a previous holder may have handled records beyond the end this worker knows of, but
        never a whole empty block beyond its last mark (it reads in order, with a bounded
        number of records in flight)."""
        out: list[Mark] = []
        block = block_of(from_offset)
        while True:
            start = max(from_offset, block << BLOCK_BITS)
            rs = await self._run(self._read, (scope, topic, partition, block, start),
                                 "read done marks")
            found = False
            for (blob,) in rs:
                found = True
                for offset, state, occurrence in orjson.loads(blob):
                    if offset >= from_offset:
                        out.append(Mark(int(offset), str(state), str(occurrence)))
            if block >= block_of(max(from_offset, to_offset)) and not found:
                return out
            block += 1


class CassandraWorkerStores:
    """A worker's marks, claims and run leases over one Cassandra session (blocking: open it
    in a thread)."""

    def __init__(self, settings: Settings) -> None:
        self.store = CassandraStore.open(settings)
        try:
            marks = CassandraMarks(self.store.session, settings.keyspace)
        except BaseException:
            self.store.close()
            raise
        history = None
        if settings.run_history:
            try:
                history = CassandraRunHistory(self.store.session, settings.keyspace)
            except ConfigError as exc:
                # A namespace from before run history (not `init`ed since): history is an
                # operator's aid, never a reason not to handle.
                log.error("run history off: %s", exc)
            except BaseException:
                self.store.close()
                raise
        self.stores = WorkerStores(marks=marks, claims=self.store, runs=self.store,
                                   history=history)

    def close(self) -> None:
        self.store.close()
