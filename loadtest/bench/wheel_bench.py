"""Microbenchmark: chronowheel's TimingWheel vs a heapq timer queue vs asyncio's call_at.

For each (structure, N, spread) a fresh child process:
  1. builds the workload outside the measurement: N distinct str keys, N due instants uniform
     over the spread (seeded), one shared small value;
  2. inserts all N in random due order          -> inserts/s
  3. cancels every 10th key (10 %)              -> cancels/s
  4. drives time from the start to the end like a node's dispatch loop:
       d = next_deadline();  if d > now: now = max(now + step, d);  advance(now, max_batch)
     i.e. steps of --step-ms while timers are dense, jumping straight to the next deadline
     across idle stretches, and calling again at once when told a deadline already reached
     (a max_batch remainder, the wheel's chunked cascade); it checks that exactly the
     uncancelled 90 % fired -> expiries/s.
  The timing child runs with the cyclic GC enabled, as a real process would.
A "lat" child repeats 2-4 and times every single advance() call with the process CPU clock
(CPU time, not wall time: the machine may be shared, and preemption is not the structure's
doing): the longest call is the stall a node's event loop would see. Reading that clock costs
a few µs per call, so this child's throughput is not reported.
A second child per config runs only step 2 under tracemalloc: bytes the structure allocated per
timer (keys, due ints and the value are built before tracing starts, so they are excluded for
every structure alike; what is counted is what the structure itself adds per timer).

Structures
  wheel    chronowheel.core.wheel.TimingWheel(tick_ms=1, wheel_size=256)
  heapq    heap of (due, seq, key, value) tuples + dict key -> live tuple; cancel/replace is
           lazy (the dict entry goes, the heap tuple is skipped when popped)
  asyncio  loop.call_at(due_s, callback, key) on a real event loop + dict key -> TimerHandle
           for cancel by key. Expiry is asyncio's own machinery: loop.time() is replaced by the
           benchmark's fake clock, the selector's select() returns at once, and each step runs
           one loop iteration (BaseEventLoop._run_once), which pops every due TimerHandle off
           loop._scheduled and runs its callback. A shared Context is passed to call_at (the
           default would also copy a Context per timer). asyncio has no max_batch.

Usage
  python loadtest/bench/wheel_bench.py --sizes 1e5,1e6 --spreads 1h,30d
  python loadtest/bench/wheel_bench.py --sizes 1e7 --structures wheel,heapq --markdown
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import heapq
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, Protocol

T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z, epoch ms
SPREADS = {"1h": 3_600_000, "30d": 30 * 86_400_000}
STRUCTURES = ("wheel", "heapq", "asyncio")
VALUE = b"v"  # shared payload: memory figures exclude payloads


class Timers(Protocol):
    def insert(self, key: str, due_ms: int, value: bytes) -> None: ...
    def cancel(self, key: str) -> bool: ...
    def advance(self, now_ms: int, max_batch: int | None = None) -> list[Any]: ...
    def next_deadline(self) -> int | None: ...
    def __len__(self) -> int: ...


class HeapTimers:
    """The usual heapq timer queue with lazy deletion, same API as the wheel."""

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str, bytes]] = []
        self._live: dict[str, tuple[int, int, str, bytes]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def insert(self, key: str, due_ms: int, value: bytes) -> None:
        entry = (due_ms, next(self._seq), key, value)
        self._live[key] = entry  # a replaced entry's tuple becomes stale in the heap
        heapq.heappush(self._heap, entry)

    def cancel(self, key: str) -> bool:
        return self._live.pop(key, None) is not None

    def next_deadline(self) -> int | None:
        heap = self._heap
        live = self._live
        while heap:
            entry = heap[0]
            if live.get(entry[2]) is entry:
                return entry[0]
            heapq.heappop(heap)
        return None

    def advance(self, now_ms: int, max_batch: int | None = None) -> list[Any]:
        heap = self._heap
        live = self._live
        pop = heapq.heappop
        budget = sys.maxsize if max_batch is None else max_batch
        out: list[Any] = []
        while heap and heap[0][0] <= now_ms and len(out) < budget:
            entry = pop(heap)
            key = entry[2]
            if live.get(key) is entry:
                del live[key]
                out.append((entry[0], key, entry[3]))
        return out


class _NoIO:
    """Selector stand-in: nothing to poll, never blocks (time is fake)."""

    def select(self, timeout: float | None = None) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class AsyncioTimers:
    """loop.call_at timers with cancel by key; expiry runs the loop's own _run_once."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._now_s = T0 / 1000.0
        self.loop.time = lambda: self._now_s  # type: ignore[method-assign]
        self._real_selector = self.loop._selector  # type: ignore[attr-defined]
        self.loop._selector = _NoIO()  # type: ignore[attr-defined]
        self._handles: dict[str, asyncio.TimerHandle] = {}
        self._ctx = contextvars.copy_context()
        self._fired: list[Any] = []

    def __len__(self) -> int:
        return len(self._handles)

    def _fire(self, key: str) -> None:
        del self._handles[key]
        self._fired.append(key)

    def insert(self, key: str, due_ms: int, value: bytes) -> None:
        old = self._handles.get(key)
        if old is not None:
            old.cancel()
        self._handles[key] = self.loop.call_at(due_ms / 1000.0, self._fire, key, context=self._ctx)

    def cancel(self, key: str) -> bool:
        handle = self._handles.pop(key, None)
        if handle is None:
            return False
        handle.cancel()
        return True

    def next_deadline(self) -> int | None:
        sched = self.loop._scheduled  # type: ignore[attr-defined]
        if not sched:
            return None
        # asyncio runs a handle once time() exceeds its `when` (by the clock resolution),
        # so the first whole millisecond at which it fires is the next one.
        return int(sched[0].when() * 1000.0 + 0.5) + 1

    def advance(self, now_ms: int, max_batch: int | None = None) -> list[Any]:
        self._now_s = now_ms / 1000.0
        self._fired = []
        self.loop._run_once()  # type: ignore[attr-defined]
        return self._fired

    def close(self) -> None:
        self.loop._selector = self._real_selector  # type: ignore[attr-defined]
        self.loop.close()


