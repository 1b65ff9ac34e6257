"""Millions of stored jobs on one node: ingest per million, storage, then firing, a restart and
`jobs list` with all of them stored (issue 26, the `scale` workload).

1. Creates a fresh namespace (16 shards) and starts one node, plus one probe job per shard
   (`every: 1s`) that shows when each shard fires.
2. Submits `--jobs` jobs a million at a time, staying at most two millions ahead of the node:
   70 % one-shots due over 1..90 days, 20 % daily cron jobs in 20 zones, 10 % one-shots that
   are then cancelled (half) or moved by an hour (half), the change sent right after the
   million they belong to. Per million applied: the ingest rate, Cassandra's disk use for the
   keyspace (`system_views.disk_usage`: sstables, not memtables), the compaction executor's
   active and pending tasks (`system_views.thread_pools`), the node's RSS.
3. Fires `--fire-rate` one-shots a second for `--fire-s` seconds (due a little later, so they
   are ingested first) and reads them read_committed: lateness, early, duplicate, lost.
4. Restarts the node (SIGTERM, then a new process): the time until it owns every shard and
   until every shard's probe fires again.
5. Times the first page of `jobs list` (100 jobs; no filter, and status=cancelled) `--list-n`
   times each.

Every 5 s during the run it samples the keyspace's data directory (live sstables, and what
compactions hold beside them) and the live sstables Cassandra reports: their largest ratio is
the compaction headroom. `--record-storage` writes the run's disk per row of each table, that
headroom and the median ingest rate into `loadtest/results/measured.json` (and its copy in the
package), as the `storage` figures `chronowheel capacity` plans with; `--record-storage-from
RESULT.json` does the same from an earlier run's `--json` output.

A run stopped during step 2 (SIGTERM: the namespace is kept) can go on with steps 3-5 on what
it stored: `--phases-only --namespace <its namespace>` (stop its node first). The commands it
had sent and not applied are deleted from `<ns>.submit` first; the jobs stored are the count
of its last million applied, plus whatever of the next its node applied before it stopped.

    .venv/bin/python loadtest/bench/scale_bench.py --jobs 10000000
    .venv/bin/python loadtest/bench/scale_bench.py --jobs 200000 --fire-s 10   # a quick look
    .venv/bin/python loadtest/bench/scale_bench.py --jobs 10000000 --record-storage
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import RecordsToDelete
from chronowheel.bus.kafka import open_admin, partition_counts, plain_producer, reader
from chronowheel.cli.capacity import Storage
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.base import JobQuery
from chronowheel.store.cassandra import CassandraStore
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
    RESULTS_DIR,
    ROOT,
    ZONES,
    add_stack_args,
    emit,
    fresh_namespace,
    init_with_cli,
    say,
)
from machine import machine_info, machine_line

PACKAGED_MEASURED = ROOT / "services" / "chronowheel" / "cli" / "measured.json"

DAY_MS = 86_400_000
MILLION = 1_000_000



def job_commands(run: str, first: int, count: int, now: int) -> list[tuple[bytes, bytes]]:
    """The commands of jobs first .. first+count-1: their upserts, then the changes of the
    tenth that is changed (a cancel, or a move by an hour)."""
    out: list[tuple[bytes, bytes]] = []
    changes: list[tuple[bytes, bytes]] = []
    for i in range(first, first + count):
        job = f"{run}.{i:09d}"
        kind = i % 10
        payload = {"i": i, "pad": PAD}
        if kind in (7, 8):
            spec: dict[str, Any] = {"id": job, "cron": f"{i % 60} {(i // 60) % 24} * * *",
                                    "tz": ZONES[(i // 10) % len(ZONES)], "payload": payload}
        else:
            spec = {"id": job, "at": now + DAY_MS + (i * 7919 * 1009) % (89 * DAY_MS),
                    "payload": payload}
        out.append((job.encode(), encode_upsert(spec)))
        if kind == 9:
            if (i // 10) % 2:
                changes.append((job.encode(), encode_cancel(job)))
            else:
                changes.append((job.encode(), encode_upsert({**spec, "at": spec["at"]
                                                             + 3_600_000})))
    return out + changes


def probes(shards: int) -> dict[int, str]:
    """One job id per shard."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < shards:
        job = f"probe-{i}"
        out.setdefault(shard_of(job, shards), job)
        i += 1
    return out


