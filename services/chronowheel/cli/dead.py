"""`chronowheel dead list|redrive`: the dead letters of `<ns>.dead`, and sending them again.

Both take the same filters (job id, tenant, failure time range, reason substring) and read the
topic from its beginning (chronowheel.client.dead). `redrive` sends each selected letter as the
next attempt of its occurrence, once per letter however often it is run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from chronowheel.cli.bulk import ProgressLine, flag_error
from chronowheel.client.dead import (
    MAX_DEAD_LIMIT,
    DeadLetterInfo,
    DeadLetterPage,
    DeadSelector,
    RedriveSummary,
    dead_selector,
)
from chronowheel.errors import ValidationError
from chronowheel.ops.format import count, human_ms, relative, rfc3339, table
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dead", help="list dead letters, or redrive them as a new attempt",
        description="The dead letters of <ns>.dead (occurrences a worker gave up on): list "
                    "them, or redrive the selected ones, each as the next attempt of its "
                    "occurrence, exactly once per letter.")
    actions = p.add_subparsers(dest="dead_command", metavar="ACTION", required=True)
    ls = actions.add_parser(
        "list", help="one page of dead letters matching every filter given",
        description="Print one page of the dead letters matching every filter given, in "
                    "(partition, offset) order of <ns>.dead, read from its beginning. When "
                    "more may follow, the last line gives the --page cursor of the next page "
                    "(use it with the same filters).")
    _filters(ls)
    ls.add_argument("--limit", type=int, default=100, metavar="N",
                    help=f"at most N letters (1..{MAX_DEAD_LIMIT}, default 100)")
    ls.add_argument("--page", metavar="CURSOR", help="continue where an earlier page ended")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    add_settings_arguments(ls, CONNECTION_SETTINGS)
    ls.set_defaults(func=run_list)

    rd = actions.add_parser(
        "redrive", help="send the selected dead letters again, once each (dry run)",
        description="Send every selected dead letter again as a retry command on "
                    "<ns>.submit: the same occurrence (cw-occurrence kept), the letter's "
                    "payload and the job's headers, the next attempt (cw-attempt + 1), due "
                    "now; if it fails again it is dead-lettered again. The retry carries the "
                    "letter's redrive id, redrive:<dead partition>:<offset>, which a node "
                    "applies once, so a letter sent twice (two redrives at once) is delivered "
                    "once. Each letter has the request id redrive:<dead partition>@<offset>, "
                    "recorded (table job_requests, for the retention period) once Kafka "
                    "acknowledged its retry: a letter recorded before is skipped, so running "
                    "the same redrive again, or after an interruption, sends nothing twice. "
                    "A payload-less stand-in letter (the broker refused the full one) is "
                    "refused, naming its source record. Ends with a summary; exit status 1 "
                    "when some retry was not written.")
    _filters(rd)
    rd.add_argument("--all", action="store_true",
                    help="redrive every dead letter of the namespace (needed when no filter "
                         "is given)")
    rd.add_argument("--limit", type=int, metavar="N", help="at most N selected letters")
    rd.add_argument("--dry-run", action="store_true",
                    help="list and count what would be sent; send nothing")
    rd.add_argument("--show", type=int, default=20, metavar="N",
                    help="list the first N letters sent or refused (default 20)")
    rd.add_argument("--window", type=int, default=100, metavar="N",
                    help="at most N retries unacknowledged at a time (default 100)")
    rd.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                    help="progress on stderr: a line redrawn on a terminal, else a line "
                         "every 5 s (auto: on a terminal only)")
    rd.add_argument("--json", action="store_true", help="the summary as one JSON object")
    add_settings_arguments(rd, CONNECTION_SETTINGS)
    rd.set_defaults(func=run_redrive)


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="ID", help="letters of job ID")
    p.add_argument("--tenant", metavar="T", help="letters of jobs whose tenant is T")
    p.add_argument("--failed-after", metavar="TIME",
                   help="letters whose cw-failed-at is at or after TIME (RFC 3339 with offset "
                        "or epoch ms)")
    p.add_argument("--failed-before", metavar="TIME",
                   help="letters whose cw-failed-at is before TIME")
    p.add_argument("--reason", metavar="TEXT",
                   help="letters whose cw-error or cw-reason contains TEXT (any case)")


# --- pure parts (unit-tested) ------------------------------------------------------------

def selector_from_args(args: argparse.Namespace) -> DeadSelector:
    """The selector the flags give, ValidationError naming the flag."""
    with flag_error():
        try:
            return dead_selector(job_id=args.job, tenant=args.tenant,
                                 failed_after=args.failed_after,
                                 failed_before=args.failed_before, reason=args.reason)
        except ValidationError as exc:
            if exc.path == "job_id":
                raise ValidationError("job", exc.rule, exc.value) from None
            raise


def view(page: DeadLetterPage) -> dict[str, Any]:
    """The JSON view of a page."""
    return {"letters": [{**x.to_json(), "failed_at": _at(x.failed_at_ms)}
                        for x in page.letters],
            "next_page": page.next_token}


def _at(ms: int | None) -> str | None:
    return None if ms is None else rfc3339(ms)


def render_page(page: DeadLetterPage, now_ms: int) -> str:
    def why(x: DeadLetterInfo) -> str:
        text = x.error or x.reason or "-"
        if x.reason and x.error:
            text = f"{x.error} ({x.reason})"
        return text if len(text) <= 60 else text[:57] + "..."

    rows = [[x.position, x.job_id or "-", x.tenant or "-", x.topic or "-",
             "-" if x.failed_at_ms is None
             else f"{rfc3339(x.failed_at_ms)} ({relative(x.failed_at_ms, now_ms)})",
             "-" if x.attempt is None else str(x.attempt), x.source, why(x)]
            for x in page.letters]
    lines = ([table(["LETTER", "JOB", "TENANT", "TOPIC", "FAILED", "ATTEMPT", "SOURCE",
                     "ERROR"], rows)] if rows else ["no dead letters on this page"])
    if page.next_token is not None:
        lines.append(f"more: --page {page.next_token}")
    return "\n".join(lines)


def render_summary(s: RedriveSummary, show: int) -> str:
    verb = "would send" if s.dry_run else "redriven"
    lines = [f"redrive {s.selector.describe()}" + (" (dry run)" if s.dry_run else ""),
             f"  matched       {count(s.matched)}",
             f"  {verb:<13} {count(len(s.redriven))}"]
    if s.redriven and show > 0:
        more = len(s.redriven) - show
        lines.append("    " + ", ".join(s.redriven[:show])
                     + (f", ... {count(more)} more" if more > 0 else ""))
    lines.append(f"  already       {count(len(s.already))}"
                 + (" (redriven before)" if s.already else ""))
    lines.append(f"  refused       {count(len(s.refused))}")
    for position, reason in s.refused[:max(0, show)]:
        lines.append(f"    {position}: {reason}")
    if s.failed:
        lines.append(f"  not written   {count(len(s.failed))} (run the same redrive again to "
                     f"send them): first {s.failed[0][0]}: {s.failed[0][1]!r}")
    lines.append(f"  took          {human_ms(round(s.elapsed_s * 1000))}")
    return "\n".join(lines)


# --- the commands ------------------------------------------------------------------------

def run_list(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    selector = selector_from_args(args)
    return asyncio.run(_list(settings, selector, args))


async def _list(settings: Settings, selector: DeadSelector, args: argparse.Namespace) -> int:
    from chronowheel.client import SchedulerClient

    f = selector.to_json()
    async with SchedulerClient(settings) as client:
        try:
            page = await client.dead_letters(
                job_id=f.get("job_id"), tenant=f.get("tenant"),
                failed_after=f.get("failed_after_ms"), failed_before=f.get("failed_before_ms"),
                reason=f.get("reason"), limit=args.limit, page_token=args.page)
        except ValidationError as exc:
            raise ValidationError("--" + exc.path.replace("_token", ""), exc.rule,
                                  exc.value) from None
    now = time.time_ns() // 1_000_000
    print(orjson.dumps(view(page)).decode() if args.json else render_page(page, now))
    return 0


def run_redrive(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    selector = selector_from_args(args)
    if selector.empty and not args.all:
        raise ValidationError("selector", "none given: name the letters with --job, "
                                          "--tenant, --failed-after, --failed-before or "
                                          "--reason, or give --all to redrive every dead "
                                          "letter of the namespace")
    if args.window < 1:
        raise ValidationError("--window", "must be at least 1", args.window)
    if args.limit is not None and args.limit < 1:
        raise ValidationError("--limit", "must be at least 1", args.limit)
    return asyncio.run(_redrive(settings, selector, args))


async def _redrive(settings: Settings, selector: DeadSelector,
                   args: argparse.Namespace) -> int:
    from chronowheel.client import SchedulerClient

    print(f"redrive {selector.describe()}{' (dry run)' if args.dry_run else ''}",
          file=sys.stderr)
    progress = ProgressLine(sys.stderr, args.progress, unit="letters")
    f = selector.to_json()
    async with SchedulerClient(settings) as client:
        try:
            summary = await client.redrive(
                job_id=f.get("job_id"), tenant=f.get("tenant"),
                failed_after=f.get("failed_after_ms"), failed_before=f.get("failed_before_ms"),
                reason=f.get("reason"), dry_run=args.dry_run, window=args.window,
                limit=args.limit, progress=progress)
        except BaseException as exc:
            progress.end()
            if not args.dry_run and not isinstance(exc, ValidationError):
                print("stopped: the same command again sends the letters not sent yet",
                      file=sys.stderr)
            raise
    progress.end()
    if args.json:
        print(orjson.dumps(summary.to_json(sample=max(0, args.show))).decode())
    else:
        print(render_summary(summary, args.show))
    return 0 if summary.ok else 1
