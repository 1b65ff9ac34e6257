"""Rebalances under load: a node joins, leaves, restarts and crashes while the others fire.

Against the Cassandra and Kafka of CHRONOWHEEL_CASSANDRA / CHRONOWHEEL_KAFKA (loopback only;
with `--cluster`, the stack's cluster profile on replication 3), on a scratch namespace dropped
afterwards:

1. `--nodes` `chronowheel node` processes share `--shards` shards (static membership with
   `--static`).
2. One-shot jobs due at `--rate` a second, spread evenly over every shard for the whole run, are
   submitted and ingested first: the rebalances move firing, not ingest.
3. After `--steady-s` of steady firing, one phase after the other, each ending `--steady-s`
   after the nodes share every shard again: **scale-out** (one more node joins), **scale-in**
   (that node is stopped with SIGTERM), **restart** of each first node in turn (SIGTERM, then
   started again: a rolling restart), **crash** (`kill -9` of the first node; the run ends with
   the survivors). `--phases` runs some of them, in that order: fewer phases need fewer jobs
   stored first, so a high `--rate` can be set up where the whole run's jobs could not.

A read_committed reader records every fired message. Reported per phase and shard: the owner
before and after, the **pause** (the longest time between two arrivals of the shard at the
reader, from the phase's start to its end) and the worst **lateness** (arrival at the reader
minus the due instant) of what arrived in it, each beside the same in the steady window before
the change; for the whole run, lost, early and duplicate occurrences and the lateness by
cw-fired-at (the node's publish stamp), and the share of the machine's CPU time left idle from
the first due instant to the last phase's end (from /proc/stat). One JSON line per run is
appended to loadtest/results/rebalance.jsonl.

Usage: python loadtest/rebalance.py [--cluster] [--nodes 3] [--rate 5000] [--static]
       [--phases out,in,restart,crash]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import secrets
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chronowheel.admin import init_namespace
from chronowheel.core.shard import shard_of
from chronowheel.settings import Settings
from chronowheel.testing import drop_namespace, require_loopback
from chronowheel.testing.collect import Fired
from chronowheel.testing.node_process import NodeProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's testkit/

from testkit.cluster import LocalCluster
from testkit.faults import Tally, judge, now_ms, submit_jobs
from testkit.fleet import Fleet

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "loadtest" / "results" / "rebalance.jsonl"
# Jobs keep coming due this long after the last phase's planned end (seconds).
END_MARGIN_S = 20.0
# The phases, in the order they run; scale-in stops the node that scale-out started.
PHASES = ("out", "in", "restart", "crash")


def phase_count(phases: Iterable[str], nodes: int) -> int:
    """How many changes `phases` make: a rolling restart is one per first node."""
    return sum(nodes if p == "restart" else 1 for p in phases)


def parse_phases(text: str) -> tuple[str, ...]:
    """`out,in,restart,crash` or a subset, run in PHASES' order whatever the order given."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    if unknown := [p for p in asked if p not in PHASES]:
        raise ValueError(f"--phases: unknown {', '.join(unknown)} (choose from "
                         f"{', '.join(PHASES)})")
    if not asked:
        raise ValueError("--phases: name at least one phase")
    if "in" in asked and "out" not in asked:
        raise ValueError("--phases: 'in' stops the node that 'out' starts: give 'out' too")
    return tuple(p for p in PHASES if p in asked)


@dataclass
class Phase:
    """One rebalance: from `start_ms` (the change) to `end_ms`; `shared_ms` when the members
    shared every shard again; the owners of each shard before and after."""

    name: str
    start_ms: float
    shared_ms: float
    end_ms: float
    before: dict[int, str]
    after: dict[int, str]
    subject: str = ""
    """the node that joined, stopped, restarted or crashed"""


@dataclass
class ShardFigures:
    owner_before: str
    owner_after: str
    moved: bool
    of_subject: bool
    """owned by the phase's subject before or after (a restarted node's shards stay with it)"""
    pause_ms: float
    steady_gap_ms: float
    worst_lateness_ms: float
    steady_worst_lateness_ms: float
    pause_began_ms: float = 0.0
    """when the pause began, from the phase's start (the signal, for a stop or a restart)"""


@dataclass
class PhaseFigures:
    name: str
    shared_after_s: float
    shards: dict[int, ShardFigures] = field(default_factory=dict)

    def worst(self, moved: bool | None = None, subject: bool | None = None,
              ) -> tuple[float | None, float | None]:
        """(largest pause, worst lateness) of the shards that moved (or stayed), or of the
        subject's shards (or the others')."""
        mine = [s for s in self.shards.values()
                if (moved is None or s.moved == moved)
                and (subject is None or s.of_subject == subject)]
        if not mine:
            return None, None
        return max(s.pause_ms for s in mine), max(s.worst_lateness_ms for s in mine)


