"""`chronowheel job show|history|cancel|pause|resume|trigger|backfill ID`."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any

import orjson

from chronowheel.core.runs import MAX_HISTORY_LIMIT, JobHistory, RunRecord, shown_status
from chronowheel.core.shard import shard_of
from chronowheel.errors import ChronowheelError
from chronowheel.ops.format import relative, rfc3339, table
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)
from chronowheel.store.base import JobRow


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "job", help="inspect, cancel, pause, resume, trigger or backfill one job, or show its "
                    "run history",
        description="Inspect one job of a namespace, or send it a command.")
    actions = p.add_subparsers(dest="job_command", metavar="ACTION", required=True)

    show = actions.add_parser(
        "show", help="the job's stored row: status, version, spec, next occurrence",
        description="Print the job's row in the jobs table: status, version, the spec as "
                    "submitted, the next scheduled instant and its effective firing slot "
                    "(RFC 3339, UTC), the shard, and whether that occurrence is already "
                    "published (slot at or before the shard's committed watermark), its run "
                    "counters (fired, succeeded, failed, dead-lettered, skipped, missed) and "
                    "last outcome. A one-shot whose occurrence has a recorded run reads as "
                    "finished (the stored row keeps `scheduled`: see `stored_status`). Exit "
                    "status 1 when there is no such job.")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true", help="one JSON object")
    add_settings_arguments(show, CONNECTION_SETTINGS)
    show.set_defaults(func=run_show)

    history = actions.add_parser(
        "history", help="the job's last runs and its counters",
        description="Print the job's last runs, newest first by scheduled instant (a retry "
                    "is a run of its own, attempt 2 and up): scheduled instant, attempt, "
                    "state (succeeded, failed, retried, dead-lettered, skipped, missed, "
                    "cancelled; `fired` while no handler outcome is recorded), fired-at and "
                    "lateness, node, the worker's handler start, duration and worker id, and "
                    "the error of a failure; then the job's counters. Runs are recorded by "
                    "nodes and workers in batches, so the newest may show a moment late; "
                    "each row is kept `history_ttl_ms`.")
    history.add_argument("id", metavar="ID")
    history.add_argument("--limit", type=int, metavar="N",
                         help=f"the last N runs (1..{MAX_HISTORY_LIMIT}; default: the "
                              f"history_limit setting, CHRONOWHEEL_HISTORY_LIMIT, 20)")
    history.add_argument("--json", action="store_true", help="one JSON object")
    add_settings_arguments(history, CONNECTION_SETTINGS)
    history.set_defaults(func=run_history)

    cancel = actions.add_parser(
        "cancel", help="send a cancel command for the job",
        description="Send {\"v\":1,\"op\":\"cancel\",\"id\":ID} to <ns>.submit. Every occurrence "
                    "not yet published is dropped when the owning node ingests it; one already "
                    "published may still be processed by its consumer. With --wait, poll the "
                    "jobs table until the node recorded the cancel.")
    cancel.add_argument("id", metavar="ID")
    cancel.add_argument("--wait", type=float, metavar="SECONDS",
                        help="wait up to SECONDS for the cancel to be applied")
    add_settings_arguments(cancel, CONNECTION_SETTINGS)
    cancel.set_defaults(func=run_cancel)

    for op, text in (
            ("pause", "A paused job publishes nothing until it is resumed; its status reads "
                      "`paused`, with the --note given, which `job show` and `jobs list` "
                      "print until a resume removes it."),
            ("resume", "A recurring job picks up from the first occurrence the pause withheld; "
                       "what the pause missed follows the job's catch_up policy (coalesce: "
                       "the latest, all: every one up to max_catch_up, skip: none). A paused "
                       "one-shot fires at its instant, at once if that has passed.")):
        control = actions.add_parser(
            op, help=f"send a {op} command for the job",
            description=f"Send {{\"v\":1,\"op\":\"{op}\",\"id\":ID}} to <ns>.submit. {text} "
                        "A command that does not fit the job's state (no such job, a "
                        "cancelled one) is refused to <ns>.rejected with the reason.")
        control.add_argument("id", metavar="ID")
        if op == "pause":
            control.add_argument("--note", metavar="TEXT",
                                 help="why (up to 500 characters): shown by `job show` and "
                                      "`jobs list` until the job is resumed")
        add_settings_arguments(control, CONNECTION_SETTINGS)
        control.set_defaults(func=run_control, op=op)

    trigger = actions.add_parser(
        "trigger", help="publish one occurrence of a recurring job now",
        description="Send a trigger command: the node publishes one occurrence of the "
                    "(scheduled, recurring) job at once, with the header cw-triggered and the "
                    "occurrence key <id>@<ms>/trigger/<request id>; the schedule is "
                    "untouched. Sending the same --request-id again publishes nothing more.")
    trigger.add_argument("id", metavar="ID")
    trigger.add_argument("--request-id", metavar="R",
                         help="names this request (default: a new random id, printed)")
    add_settings_arguments(trigger, CONNECTION_SETTINGS)
    trigger.set_defaults(func=run_trigger)

    backfill = actions.add_parser(
        "backfill", help="publish a recurring job's occurrences of a past range",
        description="Send a backfill command: the node publishes every occurrence the job's "
                    "schedule has in [--from, --to), each with its own cw-scheduled-at, the "
                    "header cw-backfill and the occurrence key <id>@<ms>/backfill/<request "
                    "id>, a bounded number per cycle so that on-time firing is not delayed. "
                    "At most 10000 occurrences; --to not in the future. Sending the same "
                    "--request-id again publishes nothing more.")
    backfill.add_argument("id", metavar="ID")
    backfill.add_argument("--from", dest="start", required=True, metavar="TIME",
                          help="first instant (inclusive): RFC 3339 with offset or epoch ms")
    backfill.add_argument("--to", dest="end", required=True, metavar="TIME",
                          help="last instant (exclusive), not in the future")
    backfill.add_argument("--request-id", metavar="R",
                          help="names this request (default: a new random id, printed)")
    add_settings_arguments(backfill, CONNECTION_SETTINGS)
    backfill.set_defaults(func=run_backfill)


# --- show --------------------------------------------------------------------------------

def describe(row: JobRow, shards: int, watermark: int | None, now_ms: int,
             history: JobHistory | None = None) -> dict[str, Any]:
    """The JSON view of a jobs row, with its run counters and last run when `history` is
    given (pure: unit-tested)."""
    try:
        spec: Any = orjson.loads(row.spec) if row.spec else None
    except orjson.JSONDecodeError:
        spec = row.spec.decode("utf-8", "replace")
    published = None
    if row.status == "scheduled" and row.slot_ms is not None and watermark is not None:
        published = row.slot_ms <= watermark
    last = history.runs[0] if history is not None and history.runs else None
    recurring = isinstance(spec, dict) and ("cron" in spec or "every" in spec)
    status = shown_status(row.status, recurring=recurring, scheduled_ms=row.scheduled_ms,
                          last=last)
    return {
        "id": row.job_id, "shard": row.shard, "shards": shards, "status": status,
        "stored_status": row.status,
        "note": row.note,
        "counters": None if history is None else history.counters.as_json(),
        "last_run": None if last is None else last.as_json(),
        "version": row.version,
        "next_scheduled": None if row.scheduled_ms is None else rfc3339(row.scheduled_ms),
        "next_scheduled_ms": row.scheduled_ms,
        "slot": None if row.slot_ms is None else rfc3339(row.slot_ms),
        "slot_ms": row.slot_ms,
        "published": published,
        "shard_watermark": None if watermark is None else rfc3339(watermark),
        "spec": spec,
        "now": rfc3339(now_ms),
    }


def render(view: dict[str, Any], now_ms: int) -> str:
    lines = [f"job        {view['id']}",
             f"shard      {view['shard']} of {view['shards']}",
             f"status     {view['status']}"
             + ("" if view["status"] == view.get("stored_status", view["status"])
                else f" (stored: {view['stored_status']}; its occurrence has run)"),
             f"version    {view['version']}"]
    if view.get("note"):
        lines.append(f"note       {view['note']}")
    if view["next_scheduled_ms"] is not None:
        lines.append(f"next       {view['next_scheduled']}  "
                     f"({relative(view['next_scheduled_ms'], now_ms)})")
    else:
        lines.append("next       none")
    if view["slot_ms"] is not None:
        lines.append(f"slot       {view['slot']}  ({relative(view['slot_ms'], now_ms)}; the "
                     f"effective firing instant)")
    if view["published"] is not None:
        state = ("yes: the shard's watermark is past it" if view["published"]
                 else "not yet")
        lines.append(f"published  {state} (watermark {view['shard_watermark']})")
    counters = view.get("counters")
    if counters is not None:
        lines.append("runs       " + ", ".join(
            f"{name.replace('_', '-')} {counters[name]}" for name in
            ("fired", "succeeded", "failed", "dead_lettered", "skipped", "missed")))
        last = view.get("last_run")
        if last is not None:
            lines.append(f"last run   {last['state']} (attempt {last['attempt']} of "
                         f"{rfc3339(last['scheduled_ms'])}; `job history` for more)")
    spec = orjson.dumps(view["spec"], option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    lines.append("spec")
    lines.extend("  " + ln for ln in spec.decode().splitlines())
    return "\n".join(lines)


def run_show(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    return asyncio.run(_show(settings, args.id, args.json))


async def _show(settings: Settings, job_id: str, as_json: bool) -> int:
    from chronowheel.ops.cluster import open_store, read_state_records, recorded_shards
    from chronowheel.ops.runs import open_history, read_job_history

    store = await open_store(settings)
    try:
        shards = await recorded_shards(store, settings)
        row = await store.get_job(job_id)
        history = None
        if row is not None:
            history = await read_job_history(await open_history(store, settings), job_id, 1)
    finally:
        await asyncio.to_thread(store.close)
    if row is None:
        where = shard_of(job_id, shards)
        print(f"job {job_id!r}: not found (it would live on shard {where}; a command still "
              f"in {settings.submit_topic} is not applied yet)", file=sys.stderr)
        return 1
    watermark = None
    if row.status == "scheduled" and row.slot_ms is not None:
        records = await read_state_records(settings, shards)
        rec = records.get(row.shard)
        watermark = rec.watermark if rec is not None else None
    now = time.time_ns() // 1_000_000
    view = describe(row, shards, watermark, now, history)
    print(orjson.dumps(view).decode() if as_json else render(view, now))
    return 0


# --- history -----------------------------------------------------------------------------

def _ms(value: int | None) -> str:
    return "-" if value is None else rfc3339(value)


def render_history(history: JobHistory) -> str:
    """The table of `job history` (pure: unit-tested)."""
    c = history.counters
    lines = [f"job {history.job_id}: fired {c.fired}, succeeded {c.succeeded}, failed "
             f"{c.failed}, dead-lettered {c.dead_lettered}, skipped {c.skipped}, missed "
             f"{c.missed}; last outcome {c.last_outcome or '-'}"]
    if not history.runs:
        lines.append("no runs recorded")
        return "\n".join(lines)
    rows = [_history_row(r) for r in history.runs]
    lines.append(table(["SCHEDULED", "ATTEMPT", "STATE", "FIRED", "LATE", "NODE", "STARTED",
                        "TOOK", "WORKER", "ERROR"], rows, right=(1, 4, 7)))
    return "\n".join(lines)


def _history_row(r: RunRecord) -> list[str]:
    scheduled = rfc3339(r.scheduled_ms)
    if r.occurrence != f"{r.job_id}@{r.scheduled_ms}":
        scheduled += " " + r.occurrence.rpartition("@")[2].split("/", 1)[-1]  # origin/request
    duration = r.duration_ms
    return [scheduled, str(r.attempt), r.state, _ms(r.fired_ms),
            "-" if r.lateness_ms is None else f"{r.lateness_ms} ms", r.node_id or "-",
            _ms(r.started_ms), "-" if duration is None else f"{duration} ms",
            r.worker_id or "-", (r.error or "")[:80] or "-"]


def run_history(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    limit = settings.history_limit if args.limit is None else args.limit
    if not 1 <= limit <= MAX_HISTORY_LIMIT:
        from chronowheel.errors import ValidationError

        raise ValidationError("--limit", f"must be 1..{MAX_HISTORY_LIMIT}", limit)
    return asyncio.run(_history(settings, args.id, limit, args.json))


async def _history(settings: Settings, job_id: str, limit: int, as_json: bool) -> int:
    from chronowheel.ops.cluster import open_store
    from chronowheel.ops.runs import open_history, read_job_history

    store = await open_store(settings)
    try:
        history = await read_job_history(await open_history(store, settings), job_id, limit)
    finally:
        await asyncio.to_thread(store.close)
    print(orjson.dumps(history.as_json()).decode() if as_json else render_history(history))
    return 0


# --- cancel ------------------------------------------------------------------------------

def run_cancel(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    return asyncio.run(_cancel(settings, args.id, args.wait))


async def _cancel(settings: Settings, job_id: str, wait_s: float | None) -> int:
    from chronowheel.client import SchedulerClient

    async with SchedulerClient(settings) as client:
        meta = await (await client.cancel(job_id))
    print(f"cancel {job_id}: written to {meta.topic} partition {meta.partition} "
          f"offset {meta.offset}")
    if wait_s is None:
        return 0
    return await _wait_cancelled(settings, job_id, wait_s)


async def _wait_cancelled(settings: Settings, job_id: str, wait_s: float) -> int:
    from chronowheel.ops.cluster import open_store

    store = await open_store(settings)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            row = await store.get_job(job_id)
            if row is not None and row.status != "scheduled":
                print(f"job {job_id}: {row.status} (version {row.version})")
                return 0
            if time.monotonic() > deadline:
                state = "no such job" if row is None else f"still {row.status}"
                raise ChronowheelError(f"job {job_id}: {state} after {wait_s:g}s (is a node "
                                       f"running for namespace {settings.namespace}?)")
            await asyncio.sleep(0.2)  # polling Cassandra, bounded by the deadline
    finally:
        await asyncio.to_thread(store.close)


# --- pause, resume, trigger, backfill --------------------------------------------------------

def wire_time(text: str) -> str | int:
    """A --from/--to argument as the wire takes it: digits are epoch ms, the rest RFC 3339."""
    return int(text) if text.isdigit() else text


def run_control(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    return asyncio.run(_send(settings_from_args(args), args.op, args.id, None, None, None,
                             note=getattr(args, "note", None)))


def run_trigger(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    request_id = args.request_id or uuid.uuid4().hex
    return asyncio.run(_send(settings_from_args(args), "trigger", args.id, request_id, None,
                             None))


def run_backfill(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    request_id = args.request_id or uuid.uuid4().hex
    return asyncio.run(_send(settings_from_args(args), "backfill", args.id, request_id,
                             wire_time(args.start), wire_time(args.end)))


async def _send(settings: Settings, op: str, job_id: str, request_id: str | None,
                start: str | int | None, end: str | int | None, *,
                note: str | None = None) -> int:
    from chronowheel.client import SchedulerClient

    async with SchedulerClient(settings) as client:
        if op == "pause":
            delivery = await client.pause(job_id, note=note)
        elif op == "resume":
            delivery = await client.resume(job_id)
        elif op == "trigger":
            delivery = await client.trigger(job_id, request_id=request_id or "")
        else:
            assert start is not None and end is not None
            delivery = await client.backfill(job_id, start, end, request_id=request_id or "")
        meta = await delivery
    request = f" (request id {request_id})" if request_id else ""
    print(f"{op} {job_id}{request}: written to {meta.topic} partition {meta.partition} "
          f"offset {meta.offset}")
    return 0
