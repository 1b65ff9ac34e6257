"""`chronowheel worker`: argument parsing and handler loading (no servers)."""

from __future__ import annotations

import pytest
from chronowheel import cli
from chronowheel.cli.worker import handler_map, load_handler
from chronowheel.errors import ConfigError
from chronowheel.worker.policy import error_text, retry_delay_ms


def test_registered() -> None:
    assert "chronowheel.cli.worker" in cli.COMMAND_MODULES
    args = cli.build_parser().parse_args(
        ["worker", "--topic", "a", "--topic", "b", "--handler", "m:f", "--concurrency", "4",
         "--group", "g", "--no-idempotency", "--namespace", "ns"])
    assert (args.topic, args.handler, args.concurrency, args.group) == (["a", "b"], ["m:f"], 4,
                                                                        "g")
    assert args.idempotency is False and args.namespace == "ns"


def test_load_handler_resolves_dotted_attributes() -> None:
    assert load_handler("chronowheel.worker.policy:retry_delay_ms") is retry_delay_ms
    assert load_handler("chronowheel.worker:policy.error_text") is error_text


@pytest.mark.parametrize("spec, message", [
    ("nocolon", "expected module:function"),
    ("chronowheel.no_such_module:f", "cannot import"),
    ("chronowheel.worker.policy:nope", "has no nope"),
    ("chronowheel.worker.policy:MAX_RETRY_DELAY_MS", "not callable"),
])
def test_load_handler_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_handler(spec)


def test_handler_map_default_and_per_topic() -> None:
    out = handler_map(["a", "b"], ["chronowheel.worker.policy:retry_delay_ms",
                                   "b=chronowheel.worker.policy:error_text"])
    assert out == {"a": retry_delay_ms, "b": error_text}


@pytest.mark.parametrize("specs, message", [
    (["c=chronowheel.worker.policy:error_text"], "not one of the --topic"),
    (["a=chronowheel.worker.policy:error_text"], "no handler for topic 'b'"),
    (["chronowheel.worker.policy:error_text"] * 2, "more than one default"),
    (["a=chronowheel.worker.policy:error_text"] * 2, "two handlers for topic 'a'"),
])
def test_handler_map_errors(specs: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        handler_map(["a", "b"], specs)


def test_bad_handler_exits_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["worker", "--topic", "a", "--handler", "nope"])
    assert code == 2
    assert "expected module:function" in capsys.readouterr().err


def test_the_workers_collector_setting_is_a_flag_and_a_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chronowheel.settings import settings_from_args

    base = ["worker", "--topic", "a", "--handler", "m:f", "--namespace", "ns"]
    args = cli.build_parser().parse_args([*base, "--gc-young-threshold", "1234"])
    assert settings_from_args(args).gc_young_threshold == 1234
    monkeypatch.setenv("CHRONOWHEEL_GC_YOUNG_THRESHOLD", "0")
    assert settings_from_args(cli.build_parser().parse_args(base)).gc_young_threshold == 0
