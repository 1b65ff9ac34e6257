"""Durations: grammar, error messages, and the shortest-spelling formatter."""

from __future__ import annotations

import re
from functools import cache

import pytest
from chronowheel.core.durations import (
    DURATION_PATTERN,
    MAX_DURATION_MS,
    UNITS,
    format_duration,
    parse_duration,
)
from chronowheel.errors import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property_budget import examples

S = 1_000
M = 60 * S
H = 60 * M
D = 24 * H


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0s", 0),
        ("0ms", 0),
        ("0d", 0),
        ("500ms", 500),
        ("90s", 90 * S),
        ("15m", 15 * M),
        ("1h30m", H + 30 * M),
        ("2d", 2 * D),
        ("1d2h3m4s5ms", D + 2 * H + 3 * M + 4 * S + 5),
        ("5ms", 5),  # "m" followed by "s" must not be read as minutes then seconds
        ("1m5ms", M + 5),
        ("007s", 7 * S),
        ("1h0m", H),
        ("3600s", H),
    ],
)
def test_parse_accepts(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize(
    ("text", "rule_part"),
    [
        ("", "must not be empty"),
        ("-5s", "must not be negative"),
        ("-0s", "must not be negative"),
        ("5w", "unknown unit 'w'"),
        ("15M", "unknown unit 'M'"),
        ("5msx", "unknown unit 'msx'"),
        ("5", "every number needs a unit"),
        ("1h5", "every number needs a unit"),
        ("1h1h", "unit 'h' appears more than once"),
        ("1m1h", "from largest to smallest"),
        ("1ms1s", "from largest to smallest"),
        ("1.5h", "expected parts like"),
        ("5 s", "expected parts like"),
        (" 5s", "expected parts like"),
        ("5s ", "expected parts like"),
        ("+5s", "expected parts like"),
        ("ms", "expected parts like"),
        ("\u0661\u0662s", "only ASCII digits"),  # Arabic-Indic digits: int() would take them
        ("1h\n", "expected parts like"),
    ],
)
def test_parse_rejects_with_clear_message(text: str, rule_part: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_duration(text, path="job.every")
    err = info.value
    assert err.path == "job.every"
    assert rule_part in err.rule
    assert err.value == text
    assert str(err).startswith("job.every: ")
    assert repr(text) in str(err)


def test_parse_rejects_non_strings() -> None:
    for value in (90, 1.5, None, True, ["1s"]):
        with pytest.raises(ValidationError) as info:
            parse_duration(value, path="job.backoff")  # type: ignore[arg-type]
        assert info.value.path == "job.backoff"
        assert info.value.value == value


def test_parse_rejects_too_large() -> None:
    assert parse_duration(f"{MAX_DURATION_MS}ms") == MAX_DURATION_MS
    with pytest.raises(ValidationError, match="too large"):
        parse_duration(f"{MAX_DURATION_MS + 1}ms")
    with pytest.raises(ValidationError, match="too large"):
        parse_duration("99999999999999999999d")
    with pytest.raises(ValidationError, match="too large"):
        parse_duration("9" * 5000 + "ms")  # int() would refuse this many digits


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (1, "1ms"),
        (999, "999ms"),
        (S, "1s"),
        (1_500, "1500ms"),  # shorter than 1s500ms
        (90 * S, "90s"),  # shorter than 1m30s
        (M, "1m"),
        (15 * M, "15m"),
        (H + 30 * M, "90m"),
        (H, "1h"),
        (D, "1d"),
        (D + H, "25h"),
        (36 * H, "36h"),
        (D + 1, "1d1ms"),
        (3653 * D, "3653d"),
        (D + 2 * H + 3 * M + 4 * S + 5, "93784s5ms"),  # 9 characters beat 1d2h3m4s5ms
        (10 * D + 5 * H, "245h"),  # 4 characters beat 10d5h
        (10 * D + 5 * H + 1, "245h1ms"),
        (10 * D + 5 * S, "10d5s"),
    ],
)
def test_format_examples(ms: int, text: str) -> None:
    assert format_duration(ms) == text
    assert parse_duration(text) == ms


def test_format_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration(-1)
    with pytest.raises(TypeError):
        format_duration(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        format_duration(True)


@given(st.integers(min_value=0, max_value=MAX_DURATION_MS))
@settings(max_examples=examples(300), deadline=None)
def test_format_round_trips_and_matches_the_grammar_regex(ms: int) -> None:
    text = format_duration(ms)
    assert parse_duration(text) == ms
    assert re.fullmatch(DURATION_PATTERN, text)


@cache
def _brute_shortest(index: int, rest: int) -> int:
    """Length of the shortest spelling, trying every amount of every unit (small values only)."""
    unit, size = UNITS[index]
    if index == len(UNITS) - 1:
        return len(f"{rest}{unit}") if rest else 0
    best = None
    for amount in range(rest // size + 1):
        head = len(f"{amount}{unit}") if amount else 0
        length = head + _brute_shortest(index + 1, rest - amount * size)
        best = length if best is None else min(best, length)
    assert best is not None
    return best


@given(
    st.one_of(
        st.integers(min_value=1, max_value=200_000),
        st.integers(min_value=1, max_value=250).map(lambda n: n * S),
        st.integers(min_value=1, max_value=12).map(lambda n: n * M + 7),
    )
)
@settings(max_examples=examples(200), deadline=None)
def test_format_is_the_shortest_spelling(ms: int) -> None:
    assert len(format_duration(ms)) == _brute_shortest(0, ms)


@given(st.text(alphabet="0123456789dhms-. xM", max_size=12))
@settings(max_examples=examples(500), deadline=None)
def test_parser_and_grammar_regex_agree(text: str) -> None:
    """The JSON Schema's pattern (plus minLength 1) accepts exactly what the parser accepts."""
    schema_ok = text != "" and re.fullmatch(DURATION_PATTERN, text) is not None
    try:
        parse_duration(text)
        parser_ok = True
    except ValidationError:
        parser_ok = False
    assert parser_ok == schema_ok
