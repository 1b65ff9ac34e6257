"""`chronowheel submit`: JSONL parsing, progress text, flags -> job, and --dry-run (no Kafka)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import orjson
import pytest
from chronowheel import cli
from chronowheel.cli.submit import (
    Progress,
    format_progress,
    job_from_flags,
    parse_header,
    parse_jsonl_line,
    parse_when,
    read_lines,
)
from chronowheel.errors import ValidationError

NOW = 1_800_000_000_000


def test_registered() -> None:
    assert "chronowheel.cli.submit" in cli.COMMAND_MODULES


def test_a_job_object_line_becomes_an_upsert() -> None:
    assert parse_jsonl_line(b'{"id": "a", "at": 5}\n') == {
        "v": 1, "op": "upsert", "job": {"id": "a", "at": 5}}


def test_a_full_command_line_is_kept_as_given() -> None:
    assert parse_jsonl_line(b'{"v":1,"op":"cancel","id":"a"}') == {
        "v": 1, "op": "cancel", "id": "a"}
    # "v" alone marks a command too: a job object never has it, and the parser says what is
    # missing instead of calling it an unknown job field.
    assert parse_jsonl_line(b'{"v":1,"id":"a"}') == {"v": 1, "id": "a"}


def test_blank_lines_are_nothing() -> None:
    assert parse_jsonl_line(b"  \r\n") is None


@pytest.mark.parametrize(("raw", "rule"), [
    (b"{not json", "not valid JSON"),
    (b'["a"]', "must be a JSON object"),
    (b'"a"', "must be a JSON object"),
])
def test_bad_lines_raise(raw: bytes, rule: str) -> None:
    with pytest.raises(ValidationError, match=rule):
        parse_jsonl_line(raw)


def test_read_lines_numbers_lines_and_tracks_offsets() -> None:
    data = b'{"id":"a","at":1}\n\nnope\n{"id":"b","at":2}'
    lines = list(read_lines(io.BytesIO(data)))
    assert [ln.number for ln in lines] == [1, 3, 4]
    assert [ln.error is not None for ln in lines] == [False, True, False]
    assert [ln.end_offset for ln in lines] == [18, 24, len(data)]
    assert lines[2].command == {"v": 1, "op": "upsert", "job": {"id": "b", "at": 2}}


def test_progress_with_a_known_size_shows_bar_percent_rate_and_eta() -> None:
    text = format_progress(50_000, 49_000, 3, 10.0, done_bytes=250, total_bytes=1000, width=8)
    assert text == ("[##......]  25%  50,000 lines  5,000/s  49,000 acked  3 bad  ETA 30.0s")


def test_progress_without_a_size_has_no_bar_or_eta() -> None:
    assert format_progress(10, 10, 0, 2.0) == "10 lines  5/s  10 acked"


def test_parse_when() -> None:
    assert parse_when("+90s", NOW) == NOW + 90_000
    assert parse_when("1796115600000", NOW) == 1796115600000
    assert parse_when("2026-12-01T09:00:00Z", NOW) == "2026-12-01T09:00:00Z"
    with pytest.raises(ValidationError):
        parse_when("+soon", NOW)


def test_parse_header() -> None:
    assert parse_header("trace=a=b") == ("trace", "a=b")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_header("novalue")


def test_job_from_flags(tmp_path: Path) -> None:
    blob = tmp_path / "p.bin"
    blob.write_bytes(b"\x00\xff")
    args = cli.build_parser().parse_args([
        "submit", "--id", "r1", "--cron", "0 9 * * 1-5", "--tz", "Europe/London",
        "--payload-file", str(blob), "--header", "a=1", "--header", "b=2",
        "--catch-up", "skip", "--max-attempts", "3", "--start", "+1h"])
    assert job_from_flags(args, NOW) == {
        "id": "r1", "cron": "0 9 * * 1-5", "tz": "Europe/London", "payload": b"\x00\xff",
        "headers": {"a": "1", "b": "2"}, "start": NOW + 3_600_000, "catch_up": "skip",
        "max_attempts": 3}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["submit", "--namespace", "acme", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_the_wire_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--id", "a", "--at", "2026-12-01T09:00:00Z",
                         "--payload", '{"x": 1.50}', "--dry-run")
    assert (code, err) == (0, "")
    assert orjson.loads(out) == {"v": 1, "op": "upsert", "job": {
        "id": "a", "at": "2026-12-01T09:00:00Z", "payload": {"x": 1.5}}}


def test_max_lateness_is_a_flag_checked_like_the_wire_field(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--id", "a", "--every", "1m", "--max-lateness", "30s",
                         "--dry-run")
    assert (code, err) == (0, "")
    assert orjson.loads(out)["job"]["max_lateness"] == "30s"
    code, out, err = run(capsys, "--id", "a", "--every", "1m", "--max-lateness", "500ms",
                         "--dry-run")
    assert code == 2 and out == ""
    assert "job.max_lateness: must be between 1s and 3653d" in err


def test_dry_run_rejects_an_invalid_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--id", "a", "--cron", "0 9 * * *", "--tz", "Mars/Olympus",
                         "--dry-run")
    assert code == 2 and out == ""
    assert "job.tz: unknown time zone" in err


def test_bad_payload_json_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--id", "a", "--at", "+1s", "--payload", "{x}", "--dry-run")
    assert code == 2 and "--payload: not valid JSON" in err


def test_file_and_one_job_flags_do_not_mix(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    code, _, err = run(capsys, "--file", str(tmp_path / "x"), "--id", "a")
    assert code == 2 and "--id" in err


def test_file_dry_run_reports_bad_lines_by_number(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"id":"a","at":"2026-12-01T09:00:00Z"}\n'
                    '{"id":"b","at":"2026-12-01T09:00:00Z","tz":"UTC"}\n'
                    "\n"
                    "[1]\n"
                    '{"v":1,"op":"cancel","id":"a"}\n')
    code, out, err = run(capsys, "--file", str(path), "--dry-run")
    assert code == 1
    assert [orjson.loads(ln)["op"] for ln in out.splitlines()] == ["upsert", "cancel"]
    assert f"{path}:2: job.tz: only allowed with cron" in err
    assert f"{path}:4: $: each line must be a JSON object" in err
    assert "2 bad line(s); nothing sent" in err


def test_strict_sends_nothing_when_a_line_is_bad(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"id":"a","at":1}\n{"id":"b"}\n')
    # No Kafka is configured to be reachable here: strict mode must stop before connecting.
    code, _, err = run(capsys, "--file", str(path), "--strict", "--kafka", "127.0.0.1:1")
    assert code == 1
    assert f"{path}:2: job: exactly one of at, cron, every" in err
    assert "nothing sent" in err


def test_max_reported_limits_the_listing(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text("x\n" * 5)
    code, _, err = run(capsys, "--file", str(path), "--dry-run", "--max-reported", "2")
    assert code == 1
    assert err.count(": $: not valid JSON") == 2
    assert "3 more bad line(s) not shown" in err


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_redraws_in_place_on_a_terminal() -> None:
    stream = FakeStream(tty=True)
    bar = Progress(stream, "auto", total_bytes=100)
    bar.update(10, 5, 0, 10)
    assert stream.getvalue() == ""  # nothing during the first second: small files stay quiet
    bar.t0 -= 2
    bar.update(10, 5, 0, 10)
    bar.last -= 1
    bar.update(20, 20, 1, 100, final=True)
    out = stream.getvalue()
    assert out.startswith("\r\x1b[K[##") and out.count("\r\x1b[K") == 2
    assert "] 100%  20 lines  " in out and out.endswith("20 acked  1 bad  ETA 0ms\n")


def test_progress_is_off_when_not_a_terminal_unless_forced() -> None:
    quiet = Progress(FakeStream(tty=False), "auto", None)
    quiet.t0 -= 10
    quiet.update(1, 1, 0, 1, final=True)
    assert quiet.stream.getvalue() == ""
    stream = FakeStream(tty=False)
    forced = Progress(stream, "always", None)
    forced.t0 -= 10
    forced.update(7, 7, 0, 70)
    assert stream.getvalue() == "7 lines  1/s  7 acked\n"
