"""`chronowheel jobs list`: jobs of a namespace by tenant, status, id prefix and due time."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping
from typing import Any

import orjson

from chronowheel.core.runs import RunCounters, RunRecord, shown_status
from chronowheel.ops.format import relative, rfc3339, table
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)
from chronowheel.store.base import JOB_STATUSES, MAX_LIST_LIMIT, JobPage, JobSummary


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "jobs", help="list jobs, or pause, resume, cancel or trigger many at once",
        description="List the jobs of a namespace by tenant, status, id prefix or due time, "
                    "or send one command to every job those select (pause, resume, cancel, "
                    "trigger).")
    actions = p.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    ls = actions.add_parser(
        "list", help="one page of jobs matching every filter given",
        description="Print one page of jobs rows matching every filter given, read through "
                    "the jobs table's storage-attached indexes (tenant, status, due time); "
                    "--prefix is applied to the rows read. A page holds at most --limit jobs "
                    "and may hold fewer (a page reads at most 5000 rows); when more may "
                    "follow, the last line gives the --page cursor of the next page (use it "
                    "with the same filters). Each job shows its run counters (fired, "
                    "succeeded, failed, dead-lettered, skipped, missed) and last outcome. A "
                    "fired one-shot is stored as scheduled (--status scheduled finds it) and "
                    "shows as finished once its run is recorded. A paused job's note (why it "
                    "was paused, e.g. by auto-pause) is listed below the table.")
    ls.add_argument("--tenant", metavar="T", help="jobs whose tenant is T")
    ls.add_argument("--status", choices=JOB_STATUSES, help="jobs in this state")
    ls.add_argument("--prefix", metavar="P", help="job ids starting with P")
    ls.add_argument("--due-before", metavar="TIME",
                    help="jobs whose pending occurrence is before TIME (RFC 3339 with offset "
                         "or epoch ms); for a paused job, the first one it withholds")
    ls.add_argument("--due-after", metavar="TIME",
                    help="jobs whose pending occurrence is at or after TIME")
    ls.add_argument("--limit", type=int, default=100, metavar="N",
                    help=f"at most N jobs (1..{MAX_LIST_LIMIT}, default 100)")
    ls.add_argument("--page", metavar="CURSOR", help="continue where an earlier page ended")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    add_settings_arguments(ls, CONNECTION_SETTINGS)
    ls.set_defaults(func=run_list)
    from chronowheel.cli.bulk import register_actions

    register_actions(actions)


def _status(j: JobSummary, last: Mapping[str, RunRecord]) -> str:
    # Not knowing whether the job recurs is fine here: a recurring job's pending occurrence
    # moves on (stored before the one it follows is published), so only a one-shot has a run
    # at or after its pending instant.
    return shown_status(j.status, recurring=False, scheduled_ms=j.scheduled_ms,
                        last=last.get(j.job_id))


def view(page: JobPage, counters: Mapping[str, RunCounters] | None = None,
         last: Mapping[str, RunRecord] | None = None) -> dict[str, Any]:
    """The JSON view of a page, with each job's run counters when given (pure:
    unit-tested)."""
    last = last or {}
    return {
        "jobs": [{"id": j.job_id, "status": _status(j, last), "stored_status": j.status,
                  "tenant": j.tenant, "shard": j.shard, "note": j.note,
                  "version": j.version, "due_ms": j.scheduled_ms,
                  "due": None if j.scheduled_ms is None else rfc3339(j.scheduled_ms),
                  "counters": None if counters is None or j.job_id not in counters
                  else counters[j.job_id].as_json()}
                 for j in page.jobs],
        "next_page": page.next_token,
    }


def render(page: JobPage, now_ms: int, counters: Mapping[str, RunCounters] | None = None,
           last: Mapping[str, RunRecord] | None = None) -> str:
    last = last or {}
    counters = counters or {}
    rows = [[j.job_id, _status(j, last), j.tenant or "-",
             "-" if j.scheduled_ms is None
             else f"{rfc3339(j.scheduled_ms)} ({relative(j.scheduled_ms, now_ms)})",
             _runs(counters.get(j.job_id))]
            for j in page.jobs]
    lines = [table(["ID", "STATUS", "TENANT", "DUE", "RUNS (FIRED/OK/FAILED/LAST)"], rows)] \
        if rows else ["no jobs on this page"]
    notes = [f"  {j.job_id}: {j.note}" for j in page.jobs if j.note]
    if notes:  # why each paused job was paused (a pause's note), below the table
        lines += ["notes", *notes]
    if page.next_token is not None:
        lines.append(f"more: --page {page.next_token}")
    return "\n".join(lines)


def _runs(c: RunCounters | None) -> str:
    if c is None:
        return "-"
    return f"{c.fired}/{c.succeeded}/{c.failed}/{c.last_outcome or '-'}"


def run_list(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    due, after = args.due_before, args.due_after
    return asyncio.run(_list(settings, dict(
        tenant=args.tenant, status=args.status, prefix=args.prefix,
        due_before=int(due) if due is not None and due.isdigit() else due,
        due_after=int(after) if after is not None and after.isdigit() else after,
        limit=args.limit, page_token=args.page), args.json))


async def _list(settings: Settings, filters: dict[str, Any], as_json: bool) -> int:
    from chronowheel.client.scheduler import job_query
    from chronowheel.ops.cluster import open_store
    from chronowheel.ops.runs import open_history, read_counters

    query = job_query(**filters)  # a bad filter fails before anything is opened
    store = await open_store(settings)
    try:
        try:
            page = await store.list_jobs(query)
        except ValueError as exc:
            from chronowheel.errors import ValidationError

            raise ValidationError("--page", str(exc)) from None
        counters, last = await read_counters(await open_history(store, settings),
                                             [j.job_id for j in page.jobs])
    finally:
        await asyncio.to_thread(store.close)
    now = time.time_ns() // 1_000_000
    print(orjson.dumps(view(page, counters, last)).decode() if as_json
          else render(page, now, counters, last))
    return 0