async def send_all(producer: AIOKafkaProducer, topic: str,
                   commands: list[tuple[bytes, bytes]], chunk: int = 50_000) -> None:
    for i in range(0, len(commands), chunk):  # bounded: a future per message until acked
        futs = [await producer.send(topic, value, key=key)
                for key, value in commands[i:i + chunk]]
        await asyncio.gather(*futs)


def keyspace_dir(keyspace: str) -> Path | None:
    """The keyspace's data directory in the local stack (None: not on this machine)."""
    root = Path(os.environ.get("CHRONOWHEEL_STATE_DIR")
                or Path.home() / ".cache" / "chronowheel" / "stack")
    ks_dir = root / "cassandra" / "data" / "data" / keyspace
    return ks_dir if ks_dir.is_dir() else None


def live_sstables(keyspace: str) -> dict[str, int] | None:
    """Live sstables per table of the keyspace, counted in the local stack's data directory
    (one `*-Data.db` per sstable; Cassandra exposes no count over CQL and the stack opens no
    JMX). None when that directory is not on this machine."""
    ks_dir = keyspace_dir(keyspace)
    if ks_dir is None:
        return None
    counts: dict[str, int] = {}
    for table_dir in ks_dir.iterdir():
        name = table_dir.name.rsplit("-", 1)[0]
        counts[name] = counts.get(name, 0) + sum(1 for _ in table_dir.glob("*-Data.db"))
    return counts


def data_dir_bytes(keyspace: str) -> int | None:
    """Bytes under the keyspace's data directory: live sstables, SAI components, and what
    running compactions have written beside them (None: not on this machine)."""
    ks_dir = keyspace_dir(keyspace)
    if ks_dir is None:
        return None
    total = 0
    for path in ks_dir.rglob("*"):
        with contextlib.suppress(OSError):  # a compaction removed it meanwhile
            if path.is_file():
                total += path.stat().st_size
    return total


async def sample_storage(store: CassandraStore, samples: list[dict[str, Any]],
                         every_s: float = 5.0) -> None:
    """Until cancelled: the data directory's bytes beside the live sstables' (MiB), the
    compaction executor's tasks and the sstables per table."""
    ks = store.settings.keyspace
    while True:
        try:
            view = await asyncio.to_thread(cassandra_view, store)
            samples.append({"t": round(time.time()), "dir_bytes": await asyncio.to_thread(
                data_dir_bytes, ks), "live_mib": view["disk_mib_total"],
                "compactions": [view["compactions_active"], view["compactions_pending"]],
                "sstables": view["sstables"]})
        except Exception as exc:  # a slow virtual-table read under load: skip this sample
            say(f"storage sample skipped: {exc!r}")
        await asyncio.sleep(every_s)


