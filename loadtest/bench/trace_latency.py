"""Where the time between an occurrence's due instant and its handler's start goes: one run of
the real node and the real worker (default settings, `bench_handler:handle`, an `async def`
handler) with timestamps at every stage (`trace_shim.py`), and a read_committed probe.

    python loadtest/bench/trace_latency.py --rate 1000 --window-s 10
    python loadtest/bench/trace_latency.py --rate 1000 --py-spy loadtest/out/trace

N = rate x window one-shot jobs due uniformly in the window are submitted ahead of it (all
ingested before it opens, as in bench-peers). Printed: for each stage, the time it took
(p50/p90/p99 over the jobs) and the lateness at its end; the stages are

    due -> taken       dispatch woke and took it out of the wheel (the wheel's tick, the
                       shard's loop, the event loop's turn)
    taken -> handed    its shard's publisher began its part (recurring writes: none here)
    handed -> queued   the part encoded and queued for the node's transaction
    queued -> begin    waiting for the transaction loop: a transaction in flight, the
                       loop's turns
    begin -> sent      BeginTxn and every part's batches handed to the producer
    sent -> offsets    AddOffsetsToTxn + TxnOffsetCommit (only when commands were ingested)
    -> acked           every batch acknowledged (AddPartitionsToTxn + Produce)
    acked -> committed EndTxn
    committed -> visible  the probe's read_committed fetch returned it (its own fetch wait
                       included; the markers are written after EndTxn is answered)
    committed -> fetched  the worker's fetch returned it
    fetched -> slot    a handler slot took it
    slot -> start      the handler began

Beside them: each process's time waiting for a CPU while runnable over the window (its
threads' `schedstat`: an event loop waiting there is late to everything), and the floor under
every occurrence's lateness, measured before the node starts (`--floor-s`, default 10 s): a
bare transactional producer commits one message every 10 ms and a read_committed reader
stamps its arrival; no occurrence published by a transaction can reach a committed reader
sooner.

`--py-spy DIR` also records a py-spy profile of the node and of the worker over the window
(folded stacks, one file per process, `py-spy` from the virtualenv; `--top` of each printed).
Writes loadtest/results/trace-latency.json. The run's namespace (its topics and keyspace) is
dropped at the end; `--keep` keeps it.
Servers: CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA (default the local stack).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chronowheel.client import SchedulerClient
from chronowheel.settings import Settings
from chronowheel.testing import Collector, Fired, NodeProcess, drop_namespace
from chronowheel.testing.lateness import percentile
from common import stored_commands
from limits import create_raw_topic, raw_kafka_visibility
from worker_bench import ASSIGNED_RE, machine, new_namespace, say, settings_for, wait_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "loadtest" / "results"

NODE_FIELDS = ("job", "scheduled", "take", "hand", "queued", "begin", "begun", "sent",
               "offsets", "offsets_done", "acked", "endtxn", "committed", "done", "txn_seq",
               "txn_parts", "txn_offsets")


class Trace:
    """What one process's trace file says (see trace_shim.py)."""

    def __init__(self, path: Path) -> None:
        self.node: dict[str, dict[str, float]] = {}
        self.fetch: dict[str, float] = {}
        self.slot: dict[str, float] = {}
        self.gc: list[tuple[int, float, float]] = []  # generation, start, ms
        self.stalls: list[tuple[float, float]] = []  # start, ms
        self.marks: list[tuple[float, int, int]] = []  # when, marks and rows in that write
        self.applied: dict[str, float] = {}  # job -> when its command reached the wheel
        self.txns: list[dict[str, float]] = []  # every node transaction: its stage stamps
        self.retries: list[tuple[str, float]] = []  # transactional requests asked again
        if not path.exists():
            return
        for line in path.read_text().splitlines():
            kind, _, rest = line.partition(",")
            values = rest.split(",")
            if kind == "node" and len(values) == len(NODE_FIELDS):
                row = {k: float(v) for k, v in zip(NODE_FIELDS[1:], values[1:], strict=True)
                       if v != ""}
                self.node.setdefault(values[0], row)
            elif kind == "txn" and len(values) >= 4:
                txn = {"seq": float(values[0]), "parts": float(values[1]),
                       "offsets": float(values[2]), "messages": float(values[3])}
                txn.update((k, float(v)) for k, _, v in (x.partition("=") for x in values[4:]))
                self.txns.append(txn)
            elif kind == "retry" and len(values) == 3:
                self.retries.append((values[0], float(values[2])))
            elif kind == "applied" and len(values) == 2:
                self.applied.setdefault(values[0], float(values[1]))
            elif kind in ("fetch", "slot") and len(values) >= 2:
                (self.fetch if kind == "fetch" else self.slot).setdefault(
                    ",".join(values[:-1]), float(values[-1]))
            elif kind == "gc" and len(values) == 3:
                self.gc.append((int(values[0]), float(values[1]), float(values[2])))
            elif kind == "marks" and len(values) == 3:
                self.marks.append((float(values[2]), int(values[0]), int(values[1])))
            elif kind == "stall" and len(values) == 2:
                self.stalls.append((float(values[0]), float(values[1])))

    def pauses(self, t0: float, t1: float) -> dict[str, Any]:
        """Collections and loop stalls that began in [t0, t1] (ms)."""
        gcs = [(g, ms) for g, t, ms in self.gc if t0 <= t <= t1]
        stalls = sorted(ms for t, ms in self.stalls if t0 <= t <= t1)
        marks = [(n, rows) for t, n, rows in self.marks if t0 <= t <= t1]
        return {"mark_writes": len(marks), "marks": sum(n for n, _ in marks),
                "mark_rows": sum(rows for _, rows in marks), "gc_count": len(gcs),
                "gc_ms_total": round(sum(ms for _, ms in gcs), 1),
                "gc_ms_max": round(max((ms for _, ms in gcs), default=0.0), 1),
                "gc_by_generation": {g: sum(1 for x, _ in gcs if x == g) for g in (0, 1, 2)},
                "stalls": len(stalls), "stall_ms_total": round(sum(stalls), 1),
                "stall_ms_max": round(stalls[-1], 1) if stalls else 0.0}


