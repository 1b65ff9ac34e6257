"""`chronowheel submit`: send one job from flags, or many from a JSON Lines file.

File mode (`--file PATH`, `-` for stdin): one JSON object per line, either a job object (the
wire's `job`, e.g. {"id": "a", "at": "2026-12-01T09:00:00Z"}) or a full command
({"v": 1, "op": "upsert" | "cancel", ...}). Blank lines are ignored. A bad line (not JSON, not
an object, or failing validation) is reported on stderr as `PATH:LINE: reason` and:
  - by default skipped: the other lines are sent, the exit status is 1;
  - with --strict: the whole file is validated first and nothing is sent if any line is bad.
A summary line ends the run; a progress line (count, rate, percent, ETA) is drawn on stderr
when stderr is a terminal (--progress always/never to force it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import orjson

from chronowheel.core.durations import parse_duration
from chronowheel.core.model import ValidationPolicy, encode_upsert, parse_command
from chronowheel.errors import ChronowheelError, ValidationError
from chronowheel.ops.format import count, human_ms
from chronowheel.settings import Settings, add_settings_arguments, settings_from_args

# The node's validation limits, so that what the CLI accepts the node accepts too.
SUBMIT_SETTINGS = ("namespace", "kafka", "allowed_topics", "max_id_bytes", "max_payload_bytes",
                   "max_horizon_ms", "min_period_ms", "store_batch_fail_bytes", "retention_ms")
MAX_REPORTED_DEFAULT = 100
PROGRESS_AFTER_S = 1.0  # files that finish sooner never draw a progress line


# --- pure parts (unit-tested) ------------------------------------------------------------

def parse_jsonl_line(raw: bytes) -> dict[str, Any] | None:
    """The command of one JSONL line: a full command as given, a job object wrapped in an
    upsert; None for a blank line. Raises ValidationError for non-JSON or a non-object."""
    text = raw.strip()
    if not text:
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValidationError("$", f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValidationError("$", "each line must be a JSON object: a job or a command", doc)
    if "op" in doc or "v" in doc:  # a job object never has these (unknown job fields)
        return doc
    return {"v": 1, "op": "upsert", "job": doc}


@dataclass
class Line:
    number: int
    end_offset: int  # bytes of the input consumed through this line
    command: dict[str, Any] | None = None
    error: ValidationError | None = None


def read_lines(stream: IO[bytes]) -> Iterator[Line]:
    """Numbered lines of a JSONL stream, parsed; blank lines are skipped."""
    offset = 0
    for number, raw in enumerate(stream, start=1):
        offset += len(raw)
        try:
            command = parse_jsonl_line(raw)
        except ValidationError as exc:
            yield Line(number, offset, error=exc)
            continue
        if command is not None:
            yield Line(number, offset, command=command)


def format_progress(lines: int, acked: int, bad: int, elapsed_s: float,
                    done_bytes: int | None = None, total_bytes: int | None = None,
                    width: int = 20) -> str:
    """One progress line: [bar] percent, lines, rate, acked, bad, ETA (bar/percent/ETA only
    when the input size is known)."""
    rate = lines / elapsed_s if elapsed_s > 0 else 0.0
    parts = []
    if total_bytes and done_bytes is not None:
        frac = min(1.0, done_bytes / total_bytes)
        filled = int(frac * width)
        parts.append("[" + "#" * filled + "." * (width - filled) + f"] {frac * 100:3.0f}%")
    parts.append(f"{count(lines)} lines")
    parts.append(f"{count(round(rate))}/s")
    parts.append(f"{count(acked)} acked")
    if bad:
        parts.append(f"{count(bad)} bad")
    if total_bytes and done_bytes:
        remaining = elapsed_s * (total_bytes - done_bytes) / done_bytes
        parts.append(f"ETA {human_ms(round(remaining * 1000))}")
    return "  ".join(parts)


def parse_when(text: str, now_ms: int) -> int | str:
    """A time flag: '+90s' (from now), integer epoch ms, or RFC 3339 passed through."""
    if text.startswith("+"):
        return now_ms + parse_duration(text[1:], path="time")
    if text.isascii() and text.isdigit():
        return int(text)
    return text


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def job_from_flags(args: argparse.Namespace, now_ms: int) -> dict[str, Any]:
    """The wire job object described by the single-job flags."""
    job: dict[str, Any] = {"id": args.id}
    if args.at is not None:
        job["at"] = parse_when(args.at, now_ms)
    elif args.cron is not None:
        job["cron"] = args.cron
    elif args.every is not None:
        job["every"] = args.every
    if args.tz is not None:
        job["tz"] = args.tz
    if args.payload is not None:
        try:
            job["payload"] = orjson.loads(args.payload)
        except orjson.JSONDecodeError as exc:
            raise ValidationError("--payload", f"not valid JSON ({exc})", args.payload) from None
    if args.payload_file is not None:
        with open(args.payload_file, "rb") as f:
            job["payload"] = f.read()  # bytes: sent verbatim as payload_b64
    if args.payload_b64 is not None:
        job["payload_b64"] = args.payload_b64
    if args.header:
        job["headers"] = dict(args.header)
    for flag in ("start", "end"):
        value = getattr(args, flag)
        if value is not None:
            job[flag] = parse_when(value, now_ms)
    if args.exclude_date:
        job["exclude_dates"] = args.exclude_date
    for flag in ("topic", "dst", "catch_up", "max_catch_up", "window", "max_attempts",
                 "backoff", "tenant", "calendar", "concurrency", "max_lateness",
                 "pause_after_failures"):
        value = getattr(args, flag)
        if value is not None:
            job[flag] = value
    return job


# --- the command -------------------------------------------------------------------------

class Progress:
    """Draws format_progress on stderr: rewritten in place on a terminal, else a line every
    few seconds (only when forced with --progress always)."""

    def __init__(self, stream: IO[str], mode: str, total_bytes: int | None) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.enabled = mode == "always" or (mode == "auto" and self.tty)
        self.total_bytes = total_bytes
        self.t0 = time.monotonic()
        self.last = 0.0
        self.drawn = False

    def update(self, lines: int, acked: int, bad: int, done_bytes: int,
               final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.t0
        if not final and (elapsed < PROGRESS_AFTER_S
                          or now - self.last < (0.2 if self.tty else 5.0)):
            return
        if final and not self.drawn:
            return
        self.last = now
        text = format_progress(lines, acked, bad, elapsed, done_bytes, self.total_bytes)
        if self.tty:
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.drawn = True

    def clear_line(self) -> None:
        """Before printing an error on a terminal, wipe the half-drawn progress line."""
        if self.enabled and self.tty and self.drawn:
            self.stream.write("\r\x1b[K")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "submit", help="submit a job from flags, or many from a JSON Lines file",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings_arguments(p, SUBMIT_SETTINGS)
    src = p.add_argument_group("many jobs")
    src.add_argument("--file", metavar="PATH", help="JSON Lines file of jobs/commands; - = stdin")
    src.add_argument("--strict", action="store_true",
                     help="validate the whole file first; send nothing if a line is bad")
    src.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                     help="progress line on stderr (auto: when stderr is a terminal)")
    src.add_argument("--max-reported", type=int, default=MAX_REPORTED_DEFAULT, metavar="N",
                     help=f"print at most N bad lines ({MAX_REPORTED_DEFAULT}); all are counted")
    one = p.add_argument_group("one job")
    one.add_argument("--id", help="job id")
    kind = one.add_mutually_exclusive_group()
    kind.add_argument("--at", metavar="TIME",
                      help="one-shot: RFC 3339 with offset, epoch ms, or +DURATION from now")
    kind.add_argument("--cron", metavar="EXPR", help='recurring: cron expression, "0 9 * * 1-5"')
    kind.add_argument("--every", metavar="DURATION", help="recurring: fixed interval, e.g. 15m")
    one.add_argument("--tz", help="IANA zone of --cron (UTC)")
    one.add_argument("--dst", choices=("skip", "cron"), help="DST policy of --cron (skip)")
    one.add_argument("--exclude-date", action="append", metavar="YYYY-MM-DD",
                     help="cron: a local date (in --tz) not to fire on (repeatable)")
    one.add_argument("--calendar", metavar="NAME",
                     help="cron: also skip the dates of this calendar of the namespace")
    one.add_argument("--start", metavar="TIME", help="recurring: no occurrence before")
    one.add_argument("--end", metavar="TIME", help="recurring: no occurrence after")
    pay = one.add_mutually_exclusive_group()
    pay.add_argument("--payload", metavar="JSON", help="payload as a JSON value")
    pay.add_argument("--payload-file", metavar="PATH", help="payload: the file's bytes, verbatim")
    pay.add_argument("--payload-b64", metavar="B64", help="payload as standard base64")
    one.add_argument("--topic", help="target topic (default <ns>.fired)")
    one.add_argument("--header", action="append", type=parse_header, metavar="NAME=VALUE",
                     help="header copied onto every fired message (repeatable)")
    one.add_argument("--window", metavar="DURATION", help="flexible window, e.g. 30s")
    one.add_argument("--catch-up", choices=("coalesce", "all", "skip"),
                     help="recurring: missed occurrences after an outage (coalesce)")
    one.add_argument("--max-catch-up", type=int, metavar="N")
    one.add_argument("--max-attempts", type=int, metavar="N", help="worker deliveries (5)")
    one.add_argument("--backoff", metavar="DURATION", help="worker's first retry delay (10s)")
    one.add_argument("--tenant", help="label")
    one.add_argument("--concurrency", choices=("allow", "forbid", "replace"),
                     help="recurring: overlap policy for workers (allow)")
    one.add_argument("--max-lateness", metavar="DURATION",
                     help="an occurrence not published within this long after its instant is "
                          "missed, not published (default: the namespace's max_lateness_ms)")
    one.add_argument("--pause-after-failures", type=int, metavar="N",
                     help="recurring: pause the job after N consecutive failed runs (1-100), "
                          "with a note saying why and when; resume clears it")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the wire command(s); send nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    if args.file is not None:
        one_job_flags = [f for f in ("id", "at", "cron", "every", "payload", "payload_file",
                                     "payload_b64", "topic", "header", "tz")
                         if getattr(args, f) is not None]
        if one_job_flags:
            raise ChronowheelError("--file cannot be combined with one-job flags "
                                   f"(--{one_job_flags[0].replace('_', '-')})")
        return asyncio.run(_submit_file(settings, args))
    if args.id is None:
        raise ChronowheelError("give --id with --at, --cron or --every, or --file PATH")
    return asyncio.run(_submit_one(settings, args))


async def _submit_one(settings: Settings, args: argparse.Namespace) -> int:
    from chronowheel.client import SchedulerClient

    job = job_from_flags(args, time.time_ns() // 1_000_000)
    if args.dry_run:
        raw = encode_upsert(job)
        parse_command(raw, key=None, policy=ValidationPolicy.from_settings(settings),
                      now_ms=time.time_ns() // 1_000_000)
        print(raw.decode())
        return 0
    async with SchedulerClient(settings) as client:
        delivery = await client.submit(job)
        meta = await delivery
    print(f"upsert {job['id']}: written to {meta.topic} partition {meta.partition} "
          f"(its shard) offset {meta.offset}")
    return 0


async def _submit_file(settings: Settings, args: argparse.Namespace) -> int:
    from chronowheel.client import SchedulerClient

    path = args.file
    name = "<stdin>" if path == "-" else path
    stream: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    total = None if path == "-" else os.fstat(stream.fileno()).st_size
    progress = Progress(sys.stderr, args.progress, total)
    reported = 0
    bad = 0

    def report_bad(line: int, error: Exception) -> None:
        nonlocal reported, bad
        bad += 1
        if reported < args.max_reported:
            progress.clear_line()
            print(f"{name}:{line}: {error}", file=sys.stderr)
            reported += 1

    try:
        if args.strict or args.dry_run:
            policy = ValidationPolicy.from_settings(settings)
            buffered: list[Line] = []
            for line in read_lines(stream):
                if line.error is None:
                    assert line.command is not None
                    try:
                        parse_command(orjson.dumps(line.command), key=None, policy=policy,
                                      now_ms=time.time_ns() // 1_000_000)
                    except ValidationError as invalid:
                        line.error = invalid
                if line.error is not None:
                    report_bad(line.number, line.error)
                elif args.dry_run:
                    print(orjson.dumps(line.command).decode())
                elif path == "-":
                    buffered.append(line)  # stdin cannot be read twice
            if bad or args.dry_run:
                _summary(name, 0, 0, bad, 0, reported, 0.0, dry_run=args.dry_run)
                return 1 if bad else 0
            if path == "-":
                lines: Iterator[Line] = iter(buffered)
            else:
                stream.seek(0)
                lines = read_lines(stream)
        else:
            lines = read_lines(stream)

        current = Line(0, 0)

        def commands() -> Iterator[Mapping[str, Any]]:
            nonlocal current
            for line in lines:
                current = line
                if line.error is not None:
                    report_bad(line.number, line.error)
                else:
                    assert line.command is not None
                    yield line.command

        sent_lines = 0

        def on_progress(p: Any) -> None:
            nonlocal sent_lines
            sent_lines = p.queued
            progress.update(p.queued, p.acked, bad, current.end_offset)

        async with SchedulerClient(settings) as client:
            report = await client.submit_many(
                commands(), progress=on_progress,
                on_invalid=lambda _i, exc: report_bad(current.number, exc))
        progress.update(report.queued, report.acked, bad, current.end_offset, final=True)
        for job_id, error in report.failed[: args.max_reported]:
            print(f"{name}: job {job_id!r} not written: {error!r}", file=sys.stderr)
        _summary(name, report.queued, report.acked, bad, len(report.failed), reported,
                 report.elapsed_s)
        return 0 if bad == 0 and not report.failed else 1
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _summary(name: str, queued: int, acked: int, bad: int, failed: int, reported: int,
             elapsed_s: float, dry_run: bool = False) -> None:
    if bad > reported:
        print(f"{name}: ... {count(bad - reported)} more bad line(s) not shown", file=sys.stderr)
    if dry_run:
        print(f"{name}: dry run: {count(bad)} bad line(s); nothing sent", file=sys.stderr)
        return
    if queued == 0 and bad:
        print(f"{name}: {count(bad)} bad line(s); nothing sent", file=sys.stderr)
        return
    rate = f" ({count(round(acked / elapsed_s))}/s)" if elapsed_s > 0 else ""
    print(f"{name}: {count(acked)} command(s) written in {elapsed_s:.1f}s{rate}; "
          f"{count(bad)} bad line(s) skipped; {count(failed)} not written")