def storage_figures(out: dict[str, Any], min_live_mib: float = 100) -> dict[str, Any]:
    """The `storage` figures of measured.json from a finished run (see capacity.Storage):
    per-table disk at the end (after the fire, restart and listing phases, by when the
    compactions of ingest had settled) over the rows the workload stored. Cassandra counts
    sstables only: what its memtables held then (at most 128 MiB on the local stack) is
    left out, so the sizes err low by up to that much over the whole keyspace."""
    if not out.get("per_million"):
        raise ValueError("the run has no per-million ingest rates (a --phases-only run?): "
                         "record the storage figures of a whole run")
    ingested = out["jobs"]
    fired = out.get("fire", {}).get("occurrences", 0)
    shards = out.get("shards", 16)
    samples = out.get("samples") or []
    span_s = (samples[-1]["t"] - samples[0]["t"]) if len(samples) > 1 else 0
    changed = ingested // 10                  # kind 9: half cancelled, half moved
    moved = changed // 2
    rows = {"jobs": ingested + fired + shards,
            # A moved job's old row stays beside its new one. Each probe (every 1s) wrote a
            # row a second, kept by TTL (from the sampled span, which began a little before
            # them); the daily cron jobs that fired during the run wrote their next row (not
            # counted: about 1 % more rows, so the sizes err high by that much).
            "due": ingested + moved + fired + shards * span_s,
            "due_retired": changed}
    disk = {k: v * 2**20 for k, v in out["cassandra_end"]["disk_mib"].items()}
    ratios = [x["dir_bytes"] / (x["live_mib"] * 2**20) for x in samples
              if x.get("dir_bytes") and x.get("live_mib", 0) >= min_live_mib]
    rates = sorted(r["commands_per_s"] for r in out["per_million"])
    payload = len(orjson.dumps({"i": ingested // 2, "pad": PAD}))
    return {
        "jobs_stored": rows["jobs"],
        "jobs_row_bytes": round(disk.get("jobs", 0) / rows["jobs"], 1),
        "due_row_bytes": round(disk.get("due", 0) / rows["due"], 1),
        "retired_row_bytes": round(disk.get("due_retired", 0) / max(1, rows["due_retired"]), 1),
        "payload_bytes": payload,
        "id_bytes": len(f"{out['namespace']}.{0:09d}"),
        "compaction_peak_ratio": round(max(ratios), 3) if ratios else None,
        "ingest_long_horizon_jobs_per_s_per_node": rates[len(rates) // 2],
        "ingest_per_million_jobs_per_s": [r["jobs_per_s"] for r in out["per_million"]],
        "ingest_per_million_commands_per_s": [r["commands_per_s"] for r in out["per_million"]],
        "rows": rows,
        "disk_mib_end": out["cassandra_end"]["disk_mib"],
        "sstables_end": out["cassandra_end"].get("sstables"),
    }


def record_storage(out: dict[str, Any], command: str,
                   paths: tuple[Path, ...] = (RESULTS_DIR / "measured.json",
                                              PACKAGED_MEASURED)) -> str:
    """Put a finished run's storage figures into measured.json and the package's copy,
    keeping their other figures."""
    if out.get("fire") and (out["fire"]["lost"] or out["fire"]["duplicates"]
                            or out["fire"]["early"]):
        return "--record-storage: the run's firing failed its checks: nothing recorded"
    try:
        figures = storage_figures(out)
    except ValueError as exc:
        return f"--record-storage: {exc}: nothing recorded"
    figures.update({"measured_on": out.get("started", "?"),
                    "command": out.get("command") or command,
                    "machine": out.get("machine", "?")})
    try:  # what `chronowheel capacity` will read, checked before anything is written
        Storage.from_doc(figures, "these figures")
    except ConfigError as exc:
        return f"--record-storage: {exc}: nothing recorded"
    for path in paths:
        doc = json.loads(path.read_text())
        doc["storage"] = figures
        path.write_text(json.dumps(doc, indent=2) + "\n")
    return (f"--record-storage: {' and '.join(map(str, paths))}: "
            f"{figures['jobs_stored']:,} jobs, jobs {figures['jobs_row_bytes']} B/row, due "
            f"{figures['due_row_bytes']} B/row, compaction peak "
            f"x{figures['compaction_peak_ratio']}, ingest "
            f"{figures['ingest_long_horizon_jobs_per_s_per_node']:,} commands/s")


def cassandra_view(store: CassandraStore) -> dict[str, Any]:
    ks = store.settings.keyspace
    s = store.session
    disk = {r.table_name: r.mebibytes for r in s.execute(
        "SELECT table_name, mebibytes FROM system_views.disk_usage WHERE keyspace_name = %s",
        (ks,))}
    pool = s.execute("SELECT active_tasks, pending_tasks FROM system_views.thread_pools "
                     "WHERE name = 'CompactionExecutor'").one()
    # The most rows and tombstones one read of each table met (server-lifetime maxima): what
    # a bucket load or a listing page costs as the tables grow.
    per_read = {f"{name}_per_read_max": {r.table_name: r.max for r in s.execute(
        f"SELECT table_name, max FROM system_views.{name}_per_read WHERE keyspace_name = %s",
        (ks,))} for name in ("rows", "tombstones")}
    return {"disk_mib": disk, "disk_mib_total": sum(disk.values()),
            "sstables": live_sstables(ks), **per_read,
            "compactions_active": pool.active_tasks if pool else None,
            "compactions_pending": pool.pending_tasks if pool else None}


async def ingest(args: argparse.Namespace, settings: Settings, node: NodeProcess,
                 store: CassandraStore, run: str) -> list[dict[str, Any]]:
    producer = plain_producer(settings)
    await producer.start()
    now = int(wall_ms())
    per_million: list[dict[str, Any]] = []
    millions = (args.jobs + MILLION - 1) // MILLION
    sent_commands = [0] * millions
    try:
        async def sender() -> None:
            for k in range(millions):
                while True:  # at most two millions ahead of the node
                    applied = metric_sum(await asyncio.to_thread(node.metrics),
                                         "chronowheel_ingested_total")
                    if k < 2 or applied >= sum(sent_commands[:k - 1]):
                        break
                    await asyncio.sleep(1)
                count = min(MILLION, args.jobs - k * MILLION)
                commands = job_commands(run, k * MILLION, count, now)
                await send_all(producer, settings.submit_topic, commands)
                sent_commands[k] = len(commands)

        task = asyncio.create_task(sender())
        t_prev = time.monotonic()
        t0 = t_prev
        for k in range(millions):
            while not sent_commands[k]:
                if task.done():
                    task.result()
                await asyncio.sleep(0.5)
            target = sum(sent_commands[:k + 1]) + args.extra_commands
            last_say = time.monotonic()
            while True:
                m = await asyncio.to_thread(node.metrics)
                applied = metric_sum(m, "chronowheel_ingested_total")
                if applied >= target:
                    break
                if metric_sum(m, "chronowheel_rejected_total"):
                    raise RuntimeError(f"the node rejected commands (see {node.log_path})")
                if not node.alive():
                    raise RuntimeError(f"the node exited:\n{node.log_tail()}")
                if time.monotonic() - last_say > 30:
                    last_say = time.monotonic()
                    say(f"  million {k + 1}: {applied:,.0f}/{target:,} commands applied")
                await asyncio.sleep(0.5)
            t = time.monotonic()
            jobs = min(MILLION, args.jobs - k * MILLION)
            view = await asyncio.to_thread(cassandra_view, store)
            row = {"million": k + 1, "s": round(t - t_prev, 1),
                   "jobs_per_s": round(jobs / (t - t_prev)),
                   "commands_per_s": round(sent_commands[k] / (t - t_prev)),
                   "elapsed_s": round(t - t0), "rss_mib": round((node.rss_bytes() or 0) / 2**20),
                   "rejected": metric_sum(m, "chronowheel_rejected_total"), **view}
            per_million.append(row)
            say(f"million {k + 1}: {row['jobs_per_s']:,} jobs/s, disk "
                f"{row['disk_mib_total']:,} MiB, compactions {row['compactions_active']}+"
                f"{row['compactions_pending']}, RSS {row['rss_mib']} MiB, sstables "
                f"{row['sstables']}")
            t_prev = t
        await task
    finally:
        await producer.stop()
    return per_million


async def fire(args: argparse.Namespace, settings: Settings, node: NodeProcess,
               run: str, ingest_per_s: float | None = None) -> dict[str, Any]:
    """Firing with everything stored. The one-shots must be applied before they come due, or
    their lateness is ingest's, not dispatch's: the lead is at least twice what the node
    needs to apply them at its last measured ingest rate, and the result says when the last
    was applied against the first instant."""
    n = int(args.fire_rate * args.fire_s)
    lead_s = max(args.fire_lead_s, 2 * n / ingest_per_s if ingest_per_s else 0)
    lead_ms = int(lead_s * 1000)
    t0 = wall_ms() + lead_ms
    span = args.fire_s * 1000
    ats = {f"fire.{run}.{i:08d}": int(t0 + i * span / n) for i in range(n)}
    tally = LatenessTally()

    def on_fired(m: Fired) -> None:
        tally.observe(m.occurrence, m.scheduled_ms, m.received_ms, fired_ms=m.fired_ms)

    collector = Collector(settings, (settings.fired_topic,), keep_messages=False,
                          from_end=True, key_prefix=b"fire.", on_fired=on_fired)
    await collector.start()
    producer = plain_producer(settings)
    await producer.start()
    applied_ahead_s: float | None = None
    try:
        before = metric_sum(await asyncio.to_thread(node.metrics), "chronowheel_ingested_total")
        await send_all(producer, settings.submit_topic,
                       [(j.encode(), encode_upsert({"id": j, "at": at, "payload": {"p": PAD}}))
                        for j, at in ats.items()])
        say(f"fire: {n:,} one-shots sent, due from {(t0 - wall_ms()) / 1000:.0f}s on")
        while wall_ms() < t0 + span:
            applied = metric_sum(await asyncio.to_thread(node.metrics),
                                 "chronowheel_ingested_total")
            if applied - before >= n:
                applied_ahead_s = round((t0 - wall_ms()) / 1000, 1)
                say(f"fire: all applied {applied_ahead_s}s before the first instant")
                break
            await asyncio.sleep(0.5)
        deadline = t0 + span + 60_000
        while tally.distinct < n and wall_ms() < deadline:
            collector.check_alive()
            if not node.alive():
                raise RuntimeError(f"the node exited:\n{node.log_tail()}")
            await asyncio.sleep(0.2)
        await asyncio.sleep(5)
    finally:
        await producer.stop()
        await collector.stop()
    g = tally.group("")
    return {"occurrences": n, "rate_per_s": args.fire_rate, "lead_s": round(lead_s),
            "all_applied_before_first_instant_s": applied_ahead_s,
            "received": tally.distinct,
            "lost": n - tally.distinct, "duplicates": tally.duplicates, "early": tally.early,
            "receive_lateness_ms": summarize(g.lateness_ms),
            "fired_lateness_ms": summarize(g.fired_lateness_ms)}


async def restart(settings: Settings, node: NodeProcess, env: dict[str, str],
                  log_path: Path, shards: int) -> tuple[NodeProcess, dict[str, Any]]:
    by_shard = probes(shards)
    shard_of_probe = {job: k for k, job in by_shard.items()}
    node.stop()
    started = wall_ms()
    again: dict[int, float] = {}

    def on_fired(m: Fired) -> None:
        k = shard_of_probe.get((m.key or b"").decode())
        if k is not None and m.fired_ms is not None and m.fired_ms >= started:
            again.setdefault(k, m.received_ms - started)

    collector = Collector(settings, (settings.fired_topic,), keep_messages=False,
                          from_end=True, key_prefix=b"probe-", on_fired=on_fired)
    await collector.start()
    new = NodeProcess(settings, log_path, env=env, cwd=ROOT)
    try:
        new.start()
        await new.wait_ready(120)
        ready_s = (wall_ms() - started) / 1000
        deadline = time.monotonic() + 60
        while len(again) < shards and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        await collector.stop()
    return new, {"owns_every_shard_s": round(ready_s, 2),
                 "every_shard_fires_again_s": round(max(again.values()) / 1000, 2)
                 if len(again) == shards else None,
                 "shards_firing_again": len(again)}


async def list_pages(store: CassandraStore, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, query in (("all", JobQuery(limit=100)),
                        ("cancelled", JobQuery(status="cancelled", limit=100))):
        took = []
        for _ in range(n):
            t = time.perf_counter()
            page = await store.list_jobs(query)
            took.append((time.perf_counter() - t) * 1000)
        out[name] = {**summarize(took), "rows": len(page.jobs)}
    return out


async def drop_backlog(settings: Settings) -> int:
    """Delete what `<ns>.submit` holds (Kafka's DeleteRecords up to each partition's end): the
    commands a stopped run had sent ahead of its node, which a new node would otherwise apply
    before anything submitted after them. Returns how many records were deleted (applied or
    not: the topic's whole content)."""
    admin = await open_admin(settings)
    consumer = reader(settings)
    await consumer.start()
    try:
        counts = await partition_counts(admin, [settings.submit_topic])
        tps = [TopicPartition(settings.submit_topic, k)
               for k in range(counts[settings.submit_topic])]
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        await admin.delete_records({tp: RecordsToDelete(before_offset=ends[tp]) for tp in tps})
    finally:
        await consumer.stop()
        await admin.close()
    return sum(ends[tp] - starts[tp] for tp in tps)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ns, settings, env = fresh_namespace(args, "scale")
    out: dict[str, Any] = {"namespace": ns, "jobs": args.jobs, "shards": args.shards,
                           "node_env": env,
                           "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "machine": machine_line(machine_info(settings))}
    samples: list[dict[str, Any]] = []
    out["samples"] = samples
    if not args.phases_only:
        init_with_cli(args, ns)
    log_dir = LOG_DIR / "scale"
    log_dir.mkdir(parents=True, exist_ok=True)
    node = NodeProcess(settings, log_dir / "node-1.log", env=env, cwd=ROOT)
    store = await asyncio.to_thread(CassandraStore.open, settings)
    sampler = asyncio.create_task(sample_storage(store, samples))
    try:
        if args.phases_only:
            # Applied or not, the earlier run's submissions are over: what it stored stays.
            out["submit_records_deleted"] = await drop_backlog(settings)
            say(f"deleted the earlier run's {out['submit_records_deleted']:,} submit records "
                f"(applied or not)")
        node.start()
        await node.wait_ready(120)
        if args.phases_only:  # the jobs and probes of an earlier run, stopped during ingest
            out["cassandra_start"] = await asyncio.to_thread(cassandra_view, store)
        else:
            producer = plain_producer(settings)
            await producer.start()
            try:
                await send_all(producer, settings.submit_topic, [
                    (job.encode(), encode_upsert({"id": job, "every": "1s"}))
                    for job in probes(args.shards).values()])
            finally:
                await producer.stop()
            args.extra_commands = args.shards
            out["per_million"] = await ingest(args, settings, node, store, ns)
        if args.fire_s > 0:
            last = (out.get("per_million") or [{}])[-1].get("commands_per_s")
            out["fire"] = await fire(args, settings, node, ns, last)
            say(f"fire: {out['fire']}")
        node, out["restart"] = await restart(settings, node, env, log_dir / "node-2.log",
                                             args.shards)
        say(f"restart: {out['restart']}")
        out["list_first_page_ms"] = await list_pages(store, args.list_n)
        say(f"jobs list: {out['list_first_page_ms']}")
        out["cassandra_end"] = await asyncio.to_thread(cassandra_view, store)
        out["node_rss_end_mib"] = round((node.rss_bytes() or 0) / 2**20)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        store.close()
        if node.alive():
            node.stop()
        if not args.keep:
            await drop_namespace(settings)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--fire-rate", type=float, default=10_000)
    p.add_argument("--fire-s", type=float, default=30)
    p.add_argument("--fire-lead-s", type=float, default=150,
                   help="the fired one-shots come due at least this long after they are "
                        "sent (longer when the node needs more to apply them: twice that at "
                        "its last per-million ingest rate)")
    p.add_argument("--list-n", type=int, default=50)
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--namespace")
    p.add_argument("--phases-only", action="store_true",
                   help="with --namespace of a run stopped during ingest: only fire, restart "
                        "and list, on what it stored")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--record-storage", action="store_true",
                   help="write the run's storage figures into loadtest/results/measured.json "
                        "and the package's copy (chronowheel capacity plans with them)")
    p.add_argument("--record-storage-from", metavar="RESULT.json",
                   help="only record the storage figures of an earlier run's --json output")
    add_stack_args(p)
    args = p.parse_args()
    command = "scale_bench.py " + " ".join(sys.argv[1:])
    if args.record_storage_from:
        say(record_storage(json.loads(Path(args.record_storage_from).read_text()), command))
        return 0
    if args.phases_only and not args.namespace:
        p.error("--phases-only needs the --namespace of the earlier run")
    if args.phases_only and args.record_storage:
        p.error("--record-storage needs a whole run (its per-million ingest rates)")
    out = asyncio.run(run(args))
    out["command"] = command
    emit(out, args.json)
    if args.record_storage:
        say(record_storage(out, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
