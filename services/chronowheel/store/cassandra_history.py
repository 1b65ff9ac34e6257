"""The RunHistoryStore (`store/base.py`) over Cassandra: tables `run_history` (a partition per
job, newest run first, every write with a TTL) and `run_counters` (a counter row per job).

Every request is a prepared statement about one partition: a job's runs of one flush go in
one unlogged batch of that partition only (a single mutation: no batch log, no fan-out), its
counters in one counter update. Counters cannot share a batch with other rows nor carry a
TTL, so they are their own request and live as long as the job's counters row."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from cassandra.cluster import Session
from cassandra.protocol import InvalidRequest
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement

from chronowheel.core.runs import COUNTERS, RunRecord
from chronowheel.errors import ConfigError
from chronowheel.store.cassandra import TUPLES, execute

RUN_COLUMNS = ("job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id, "
               "started_ms, ended_ms, outcome, worker_id, error")
# Partition keys per read of several jobs (as the jobs table's get_jobs).
READ_GROUP = 50


def _run(row: Sequence[Any]) -> RunRecord:
    (job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id, started_ms,
     ended_ms, outcome, worker_id, error) = row
    return RunRecord(job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id,
                     started_ms, ended_ms, outcome, worker_id, error)


def _unset(value: Any) -> Any:
    # Unset, not null: a bound null would be a tombstone over what the other writer set.
    return UNSET_VALUE if value is None else value


class CassandraRunHistory:
    """RunHistoryStore over one keyspace (prepare in a thread: `prepare` blocks)."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        ks = keyspace
        try:
            p = session.prepare
            self._put = p(f"INSERT INTO {ks}.run_history ({RUN_COLUMNS}) VALUES "
                          f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
            sets = ", ".join(f"{c} = {c} + ?" for c in COUNTERS)
            self._count = p(f"UPDATE {ks}.run_counters SET {sets} WHERE job_id = ?")
            self._runs = p(f"SELECT {RUN_COLUMNS} FROM {ks}.run_history WHERE job_id = ? "
                           f"LIMIT ?")
            self._last = p(f"SELECT {RUN_COLUMNS} FROM {ks}.run_history WHERE job_id IN ? "
                           f"PER PARTITION LIMIT 1")
            self._counts = p(f"SELECT job_id, {', '.join(COUNTERS)} FROM {ks}.run_counters "
                             f"WHERE job_id IN ?")
        except InvalidRequest as exc:
            raise ConfigError(
                f"keyspace {ks} has no run history tables ({exc}): run `chronowheel init` "
                f"for this namespace once more (it is idempotent and adds missing tables)"
            ) from exc

    async def _exec(self, stmt: Any, params: Sequence[Any] | None, what: str) -> Any:
        return await execute(self.session, stmt, params or (), what, execution_profile=TUPLES)

    def _params(self, r: RunRecord, ttl_s: int) -> tuple[Any, ...]:
        return (r.job_id, r.scheduled_ms, r.attempt, r.occurrence, _unset(r.fired_ms),
                _unset(r.lateness_ms), _unset(r.node_id), _unset(r.started_ms),
                _unset(r.ended_ms), _unset(r.outcome), _unset(r.worker_id), _unset(r.error),
                max(1, ttl_s))

    async def write_runs(self, job_id: str, runs: Sequence[RunRecord], ttl_s: int) -> None:
        if not runs:
            return
        for r in runs:
            if r.job_id != job_id:
                raise ValueError(f"run of job {r.job_id!r} in a write of job {job_id!r}")
        if len(runs) == 1:
            await self._exec(self._put, self._params(runs[0], ttl_s), "write a run")
            return
        batch: Any = BatchStatement(batch_type=BatchType.UNLOGGED)  # one partition: one mutation
        for r in runs:
            batch.add(self._put, self._params(r, ttl_s))
        await execute(self.session, batch, (), f"write {len(runs)} runs of one job")

    async def add_run_counts(self, job_id: str, counts: Mapping[str, int]) -> None:
        for name in counts:
            if name not in COUNTERS:
                raise ValueError(f"counter {name!r}: not one of {', '.join(COUNTERS)}")
        if not any(counts.values()):
            return
        await self._exec(self._count, (*(int(counts.get(c, 0)) for c in COUNTERS), job_id),
                         "count runs")

    async def job_runs(self, job_id: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []
        rs = await self._exec(self._runs, (job_id, limit), "read run history")
        return [_run(row) for row in rs.current_rows]

    async def _groups(self, stmt: PreparedStatement, job_ids: Sequence[str],
                      what: str) -> list[Any]:
        ids = list(dict.fromkeys(job_ids))
        groups = [ids[i:i + READ_GROUP] for i in range(0, len(ids), READ_GROUP)]
        results = await asyncio.gather(*(self._exec(stmt, (g,), what) for g in groups))
        return [row for rs in results for row in rs.current_rows]

    async def run_counts(self, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for job_id, *values in await self._groups(self._counts, job_ids, "read run counters"):
            counts = {c: int(v) for c, v in zip(COUNTERS, values, strict=True) if v}
            if counts:
                out[job_id] = counts
        return out

    async def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        return {row[0]: _run(row)
                for row in await self._groups(self._last, job_ids, "read last runs")}
