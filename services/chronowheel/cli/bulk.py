"""`chronowheel jobs pause|resume|cancel|trigger`: one command for every job the selectors pick.

The jobs are listed like `jobs list` (tenant, status, id prefix, and a due range) and each gets
an ordinary command on `<ns>.submit` (chronowheel.client.bulk). The operation id is printed
first; run the same command with `--operation-id ID` (or just `--resume ID`) after an
interruption to go on: the jobs already done are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import orjson

from chronowheel.client.bulk import (
    ACTIONS,
    BulkProgress,
    BulkSummary,
    FileJournal,
    JobSelector,
    check_operation_id,
    default_journal_dir,
    job_selector,
    new_operation_id,
    request_id_for,
)
from chronowheel.errors import ValidationError
from chronowheel.ops.format import count, human_ms
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)
from chronowheel.store.base import JOB_STATUSES

DESCRIPTIONS = {
    "pause": "Pause every selected job: a paused job publishes nothing until it is resumed. "
             "Jobs already paused are left alone; finished and cancelled ones are refused.",
    "resume": "Resume every selected paused job (what the pause withheld follows each job's "
              "catch_up policy). Jobs that are not paused are left alone.",
    "cancel": "Cancel every selected job: no occurrence not yet published fires. Jobs "
              "already cancelled are left alone.",
    "trigger": "Publish one occurrence now of every selected scheduled recurring job, with "
               "the request id bulk:<operation id> (header cw-triggered). The node refuses "
               "one-shots and paused jobs to <ns>.rejected (--wait reports them).",
}


def register_actions(actions: Any) -> None:
    """The bulk sub-commands of `chronowheel jobs`."""
    for action in ACTIONS:
        p: argparse.ArgumentParser = actions.add_parser(
            action, help=f"{action} every job the selectors pick (dry run, resumable)",
            description=DESCRIPTIONS[action] + (
                " The jobs are listed like `jobs list` (every selector given must hold) and "
                "each gets one command on <ns>.submit, at most --window unacknowledged at a "
                "time. The operation id is printed first: after an interruption, run the "
                "same command with --operation-id ID, or --resume ID, to go on; jobs already "
                "done are skipped (the journal is in --journal-dir) and a command sent again "
                "changes nothing. Ends with a summary: changed, already in that state, done "
                "by an earlier run, refused (with the reasons). Exit status 1 when some "
                "command was not written or, with --wait, not applied in time."))
        p.add_argument("--tenant", metavar="T", help="jobs whose tenant is T")
        p.add_argument("--status", choices=JOB_STATUSES, help="jobs in this state")
        p.add_argument("--prefix", metavar="P", help="job ids starting with P")
        p.add_argument("--due-after", metavar="TIME",
                       help="jobs whose pending occurrence is at or after TIME (RFC 3339 with "
                            "offset or epoch ms)")
        p.add_argument("--due-before", metavar="TIME",
                       help="jobs whose pending occurrence is before TIME; for a paused job, "
                            "the first one it withholds")
        p.add_argument("--all", action="store_true",
                       help="act on every job of the namespace (needed when no selector is "
                            "given)")
        p.add_argument("--dry-run", action="store_true",
                       help="list and count what would change; send nothing")
        p.add_argument("--show", type=int, default=20, metavar="N",
                       help="list the first N job ids that change (default 20)")
        p.add_argument("--operation-id", metavar="ID",
                       help="name the operation (default: a new id, printed); the same id "
                            "again continues it")
        p.add_argument("--resume", metavar="ID",
                       help="continue operation ID with the selectors it was started with")
        p.add_argument("--journal-dir", metavar="DIR",
                       help="where operations are recorded (default "
                            "$XDG_STATE_HOME/chronowheel/bulk, else "
                            "~/.local/state/chronowheel/bulk)")
        p.add_argument("--window", type=int, default=1000, metavar="N",
                       help="at most N commands unacknowledged at a time (default 1000)")
        p.add_argument("--wait", type=float, metavar="SECONDS",
                       help="then wait up to SECONDS until the nodes applied every command, "
                            "and report the ones they refused")
        p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                       help="progress on stderr: a line redrawn on a terminal, else a line "
                            "every 5 s (auto: on a terminal only)")
        p.add_argument("--json", action="store_true", help="the summary as one JSON object")
        add_settings_arguments(p, CONNECTION_SETTINGS)
        p.set_defaults(func=run_bulk, action=action)


# --- pure parts (unit-tested) ------------------------------------------------------------

def selector_from_args(args: argparse.Namespace) -> JobSelector | None:
    """The selector the flags give (None: none given), ValidationError naming the flag."""
    with flag_error():
        selector = job_selector(tenant=args.tenant, status=args.status, prefix=args.prefix,
                                due_after=args.due_after, due_before=args.due_before)
    return None if selector.empty else selector


@contextlib.contextmanager
def flag_error() -> Iterator[None]:
    """A ValidationError of a selector names its flag (`due_after` -> `--due-after`)."""
    try:
        yield
    except ValidationError as exc:
        raise ValidationError("--" + exc.path.replace("_", "-"), exc.rule, exc.value) from None


def format_progress(p: BulkProgress, width: int = 20, unit: str = "jobs") -> str:
    """done/total [bar] percent, rate, ETA ("+" after the total while the listing goes on)."""
    total = p.listed
    frac = p.done / total if total else 1.0
    filled = int(min(1.0, frac) * width)
    parts = [f"[{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}%",
             f"{count(p.done)}/{count(total)}{'' if p.listing_done else '+'} {unit}",
             f"{count(round(p.rate))}/s"]
    eta = p.eta_s
    parts.append("ETA " + ("?" if eta is None else human_ms(round(eta * 1000))))
    return "  ".join(parts)


def render(summary: BulkSummary, show: int) -> str:
    """The summary for people."""
    s = summary
    verb = "would change" if s.dry_run else "changed"
    lines = [f"operation {s.operation_id}: {s.action} {s.selector.describe()}"
             + (" (dry run)" if s.dry_run else ""),
             f"  matched       {count(s.matched)}",
             f"  {verb:<13} {count(len(s.changed))}"
             + ("" if s.dry_run or s.waited or not s.changed
                else " (written to Kafka; --wait confirms the nodes applied them)")]
    if s.changed and show > 0:
        more = len(s.changed) - show
        lines.append("    " + ", ".join(s.changed[:show]) + (f", ... {count(more)} more"
                                                             if more > 0 else ""))
    lines.append(f"  already       {count(len(s.already))}"
                 + (f" ({_state(s.action)})" if s.already else ""))
    if s.done_before:
        lines.append(f"  done before   {count(len(s.done_before))} (by an earlier run of "
                     f"this operation)")
    lines.append(f"  refused       {count(len(s.refused))}")
    for reason, n in s.refusal_counts().items():
        lines.append(f"    {count(n)} x {reason}")
    if s.failed:
        lines.append(f"  not written   {count(len(s.failed))} (run the same operation again "
                     f"to send them): first {s.failed[0][0]!r}: {s.failed[0][1]!r}")
    if s.wait_error is not None:
        lines.append(f"  not confirmed {s.wait_error}")
    lines.append(f"  took          {human_ms(round(s.elapsed_s * 1000))}")
    return "\n".join(lines)


def _state(action: str) -> str:
    return {"pause": "paused", "resume": "not paused", "cancel": "cancelled",
            "trigger": "this operation's trigger was applied before"}[action]


class ProgressLine:
    """format_progress on stderr: redrawn in place on a terminal, else a line every 5 s."""

    def __init__(self, stream: IO[str], mode: str, unit: str = "jobs") -> None:
        self.stream = stream
        self.unit = unit
        self.tty = stream.isatty()
        self.enabled = mode == "always" or (mode == "auto" and self.tty)
        self.last = 0.0
        self.drawn = False

    def __call__(self, p: BulkProgress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < (0.2 if self.tty else 5.0) and self.drawn:
            return
        self.last = now
        text = format_progress(p, unit=self.unit)
        self.stream.write(("\r\x1b[K" + text) if self.tty else text + "\n")
        self.stream.flush()
        self.drawn = True

    def end(self) -> None:
        if self.enabled and self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


# --- the command -------------------------------------------------------------------------

def run_bulk(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    selector = selector_from_args(args)
    journal = FileJournal(args.journal_dir or default_journal_dir(), settings.namespace)
    if args.resume is not None:
        if args.operation_id is not None and args.operation_id != args.resume:
            raise ValidationError("--resume", "names another operation than --operation-id",
                                  args.resume)
        op_id = check_flag(args.resume, "--resume")
        state = journal.load(op_id)
        if state is None:
            raise ValidationError("--resume", f"no operation of that id in {journal.directory}",
                                  op_id)
        if state.action != args.action:
            raise ValidationError("--resume", f"operation {op_id} is a {state.action}, not a "
                                              f"{args.action}", op_id)
        if selector is not None and selector != state.selector:
            raise ValidationError("--resume", f"operation {op_id} selects "
                                              f"{state.selector.describe()}; give no selector "
                                              f"or the same ones", op_id)
        selector = state.selector
    elif args.operation_id is not None:
        op_id = check_flag(args.operation_id, "--operation-id")
        state = journal.load(op_id)
        if selector is None and state is not None:
            selector = state.selector
    else:
        op_id = new_operation_id()
    if selector is None and not args.all:
        raise ValidationError("selector", "none given: name the jobs with --tenant, --prefix, "
                                          "--status, --due-after or --due-before, or give "
                                          "--all to act on every job of the namespace")
    if args.window < 1:
        raise ValidationError("--window", "must be at least 1", args.window)
    if args.wait is not None and args.wait <= 0:
        raise ValidationError("--wait", "must be a positive number of seconds", args.wait)
    return asyncio.run(_bulk(settings, args, selector or JobSelector(), op_id, journal))


def check_flag(value: str, flag: str) -> str:
    try:
        return check_operation_id(value)
    except ValidationError as exc:
        raise ValidationError(flag, exc.rule, value) from None


async def _bulk(settings: Settings, args: argparse.Namespace, selector: JobSelector,
                op_id: str, journal: FileJournal) -> int:
    from chronowheel.client import SchedulerClient

    action = args.action
    request = (f", request id {request_id_for(op_id, '')}" if action == "trigger" else "")
    print(f"operation {op_id}: {action} {selector.describe()}"
          f"{' (dry run)' if args.dry_run else ''}{request}", file=sys.stderr)
    progress = ProgressLine(sys.stderr, args.progress)
    f = selector.to_json()
    async with SchedulerClient(settings) as client:
        try:
            summary = await client.bulk(
                action, tenant=f.get("tenant"), status=f.get("status"), prefix=f.get("prefix"),
                due_after=f.get("due_after_ms"), due_before=f.get("due_before_ms"),
                operation_id=op_id, dry_run=args.dry_run, journal=journal,
                window=args.window, wait=args.wait, progress=progress)
        except BaseException as exc:
            progress.end()
            if not args.dry_run and not isinstance(exc, ValidationError):
                print(f"stopped: the same command with --operation-id {op_id} goes on where "
                      f"this one stopped", file=sys.stderr)
            raise
    progress.end()
    if args.json:
        print(orjson.dumps(summary.to_json(sample=max(0, args.show))).decode())
    else:
        print(render(summary, args.show))
    return 0 if summary.ok else 1
