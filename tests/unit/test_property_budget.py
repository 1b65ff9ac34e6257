"""The quick loop's share of property-test examples (tests/property_budget.py)."""

from __future__ import annotations

import pytest

from tests.property_budget import examples, quick


def test_the_stated_count_unless_the_quick_loop_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHRONOWHEEL_HYPOTHESIS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert not quick() and examples(300) == 300
    monkeypatch.setenv("CHRONOWHEEL_HYPOTHESIS", "quick")
    assert quick()
    assert [examples(n) for n in (600, 300, 80, 30)] == [200, 100, 26, 25]


def test_ci_always_runs_the_stated_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOWHEEL_HYPOTHESIS", "quick")
    monkeypatch.setenv("CI", "true")
    assert not quick() and examples(300) == 300
