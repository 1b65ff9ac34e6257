"""The figures of a benchmark run: the summary, the tables (stdout and RESULTS.md), the JSON
results and measured.json (read by `chronowheel capacity`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
from chronowheel.testing.collect import BATCH_RECORDS
from common import (
    AIM_FIRES_P99_MS,
    AIM_FIRES_PER_S,
    AIM_INGEST_PER_S,
    CASSANDRA_REQUESTS_PER_JOB,
    ON_TIME_P99_MS,
    RESULTS_DIR,
    RESULTS_MD,
    ROOT,
    TARGET_FIRES_PER_S,
    TARGET_HERD_S,
    TARGET_INGEST_PER_S,
    TARGET_RSS_OVER_PAYLOAD,
    Config,
    fmt,
    payload_bytes,
    ratio,
    say,
)
from machine import machine_line


def summary(r: dict[str, Any]) -> dict[str, Any]:
    limits = r.get("limits", {})
    kafka = limits.get("kafka_txn", [])
    cass = limits.get("cassandra_insert", [])
    best_kafka_1 = max((k["msgs_per_s"] or 0 for k in kafka if k["producers"] == 1),
                       default=None)
    best_kafka_n = max((k["msgs_per_s"] or 0 for k in kafka if k["producers"] > 1),
                       default=None)
    kafka_limit = max(x for x in (best_kafka_1, best_kafka_n, 0) if x is not None) or None
    cass_limit = max((c["inserts_per_s"] for c in cass), default=None)
    steps = r.get("ladder", [])
    passed = [s for s in steps if s["pass"]]
    best = max(passed, key=lambda s: s["rate"]) if passed else None
    ingest = r.get("ingest", {}).get("jobs_per_s")
    herd = r.get("herd", {})
    return {
        "ingest_jobs_per_s": ingest,
        "ingest_vs_raw_insert": ratio(ingest, cass_limit),
        "ingest_requests_vs_raw_insert": ratio(
            None if ingest is None else ingest * CASSANDRA_REQUESTS_PER_JOB, cass_limit),
        "fires_per_s": None if best is None else best["rate"],
        "fires_achieved_per_s": None if best is None else best.get("achieved_per_s"),
        "fires_vs_raw_kafka_txn": ratio(None if best is None else float(best["rate"]),
                                        kafka_limit),
        "lateness_p99_ms": None if best is None else best["receive_lateness_ms"]["p99"],
        "fired_lateness_p99_ms": None if best is None else best["fired_lateness_ms"]["p99"],
        "herd_seconds": herd.get("last_received_after_start_s"),
        "herd_fired_seconds": herd.get("last_fired_after_start_s"),
        "herd_fires_per_s": (herd["received"] / herd["last_received_after_start_s"])
        if herd.get("last_received_after_start_s") else None,
        "wheel_bytes_per_entry": herd.get("wheel_bytes_per_entry"),
        "raw_kafka_txn_msgs_per_s_1": best_kafka_1,
        "raw_kafka_txn_msgs_per_s_n": best_kafka_n,
        "raw_cassandra_inserts_per_s": cass_limit,
        "probe_consume_msgs_per_s": limits.get("probe_consume", {}).get("msgs_per_s"),
        "heapq_push_per_s": limits.get("heapq", {}).get("push_per_s"),
        "heapq_pop_per_s": limits.get("heapq", {}).get("pop_per_s"),
    }


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each throughput target beside the figure of this run: met, missed or not measured."""
    s = r["summary"]
    steps = r.get("ladder", [])
    herd = r.get("herd", {})
    checks = r.get("checks", {})
    out: list[dict[str, Any]] = []

    def add(name: str, goal: str, value: str, met: bool | None) -> None:
        out.append({"target": name, "goal": goal, "value": value,
                    "verdict": "not measured" if met is None else "met" if met else "missed"})

    fires = s["fires_per_s"]
    reached = fires is not None and fires >= TARGET_FIRES_PER_S
    # The ladder stops at its first failing rate: a failure below the target is a miss; a
    # ladder that never went as high (and never failed) did not measure it.
    tried = any(st["rate"] >= TARGET_FIRES_PER_S or not st["pass"] for st in steps)
    add(f"sustained fires/s, receive p99 < {ON_TIME_P99_MS:g} ms (must)",
        f">= {TARGET_FIRES_PER_S:,}", fmt(fires), True if reached else False if tried else None)
    aim = [st for st in steps if st["rate"] >= AIM_FIRES_PER_S]
    aim_p99 = [((st.get("receive_lateness_ms") or {}).get("p99"), st["complete"]) for st in aim]
    add(f"{AIM_FIRES_PER_S:,} fires/s at receive p99 (aim)", f"<= {AIM_FIRES_P99_MS:g} ms",
        ", ".join(f"{fmt(p, 1)} ms" for p, _ in aim_p99) or "-",
        None if not aim else any(c and p is not None and p <= AIM_FIRES_P99_MS
                                 for p, c in aim_p99))
    ingest = s["ingest_jobs_per_s"]
    add("ingest, jobs/s applied (must)", f">= {TARGET_INGEST_PER_S:,}", fmt(ingest),
        None if ingest is None else ingest >= TARGET_INGEST_PER_S)
    add("ingest, jobs/s applied (aim)", f">= {AIM_INGEST_PER_S:,}", fmt(ingest),
        None if ingest is None else ingest >= AIM_INGEST_PER_S)
    if herd:
        jobs = herd.get("jobs") or 0
        per = herd.get("wheel_bytes_per_entry")
        limit = payload_bytes("herd", jobs // 2) + TARGET_RSS_OVER_PAYLOAD
        add(f"node RSS per loaded occurrence, {jobs:,} loaded", f"<= {limit} (payload + "
            f"{TARGET_RSS_OVER_PAYLOAD}; the target is stated for 1,000,000)", fmt(per),
            None if per is None else per <= limit)
        goal_s = TARGET_HERD_S.get(jobs)
        last = herd.get("last_received_after_start_s")
        if goal_s is not None:
            add(f"herd of {jobs:,}: all received within", f"<= {goal_s:g} s", fmt(last, 2),
                None if last is None else bool(herd.get("complete")) and last <= goal_s)
    bad = [checks.get(k) for k in ("missing", "duplicates", "early_fired_at", "early_received")]
    add("missing / duplicate / early (read_committed)", "0 / 0 / 0",
        " / ".join(fmt(x) for x in (bad[0], bad[1], (bad[2] or 0) + (bad[3] or 0))),
        None if any(x is None for x in bad) else not any(bad))
    return out


def render_targets(r: dict[str, Any]) -> str:
    rows = ["| target | goal | this run | verdict |", "|---|---|---:|---|"]
    rows += [f"| {t['target']} | {t['goal']} | {t['value']} | {t['verdict']} |"
             for t in targets(r)]
    return "\n".join(rows)


def render_table(r: dict[str, Any]) -> str:
    s = r["summary"]
    lines = ["| figure | value | limit | ratio |", "|---|---:|---:|---:|"]

    def row(name: str, value: str, limit: str = "", rat: float | None = None) -> None:
        lines.append(f"| {name} | {value} | {limit} | "
                     f"{'' if rat is None else f'{rat:.1%}'} |")

    cass = s["raw_cassandra_inserts_per_s"]
    row("ingest, jobs/s", fmt(s["ingest_jobs_per_s"]),
        f"{fmt(cass)} raw `due` inserts/s", s["ingest_vs_raw_insert"])
    row(f"ingest, Cassandra rows written/s ({CASSANDRA_REQUESTS_PER_JOB} per job, grouped)",
        fmt(None if s["ingest_jobs_per_s"] is None
            else s["ingest_jobs_per_s"] * CASSANDRA_REQUESTS_PER_JOB),
        f"{fmt(cass)} raw inserts/s", s["ingest_requests_vs_raw_insert"])
    kafka = max((x for x in (s["raw_kafka_txn_msgs_per_s_1"], s["raw_kafka_txn_msgs_per_s_n"])
                 if x is not None), default=None)
    row("sustained fires/s with p99 < 100 ms", fmt(s["fires_per_s"]),
        f"{fmt(kafka)} raw txn msgs/s", s["fires_vs_raw_kafka_txn"])
    row("lateness p99 at that rate, receive (ms)", fmt(s["lateness_p99_ms"], 1))
    row("lateness p99 at that rate, cw-fired-at (ms)", fmt(s["fired_lateness_p99_ms"], 1))
    herd = r.get("herd", {})
    row(f"herd of {fmt(herd.get('jobs'))}: instant to last received (s)",
        fmt(s["herd_seconds"], 2))
    row("herd: instant to last cw-fired-at (s)", fmt(s["herd_fired_seconds"], 2))
    row("herd: fires/s", fmt(s["herd_fires_per_s"]), f"{fmt(kafka)} raw txn msgs/s",
        ratio(s["herd_fires_per_s"], kafka))
    probe = s.get("probe_consume_msgs_per_s")
    row("herd: fires/s vs the probe's own consume rate", fmt(s["herd_fires_per_s"]),
        f"{fmt(probe)} probe msgs/s", ratio(s["herd_fires_per_s"], probe))
    row("node RSS per loaded occurrence, bytes (growth with the herd loaded)",
        fmt(s["wheel_bytes_per_entry"]))
    row("heapq push/s, pop/s (reference)",
        f"{fmt(s['heapq_push_per_s'])} / {fmt(s['heapq_pop_per_s'])}")
    out = ["Targets (one node, 16 shards; on-time means receive p99 < "
           f"{ON_TIME_P99_MS:g} ms):", "", render_targets(r), "", "\n".join(lines), "",
           "Dispatch ladder (lateness in ms; receive = read_committed "
           "consumer receive time - cw-scheduled-at; fired = cw-fired-at - cw-scheduled-at):",
           "",
           "| rate/s | jobs | received | achieved/s | recv p50 | recv p95 | recv p99 | recv max "
           "| fired p50 | fired p99 | node p99 ≤ | transactions/s | fired per transaction "
           "| full GCs (s) | result |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for st in r.get("ladder", []):
        rl = st.get("receive_lateness_ms") or {}
        fl = st.get("fired_lateness_ms") or {}
        verdict = "pass" if st["pass"] else (
            "FAIL (ingest overran)" if st["ingest_overran"] else
            "FAIL (incomplete)" if not st["complete"] else "FAIL (p99)")
        out.append(
            f"| {st['rate']:,} | {st['jobs']:,} | {st['received']:,} | "
            f"{fmt(st.get('achieved_per_s'))} | {fmt(rl.get('p50'), 1)} | "
            f"{fmt(rl.get('p95'), 1)} | {fmt(rl.get('p99'), 1)} | {fmt(rl.get('max'), 1)} | "
            f"{fmt(fl.get('p50'), 1)} | {fmt(fl.get('p99'), 1)} | "
            f"{fmt(st.get('node_p99_bucket_ms'), 0)} | "
            f"{fmt(st.get('transactions_per_s'), 1)} | "
            f"{fmt(st.get('fired_per_transaction'), 1)} | "
            f"{fmt(st.get('full_gc'))} ({fmt(st.get('full_gc_seconds'), 2)}) | {verdict} |")
    if herd:
        rl = herd.get("receive_lateness_ms") or {}
        fl = herd.get("fired_lateness_ms") or {}
        out += ["", f"Herd lateness (ms): receive p50 {fmt(rl.get('p50'))}, p95 "
                f"{fmt(rl.get('p95'))}, p99 {fmt(rl.get('p99'))}, max {fmt(rl.get('max'))}; "
                f"cw-fired-at p50 {fmt(fl.get('p50'))}, p99 {fmt(fl.get('p99'))}, max "
                f"{fmt(fl.get('max'))}; {fmt(herd.get('full_gc'))} full GC(s) taking "
                f"{fmt(herd.get('full_gc_seconds'), 2)} s; "
                f"{fmt(herd.get('transactions'))} transactions, "
                f"{fmt(herd.get('fired_per_transaction'))} fired per transaction; node RSS "
                f"{fmt((herd.get('rss_before_bytes') or 0) / 2**20)} -> "
                f"{fmt((herd.get('rss_loaded_bytes') or 0) / 2**20)} MiB with "
                f"{fmt(herd.get('wheel_entries_added'))} occurrences loaded."]
    lim = r.get("limits", {})
    if lim:
        out += ["", "Limits measured in this run (before the node started):", "",
                "| limit | setting | rate/s | per transaction |", "|---|---|---:|---:|"]
        for k in lim.get("kafka_txn", []):
            out.append(f"| aiokafka transactional produce | {k['producers']} producer(s), "
                       f"batch {k['batch']:,} | {fmt(k['msgs_per_s'])} | "
                       f"{fmt(k['txn_ms'], 1)} ms |")
        for c in lim.get("cassandra_insert", []):
            out.append(f"| cassandra-driver prepared `due` insert | {c['concurrency']} in flight"
                       f" | {fmt(c['inserts_per_s'])} | |")
        vis = lim.get("kafka_visibility")
        if vis:
            cm, vm = vis["commit_ms"], vis["visible_ms"]
            out.append(f"| transaction stamp -> visible to read_committed (ms) | "
                       f"{vis['batch']} msgs every {vis['every_ms']:.0f} ms | p50 "
                       f"{fmt(vm['p50'], 1)}, p99 {fmt(vm['p99'], 1)}, max {fmt(vm['max'], 1)} "
                       f"| commit p50 {fmt(cm['p50'], 1)}, p99 {fmt(cm['p99'], 1)} ms |")
        pc = lim.get("probe_consume")
        if pc:
            out.append(f"| the harness's read_committed probe, consume + decode | "
                       f"batches of {BATCH_RECORDS} | {fmt(pc['msgs_per_s'])} | |")
        hq = lim.get("heapq")
        if hq:
            out.append(f"| heapq push / pop | {hq['n']:,} entries | {fmt(hq['push_per_s'])} / "
                       f"{fmt(hq['pop_per_s'])} | |")
    c = r.get("checks", {})
    out += ["", f"Checks: {c.get('received', 0):,} received of {c.get('expected', 0):,} "
            f"expected; missing {c.get('missing')}, duplicate cw-occurrence "
            f"{c.get('duplicates')}, early by cw-fired-at {c.get('early_fired_at')}, early by "
            f"receive time {c.get('early_received')}. The node stopped dispatching (clock skew "
            f"check) {r.get('node_final_metrics', {}).get('dispatch_stopped_events', '?')} "
            f"time(s); slowest /metrics answer "
            f"{r.get('node_final_metrics', {}).get('slowest_metrics_scrape_s', '?')} s."]
    return "\n".join(out)


# The presets whose run becomes loadtest/results/measured.json, the per-node figures that
# `chronowheel capacity` plans with: runs of the whole ladder. The targets preset checks the
# targets at their own sizes and writes only its own JSON and RESULTS.md section.
MEASURED_PRESETS = ("quick", "full")


def record_memory(r: dict[str, Any], path: Path | None = None) -> str:
    """Put this run's node RSS per loaded occurrence into measured.json, keeping its other
    figures; returns what was done."""
    path = path or RESULTS_DIR / "measured.json"
    herd = r.get("herd", {})
    per_entry = herd.get("wheel_bytes_per_entry")
    if per_entry is None:
        return f"--record-memory: the herd was not all loaded before its instant: {path} unchanged"
    c = r["checks"]
    if c["duplicates"] or c["early_fired_at"] or c["early_received"] or c["missing"]:
        return f"--record-memory: the run failed its checks: {path} unchanged"
    doc = json.loads(path.read_text())
    doc.update({
        "wheel_bytes_per_entry": round(per_entry),
        "wheel_bytes_herd_jobs": herd["jobs"],
        "wheel_bytes_measured_on": r["started"],
        "wheel_bytes_command": r["command"],
        "wheel_bytes_machine": machine_line(r["machine"]),
    })
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return (f"--record-memory: {path}: wheel_bytes_per_entry {round(per_entry)} "
            f"({herd['jobs']:,} loaded); its other figures kept")


def write_outputs(cfg: Config, r: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS_DIR / f"bench-{cfg.preset}.json"
    json_path.write_bytes(orjson.dumps(r, option=orjson.OPT_INDENT_2))
    s = r["summary"]
    command = r["command"]
    measured = {
        "fires_per_s_per_node": s["fires_per_s"],
        "ingest_jobs_per_s_per_node": s["ingest_jobs_per_s"],
        "herd_100k_seconds": s["herd_seconds"] if r.get("herd", {}).get("jobs") == 100_000
        else None,
        "lateness_p99_ms": s["lateness_p99_ms"],
        "wheel_bytes_per_entry": s["wheel_bytes_per_entry"],
        "herd_jobs": r.get("herd", {}).get("jobs"),
        "herd_seconds": s["herd_seconds"],
        "targets": targets(r),
        "measured_on": r["started"],
        "command": command,
        "preset": cfg.preset,
        "machine": machine_line(r["machine"]),
        "note": cfg.note,
    }
    if cfg.preset in MEASURED_PRESETS:
        (RESULTS_DIR / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
    section = "\n".join([
        f"<!-- bench:{cfg.preset}:begin -->",
        f"## `{cfg.preset}` preset" + (f" — {cfg.note}" if cfg.note else ""),
        "",
        f"- command: `{command}`",
        f"- date: {r['started']} (UTC), finished {r['finished']}",
        f"- machine: {machine_line(r['machine'])}",
        f"- node: one `chronowheel node` process, {cfg.shards} shards, default settings"
        + (f" plus {cfg.node_env}" if cfg.node_env else ""),
        f"- raw JSON: `loadtest/results/{json_path.name}`",
        "",
        render_table(r),
        "",
        f"<!-- bench:{cfg.preset}:end -->",
    ])
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else RESULTS_HEADER
    pattern = re.compile(rf"<!-- bench:{re.escape(cfg.preset)}:begin -->.*?"
                         rf"<!-- bench:{re.escape(cfg.preset)}:end -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS_MD.write_text(text)
    say(f"wrote {json_path.relative_to(ROOT)}"
        + (", loadtest/results/measured.json" if cfg.preset in MEASURED_PRESETS else "")
        + f" and {RESULTS_MD.relative_to(ROOT)}")


RESULTS_HEADER = """# chronowheel benchmark results

Produced by `loadtest/bench/run_bench.py` (see loadtest/README.md). Each preset's section is
replaced by its latest run. Lateness is measured by a read_committed consumer on the same machine
and clock as the node: receive time minus `cw-scheduled-at` (what a user sees), and
`cw-fired-at` minus `cw-scheduled-at` (when the node stamped the transaction). Ratios compare a
figure with the raw limit measured in the same run.
"""

