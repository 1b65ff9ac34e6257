"""The worker's storage (`store/base.py`, "the worker's storage") over Cassandra: the MarkStore of
its per-partition idempotency (`worker/partitions.py`), leases in `worker_leases` (LWT) and
outcome marks in `worker_marks` (plain writes: a row per partition and round, the rows of a
round grouped into unlogged batches by replica set); claims and run leases are
`CassandraStore`'s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType, BoundStatement, PreparedStatement

from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.base import (
    BLOCK_BITS,
    MARK_WRITE_BYTES,
    MARK_WRITE_PARTITIONS,
    Mark,
    MarkRow,
    WorkerStores,
    block_of,
    by_replicas,
)
from chronowheel.store.cassandra import TUPLES, CassandraStore, execute, prepare_tables
from chronowheel.store.cassandra_history import CassandraRunHistory

log = logging.getLogger(__name__)


class CassandraMarks:
    """MarkStore over one keyspace's `worker_leases` and `worker_marks`."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        self.keyspace = keyspace
        prepare_tables(session, self._declare_statements, keyspace, "worker lease")

    def _declare_statements(self, p: Callable[[str], Any]) -> None:
        """Every statement of the marks, each from `p(cql)` (see `prepare_concurrently`)."""
        ks = self.keyspace
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

    async def write_marks(self, scope: str, rows: Sequence[MarkRow], ttl_s: int) -> int:
        chunks = mark_chunks([self._bound(scope, row, ttl_s) for row in rows if row.marks],
                             self._replicas)
        await asyncio.gather(*(self._write_chunk(c) for c in chunks))
        return len(chunks)

    def _bound(self, scope: str, row: MarkRow, ttl_s: int) -> tuple[BoundStatement, int]:
        marks = row.marks
        blob = orjson.dumps([list(m) for m in marks])
        bound = self._write.bind((scope, row.topic, row.partition, block_of(marks[0].offset),
                                  marks[-1].offset, blob, max(1, ttl_s)))
        return bound, len(blob) + len(scope) + len(row.topic) + MARK_ROW_BYTES

    def _replicas(self, bound: BoundStatement) -> Any:
        return self.session.cluster.metadata.get_replicas(self.keyspace, bound.routing_key)

    async def _write_chunk(self, chunk: list[BoundStatement]) -> None:
        if len(chunk) == 1:
            await execute(self.session, chunk[0], (), "write done marks",
                          execution_profile=TUPLES)
            return
        # Unlogged over partitions of the same replicas: a mutation per partition, no batch
        # log, routed (by its first statement) to one of those replicas.
        batch: Any = BatchStatement(batch_type=BatchType.UNLOGGED)
        for bound in chunk:
            batch.add(bound)
        await execute(self.session, batch, (), f"write done marks of {len(chunk)} partitions",
                      execution_profile=TUPLES)

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


MARK_ROW_BYTES = 40
"""What a mark row adds to its JSON and strings when Cassandra sizes a batch (its partition,
block and clustering integers, a cell's and a row's overhead): for `MARK_WRITE_BYTES`."""


def mark_chunks(rows: Sequence[tuple[Any, int]], replicas_of: Any) -> list[list[Any]]:
    """Statements (each with its size) in requests: those whose partitions have the same
    replicas together, at most `MARK_WRITE_PARTITIONS` and about `MARK_WRITE_BYTES` a request;
    a statement whose replicas are unknown goes alone (`by_replicas`)."""
    out: list[list[Any]] = []
    for group in by_replicas(rows, lambda row: replicas_of(row[0])):
        chunk: list[Any] = []
        used = 0
        for stmt, size in group:
            if chunk and (len(chunk) >= MARK_WRITE_PARTITIONS or used + size > MARK_WRITE_BYTES):
                out.append(chunk)
                chunk, used = [], 0
            chunk.append(stmt)
            used += size
        if chunk:
            out.append(chunk)
    return out


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
