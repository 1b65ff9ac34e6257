"""The run history storage contract (`chronowheel.store.base.RunHistoryStore`), once for every
implementation.

A test module subclasses `RunHistoryContract` and provides two fixtures: `history` (the store)
and `pass_time` (an async function that lets that many seconds pass for the store's TTLs). The
unit tests run it in memory, the integration tests against Cassandra. Each test uses its own job
ids, so one store may serve the tests of a module.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import pytest
from chronowheel.core import runs
from chronowheel.core.runs import RunRecord
from chronowheel.store.base import RUN_WRITE_JOBS, RunHistoryStore

PassTime = Callable[[float], Awaitable[None]]
T = 1_796_115_600_000


class CountedPermits:
    """Permits without a bound that count what the store takes (`store.base.Permits`)."""

    def __init__(self) -> None:
        self.taken = 0
        self.held = 0

    async def __aenter__(self) -> None:
        self.taken += 1
        self.held += 1

    async def __aexit__(self, *exc: object) -> None:
        self.held -= 1


class RunHistoryContract:
    @pytest.fixture
    def job(self) -> str:
        return "job-" + secrets.token_hex(4)

    async def test_runs_read_back_newest_first_up_to_the_limit(
            self, history: RunHistoryStore, job: str) -> None:
        written = [RunRecord(job, T + i * 1000, fired_ms=T + i * 1000 + 5, lateness_ms=5,
                             node_id="n1") for i in range(5)]
        await history.write_runs(job, written[:2], 3600)
        await history.write_runs(job, written[2:], 3600)
        got = await history.job_runs(job, 3)
        assert [r.scheduled_ms for r in got] == [T + 4000, T + 3000, T + 2000]
        assert got[0] == written[4]
        assert len(await history.job_runs(job, 100)) == 5
        assert await history.job_runs(job + "-other", 10) == []

    async def test_the_node_and_the_worker_parts_of_a_run_combine_in_either_order(
            self, history: RunHistoryStore, job: str) -> None:
        node = RunRecord(job, T, fired_ms=T + 7, lateness_ms=7, node_id="n1")
        worker = RunRecord(job, T, started_ms=T + 20, ended_ms=T + 31,
                           outcome=runs.SUCCEEDED, worker_id="w1")
        await history.write_runs(job, [worker], 3600)  # the worker's record came first
        (only,) = await history.job_runs(job, 10)
        assert only.state == runs.SUCCEEDED and only.fired_ms is None
        await history.write_runs(job, [node], 3600)
        (both,) = await history.job_runs(job, 10)
        assert both == RunRecord(job, T, fired_ms=T + 7, lateness_ms=7, node_id="n1",
                                 started_ms=T + 20, ended_ms=T + 31, outcome=runs.SUCCEEDED,
                                 worker_id="w1")
        assert both.duration_ms == 11

    async def test_attempts_and_requested_occurrences_are_runs_of_their_own(
            self, history: RunHistoryStore, job: str) -> None:
        first = RunRecord(job, T, 1, outcome=runs.RETRIED, error="ValueError: no")
        retry = RunRecord(job, T, 2, outcome=runs.SUCCEEDED)
        trigger = RunRecord(job, T, 1, f"{job}@{T}/trigger/r1", fired_ms=T + 3)
        await history.write_runs(job, [first, retry, trigger], 3600)
        got = await history.job_runs(job, 10)
        assert [(r.attempt, r.occurrence, r.state) for r in got] == [
            (2, f"{job}@{T}", runs.SUCCEEDED),
            (1, f"{job}@{T}", runs.RETRIED),
            (1, f"{job}@{T}/trigger/r1", runs.FIRED)]
        assert got[1].error == "ValueError: no"

    async def test_runs_expire_after_their_ttl(
            self, history: RunHistoryStore, job: str, pass_time: PassTime) -> None:
        await history.write_runs(job, [RunRecord(job, T, fired_ms=T)], 1)
        await history.write_runs(job, [RunRecord(job, T + 1000, fired_ms=T + 1000)], 3600)
        await pass_time(1.5)
        assert [r.scheduled_ms for r in await history.job_runs(job, 10)] == [T + 1000]

    async def test_counters_add_up_per_job_and_read_for_many(
            self, history: RunHistoryStore, job: str) -> None:
        other = job + "-b"
        await history.add_run_counts(job, {"fired": 2, "succeeded": 1})
        await history.add_run_counts(job, {"fired": 1, "failed": 1, "dead_lettered": 1})
        await history.add_run_counts(other, {"missed": 3, "skipped": 2})
        counts = await history.run_counts([job, other, job + "-none"])
        assert counts == {job: {"fired": 3, "succeeded": 1, "failed": 1, "dead_lettered": 1},
                          other: {"missed": 3, "skipped": 2}}
        with pytest.raises(ValueError, match="counter 'bogus'"):
            await history.add_run_counts(job, {"bogus": 1})

    async def test_last_runs_are_each_jobs_newest(
            self, history: RunHistoryStore, job: str) -> None:
        other = job + "-b"
        await history.write_runs(job, [RunRecord(job, T, outcome=runs.FAILED),
                                       RunRecord(job, T + 60_000, fired_ms=T + 60_001)], 3600)
        await history.write_runs(other, [RunRecord(other, T, outcome=runs.MISSED)], 3600)
        last = await history.last_runs([job, other, job + "-none"])
        assert {j: (r.scheduled_ms, r.state) for j, r in last.items()} == {
            job: (T + 60_000, runs.FIRED), other: (T, runs.MISSED)}

    async def test_a_write_holds_the_runs_of_one_job_only(
            self, history: RunHistoryStore, job: str) -> None:
        with pytest.raises(ValueError, match="in a write of job"):
            await history.write_runs(job, [RunRecord(job + "-b", T)], 3600)

    async def test_runs_and_counters_of_several_jobs_in_one_write(
            self, history: RunHistoryStore, job: str) -> None:
        jobs = [f"{job}-{i}" for i in range(RUN_WRITE_JOBS)]
        # Each job's node and worker parts, several runs of one job, in one write.
        made = await history.write_runs_of_jobs(
            {j: [RunRecord(j, T, fired_ms=T + 5, lateness_ms=5, node_id="n1")] for j in jobs},
            3600)
        assert 1 <= made <= len(jobs)  # a request per group of jobs with the same replicas
        await history.write_runs_of_jobs(
            {jobs[0]: [RunRecord(jobs[0], T, started_ms=T + 6, ended_ms=T + 9,
                                 outcome=runs.SUCCEEDED, worker_id="w1"),
                       RunRecord(jobs[0], T + 1000, fired_ms=T + 1001)],
             jobs[1]: [RunRecord(jobs[1], T, outcome=runs.RETRIED, error="E: x")]}, 3600)
        await history.write_runs_of_jobs({jobs[2]: [RunRecord(jobs[2], T + 1, fired_ms=T)]},
                                         3600)  # one job, one row
        first = await history.job_runs(jobs[0], 5)
        assert [(r.scheduled_ms, r.state) for r in first] == [(T + 1000, runs.FIRED),
                                                              (T, runs.SUCCEEDED)]
        assert (first[1].node_id, first[1].worker_id, first[1].lateness_ms) == ("n1", "w1", 5)
        assert [r.state for r in await history.job_runs(jobs[1], 5)] == [runs.RETRIED]
        assert len(await history.job_runs(jobs[2], 5)) == 2
        assert 1 <= await history.add_run_counts_of_jobs({j: {"fired": 1} for j in jobs}) \
            <= len(jobs)
        assert await history.add_run_counts_of_jobs({jobs[4]: {}, jobs[5]: {"fired": 0}}) == 0
        await history.add_run_counts_of_jobs({jobs[0]: {"succeeded": 1, "fired": 1},
                                              jobs[1]: {"failed": 1}, jobs[3]: {}})
        counts = await history.run_counts(jobs)
        assert counts[jobs[0]] == {"fired": 2, "succeeded": 1}
        assert counts[jobs[1]] == {"fired": 1, "failed": 1}
        assert all(counts[j] == {"fired": 1} for j in jobs[2:])

    async def test_each_request_of_a_write_of_several_jobs_holds_a_permit(
            self, history: RunHistoryStore, job: str) -> None:
        permits = CountedPermits()
        jobs = [f"{job}-{i}" for i in range(RUN_WRITE_JOBS)]
        made = await history.write_runs_of_jobs(
            {j: [RunRecord(j, T, fired_ms=T + 5)] for j in jobs}, 3600, permits)
        counted = await history.add_run_counts_of_jobs({j: {"fired": 1} for j in jobs}, permits)
        assert permits.taken == made + counted and permits.held == 0
        assert await history.add_run_counts_of_jobs({jobs[0]: {}}, permits) == 0
        assert permits.taken == made + counted  # no request, no permit
        assert [len(await history.job_runs(j, 5)) for j in jobs] == [1] * len(jobs)
        assert (await history.run_counts(jobs))[jobs[-1]] == {"fired": 1}

    async def test_a_write_of_several_jobs_is_bounded_and_checked(
            self, history: RunHistoryStore, job: str) -> None:
        many = {f"{job}-{i}": [RunRecord(f"{job}-{i}", T)] for i in range(RUN_WRITE_JOBS + 1)}
        with pytest.raises(ValueError, match="at most"):
            await history.write_runs_of_jobs(many, 3600)
        with pytest.raises(ValueError, match="at most"):
            await history.add_run_counts_of_jobs({j: {"fired": 1} for j in many})
        with pytest.raises(ValueError, match="in a write of job"):
            await history.write_runs_of_jobs({job: [RunRecord(job + "-b", T)]}, 3600)
        with pytest.raises(ValueError, match="counter 'bogus'"):
            await history.add_run_counts_of_jobs({job: {"bogus": 1}})
