"""What the local Cassandra's CPU follows at ordinary rates: requests a second, not rows. The
Python driver alone (no node, no worker) writes rows shaped like the worker's outcome marks
(`worker_marks`: a partition per topic partition, a 50-byte blob) into a scratch keyspace,
spread evenly over each step, and reads the Cassandra JVM's CPU from /proc over the step.

    python loadtest/bench/cassandra_request_cost.py                        # 10..1,600 requests/s
    python loadtest/bench/cassandra_request_cost.py --rates 800 --rows-per-request 1,4,8
    python loadtest/bench/cassandra_request_cost.py --rates 800 --burst-ms 10,50,100

A step sends `rate` requests a second for `--seconds`; a request is one INSERT, or an unlogged
batch of `rows-per-request` rows of one partition; with `--burst-ms B` the step's requests go
in bursts every B ms instead of one by one. Printed per step: requests/s, rows/s, Cassandra
cores (user + system of its JVM over the step) and the idle cores measured before the first
step. The scratch keyspace is dropped at the end. Loopback only (the local stack).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
from typing import Any

from cassandra.cluster import Cluster
from cassandra.query import BatchStatement, BatchType
from chronowheel.store.cassandra import execute
from chronowheel.testing import require_loopback
from common import add_stack_args
from trace_latency import cpu_s, server_pids

BLOB = b"x" * 50


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


async def step(session: Any, insert: Any, rate: int, rows: int, burst_ms: int,
               seconds: float, pid: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()

    async def request(i: int) -> None:
        partition = i % 16
        if rows == 1:
            await execute(session, insert, (partition, i, BLOB), "probe insert")
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for r in range(rows):
            batch.add(insert, (partition, i * rows + r, BLOB))
        await execute(session, batch, (), "probe batch")

    total = int(rate * seconds)
    per_burst = max(1, rate * burst_ms // 1000) if burst_ms else 1
    gap_s = per_burst / rate
    waits: list[asyncio.Task[None]] = []
    cpu0, t0 = cpu_s(pid), loop.time()
    sent = 0
    while sent < total:
        for _ in range(min(per_burst, total - sent)):
            waits.append(asyncio.ensure_future(request(sent)))
            sent += 1
        await asyncio.sleep(max(0.0, t0 + sent / rate - loop.time()) if per_burst == 1
                            else max(0.0, t0 + (sent // per_burst) * gap_s - loop.time()))
    await asyncio.gather(*waits)
    wall = loop.time() - t0
    cpu1 = cpu_s(pid)
    cores = (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None else float("nan")
    return {"requests_per_s": total / wall, "rows_per_s": total * rows / wall,
            "cassandra_cores": round(cores, 3)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_stack_args(ap)
    ap.add_argument("--rates", type=ints, default=ints("10,50,100,200,400,800,1600"))
    ap.add_argument("--rows-per-request", type=ints, default=[1])
    ap.add_argument("--burst-ms", type=ints, default=[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    require_loopback("cassandra", args.cassandra)
    pid = server_pids().get("cassandra")
    if pid is None:
        raise SystemExit("no local stack Cassandra found (./run stack up)")
    host, _, port = args.cassandra.partition(":")
    cluster = Cluster([host], port=int(port or 9042))
    session = cluster.connect()
    ks = f"reqcost{secrets.token_hex(3)}"
    session.execute(f"CREATE KEYSPACE {ks} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    try:
        session.execute(f"CREATE TABLE {ks}.marks (partition int, last_offset bigint, "
                        "marks blob, PRIMARY KEY (partition, last_offset))")
        insert = session.prepare(f"INSERT INTO {ks}.marks (partition, last_offset, marks) "
                                 "VALUES (?, ?, ?) USING TTL 600")
        c0, t0 = cpu_s(pid), time.monotonic()
        await asyncio.sleep(5)
        c1 = cpu_s(pid)
        idle = (c1 - c0) / (time.monotonic() - t0) if c0 is not None and c1 is not None else 0
        print(f"Cassandra idle: {idle:.2f} cores (pid {pid}, {os.cpu_count()} CPUs)")
        print("| requests/s | rows a request | burst every ms | rows/s | Cassandra cores |")
        print("|---:|---:|---:|---:|---:|")
        for rows in args.rows_per_request:
            for burst in args.burst_ms:
                for rate in args.rates:
                    r = await step(session, insert, rate, rows, burst, args.seconds, pid)
                    print(f"| {r['requests_per_s']:,.0f} | {rows} | {burst or '-'} | "
                          f"{r['rows_per_s']:,.0f} | {r['cassandra_cores']:.2f} |", flush=True)
    finally:
        session.execute(f"DROP KEYSPACE {ks}")
        cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