def make(structure: str, cascade_chunk: int = 4096) -> Timers:
    if structure == "wheel":
        from chronowheel.core.wheel import TimingWheel

        return TimingWheel(start_ms=T0, tick_ms=1, wheel_size=256, cascade_chunk=cascade_chunk)
    if structure == "heapq":
        return HeapTimers()
    if structure == "asyncio":
        return AsyncioTimers()
    raise SystemExit(f"unknown structure {structure}")


def workload(n: int, spread_ms: int, seed: int) -> tuple[list[str], list[int]]:
    rnd = random.Random(seed).random
    keys = [f"job-{i:09d}" for i in range(n)]
    dues = [T0 + int(rnd() * spread_ms) for _ in range(n)]
    return keys, dues


# CPU time of this process: the benchmark machine may be shared, and a timer structure's cost
# is its CPU work. Wall time of the whole cycle is recorded too.
clock = time.process_time


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child(args: argparse.Namespace) -> dict[str, Any]:
    n = int(float(args.n))
    spread_ms = SPREADS[args.spread]
    label = f"[{args.structure} n={n:.0e} {args.spread} {args.mode}]"
    t = time.perf_counter()
    keys, dues = workload(n, spread_ms, args.seed)
    log(f"{label} workload built in {time.perf_counter() - t:.1f}s")
    s = make(args.structure, args.cascade_chunk)
    gc.collect()
    result: dict[str, Any] = {
        "structure": args.structure,
        "n": n,
        "spread": args.spread,
        "mode": args.mode,
    }

    if args.mode == "mem":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        ins: Callable[[str, int, bytes], None] = s.insert
        for k, d in zip(keys, dues, strict=True):
            ins(k, d, VALUE)
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result["bytes_per_timer"] = (current - before) / n
        result["peak_bytes_per_timer"] = (peak - before) / n
        log(f"{label} {result['bytes_per_timer']:.1f} B/timer")
        if isinstance(s, AsyncioTimers):
            s.close()
        return result

    rss0 = rss_bytes()
    ins = s.insert
    wall0 = time.perf_counter()
    t = clock()
    for k, d in zip(keys, dues, strict=True):
        ins(k, d, VALUE)
    t_ins = clock() - t
    rss1 = rss_bytes()
    log(f"{label} insert {t_ins:.2f}s ({n / t_ins:,.0f}/s), RSS +{(rss1 - rss0) / n:.0f} B/timer")

    cancel = s.cancel
    victims = keys[::10]
    t = clock()
    for k in victims:
        cancel(k)
    t_can = clock() - t
    log(f"{label} cancel {t_can:.2f}s ({len(victims) / t_can:,.0f}/s)")

    expected = len(s)
    step = args.step_ms
    batch = args.max_batch or None
    nd = s.next_deadline
    adv = s.advance
    now = T0
    fired = 0
    calls = 0
    report_every = max(1, expected // 10)
    next_report = report_every
    worst = 0.0  # longest single advance() call (lat mode)
    lat = args.mode == "lat"
    t = clock()
    while True:
        deadline = nd()
        if deadline is None:
            break
        if deadline > now:
            now = max(now + step, deadline)
        if lat:
            t1 = clock()
            fired += len(adv(now, batch))
            t1 = clock() - t1
            if t1 > worst:
                worst = t1
        else:
            fired += len(adv(now, batch))
        calls += 1
        if fired >= next_report:
            log(f"{label} expire {fired:,}/{expected:,} ({clock() - t:.1f}s)")
            next_report += report_every
    t_exp = clock() - t
    wall = time.perf_counter() - wall0
    if fired != expected or len(s) != 0:
        raise SystemExit(f"{label} fired {fired}, expected {expected}, left {len(s)}")
    if isinstance(s, AsyncioTimers):
        s.close()
    if lat:
        log(f"{label} longest advance() call {worst * 1000:.1f} ms CPU ({calls:,} calls)")
        result["max_advance_ms"] = worst * 1000
        return result
    log(f"{label} expire {t_exp:.2f}s ({fired / t_exp:,.0f}/s) in {calls:,} advance calls")
    result.update(
        insert_s=t_ins,
        cancel_s=t_can,
        expire_s=t_exp,
        inserts_per_s=n / t_ins,
        cancels_per_s=len(victims) / t_can,
        expiries_per_s=fired / t_exp,
        advance_calls=calls,
        cycle_s=t_ins + t_can + t_exp,
        cycle_wall_s=wall,
        rss_bytes_per_timer=(rss1 - rss0) / n,
    )
    return result


def run_child(argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *argv],
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def machine() -> str:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def table(rows: list[dict[str, Any]]) -> str:
    by = {(r["structure"], r["n"], r["spread"], r["mode"]): r for r in rows}
    configs = sorted({(r["n"], r["spread"]) for r in rows}, key=lambda c: (c[0], c[1] != "1h"))
    structures = [s for s in STRUCTURES if any(r["structure"] == s for r in rows)]
    out = [
        "| N | spread | structure | inserts/s | cancels/s | expiries/s | insert+cancel+expire s "
        "| longest advance() ms CPU | B/timer (tracemalloc) | B/timer (RSS) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, spread in configs:
        for s in structures:
            t = by.get((s, n, spread, "time"), {})
            m = by.get((s, n, spread, "mem"), {})
            lt = by.get((s, n, spread, "lat"), {})

            def f(r: dict[str, Any], k: str, fmt: str) -> str:
                return format(r[k], fmt) if k in r else "-"

            out.append(
                f"| {n:.0e} | {spread} | {s} | {f(t, 'inserts_per_s', ',.0f')} "
                f"| {f(t, 'cancels_per_s', ',.0f')} | {f(t, 'expiries_per_s', ',.0f')} "
                f"| {f(t, 'cycle_s', '.2f')} | {f(lt, 'max_advance_ms', '.1f')} "
                f"| {f(m, 'bytes_per_timer', '.1f')} "
                f"| {f(t, 'rss_bytes_per_timer', '.0f')} |"
            )
    out += [
        "",
        "Ratios wheel / heapq (time: < 1 means the wheel is faster; memory: < 1 = smaller)",
        "",
    ]
    out += [
        "| N | spread | insert time | cancel time | expire time | full cycle time | B/timer |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n, spread in configs:
        w, h = by.get(("wheel", n, spread, "time")), by.get(("heapq", n, spread, "time"))
        wm, hm = by.get(("wheel", n, spread, "mem")), by.get(("heapq", n, spread, "mem"))
        cells = []
        for k in ("insert_s", "cancel_s", "expire_s", "cycle_s"):
            cells.append(f"{w[k] / h[k]:.2f}" if w and h else "-")
        cells.append(f"{wm['bytes_per_timer'] / hm['bytes_per_timer']:.2f}" if wm and hm else "-")
        out.append(f"| {n:.0e} | {spread} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--sizes", default="1e5,1e6", help="comma-separated timer counts (e.g. 1e5,1e6,1e7)"
    )
    p.add_argument("--spreads", default="1h,30d", help="comma-separated: 1h, 30d")
    p.add_argument("--structures", default=",".join(STRUCTURES))
    p.add_argument(
        "--modes",
        default="time,mem,lat",
        help="time (throughput), mem (tracemalloc), lat (CPU time of each advance() call)",
    )
    p.add_argument("--step-ms", type=int, default=100, help="driver step while timers are dense")
    p.add_argument("--max-batch", type=int, default=5000, help="max_batch per advance (0 = none)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--cascade-chunk",
        type=int,
        default=4096,
        help="wheel: timers cascaded per advance() (huge = a bucket at once, no staging)",
    )
    p.add_argument("--json", help="also write all results to this file")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (default)")
    # internal: one measurement in this process
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--structure", help=argparse.SUPPRESS)
    p.add_argument("--n", help=argparse.SUPPRESS)
    p.add_argument("--spread", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        print(json.dumps(child(args)), flush=True)
        return

    log(f"machine: {machine()}")
    rows: list[dict[str, Any]] = []
    started = time.time()
    for n in args.sizes.split(","):
        for spread in args.spreads.split(","):
            for mode in args.modes.split(","):
                for structure in args.structures.split(","):
                    rows.append(
                        run_child(
                            [
                                f"--structure={structure}",
                                f"--n={n}",
                                f"--spread={spread}",
                                f"--mode={mode}",
                                f"--step-ms={args.step_ms}",
                                f"--max-batch={args.max_batch}",
                                f"--seed={args.seed}",
                                f"--cascade-chunk={args.cascade_chunk}",
                            ]
                        )
                    )
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump(rows, f, indent=1)
    log(f"total {time.time() - started:.0f}s")
    print(table(rows))


if __name__ == "__main__":
    main()