STAGES: tuple[tuple[str, str, str], ...] = (
    # (name, from, to): named times of one job, see `times`
    ("due -> taken", "due", "take"),
    ("taken -> handed", "take", "hand"),
    ("handed -> queued", "hand", "queued"),
    ("queued -> txn begins", "queued", "begin"),
    ("begin -> batches sent", "begin", "sent"),
    ("sent -> offsets in txn", "sent", "offsets_done"),
    ("-> every batch acked", "offsets_done", "acked"),
    ("acked -> EndTxn answered", "acked", "committed"),
    ("committed -> probe visible", "committed", "visible"),
    ("committed -> worker fetch", "committed", "fetch"),
    ("fetch -> handler slot", "fetch", "slot"),
    ("slot -> handler start", "slot", "start"),
)


def times(job: str, due: float, node: dict[str, float], visible: float | None,
          fetch: float | None, slot: float | None, start: float | None) -> dict[str, float]:
    t = {"due": due, **node}
    t.setdefault("offsets_done", t.get("sent", 0.0))  # no offsets in that transaction
    for k, v in (("visible", visible), ("fetch", fetch), ("slot", slot), ("start", start)):
        if v is not None:
            t[k] = v
    return t


def table(rows: list[dict[str, float]]) -> list[dict[str, Any]]:
    out = []
    for name, a, b in STAGES:
        took = sorted(r[b] - r[a] for r in rows if a in r and b in r)
        late = sorted(r[b] - r["due"] for r in rows if b in r)
        if not took:
            continue
        out.append({"stage": name, "n": len(took),
                    **{f"took_p{q}": round(percentile(took, q) or 0, 2) for q in (50, 90, 99)},
                    "late_p50": round(percentile(late, 50) or 0, 2),
                    "late_p99": round(percentile(late, 99) or 0, 2)})
    return out


