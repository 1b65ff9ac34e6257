"""What a run history write costs the writing process: CPU (every thread: the event loop's and
the Cassandra driver's) per row, with one job a request (a request for its runs, one for its
counters) against `RUN_WRITE_JOBS` jobs a request (an unlogged batch, a counter batch), on the
local Cassandra, 32 requests in flight as the writer.

    python loadtest/bench/history_requests.py --namespace NS [--rows 2000]

NS must exist (`chronowheel init`); rows go to jobs named `hr<n>-<i>` with a one-hour TTL.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from collections.abc import Awaitable, Iterable

from chronowheel.core import runs
from chronowheel.core.runs import RunRecord
from chronowheel.settings import Settings
from chronowheel.store.base import RUN_WRITE_JOBS
from chronowheel.store.cassandra import CassandraStore
from chronowheel.store.cassandra_history import CassandraRunHistory

T0 = 1_796_115_600_000


async def bounded(calls: Iterable[Awaitable[None]], in_flight: int = 32) -> None:
    todo = iter(calls)

    async def lane() -> None:
        for call in todo:
            await call

    await asyncio.gather(*(lane() for _ in range(in_flight)))


async def one(history: CassandraRunHistory, mode: str, n: int) -> str:
    tag = secrets.token_hex(3)
    recs = [RunRecord(f"hr{tag}-{i}", T0, 1, f"hr{tag}-{i}@{T0}", started_ms=T0,
                      ended_ms=T0 + 1, outcome=runs.SUCCEEDED, worker_id="w-bench")
            for i in range(n)]
    cpu0, t0 = time.process_time(), time.monotonic()
    if mode == "job":
        await bounded(history.write_runs(r.job_id, [r], 3600) for r in recs)
        await bounded(history.add_run_counts(r.job_id, {"succeeded": 1}) for r in recs)
        requests = 2 * n
    else:
        groups = [recs[i:i + RUN_WRITE_JOBS] for i in range(0, n, RUN_WRITE_JOBS)]
        await bounded(history.write_runs_of_jobs({r.job_id: [r] for r in g}, 3600)
                      for g in groups)
        await bounded(history.add_run_counts_of_jobs({r.job_id: {"succeeded": 1} for r in g})
                      for g in groups)
        requests = 2 * len(groups)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    return (f"{mode:>6}: {n} rows in {requests} requests: CPU {cpu:.2f} s, "
            f"{cpu / n * 1e6:.0f} µs a row, {cpu / requests * 1e6:.0f} µs a request; "
            f"wall {wall:.2f} s")


async def main(namespace: str, n: int) -> None:
    settings = Settings.from_env(namespace=namespace)
    store = CassandraStore.open(settings)
    try:
        history = CassandraRunHistory(store.session, settings.keyspace)
        for mode in ("job", "group", "job", "group"):
            print(await one(history, mode, n), flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--rows", type=int, default=2000)
    args = ap.parse_args()
    asyncio.run(main(args.namespace, args.rows))
