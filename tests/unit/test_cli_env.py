"""Every CLI flag is also readable from a CHRONOWHEEL_* environment variable, named in --help."""

from __future__ import annotations

import argparse

import pytest
from chronowheel.cli import build_parser


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _all_parsers(child)
    return out


def test_every_long_option_of_every_command_names_its_environment_variable() -> None:
    missing = []
    for parser in _all_parsers(build_parser()):
        for action in parser._actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            if longs and action.dest != "help" and "CHRONOWHEEL_" not in (action.help or ""):
                missing.append(f"{parser.prog} {longs[0]}")
    assert missing == []


def test_a_command_flag_comes_from_its_variable_and_the_command_line_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOWHEEL_WORKER_CONCURRENCY", "7")
    base = ["worker", "--topic", "t", "--handler", "m:f"]
    assert build_parser().parse_args(base).concurrency == 7  # converted by the flag's type
    assert build_parser().parse_args([*base, "--concurrency", "3"]).concurrency == 3


def test_a_required_flag_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["capacity"])
    monkeypatch.setenv("CHRONOWHEEL_CAPACITY_JOBS_PER_DAY", "1e9")
    args = build_parser().parse_args(["capacity"])
    assert args.jobs_per_day == 1e9


def test_switches_and_repeated_flags_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOWHEEL_VERBOSE", "yes")
    monkeypatch.setenv("CHRONOWHEEL_WORKER_TOPIC", "a.fired,b.fired")
    monkeypatch.setenv("CHRONOWHEEL_WORKER_HANDLER", "m:f")
    args = build_parser().parse_args(["worker"])
    assert args.verbose is True
    assert args.topic == ["a.fired", "b.fired"]