def markdown(stages: list[dict[str, Any]]) -> str:
    lines = ["| stage | took p50 | p90 | p99 | lateness at its end p50 | p99 |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in stages:
        lines.append(f"| {s['stage']} | {s['took_p50']:.1f} | {s['took_p90']:.1f} | "
                     f"{s['took_p99']:.1f} | {s['late_p50']:.1f} | {s['late_p99']:.1f} |")
    return "\n".join(lines)


def server_pids() -> dict[str, int]:
    """The local stack's JVMs (`./run stack`), by the state directory on their command line:
    other stacks (a test's secured or cluster one) may run beside it."""
    state = os.environ.get("CHRONOWHEEL_STATE_DIR",
                           str(Path.home() / ".cache" / "chronowheel" / "stack"))
    found: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for name in ("cassandra", "kafka"):
            if f"-Dchronowheel.stack={state}/{name}".encode() in args:
                found.setdefault(name, int(d.name))
    return found


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (its threads included), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuWatch:
    """CPU used by each process per second, sampled every second over the window."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[tuple[float, dict[str, float]]] = []

    async def run(self, until_s: float) -> None:
        last = {k: cpu_s(p) for k, p in self.pids.items()}
        t_last = time.monotonic()
        while time.time() < until_s:
            await asyncio.sleep(1.0)
            now = {k: cpu_s(p) for k, p in self.pids.items()}
            t = time.monotonic()
            self.samples.append((time.time(), {
                k: round((now[k] - last[k]) / (t - t_last), 2) for k in now
                if now[k] is not None and last[k] is not None}))
            last, t_last = now, t

    def mean(self) -> dict[str, float]:
        keys = {k for _, d in self.samples for k in d}
        return {k: round(sum(d.get(k, 0.0) for _, d in self.samples)
                         / max(1, len(self.samples)), 2) for k in sorted(keys)}


def schedstat(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread of `pid`: (ns on a CPU, ns runnable but waiting for one), from
    /proc/<pid>/task/<tid>/schedstat; the main thread's key is "main"."""
    out: dict[str, tuple[int, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            on_cpu, waiting, _slices = (int(x) for x in (t / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        out["main" if t.name == str(pid) else t.name] = (on_cpu, waiting)
    return out


class RunQueueWatch:
    """How long each process's threads waited for a CPU while runnable over the window: an
    event loop that waits there is late to everything, whatever its own code costs."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.first = {k: schedstat(p) for k, p in pids.items()}
        self.t0 = time.monotonic()

    def result(self) -> dict[str, dict[str, float]]:
        wall_ms = (time.monotonic() - self.t0) * 1000
        out: dict[str, dict[str, float]] = {}
        for k, p in self.pids.items():
            then, now = self.first[k], schedstat(p)
            common = [t for t in now if t in then]
            cpu = {t: (now[t][0] - then[t][0]) / 1e6 for t in common}
            wait = {t: (now[t][1] - then[t][1]) / 1e6 for t in common}
            out[k] = {"window_ms": round(wall_ms), "main_cpu_ms": round(cpu.get("main", 0)),
                      "main_wait_ms": round(wait.get("main", 0)),
                      "all_threads_cpu_ms": round(sum(cpu.values())),
                      "all_threads_wait_ms": round(sum(wait.values()))}
        return out


async def raw_floor(settings: Settings, seconds: float) -> dict[str, Any]:
    """The floor under any occurrence's lateness, measured before the node starts: a bare
    transactional producer commits ONE fired-like message every 10 ms and a read_committed
    reader measures stamp -> received (loadtest/bench/limits.py, `raw_kafka_visibility`)."""
    topic = f"{settings.namespace}.rawfloor"
    await create_raw_topic(settings, topic, 1)
    out = await raw_kafka_visibility(settings, topic, 1, seconds, "floor", batch=1, every_ms=10)
    return {"commit_ms": out["commit_ms"], "visible_ms": out["visible_ms"],
            "transactions": out["transactions"]}


def py_spy(pid: int, seconds: float, path: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        say("py-spy not found: no profile")
        return None
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100",
                             "-f", "raw", "-o", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(path: Path, k: int = 20) -> dict[str, list[tuple[str, float]]]:
    """The frames of a folded-stack profile that held the most samples: by themselves (self)
    and with what they called (inclusive), as a share of all samples. py-spy leaves idle
    threads out (no `--idle`), so the shares are of the time some thread was busy."""
    import re
    selfs: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    strip = re.compile(r":\d+\)$")
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [strip.sub(")", f) for f in stack.split(";")]
        selfs[frames[-1]] = selfs.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    def best(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / max(total, 1), 1))
                for f, n in sorted(d.items(), key=lambda kv: -kv[1])[:k]]
    return {"self": best(selfs), "inclusive": best(incl)}


async def run(rate: int, window_s: float, lead_s: float | None, spy_dir: Path | None,
              env_extra: dict[str, str], keep: bool = False,
              worker_args: tuple[str, ...] = (), floor_s: float = 10.0) -> dict[str, Any]:
    n = int(rate * window_s)
    ns = new_namespace("trc")
    settings = settings_for(ns)
    floor: dict[str, Any] | None = None
    if floor_s > 0:
        say(f"the floor: one-message transactions every 10 ms for {floor_s:.0f} s")
        floor = await raw_floor(settings, floor_s)
    workdir = ROOT / ".state" / "trace-latency"
    workdir.mkdir(parents=True, exist_ok=True)
    sink = workdir / f"starts-{ns}.csv"
    traces = {name: workdir / f"trace-{name}-{ns}.csv" for name in ("node", "worker")}
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    shim = [sys.executable, str(HERE / "trace_shim.py")]
    procs = {}
    for name, args in (("node", ("node",)),
                       ("worker", ("worker", "--topic", settings.fired_topic,
                                   "--handler", "bench_handler:handle", *worker_args))):
        p = NodeProcess(settings, workdir / f"{name}-{ns}.log", name=name, cwd=ROOT, args=args,
                        env={"CHRONOWHEEL_BENCH_SINK": str(sink), "PYTHONPATH": path,
                             "CHRONOWHEEL_TRACE_OUT": str(traces[name]), **env_extra})
        p.args_prefix = shim
        procs[name] = p
    visible: dict[str, float] = {}

    def on_fired(f: Fired) -> None:
        visible.setdefault(f.job_id, f.received_ms)

    probe = Collector(settings, keep_messages=False, on_fired=on_fired)
    node, worker = procs["node"], procs["worker"]
    node.start()
    worker.start()
    await probe.start()
    spies: list[subprocess.Popen[bytes]] = []
    try:
        await node.wait_ready()
        await wait_for(lambda: bool(ASSIGNED_RE.search(worker.log_text())), 120,
                       "the worker to be assigned its partitions")
        if lead_s is None:
            lead_s = max(15.0, n / 700.0 + 10.0)
        t0_ms = int(time.time() * 1000 + lead_s * 1000)
        rng = secrets.SystemRandom()
        jobs = {f"{ns}-{i}": due for i, due in enumerate(
            sorted(t0_ms + int(rng.random() * window_s * 1000) for _ in range(n)))}
        say(f"{rate}/s: submitting {n:,} jobs due in [{lead_s:.0f}s, {lead_s + window_s:.0f}s)")
        client = SchedulerClient(settings)
        await client.start()
        try:
            rep = await client.submit_many([{"id": j, "at": d} for j, d in jobs.items()])
        finally:
            await client.close()
        if rep.failed:
            raise RuntimeError(f"{len(rep.failed)} submits failed")
        await wait_for(lambda: stored_commands(node.metrics(), "upsert") >= n,
                       lead_s + window_s + 120, "the node to ingest every job")
        if time.time() * 1000 > t0_ms:
            say("WARNING: ingest ended after the window opened")
        await asyncio.sleep(max(0.0, t0_ms / 1000 - time.time()))
        cpu = CpuWatch({"node": node.pid, "worker": worker.pid, "bench": os.getpid(),
                        **server_pids()})
        cpu_task = asyncio.ensure_future(cpu.run(t0_ms / 1000 + window_s + 2))
        run_queue = RunQueueWatch({"node": node.pid, "worker": worker.pid})
        if spy_dir is not None:
            spy_dir.mkdir(parents=True, exist_ok=True)
            for name, p in procs.items():
                s = py_spy(p.pid, window_s, spy_dir / f"{name}-{rate}.folded")
                if s is not None:
                    spies.append(s)

        def starts() -> dict[str, float]:
            out: dict[str, float] = {}
            if sink.exists():
                for line in sink.read_text().splitlines():
                    jid, _due, start, _pid = line.split(",")
                    out.setdefault(jid, float(start))
            return out

        end_ms = t0_ms + window_s * 1000
        while time.time() * 1000 < end_ms + 60_000 and len(starts()) < n:
            await asyncio.sleep(0.5)
        seen = starts()
        await cpu_task
        waited = run_queue.result()
    finally:
        for s in spies:
            s.wait(60)
        await probe.stop()
        worker_rc = worker.stop()
        node_rc = node.stop()
        if not keep:
            # Its 3 x 16 partitions would stay on the broker otherwise: runs add up, and every
            # partition costs the broker memory and work (see loadtest/RESULTS.md, "Kafka's
            # index files").
            await drop_namespace(settings)
    node_trace, worker_trace = Trace(traces["node"]), Trace(traces["worker"])
    node_rows, fetch, slot = node_trace.node, worker_trace.fetch, worker_trace.slot
    rows = [times(j, due, node_rows[j], visible.get(j), fetch.get(j), slot.get(j), seen.get(j))
            for j, due in jobs.items() if j in node_rows]
    window = (t0_ms - 1000.0, t0_ms + window_s * 1000 + 5000.0)
    stages = table(rows)
    by_second: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        if "start" in r:
            by_second.setdefault(int((r["due"] - t0_ms) // 1000), []).append(
                (r["take"] - r["due"], r["start"] - r["due"]))
    seconds = {k: {"n": len(v),
                   "taken_p99": percentile(sorted(a for a, _ in v), 99),
                   "start_p50": percentile(sorted(b for _, b in v), 50),
                   "start_max": max(b for _, b in v)} for k, v in sorted(by_second.items())}
    txns = {int(r["txn_seq"]): r for r in rows if "txn_seq" in r}
    retried: dict[str, int] = {}
    for handler, at in node_trace.retries:
        if window[0] <= at <= window[1]:
            retried[handler] = retried.get(handler, 0) + 1
    late = sorted(seen[j] - d for j, d in jobs.items() if j in seen)
    early = sum(1 for j, d in jobs.items() if j in seen and seen[j] < d)
    return {
        "rate": rate, "n": n, "window_s": window_s, "namespace": ns, "env": env_extra,
        "worker_args": list(worker_args),
        "handler_start_lateness_ms": {q: round(percentile(late, q) or 0, 2)
                                      for q in (50, 90, 99, 100)},
        "traced": len(rows), "handled": len(seen), "early": early,
        "transactions": len(txns),
        "parts_per_txn_p50": percentile(sorted(r["txn_parts"] for r in txns.values()), 50),
        "txns_with_offsets": sum(1 for r in txns.values() if r.get("txn_offsets")),
        "node_transactions": sum(1 for t in node_trace.txns
                                 if window[0] <= t["begin"] <= window[1]),
        "transactional_retries": retried,
        "stages": stages, "by_second": seconds,
        "cpu_cores_mean": cpu.mean(), "cpu_cores_per_second": [d for _, d in cpu.samples],
        "node_rc": node_rc, "worker_rc": worker_rc,
        "node_pauses": node_trace.pauses(*window), "worker_pauses": worker_trace.pauses(*window),
        "run_queue_wait": waited, "floor": floor,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=1000, help="occurrences due per second")
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--lead-s", type=float, default=None)
    ap.add_argument("--py-spy", type=Path, default=None, metavar="DIR")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a variable for the node and worker (e.g. a CHRONOWHEEL_* setting)")
    ap.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="an argument for the worker (e.g. --no-idempotency); repeat as needed")
    ap.add_argument("--floor-s", type=float, default=10.0,
                    help="seconds of the raw floor measured before the node starts (one-message "
                         "transactions to a read_committed reader); 0 skips it")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run's namespace (its topics and keyspace) for inspection")
    args = ap.parse_args()
    env = dict(e.split("=", 1) for e in args.env)
    result: dict[str, Any] = {"machine": machine(), "command": " ".join(
        ["python", "loadtest/bench/trace_latency.py", *sys.argv[1:]])}
    result.update(asyncio.run(run(args.rate, args.window_s, args.lead_s, args.py_spy, env,
                                   args.keep, tuple(args.worker_arg), args.floor_s)))
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    h = result["handler_start_lateness_ms"]
    say(f"{args.rate}/s: handler start p50 {h[50]:.1f} p90 {h[90]:.1f} p99 {h[99]:.1f} "
        f"max {h[100]:.1f} ms; handled {result['handled']}/{result['n']}, early "
        f"{result['early']}; {result['transactions']} transactions, "
        f"{result['parts_per_txn_p50']} parts each (p50), {result['txns_with_offsets']} "
        f"with submit offsets")
    retried = result["transactional_retries"]
    say(f"node transactions in the window: {result['node_transactions']}; transactional "
        f"requests asked again (a retriable answer, CONCURRENT_TRANSACTIONS mostly): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(retried.items())) or 'none'}")
    print(markdown(result["stages"]))
    print("second of the window: jobs, due->taken p99, due->start p50 and max (ms)")
    for k, v in result["by_second"].items():
        print(f"  {k:3d}: {v['n']:6d} {v['taken_p99']:8.1f} {v['start_p50']:8.1f} "
              f"{v['start_max']:8.1f}")
    print(f"CPU (cores) over the window, mean: {result['cpu_cores_mean']}")
    for d in result["cpu_cores_per_second"]:
        print(f"  {d}")
    for who in ("node", "worker"):
        print(f"{who} during the window: {result[who + '_pauses']}")
        print(f"{who} waiting for a CPU while runnable: {result['run_queue_wait'][who]}")
    floor = result["floor"]
    if floor is not None:
        c, v = floor["commit_ms"], floor["visible_ms"]
        print(f"the floor ({floor['transactions']} one-message transactions): commit p50 "
              f"{c['p50']:.1f} p99 {c['p99']:.1f} ms; stamp -> read_committed visible p50 "
              f"{v['p50']:.1f} p99 {v['p99']:.1f} max {v['max']:.1f} ms")
    if args.py_spy is not None:
        for f in sorted(args.py_spy.glob(f"*-{args.rate}.folded")):
            top = top_frames(f)
            result.setdefault("profiles", {})[f.name] = top
            print(f"\n{f.name}: self")
            for frame, pct in top["self"]:
                print(f"  {pct:5.1f}%  {frame}")
            print(f"{f.name}: inclusive")
            for frame, pct in top["inclusive"]:
                print(f"  {pct:5.1f}%  {frame}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trace-latency.json").write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["early"] else 0


if __name__ == "__main__":
    sys.exit(main())
