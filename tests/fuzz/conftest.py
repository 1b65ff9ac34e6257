"""Fixtures of the fuzz suite: its size and seed (see tests/fuzz/__init__.py)."""

from __future__ import annotations

import os
import secrets

import pytest

DEFAULT_COMMANDS = 300


@pytest.fixture
def fuzz_commands() -> int:
    """How many commands a run sends: CHRONOWHEEL_FUZZ_COMMANDS, default 300 (CI size)."""
    return int(os.environ.get("CHRONOWHEEL_FUZZ_COMMANDS", "") or DEFAULT_COMMANDS)


@pytest.fixture
def fuzz_seed() -> int:
    """CHRONOWHEEL_FUZZ_SEED, or a fresh one (printed, so a failing run can be repeated)."""
    raw = os.environ.get("CHRONOWHEEL_FUZZ_SEED", "")
    seed = int(raw) if raw else secrets.randbelow(2**31)
    print(f"fuzz seed {seed} (CHRONOWHEEL_FUZZ_SEED={seed} repeats it)")
    return seed