def phase_figures(phase: Phase, messages: Iterable[Fired], shards: int,
                  steady_ms: float) -> PhaseFigures:
    """Per shard, over the arrivals at the read_committed reader inside the phase: the longest
    gap between two (the pause) and the worst lateness (arrival minus the due instant); the
    same two over the `steady_ms` before it. Lateness goes by arrival: an occurrence due just
    before a change and held up by it counts for the change, not the calm before."""
    quiet = phase.start_ms - steady_ms
    arrivals: dict[int, list[float]] = defaultdict(list)
    worst: dict[int, float] = defaultdict(float)
    steady_worst: dict[int, float] = defaultdict(float)
    for m in messages:
        if not quiet < m.received_ms <= phase.end_ms:
            continue
        k = shard_of(m.job_id, shards)
        arrivals[k].append(m.received_ms)
        late = m.received_ms - m.scheduled_ms
        if m.received_ms > phase.start_ms:
            worst[k] = max(worst[k], late)
        else:
            steady_worst[k] = max(steady_worst[k], late)
    out = PhaseFigures(phase.name, round((phase.shared_ms - phase.start_ms) / 1000, 2))
    for k in range(shards):
        times = sorted(arrivals[k])
        pause = steady = 0.0
        began = phase.start_ms
        for a, b in itertools.pairwise(times):
            if b <= phase.start_ms:
                steady = max(steady, b - a)
            elif b - a > pause:
                pause, began = b - a, a
        # A shard silent from its last arrival to the phase's end paused that long too.
        last = times[-1] if times else quiet
        if phase.end_ms - max(last, phase.start_ms) > pause:
            began = max(last, phase.start_ms)
            pause = phase.end_ms - began
        before, after = phase.before.get(k, "?"), phase.after.get(k, "?")
        of_subject = bool(phase.subject) and phase.subject in (before, after)
        out.shards[k] = ShardFigures(before, after, before != after, of_subject, round(pause),
                                     round(steady), round(worst[k]), round(steady_worst[k]),
                                     round(began - phase.start_ms))
    return out


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of every CPU since boot, from /proc/stat (Linux); (0, 0) where
    there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal; guest time is counted in user already
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


def idle_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The share of the CPUs' time spent idle between two `cpu_times()` readings."""
    total = after[1] - before[1]
    return None if total <= 0 else round((after[0] - before[0]) / total, 3)


