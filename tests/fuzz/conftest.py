"""Fixtures of the fuzz suite: its size and seed (see tests/fuzz/__init__.py)."""

from __future__ import annotations

import os
import secrets

import pytest

DEFAULT_COMMANDS = 300


def _commands() -> int:
    return int(os.environ.get("CHRONOWHEEL_FUZZ_COMMANDS", "") or DEFAULT_COMMANDS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-timeout's limit (pyproject.toml) fits the default size; a larger run gets the
    time its settling may take (run_fuzz waits 60 s + 10 ms per command) and its sending at a
    few hundred commands a second on a loaded machine, on top."""
    n = _commands()
    if n <= DEFAULT_COMMANDS:
        return
    for item in items:
        if "fuzz_commands" in getattr(item, "fixturenames", ()) \
                and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(300 + 60 + n / 100 + n / 250))


@pytest.fixture
def fuzz_commands() -> int:
    """How many commands a run sends: CHRONOWHEEL_FUZZ_COMMANDS, default 300 (CI size)."""
    return _commands()


@pytest.fixture
def fuzz_seed() -> int:
    """CHRONOWHEEL_FUZZ_SEED, or a fresh one (printed, so a failing run can be repeated)."""
    raw = os.environ.get("CHRONOWHEEL_FUZZ_SEED", "")
    seed = int(raw) if raw else secrets.randbelow(2**31)
    print(f"fuzz seed {seed} (CHRONOWHEEL_FUZZ_SEED={seed} repeats it)")
    return seed
