"""Which threads of a process take its CPU: cores per thread name over a span (Linux).

    python loadtest/bench/thread_cpu.py PID [--seconds 10] [--top 12]

Reads each thread's user and system time from `/proc/PID/task/*/stat` at the start and the
end of the span and sums them by thread name with trailing numbers dropped (a JVM's
`C2 CompilerThread0` and `C2 CompilerThread1` are one line). The kernel keeps only the first
15 characters of a thread's name, so Kafka's `data-plane-kafka-request-handler-N` and its
network threads share one line, `data-plane-kafk`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def snapshot(pid: int) -> dict[str, tuple[str, int]]:
    """thread id -> (name, user + system ticks so far)."""
    out: dict[str, tuple[str, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, int(fields[11]) + int(fields[12]))
    return out


def by_name(before: dict[str, tuple[str, int]],
            after: dict[str, tuple[str, int]]) -> Counter[str]:
    """Ticks spent between the two snapshots, by thread name without its trailing number."""
    spent: Counter[str] = Counter()
    for tid, (name, ticks) in after.items():
        spent[re.sub(r"[-_:#]?\d+$", "", name)] += ticks - before.get(tid, (name, 0))[1]
    return spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pid", type=int)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    before = snapshot(args.pid)
    t0 = time.monotonic()
    time.sleep(args.seconds)
    after = snapshot(args.pid)
    span = time.monotonic() - t0
    spent = by_name(before, after)
    total = sum(spent.values()) / TICKS_PER_S / span
    print(f"pid {args.pid}: {total:.2f} cores over {span:.1f} s")
    for name, ticks in spent.most_common(args.top):
        print(f"  {name:<16} {ticks / TICKS_PER_S / span:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
