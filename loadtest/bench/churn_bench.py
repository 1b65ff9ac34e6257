"""Churn in a hot minute: most of a minute's jobs cancelled or moved before it comes.

1. Creates a fresh namespace (16 shards by default) and submits `--jobs` one-shots due
   uniformly over one minute about `--lead-s` ahead, then for 4 of every 5 of them a cancel
   (`--moved-share` of those an edit to the same second two minutes later instead): the
   commands go to `<ns>.submit` before the node starts, so ingest alone sets the pace.
2. Starts a node and waits until it has applied every command; reports the ingest rate.
3. Stops that node and starts another, which reads the hot minute and the minute of the moved
   jobs from Cassandra after all the cancels and edits: the read a failover or a deploy in the
   hour before a hot minute makes. Reports when it owns every shard and when the minute is in
   its wheel.
4. Reads `<ns>.fired` read_committed from the start and checks every occurrence against what
   must fire: the kept jobs at their instant, the moved ones at their new instant, nothing of
   a cancelled job and nothing at a moved job's old instant; lateness of the receive and of
   `cw-fired-at`, early, duplicate, lost.
5. Reports what Cassandra warned of: the nodes' `chronowheel_store_server_warnings_total` by
   kind, and the lines of Cassandra's log written during the run that mention tombstones.

    .venv/bin/python loadtest/bench/churn_bench.py --jobs 500000 --lead-s 600
    .venv/bin/python loadtest/bench/churn_bench.py --jobs 20000 --lead-s 150   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.bus.kafka import plain_producer
from chronowheel.core import wire
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.settings import Settings
from chronowheel.testing import (
    Collector,
    Fired,
    LatenessTally,
    NodeProcess,
    drop_namespace,
    metric_sum,
    summarize,
    wall_ms,
)
from common import (
    LOG_DIR,
    PAD,
    ROOT,
    add_stack_args,
    emit,
    fresh_namespace,
    init_with_cli,
    say,
    stored_commands,
)

MINUTE_MS = 60_000
MOVE_MS = 2 * MINUTE_MS


def default_cassandra_log() -> Path:
    state = os.environ.get("CHRONOWHEEL_STATE_DIR",
                           str(Path.home() / ".cache" / "chronowheel" / "stack"))
    return Path(state) / "cassandra" / "logs" / "system.log"


class Plan:
    """What is submitted and what must fire: job i is due at `at[i]`; i % 5 == 0 is kept, the
    others are cancelled, except every `moved_every`-th of them, moved by MOVE_MS."""

    def __init__(self, run: str, jobs: int, minute_ms: int, moved_share: float) -> None:
        self.run = run
        self.minute_ms = minute_ms
        self.at = [minute_ms + (i * 7919) % MINUTE_MS for i in range(jobs)]
        changed = [i for i in range(jobs) if i % 5]
        step = round(1 / moved_share) if moved_share > 0 else 0
        self.moved = set(changed[::step]) if step else set()
        self.cancelled = set(changed) - self.moved
        self.kept = [i for i in range(jobs) if i % 5 == 0]

    def job_id(self, i: int) -> str:
        return f"{self.run}.{i:08d}"

    def expected(self) -> dict[str, str]:
        """occurrence id -> "kept" | "moved" for every occurrence that must fire."""
        out = {wire.occurrence_id(self.job_id(i), self.at[i]): "kept" for i in self.kept}
        out.update({wire.occurrence_id(self.job_id(i), self.at[i] + MOVE_MS): "moved"
                    for i in self.moved})
        return out

    def commands(self) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        for i, at in enumerate(self.at):
            out.append((self.job_id(i).encode(), encode_upsert(
                {"id": self.job_id(i), "at": at, "payload": {"i": i, "pad": PAD}})))
        for i in sorted(self.moved | self.cancelled):  # after every upsert of the same key
            job = self.job_id(i)
            if i in self.moved:
                value = encode_upsert({"id": job, "at": self.at[i] + MOVE_MS,
                                       "payload": {"i": i, "pad": PAD, "moved": True}})
            else:
                value = encode_cancel(job)
            out.append((job.encode(), value))
        return out


async def send(settings: Settings, commands: list[tuple[bytes, bytes]]) -> float:
    producer = plain_producer(settings)
    await producer.start()
    t0 = time.monotonic()
    try:
        futs = []
        for n, (key, value) in enumerate(commands, 1):
            futs.append(await producer.send(settings.submit_topic, value, key=key))
            if n % 100_000 == 0:
                say(f"  {n:,}/{len(commands):,} commands sent")
        await asyncio.gather(*futs)
    finally:
        await producer.stop()
    return time.monotonic() - t0


async def wait_applied(node: NodeProcess, total: int, timeout_s: float) -> float:
    t0 = time.monotonic()
    last = t0
    while True:
        m = await asyncio.to_thread(node.metrics)
        done = metric_sum(m, "chronowheel_ingested_total")
        if done >= total:
            return time.monotonic() - t0
        if not node.alive():
            raise RuntimeError(f"the node exited:\n{node.log_tail()}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"only {done:,.0f}/{total:,} commands applied in {timeout_s}s")
        if time.monotonic() - last > 10:
            last = time.monotonic()
            say(f"  {done:,.0f}/{total:,} commands applied after {last - t0:.0f}s "
                f"(stored {stored_commands(m):,.0f})")
        await asyncio.sleep(0.2)


PREWARMED = re.compile(r"shard (\d+): pre-warmed hot bucket (\d+) \((\d+) rows counted\) "
                       r"in (\d+) ms, (-?[\d.]+) s ahead")


def prewarms(node: NodeProcess, minute: int) -> dict[str, Any]:
    """The node's pre-warm reads of `minute` (its log lines): shards, slowest read, least
    time ahead."""
    reads = [(int(ms), float(ahead)) for _shard, m, _rows, ms, ahead
             in PREWARMED.findall(node.log_text()) if int(m) == minute]
    if not reads:
        return {"shards": 0}
    return {"shards": len(reads), "slowest_read_ms": max(ms for ms, _ in reads),
            "least_ahead_s": min(ahead for _, ahead in reads)}


def warnings_by_kind(m: dict[str, float]) -> dict[str, float]:
    prefix = "chronowheel_store_server_warnings_total{"
    out: dict[str, float] = {}
    for name, value in m.items():
        if name.startswith(prefix):
            kind = name[len(prefix):].split('kind="', 1)[-1].split('"', 1)[0]
            out[kind] = out.get(kind, 0) + value
    return out


def tombstone_lines(log: Path, offset: int, keyspace: str) -> list[str]:
    """The lines Cassandra wrote to its log since `offset` that mention tombstones and this
    run's keyspace."""
    if not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    return [line for line in text.splitlines()
            if "tombstone" in line.lower() and f"{keyspace}." in line]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ns, settings, env = fresh_namespace(args, "churn")
    log = Path(args.cassandra_log)
    log_offset = log.stat().st_size if log.exists() else 0
    init_with_cli(args, ns)
    minute = (wall_ms() + args.lead_s * 1000) // MINUTE_MS * MINUTE_MS
    plan = Plan(ns, args.jobs, int(minute), args.moved_share)
    expected = plan.expected()
    out: dict[str, Any] = {"namespace": ns, "jobs": args.jobs, "kept": len(plan.kept),
                           "cancelled": len(plan.cancelled), "moved": len(plan.moved),
                           "hot_minute_in_s": round((minute - wall_ms()) / 1000), "node_env": env}
    tally = LatenessTally()
    stale: list[str] = []

    def on_fired(m: Fired) -> None:
        what = expected.get(m.occurrence)
        if what is None:
            stale.append(m.occurrence)
            return
        tally.observe(m.occurrence, m.scheduled_ms, m.received_ms, fired_ms=m.fired_ms,
                      group=what)

    collector = Collector(settings, (settings.fired_topic,), keep_messages=False,
                          on_fired=on_fired)
    log_dir = LOG_DIR / "churn"
    log_dir.mkdir(parents=True, exist_ok=True)
    nodes: list[NodeProcess] = []
    try:
        commands = plan.commands()
        took = await send(settings, commands)
        say(f"sent {len(commands):,} commands in {took:.1f}s; the hot minute starts in "
            f"{(minute - wall_ms()) / 1000:.0f}s")
        await collector.start()
        first = NodeProcess(settings, log_dir / "node-1.log", env=env, cwd=ROOT)
        nodes.append(first)
        first.start()
        await first.wait_ready(120)
        applied_s = await wait_applied(first, len(commands), args.timeout_s)
        out["ingest_s"] = round(applied_s, 1)
        out["commands_per_s"] = round(len(commands) / applied_s)
        out["node1_warnings"] = warnings_by_kind(await asyncio.to_thread(first.metrics))
        say(f"applied {len(commands):,} commands in {applied_s:.1f}s "
            f"({out['commands_per_s']:,}/s); warnings {out['node1_warnings']}")
        left_s = (minute - wall_ms()) / 1000
        out["left_before_minute_s"] = round(left_s)
        if left_s < 30:
            raise RuntimeError(f"ingest ended {left_s:.0f}s before the hot minute: give a "
                               f"larger --lead-s")
        first.stop()
        second = NodeProcess(settings, log_dir / "node-2.log", env=env, cwd=ROOT)
        nodes.append(second)
        t0 = time.monotonic()
        second.start()
        await second.wait_ready(120)
        out["second_ready_s"] = round(time.monotonic() - t0, 1)
        need = len(plan.kept)
        while True:  # the hot minute in the wheel (the pre-warm reads it)
            m = await asyncio.to_thread(second.metrics)
            entries = metric_sum(m, "chronowheel_wheel_entries")
            if entries >= need or wall_ms() >= minute:
                break
            await asyncio.sleep(0.2)
        out["wheel_entries_when_loaded"] = entries
        out["hot_minute_loaded_s_before_it"] = round((minute - wall_ms()) / 1000, 1)
        say(f"second node: ready after {out['second_ready_s']}s; {entries:,.0f} occurrences "
            f"in its wheel {out['hot_minute_loaded_s_before_it']}s before the minute")
        deadline = minute + MOVE_MS + MINUTE_MS + args.grace_s * 1000
        last = time.monotonic()
        while tally.distinct < len(expected) and wall_ms() < deadline:
            collector.check_alive()
            if not second.alive():
                raise RuntimeError(f"the second node exited:\n{second.log_tail()}")
            if time.monotonic() - last > 10:
                last = time.monotonic()
                say(f"  {tally.distinct:,}/{len(expected):,} fired occurrences received")
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.grace_s)  # anything fired late or twice
        out["node2_warnings"] = warnings_by_kind(await asyncio.to_thread(second.metrics))
        out["node2_prewarm_hot_minute"] = prewarms(second, plan.minute_ms)
        out["node2_prewarm_moved_minute"] = prewarms(second, plan.minute_ms + MOVE_MS)
        out["expected"] = len(expected)
        out["received_distinct"] = tally.distinct
        out["lost"] = len(expected) - tally.distinct
        out["duplicates"] = tally.duplicates
        out["early"] = tally.early
        out["stale_fired"] = len(stale)
        for group in ("kept", "moved"):
            g = tally.group(group)
            out[f"{group}_receive_lateness_ms"] = summarize(g.lateness_ms)
            out[f"{group}_fired_lateness_ms"] = summarize(g.fired_lateness_ms)
        lines = tombstone_lines(log, log_offset, settings.keyspace)
        out["cassandra_tombstone_lines"] = len(lines)
        out["cassandra_tombstone_examples"] = lines[:3]
    finally:
        await collector.stop()
        for node in nodes:
            if node.alive():
                node.stop()
        if not args.keep:
            await drop_namespace(settings)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500_000)
    p.add_argument("--moved-share", type=float, default=0.25,
                   help="share of the changed jobs that are moved rather than cancelled")
    p.add_argument("--lead-s", type=float, default=600,
                   help="the hot minute starts about this long after the submission")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--timeout-s", type=float, default=1200)
    p.add_argument("--grace-s", type=float, default=10)
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--cassandra-log", default=str(default_cassandra_log()))
    p.add_argument("--namespace")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", help="also write the result to this file")
    add_stack_args(p)
    args = p.parse_args()
    out = asyncio.run(run(args))
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
