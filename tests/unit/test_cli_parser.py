"""The command line builds only the parser of the command it names (each command's module
imports what it needs; the others stay unimported), and the result parses as the whole one."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest
from chronowheel import cli


def test_each_module_registers_the_command_named_after_it() -> None:
    for command, module in cli.COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        assert list(sub.choices) == [command], module


@pytest.mark.parametrize(("argv", "command"), [
    (["node"], "node"),
    (["-v", "worker", "--topic", "t"], "worker"),
    (["--log-format", "json", "submit", "node"], "submit"),
    (["--log-format=json", "jobs", "list"], "jobs"),
    (["--log-format", "node"], None),  # "node" is the option's value: no command yet
    (["--help", "node"], None),
    ([], None),
    (["nodes"], None),
])
def test_the_command_is_the_first_word_after_the_global_options(
        argv: list[str], command: str | None) -> None:
    assert cli.command_in(argv) == command


def test_every_global_option_that_takes_a_value_is_skipped_with_it() -> None:
    # Read from the parser itself, so a global option added later needs no list kept by hand.
    parser = cli.build_parser("worker")
    takes_value = [option for action in parser._actions if action.nargs != 0
                   for option in action.option_strings]
    assert "--log-format" in takes_value
    for option in takes_value:
        assert cli.command_in([option, "node", "worker", "--topic", "t"]) == "worker", option


def test_one_command_parses_as_in_the_whole_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOWHEEL_WORKER_CONCURRENCY", "7")
    argv = ["-v", "worker", "--topic", "t", "--handler", "m:f"]
    alone = cli.build_parser(cli.command_in(argv)).parse_args(argv)
    whole = cli.build_parser().parse_args(argv)
    assert vars(alone) == vars(whole) and alone.concurrency == 7


def test_an_unknown_command_is_refused_with_every_choice_listed(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["nodes"])
    err = capsys.readouterr().err
    assert "invalid choice: 'nodes'" in err and "'worker'" in err and "'node'" in err


def test_a_node_start_imports_no_other_command() -> None:
    probe = ("import sys\n"
             "from chronowheel import cli\n"
             "cli.build_parser(cli.command_in(['node', '--help']))\n"
             "print(sorted(m for m in sys.modules if m.startswith('chronowheel.cli.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['chronowheel.cli.node']"
