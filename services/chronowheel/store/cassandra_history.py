"""The RunHistoryStore (`store/base.py`) over Cassandra: tables `run_history` (a partition per
job, newest run first, every write with a TTL) and `run_counters` (a counter row per job).

Every request is of prepared statements. Of the up to `RUN_WRITE_JOBS` (10) jobs of one flush,
those whose partitions have the same replicas go in one unlogged batch (a mutation per
partition, no batch log), their counters in one counter batch: a request per job and kind cost
the writer's process about five times the CPU a row. A batch never spans partitions of
different replicas (`same_replicas`), and the token-aware policy sends it to one of its
replicas, so no coordinator does another node's work, the cost that makes the project avoid
multi-partition batches elsewhere; on one node, or with few nodes, the whole flush shares its
replicas. Counters cannot share a batch with other rows nor carry a TTL, so they are their own
request and live as long as the job's counters row. Each request of a write of several jobs
holds one of the caller's permits while in flight (the writer's `history_writes_in_flight`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement

from chronowheel.core.runs import COUNTERS, RunRecord
from chronowheel.store.base import RUN_WRITE_JOBS, Permits, permit, same_replicas
from chronowheel.store.cassandra import TUPLES, execute, prepare_tables

RUN_COLUMNS = ("job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id, "
               "started_ms, ended_ms, outcome, worker_id, error")
WORKER_COLUMNS = ("job_id, scheduled_ms, attempt, occurrence, started_ms, ended_ms, outcome, "
                  "worker_id, error")
NODE_COLUMNS = "job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id, outcome"
# Partition keys per read of several jobs (as the jobs table's get_jobs).
READ_GROUP = 50


def _run(row: Sequence[Any]) -> RunRecord:
    (job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id, started_ms,
     ended_ms, outcome, worker_id, error) = row
    return RunRecord(job_id, scheduled_ms, attempt, occurrence, fired_ms, lateness_ms, node_id,
                     started_ms, ended_ms, outcome, worker_id, error)


def _of_job(job_id: str, runs: Sequence[RunRecord]) -> Sequence[RunRecord]:
    for r in runs:
        if r.job_id != job_id:
            raise ValueError(f"run of job {r.job_id!r} in a write of job {job_id!r}")
    return runs


def _check_jobs(per_job: Mapping[str, object]) -> None:
    if len(per_job) > RUN_WRITE_JOBS:
        raise ValueError(f"a run history write of {len(per_job)} jobs: at most "
                         f"{RUN_WRITE_JOBS} a request (Cassandra warns about a batch over "
                         f"more partitions)")


def _check_counters(counts: Mapping[str, int]) -> None:
    for name in counts:
        if name not in COUNTERS:
            raise ValueError(f"counter {name!r}: not one of {', '.join(COUNTERS)}")


def _unset(value: Any) -> Any:
    # Unset, not null: a bound null would be a tombstone over what the other writer set.
    return UNSET_VALUE if value is None else value


class CassandraRunHistory:
    """RunHistoryStore over one keyspace (prepare in a thread: `prepare` blocks)."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        self.keyspace = ks = keyspace
        prepare_tables(session, self._declare_statements, ks, "run history")

    def _declare_statements(self, p: Callable[[str], Any]) -> None:
        """Every statement of the history, each from `p(cql)` (see `prepare_concurrently`)."""
        ks = self.keyspace
        self._put = p(f"INSERT INTO {ks}.run_history ({RUN_COLUMNS}) VALUES "
                      f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        # Each writer's own columns only, and a counter alone: the driver binds a value in
        # some 4 µs of Python here, so a row binds what it sets (a worker's row 10 values
        # instead of 13, a run's single counter 2 instead of 7).
        self._put_worker = p(f"INSERT INTO {ks}.run_history ({WORKER_COLUMNS}) VALUES "
                             f"(?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        self._put_node = p(f"INSERT INTO {ks}.run_history ({NODE_COLUMNS}) VALUES "
                           f"(?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        sets = ", ".join(f"{c} = {c} + ?" for c in COUNTERS)
        self._count = p(f"UPDATE {ks}.run_counters SET {sets} WHERE job_id = ?")
        self._count_one = {c: p(f"UPDATE {ks}.run_counters SET {c} = {c} + ? "
                                f"WHERE job_id = ?") for c in COUNTERS}
        self._runs = p(f"SELECT {RUN_COLUMNS} FROM {ks}.run_history WHERE job_id = ? "
                       f"LIMIT ?")
        self._last = p(f"SELECT {RUN_COLUMNS} FROM {ks}.run_history WHERE job_id IN ? "
                       f"PER PARTITION LIMIT 1")
        self._counts = p(f"SELECT job_id, {', '.join(COUNTERS)} FROM {ks}.run_counters "
                         f"WHERE job_id IN ?")

    async def _exec(self, stmt: Any, params: Sequence[Any] | None, what: str) -> Any:
        return await execute(self.session, stmt, params or (), what, execution_profile=TUPLES)

    def _params(self, r: RunRecord, ttl_s: int) -> tuple[Any, ...]:
        return (r.job_id, r.scheduled_ms, r.attempt, r.occurrence, _unset(r.fired_ms),
                _unset(r.lateness_ms), _unset(r.node_id), _unset(r.started_ms),
                _unset(r.ended_ms), _unset(r.outcome), _unset(r.worker_id), _unset(r.error),
                max(1, ttl_s))

    def _row(self, r: RunRecord, ttl_s: int) -> tuple[PreparedStatement, tuple[Any, ...]]:
        """The statement and values of a run's write: the worker's or the node's columns
        when the record has only those, else every column."""
        if r.fired_ms is None and r.lateness_ms is None and r.node_id is None:
            return self._put_worker, (
                r.job_id, r.scheduled_ms, r.attempt, r.occurrence, _unset(r.started_ms),
                _unset(r.ended_ms), _unset(r.outcome), _unset(r.worker_id), _unset(r.error),
                max(1, ttl_s))
        if r.started_ms is None and r.ended_ms is None and r.worker_id is None \
                and r.error is None:
            return self._put_node, (
                r.job_id, r.scheduled_ms, r.attempt, r.occurrence, _unset(r.fired_ms),
                _unset(r.lateness_ms), _unset(r.node_id), _unset(r.outcome), max(1, ttl_s))
        return self._put, self._params(r, ttl_s)

    def _counts_row(self, job_id: str,
                    counts: Mapping[str, int]) -> tuple[PreparedStatement, tuple[Any, ...]]:
        nonzero = [(c, n) for c, n in counts.items() if n]
        if len(nonzero) == 1:
            name, n = nonzero[0]
            return self._count_one[name], (int(n), job_id)
        return self._count, (*(int(counts.get(c, 0)) for c in COUNTERS), job_id)

    async def write_runs(self, job_id: str, runs: Sequence[RunRecord], ttl_s: int) -> None:
        if not runs:
            return
        _of_job(job_id, runs)
        if len(runs) == 1:
            await self._exec(*self._row(runs[0], ttl_s), "write a run")
            return
        batch: Any = BatchStatement(batch_type=BatchType.UNLOGGED)  # one partition: one mutation
        for r in runs:
            batch.add(*self._row(r, ttl_s))
        await execute(self.session, batch, (), f"write {len(runs)} runs of one job")

    async def add_run_counts(self, job_id: str, counts: Mapping[str, int]) -> None:
        _check_counters(counts)
        if not any(counts.values()):
            return
        await self._exec(*self._counts_row(job_id, counts), "count runs")

    def _replicas(self, key: bytes) -> Any:
        return self.session.cluster.metadata.get_replicas(self.keyspace, key)

    async def write_runs_of_jobs(self, runs: Mapping[str, Sequence[RunRecord]], ttl_s: int,
                                 permits: Permits | None = None) -> int:
        _check_jobs(runs)
        for job_id, mine in runs.items():
            _of_job(job_id, mine)
        groups = same_replicas([j for j, mine in runs.items() if mine], self._replicas)
        await asyncio.gather(*(self._write_group([r for j in g for r in runs[j]], len(g), ttl_s,
                                                 permits) for g in groups))
        return len(groups)

    async def _write_group(self, rows: list[RunRecord], jobs: int, ttl_s: int,
                           permits: Permits | None) -> None:
        async with permit(permits):
            if len(rows) == 1:
                await self._exec(*self._row(rows[0], ttl_s), "write a run")
                return
            # Unlogged over partitions of the same replicas: a mutation per partition, no
            # batch log, routed (by its first statement) to one of those replicas.
            batch: Any = BatchStatement(batch_type=BatchType.UNLOGGED)
            for r in rows:
                batch.add(*self._row(r, ttl_s))
            await execute(self.session, batch, (), f"write {len(rows)} runs of {jobs} jobs")

    async def add_run_counts_of_jobs(self, counts: Mapping[str, Mapping[str, int]],
                                     permits: Permits | None = None) -> int:
        _check_jobs(counts)
        for mine in counts.values():
            _check_counters(mine)
        todo = {job_id: mine for job_id, mine in counts.items() if any(mine.values())}
        groups = same_replicas(list(todo), self._replicas)
        await asyncio.gather(*(self._count_group([(j, todo[j]) for j in g], permits)
                               for g in groups))
        return len(groups)

    async def _count_group(self, todo: list[tuple[str, Mapping[str, int]]],
                           permits: Permits | None) -> None:
        async with permit(permits):
            if len(todo) == 1:
                await self.add_run_counts(*todo[0])
                return
            batch: Any = BatchStatement(batch_type=BatchType.COUNTER)
            for job_id, mine in todo:
                batch.add(*self._counts_row(job_id, mine))
            await execute(self.session, batch, (), f"count runs of {len(todo)} jobs")

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