def even_jobs(start_ms: int, seconds: float, rate: int) -> dict[str, int]:
    """One-shot jobs (id -> due ms) due `rate` a second from `start_ms` for `seconds`."""
    count = int(seconds * rate)
    return {f"r-{i:08d}": start_ms + i * 1000 // rate for i in range(count)}


def owners(fleet: Fleet) -> dict[int, str]:
    out: dict[int, str] = {}
    for n in fleet.nodes:
        for k in fleet.owned(n) or ():
            out[k] = n.name
    return out


def say(msg: str) -> None:
    print(f"[rebalance {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sharing(fleet: Fleet, members: Callable[[], list[NodeProcess]]) -> Callable[[], bool]:
    """Whether `members` share every shard; stops the run at once when one of them exited."""
    def check() -> bool:
        if dead := [n.name for n in members() if not n.alive()]:
            raise SystemExit(f"nodes exited: {dead}{fleet.tails()}")
        return fleet.sharing(*members())
    return check


async def rebalance(fleet: Fleet, name: str, change: Callable[[], object],
                    members: Callable[[], list[NodeProcess]], steady_s: float,
                    subject: str) -> Phase:
    """Apply `change`, wait until `members` share every shard, then `steady_s` more."""
    before = owners(fleet)
    start = now_ms()
    await asyncio.to_thread(change)  # a stop waits for the process: not on the reader's loop
    await fleet.until(sharing(fleet, members), 180, f"{name}: the nodes sharing")
    shared = now_ms()
    after = owners(fleet)
    say(f"{name}: shared after {(shared - start) / 1000:.1f} s")
    await asyncio.sleep(max(0.0, shared / 1000 + steady_s - now_ms() / 1000))
    return Phase(name, start, shared, now_ms(), before, after, subject)


def stop_node(node: NodeProcess) -> None:
    node.stop(60)  # one SIGTERM: a graceful stop (a second one makes the node abort)


def restart_node(fleet: Fleet, node: NodeProcess, env: dict[str, str]) -> None:
    """Stop the node, then start it again with the same variables of its own (its instance id:
    without it a static member would come back as a dynamic one)."""
    stop_node(node)
    fleet.restart(node, **env)


async def run(args: argparse.Namespace) -> dict[str, object]:
    if args.cluster:
        cassandra, kafka = LocalCluster().addresses()
        replication = "3"
    else:
        cassandra = os.environ.get("CHRONOWHEEL_CASSANDRA", "127.0.0.1:9042")
        kafka = os.environ.get("CHRONOWHEEL_KAFKA", "127.0.0.1:9092")
        replication = "1"
    for name, address in (("cassandra", cassandra), ("kafka", kafka)):
        for one in address.split(","):
            require_loopback(name, one)
    settings = Settings(namespace="rb" + secrets.token_hex(5), cassandra=cassandra,
                        kafka=kafka, shards=args.shards, replication=replication, http_port=0)
    await init_namespace(settings)
    log_dir = Path(tempfile.mkdtemp(prefix="rebalance-"))
    fleet = Fleet(settings, log_dir, env=dict(kv.split("=", 1) for kv in args.node_env),
                  cwd=REPO)
    tally = Tally(settings)

    def node_env(name: str) -> dict[str, str]:
        return {"CHRONOWHEEL_NODE_INSTANCE_ID": name} if args.static else {}

    phases: list[Phase] = []
    try:
        first = [fleet.start(f"n{i + 1}", **node_env(f"n{i + 1}")) for i in range(args.nodes)]
        await fleet.until(sharing(fleet, lambda: first), 180, "the nodes sharing the shards")
        await tally.start()
        changes = phase_count(args.phases, args.nodes)
        span_s = args.steady_s * (changes + 1) + args.phase_allowance_s * changes
        # every job the run submits, the margin's too: the ingest must take them all first
        count = int((span_s + END_MARGIN_S) * args.rate)
        start = int(now_ms() + count * 1000 / args.ingest_rate + 10_000)
        jobs = even_jobs(start, span_s + END_MARGIN_S, args.rate)
        say(f"{len(jobs):,} jobs due {args.rate:,}/s from {(start - now_ms()) / 1000:.0f} s on")
        t0 = time.monotonic()
        await submit_jobs(settings, jobs)
        await fleet.until(lambda: fleet.ingested(*first) >= len(jobs),
                          max(120.0, (start - now_ms()) / 1000 + 300), "ingest")
        ingest_s = time.monotonic() - t0
        slack_s = (start - now_ms()) / 1000
        say(f"ingested in {ingest_s:.0f} s ({len(jobs) / ingest_s:,.0f}/s); "
            f"{slack_s:.0f} s to the first due instant")
        if slack_s < 1:
            raise SystemExit(f"ingest of {len(jobs):,} jobs took {ingest_s:.0f} s, past the "
                             "first due instant: lower --ingest-rate")
        await asyncio.sleep(slack_s)
        firing_cpu = cpu_times()  # how busy the machine is while the nodes fire
        await asyncio.sleep(args.steady_s)

        extra: list[NodeProcess] = []
        name = f"n{args.nodes + 1}"
        if "out" in args.phases:
            phases.append(await rebalance(
                fleet, "scale-out", lambda: extra.append(fleet.start(name, **node_env(name))),
                lambda: [*first, *extra], args.steady_s, name))
        if "in" in args.phases:
            phases.append(await rebalance(fleet, "scale-in (SIGTERM)",
                                          lambda: stop_node(extra.pop()), lambda: first,
                                          args.steady_s, name))
        if "restart" in args.phases:
            for node in first:
                phases.append(await rebalance(fleet, f"restart {node.name}",
                                              functools.partial(restart_node, fleet, node,
                                                                node_env(node.name)),
                                              lambda: [*first, *extra], args.steady_s,
                                              node.name))
        if "crash" in args.phases:
            victim = first[0]
            phases.append(await rebalance(fleet, f"crash {victim.name} (kill -9)", victim.kill,
                                          lambda: [*first[1:], *extra], args.steady_s,
                                          victim.name))
        end = phases[-1].end_ms
        if end > start + (span_s + END_MARGIN_S) * 1000:
            raise SystemExit("the phases outlasted the jobs: raise --phase-allowance-s")
        cpu_idle = idle_share(firing_cpu, cpu_times())
        due = {j: at for j, at in jobs.items() if at <= end}
        await fleet.until(lambda: {m.job_id for m in tally.messages} >= due.keys(), 120,
                          "every occurrence due before the end read")
        await asyncio.sleep(3)  # a late duplicate would show here
        seen = [m for m in tally.messages if m.job_id in due]
        outcome = judge(seen, due)
        figures = [phase_figures(p, seen, args.shards, args.steady_s * 1000) for p in phases]
        for f in figures:
            say(f"{f.name}: shared after {f.shared_after_s} s")
            for k, s in f.shards.items():
                say(f"  shard {k:2d} {s.owner_before:>3} -> {s.owner_after:<3} "
                    f"{'moved ' if s.moved else 'stayed'} pause {s.pause_ms:5.0f} ms (steady "
                    f"{s.steady_gap_ms:4.0f} ms), worst lateness {s.worst_lateness_ms:5.0f} ms "
                    f"(steady {s.steady_worst_lateness_ms:4.0f} ms)")
            for moved in (False, True):
                pause, late = f.worst(moved=moved)
                if pause is not None:
                    say(f"  {'moved' if moved else 'stayed'}: pause up to {pause:.0f} ms, "
                        f"lateness up to {late:.0f} ms")
            for own in (True, False):
                pause, late = f.worst(subject=own)
                if pause is not None:
                    say(f"  {'its node' if own else 'other nodes'}' shards: pause up to "
                        f"{pause:.0f} ms, lateness up to {late:.0f} ms")
        say(outcome.summary())
        if cpu_idle is not None:
            say(f"the CPUs were idle {cpu_idle:.1%} of the time while the nodes fired")
        return {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cluster": args.cluster, "nodes": args.nodes, "shards": args.shards,
            "rate": args.rate, "static": args.static, "node_env": args.node_env,
            "phases_run": list(args.phases),
            "jobs": len(due), "ingest_s": round(ingest_s, 1), "load_1m": os.getloadavg()[0],
            "cpu_idle_firing": cpu_idle,
            "lost": outcome.lost, "early": outcome.early, "duplicates": outcome.duplicates,
            "lateness_p50_ms": outcome.p(50), "lateness_p99_ms": outcome.p(99),
            "lateness_max_ms": outcome.max_ms,
            "phases": [summary(f) for f in figures],
        }
    finally:
        await tally.stop()
        fleet.close()
        if args.keep:
            say(f"kept namespace {settings.namespace}")
        else:
            await drop_namespace(settings)
        say(f"the nodes' logs are in {log_dir}")


def summary(f: PhaseFigures) -> dict[str, object]:
    stayed_pause, stayed_late = f.worst(moved=False)
    moved_pause, moved_late = f.worst(moved=True)
    own_pause, own_late = f.worst(subject=True)
    other_pause, other_late = f.worst(subject=False)
    return {"name": f.name, "shared_after_s": f.shared_after_s,
            "stayed_pause_max_ms": stayed_pause, "stayed_lateness_max_ms": stayed_late,
            "moved_pause_max_ms": moved_pause, "moved_lateness_max_ms": moved_late,
            "subject_pause_max_ms": own_pause, "subject_lateness_max_ms": own_late,
            "others_pause_max_ms": other_pause, "others_lateness_max_ms": other_late,
            "shards": {str(k): asdict(s) for k, s in f.shards.items()}}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", action="store_true",
                   help="the stack's cluster profile (`./run stack up --profile cluster`), "
                        "replication 3")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--rate", type=int, default=5_000, help="occurrences due per second")
    p.add_argument("--steady-s", type=float, default=5.0)
    p.add_argument("--phase-allowance-s", type=float, default=12.0,
                   help="time a change takes until the nodes share the shards again, when "
                        "planning how long the jobs must last")
    p.add_argument("--ingest-rate", type=float, default=1_500,
                   help="jobs/s assumed when planning the first due instant after the ingest")
    p.add_argument("--static", action="store_true",
                   help="give each node a group instance id (static membership)")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="the changes to make, comma-separated, run in this order: "
                        f"{','.join(PHASES)} (default: all)")
    p.add_argument("--keep", action="store_true",
                   help="keep the namespace (its topics and keyspace) after the run; the nodes' "
                        "logs are kept either way. Kept namespaces add up on the servers and "
                        "load them: drop them when done")
    args = p.parse_args(argv)
    if args.nodes < 2 or min(args.rate, args.steady_s, args.ingest_rate,
                             args.phase_allowance_s) <= 0:
        p.error("--nodes must be at least 2; --rate, --steady-s, --phase-allowance-s and "
                "--ingest-rate positive")
    if any("=" not in kv for kv in args.node_env):
        p.error("--node-env takes KEY=VALUE")
    try:
        args.phases = parse_phases(args.phases)
    except ValueError as e:
        p.error(str(e))
    return args


def main() -> None:
    args = parse()
    result = asyncio.run(run(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

