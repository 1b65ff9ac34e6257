"""The `chronowheel` command. Each sub-command lives in its own module with `register()`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence

from chronowheel.errors import ChronowheelError
from chronowheel.logs import configure

# Modules under chronowheel.cli that each define register(subparsers).
COMMAND_MODULES = (
    "chronowheel.cli.stack",
    "chronowheel.cli.init",
    "chronowheel.cli.acl",
    "chronowheel.cli.node",
    "chronowheel.cli.cron",
    "chronowheel.cli.worker",
    "chronowheel.cli.submit",
    "chronowheel.cli.job",
    "chronowheel.cli.jobs",
    "chronowheel.cli.dead",
    "chronowheel.cli.calendar",
    "chronowheel.cli.status",
    "chronowheel.cli.tail",
    "chronowheel.cli.console",
    "chronowheel.cli.capacity",
    "chronowheel.cli.demo",
)


# The command each module registers is named after the module.
COMMANDS = {module.rsplit(".", 1)[1]: module for module in COMMAND_MODULES}


def command_in(argv: Sequence[str]) -> str | None:
    """The command `argv` names, or None (no command, an unknown one, or only --help).

    The parser then needs only that command's module: a `chronowheel node` skips importing
    the fifteen others (about 0.3 s of CPU at every node and worker start, measured with
    `chronowheel node --help`)."""
    takes_value = _options_taking_a_value(_global_parser())
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help"):  # the whole help lists every command
            return None
        if word in takes_value:
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _options_taking_a_value(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The option strings of `parser` whose next word is their value, not a command."""
    return frozenset(option for action in parser._actions if action.nargs != 0
                     for option in action.option_strings)


def _global_parser() -> argparse.ArgumentParser:
    """The options that come before the command, without any command."""
    parser = argparse.ArgumentParser(
        prog="chronowheel",
        description="Durable scheduler for future work (Cassandra + timing wheels + Kafka).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format", choices=("text", "json"),
        default=os.environ.get("CHRONOWHEEL_LOG_FORMAT", "text"),
        help="text, or one JSON object per line [env CHRONOWHEEL_LOG_FORMAT; default text]")
    return parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only` (a command of COMMANDS), that command alone."""
    parser = _global_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (COMMANDS[only],) if only is not None else COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    env_backed(parser, os.environ)
    return parser


_TRUE = ("1", "true", "yes", "on")


def env_backed(parser: argparse.ArgumentParser, env: Mapping[str, str], prefix: str = "",
               _seen: set[int] | None = None) -> None:
    """Make every long option also readable from an environment variable, named in --help.

    Settings flags already say `[env CHRONOWHEEL_X]` and are left alone; the others get
    CHRONOWHEEL_<COMMAND>_<FLAG> (the command in the name, as `--topic` of `submit` and of
    `worker` mean different things). A flag given on the command line still wins.
    """
    seen = set() if _seen is None else _seen
    if id(parser) in seen:
        return
    seen.add(id(parser))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                env_backed(child, env, f"{prefix}{_env_word(name)}_", seen)
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest == "help" or "[env " in (action.help or ""):
            continue
        var = f"CHRONOWHEEL_{prefix}{_env_word(longs[0][2:])}"
        action.help = f"{action.help or ''} [env {var}]".strip()
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if isinstance(action, argparse._StoreTrueAction):
            action.default = raw.lower() in _TRUE
        elif isinstance(action, argparse._StoreFalseAction):
            action.default = raw.lower() not in _TRUE
        elif isinstance(action, argparse._AppendAction):
            convert = action.type if callable(action.type) else str
            action.default = [convert(v) for v in raw.split(",") if v]
        else:
            action.default = raw  # argparse applies the option's type to a string default
        action.required = False


def _env_word(text: str) -> str:
    return text.upper().replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(command_in(argv))
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
