"""An in-memory RunHistoryStore (`store/base.py`) with the Cassandra one's contract, for tests
and tools without servers. Rows expire by their TTL when a clock is given, never otherwise.
`delay`, when given, is awaited at the start of every request: a test makes the store slow
with it (and sees that firing does not wait). `replicas_of`, when given, stands for
Cassandra's token map: a write of several jobs is a request per group of jobs with the same
replicas (`same_replicas`), as the Cassandra store makes them, run together and each holding
one of the caller's permits; without it, one (a single node). `in_flight` and
`most_in_flight` are the requests under way and the most there were at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from chronowheel.core import limits
from chronowheel.core.clock import Clock
from chronowheel.core.runs import COUNTERS, RunRecord
from chronowheel.errors import StoreRefused
from chronowheel.store.base import RUN_WRITE_JOBS, Permits, permit, same_replicas

_Key = tuple[int, int, str]  # clustering key: (scheduled_ms, attempt, occurrence)


class MemoryRunHistory:
    def __init__(self, *, clock: Clock | None = None,
                 delay: Callable[[], Awaitable[None]] | None = None,
                 replicas_of: Callable[[bytes], Any] | None = None) -> None:
        self.clock = clock
        self.delay = delay
        self.replicas_of = replicas_of
        self.runs: dict[str, dict[_Key, tuple[RunRecord, int | None]]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.writes = 0
        """Requests so far, as Cassandra would receive them: one per single-job write, one
        per group of jobs with the same replicas in a write of several."""
        self.in_flight = 0
        """Requests under way (past their permit, not yet applied)."""
        self.most_in_flight = 0
        """The most requests that were under way at once."""

    def _expiry(self, ttl_s: int) -> int | None:
        if ttl_s > limits.CASSANDRA_MAX_TTL_S:
            raise StoreRefused(f"ttl is too large. requested ({ttl_s}) maximum "
                               f"({limits.CASSANDRA_MAX_TTL_S})")
        if self.clock is None:
            return None
        return self.clock.now_ms() + max(1, ttl_s) * 1000

    def _alive(self, expires: int | None) -> bool:
        return expires is None or self.clock is None or self.clock.now_ms() < expires

    async def _request(self, apply: Callable[[], None], permits: Permits | None = None) -> None:
        """One request as Cassandra receives it: a permit held while in flight, `delay`,
        then `apply`."""
        async with permit(permits):
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                if self.delay is not None:
                    await self.delay()
                self.writes += 1
                apply()
            finally:
                self.in_flight -= 1

    async def write_runs(self, job_id: str, runs: Sequence[RunRecord], ttl_s: int) -> None:
        _of_job(job_id, runs)
        if runs:  # as Cassandra's: nothing to write, no request
            await self._request(lambda: self._put({job_id: runs}, ttl_s))

    def _put(self, runs: Mapping[str, Sequence[RunRecord]], ttl_s: int) -> None:
        expires = self._expiry(ttl_s)
        for job_id, mine in runs.items():
            rows = self.runs.setdefault(job_id, {})
            for run in mine:
                key = (run.scheduled_ms, run.attempt, run.occurrence)
                hit = rows.get(key)
                # Like Cassandra's cells, which expire one by one: a field written earlier
                # keeps its own expiry; approximated by the row's newest write (the contract
                # suite writes both parts of a run with the same TTL).
                merged = run if hit is None or not self._alive(hit[1]) else hit[0].merged(run)
                rows[key] = (merged, expires)

    async def add_run_counts(self, job_id: str, counts: Mapping[str, int]) -> None:
        _check_counters(counts)
        if any(counts.values()):
            await self._request(lambda: self._add({job_id: counts}))

    def _add(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        for job_id, theirs in counts.items():
            mine = self.counts.setdefault(job_id, {})
            for name, n in theirs.items():
                mine[name] = mine.get(name, 0) + n

    async def write_runs_of_jobs(self, runs: Mapping[str, Sequence[RunRecord]], ttl_s: int,
                                 permits: Permits | None = None) -> int:
        _check_jobs(runs)
        for job_id, mine in runs.items():
            _of_job(job_id, mine)
        groups = self._groups([j for j, mine in runs.items() if mine])
        await asyncio.gather(*(self._request(
            partial(self._put, {j: runs[j] for j in g}, ttl_s), permits) for g in groups))
        return len(groups)

    async def add_run_counts_of_jobs(self, counts: Mapping[str, Mapping[str, int]],
                                     permits: Permits | None = None) -> int:
        _check_jobs(counts)
        for mine in counts.values():
            _check_counters(mine)
        groups = self._groups([j for j, mine in counts.items() if any(mine.values())])
        await asyncio.gather(*(self._request(
            partial(self._add, {j: counts[j] for j in g}), permits) for g in groups))
        return len(groups)

    def _groups(self, job_ids: list[str]) -> list[list[str]]:
        """The requests the Cassandra store makes to write `job_ids` (see the class)."""
        if not job_ids:
            return []
        if self.replicas_of is None:
            return [job_ids]
        return same_replicas(job_ids, self.replicas_of)

    async def job_runs(self, job_id: str, limit: int) -> list[RunRecord]:
        rows = self.runs.get(job_id, {})
        live = [(k, run) for k, (run, expires) in rows.items() if self._alive(expires)]
        live.sort(key=lambda kr: (-kr[0][0], -kr[0][1], kr[0][2]))
        return [run for _, run in live[:max(0, limit)]]

    async def run_counts(self, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        return {j: dict(self.counts[j]) for j in job_ids if self.counts.get(j)}

    async def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        out: dict[str, RunRecord] = {}
        for j in job_ids:
            runs = await self.job_runs(j, 1)
            if runs:
                out[j] = runs[0]
        return out


def _check_jobs(per_job: Mapping[str, object]) -> None:
    if len(per_job) > RUN_WRITE_JOBS:
        raise ValueError(f"a run history write of {len(per_job)} jobs: at most "
                         f"{RUN_WRITE_JOBS} a request")


def _of_job(job_id: str, runs: Sequence[RunRecord]) -> None:
    for run in runs:
        if run.job_id != job_id:
            raise ValueError(f"run of job {run.job_id!r} in a write of job {job_id!r}")


def _check_counters(counts: Mapping[str, int]) -> None:
    for name in counts:
        if name not in COUNTERS:
            raise ValueError(f"counter {name!r}: not one of {', '.join(COUNTERS)}")
