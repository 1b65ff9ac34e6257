"""Time-window compaction and one long-lived row, in minute-sized windows (issue 26, item 2).

Two tables shaped like `due` (partition (minute, shard)), time-window compaction in one-minute
windows, gc_grace 0, memtables flushed every 15 s, the expired-sstable check every 30 s. Each
second 200 rows go to both, with TTLs of 60 to 120 s (due within a minute, plus a minute of
retention: an hour-window namespace's jobs due within the hour, sixty times faster). Table
`pinned` also gets, first, one row with a one-hour TTL (a job far ahead). Every 20 s: live
sstables of each (the local stack's data directory). Drops its scratch keyspace `twcspin` first.

    .venv/bin/python loadtest/bench/twcs_pin.py --seconds 720
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from cassandra.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_bench import keyspace_dir

KEYSPACE = "twcspin"
TABLES = ("plain", "pinned")


def live_sstables(table: str) -> int:
    ks_dir = keyspace_dir(KEYSPACE)
    return 0 if ks_dir is None else sum(
        1 for d in ks_dir.glob(f"{table}-*") for _ in d.glob("*-Data.db"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=720)
    p.add_argument("--cassandra", default="127.0.0.1")
    args = p.parse_args()
    s = Cluster([args.cassandra]).connect()
    s.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}")
    s.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    for t in TABLES:
        s.execute(f"""CREATE TABLE {KEYSPACE}.{t} (minute bigint, shard int, slot bigint,
            id text, v blob, PRIMARY KEY ((minute, shard), slot, id))
            WITH compaction = {{'class': 'TimeWindowCompactionStrategy',
                'compaction_window_unit': 'MINUTES', 'compaction_window_size': 1,
                'expired_sstable_check_frequency_seconds': 30}}
            AND gc_grace_seconds = 0 AND memtable_flush_period_in_ms = 15000""")
    insert = {t: s.prepare(f"INSERT INTO {KEYSPACE}.{t} (minute, shard, slot, id, v) "
                           "VALUES (?, ?, ?, ?, ?) USING TTL ?") for t in TABLES}
    s.execute(insert["pinned"], (0, 0, 0, "far-future", b"x" * 64, 3600))
    t0 = last = time.time()
    i = 0
    while time.time() - t0 < args.seconds:
        for _ in range(200):
            i += 1
            ttl = 60 + random.randint(0, 60)
            minute = int(time.time() + ttl - 60) // 60
            for t in TABLES:
                s.execute_async(insert[t], (minute, i % 16, i, f"j{i}", b"x" * 64, ttl))
        time.sleep(1)
        if time.time() - last >= 20:
            last = time.time()
            print(f"{time.time() - t0:5.0f}s live sstables: plain {live_sstables('plain'):3d}, "
                  f"pinned {live_sstables('pinned'):3d}", flush=True)
    s.execute(f"DROP KEYSPACE {KEYSPACE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
