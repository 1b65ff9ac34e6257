"""The `chronowheel` command. Each sub-command lives in its own module with `register()`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from chronowheel.errors import ChronowheelError
from chronowheel.logs import configure

# Modules under chronowheel.cli that each define register(subparsers).
COMMAND_MODULES = (
    "chronowheel.cli.stack",
    "chronowheel.cli.init",
    "chronowheel.cli.node",
    "chronowheel.cli.cron",
    "chronowheel.cli.worker",
    "chronowheel.cli.submit",
    "chronowheel.cli.job",
    "chronowheel.cli.status",
    "chronowheel.cli.tail",
    "chronowheel.cli.capacity",
    "chronowheel.cli.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chronowheel",
        description="Durable scheduler for future work (Cassandra + timing wheels + Kafka).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format", choices=("text", "json"),
        default=os.environ.get("CHRONOWHEEL_LOG_FORMAT", "text"),
        help="text, or one JSON object per line [env CHRONOWHEEL_LOG_FORMAT; default text]")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure(verbose=args.verbose, fmt=args.log_format)
    try:
        result = args.func(args)
    except ChronowheelError as exc:
        print(f"chronowheel {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
