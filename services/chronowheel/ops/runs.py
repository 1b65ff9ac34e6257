"""Reading the run history back (`chronowheel job history|show`, `jobs list`, the client, the
console); written by `chronowheel.history.RunRecorder`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from chronowheel.core.runs import JobHistory, RunCounters, RunRecord
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.base import RunHistoryStore


async def read_job_history(store: RunHistoryStore, job_id: str, limit: int) -> JobHistory:
    """The job's newest `limit` runs and its counters (two reads, at once)."""
    runs, counts = await asyncio.gather(store.job_runs(job_id, limit),
                                        store.run_counts([job_id]))
    return JobHistory(job_id, runs, RunCounters.of(counts.get(job_id, {}),
                                                   runs[0] if runs else None))


async def read_counters(store: RunHistoryStore,
                        job_ids: Sequence[str]) -> tuple[dict[str, RunCounters],
                                                         dict[str, RunRecord]]:
    """Each job's counters (every job of `job_ids`, zeros when it has none) and newest run
    (those with one), in few requests: for listings."""
    counts, last = await asyncio.gather(store.run_counts(job_ids), store.last_runs(job_ids))
    return ({j: RunCounters.of(counts.get(j, {}), last.get(j)) for j in job_ids}, last)


async def open_history(store: object, settings: Settings) -> RunHistoryStore:
    """The run history of the keyspace `store` (a `CassandraStore`) is open on: its session,
    the statements prepared in a thread."""
    session = getattr(store, "session", None)
    if session is None:
        raise ConfigError("run history: the job store has no Cassandra session to read it "
                          "through (give the client a history store)")
    from chronowheel.store.cassandra_history import CassandraRunHistory

    return await asyncio.to_thread(CassandraRunHistory, session, settings.keyspace)
