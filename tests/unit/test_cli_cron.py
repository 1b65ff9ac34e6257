"""`chronowheel cron next`, driven through the real CLI entry point."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from chronowheel import cli


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = cli.main(["cron", "next", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_registered() -> None:
    assert "chronowheel.cli.cron" in cli.COMMAND_MODULES


def test_next_prints_local_offsets_and_skips_the_gap(capsys: pytest.CaptureFixture[str]) -> None:
    # London springs forward on 2026-03-29 at 01:00 GMT: 01:30 that day does not exist.
    code, lines, err = run(
        capsys, "30 1 * * *", "--tz", "Europe/London", "--after", "2026-03-28T00:00:00Z",
        "--count", "3",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert lines == [
        "2026-03-28T01:30:00+00:00",
        "2026-03-30T01:30:00+01:00",
        "2026-03-31T01:30:00+01:00",
    ]


def test_dst_cron_fires_at_the_end_of_the_gap(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys, "30 1 * * *", "--tz", "Europe/London", "--after", "2026-03-28T00:00:00Z",
        "--count", "3", "--dst", "cron",
    )  # fmt: skip
    assert code == 0
    assert lines == [
        "2026-03-28T01:30:00+00:00",
        "2026-03-29T02:00:00+01:00",
        "2026-03-30T01:30:00+01:00",
    ]


def test_after_in_another_offset_and_default_count(capsys: pytest.CaptureFixture[str]) -> None:
    # --after in +01:00: 02:30 BST (01:30Z) is before that day's 03:00 BST (02:00Z).
    code, lines, _ = run(
        capsys, "0 3 * * *", "--tz", "Europe/London", "--after", "2026-03-29T02:30:00+01:00"
    )
    assert code == 0
    assert lines[:2] == ["2026-03-29T03:00:00+01:00", "2026-03-30T03:00:00+01:00"]
    assert len(lines) == 5


def test_inclusive(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("30 1 * * *", "--tz", "Europe/London", "--count", "1")
    at = "2026-03-30T00:30:00Z"  # = 01:30 BST, an occurrence
    assert run(capsys, *args, "--after", at)[1] == ["2026-03-31T01:30:00+01:00"]
    assert run(capsys, *args, "--after", at, "--inclusive")[1] == ["2026-03-30T01:30:00+01:00"]


def test_fractional_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("30 1 * * *", "--tz", "Europe/London", "--count", "1")
    # A hair before the occurrence: it is strictly after, so it is printed.
    before = "2026-03-30T01:29:59.9999999+01:00"
    assert run(capsys, *args, "--after", before)[1] == ["2026-03-30T01:30:00+01:00"]
    # Exactly on it with a zero fraction: inclusive keeps it.
    exact = "2026-03-30T01:30:00.000+01:00"
    assert run(capsys, *args, "--after", exact, "--inclusive")[1] == ["2026-03-30T01:30:00+01:00"]
    # 0.4 ms after it: even inclusive, the occurrence is in the past.
    past = "2026-03-30T01:30:00.0004+01:00"
    assert run(capsys, *args, "--after", past, "--inclusive")[1] == ["2026-03-31T01:30:00+01:00"]


def test_seconds_field_and_utc(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys, "*/20 0 12 * * *", "--after", "2026-01-01t00:00:00z", "--count", "4"
    )
    assert code == 0
    assert lines == [
        "2026-01-01T12:00:00+00:00",
        "2026-01-01T12:00:20+00:00",
        "2026-01-01T12:00:40+00:00",
        "2026-01-02T12:00:00+00:00",
    ]


def test_default_after_is_now(capsys: pytest.CaptureFixture[str]) -> None:
    before = time.time()
    code, lines, _ = run(capsys, "* * * * * *", "--count", "2")
    assert code == 0 and len(lines) == 2
    first = datetime.fromisoformat(lines[0]).timestamp()
    assert before < first <= time.time() + 1


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["61 * * * *"], "job.cron: minute field: 61 is out of range 0-59"),
        (["0 0 30 2 *"], "job.cron: never matches a real date"),
        (["@every"], "job.cron: unknown macro"),
        (["* * * * *", "--tz", "Mars/Olympus_Mons"], "job.tz: unknown IANA time zone"),
        (["* * * * *", "--after", "2026-03-29 01:00"], "--after: must be an RFC 3339 time"),
        (["* * * * *", "--after", "2026-03-29T01:00:00"], "--after: must be an RFC 3339 time"),
        (["* * * * *", "--after", "2026-02-30T01:00:00Z"], "--after: not a valid date"),
        (["* * * * *", "--after", "2026-03-29T01:00:00+01:75"], "--after: not a valid date"),
    ],
)
def test_bad_input_exits_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, lines, err = run(capsys, *argv)
    assert code == 2
    assert lines == []
    assert err.startswith("chronowheel cron: ")
    assert fragment in err


@pytest.mark.parametrize("argv", [["* * * * *", "--count", "0"], ["* * * * *", "--dst", "x"]])
def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cron", "next", *argv])
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_exclude_date_previews_a_holiday_in_the_zone(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = run(
        capsys, "0 9 * * *", "--tz", "America/New_York", "--after", "2026-12-24T00:00:00Z",
        "--count", "2", "--exclude-date", "2026-12-25", "--exclude-date", "2026-12-26",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert lines == ["2026-12-24T09:00:00-05:00", "2026-12-27T09:00:00-05:00"]


def test_a_malformed_exclude_date_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cron", "next", "0 9 * * *", "--exclude-date", "2026-02-30"])
    assert exit_.value.code == 2
    assert "not a date like 2026-12-25: '2026-02-30'" in capsys.readouterr().err


def test_new_syntax_and_named_rejections(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(capsys, "0 9 15W * *", "--after", "2026-08-01T00:00:00Z", "--count", "1")
    assert (code, lines) == (0, ["2026-08-14T09:00:00+00:00"])  # Aug 15 is a Saturday
    code, _, err = run(capsys, "H * * * *")
    assert code != 0 and "'H' (hashed values, a Jenkins extension) is not supported" in err
