"""`./run test` starts the local stack only when the run may need it: not when every path it is
given is under tests/unit (the `unit_only` function of the `run` script, run here alone)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def unit_only(*args: str) -> bool:
    script = ('eval "$(sed -n \'/^unit_only() {/,/^}/p\' "$ROOT/run")"\n'
              'unit_only "$@"')
    done = subprocess.run(["bash", "-c", script, "unit_only", *args], cwd=REPO,
                          env={"ROOT": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


@pytest.mark.parametrize("args", [
    ("tests/unit",),
    ("./tests/unit/",),
    ("tests/unit/test_clock.py::test_offset_clock", "-q"),
    ("-k", "clock", "tests/unit"),
    ("-m", "not slow", "-p", "no:cacheprovider", "--durations=10", "tests/unit"),
    (str(REPO / "tests" / "unit" / "test_clock.py"), "tests/unit/test_wheel.py"),
])
def test_paths_all_under_tests_unit_start_no_server(args: tuple[str, ...]) -> None:
    assert unit_only(*args)


@pytest.mark.parametrize("args", [
    (),
    ("-q",),
    ("tests",),
    ("tests/unit", "tests/integration"),
    ("tests/unitx",),
    ("tests/unit/../integration",),
    ("-k", "tests/unit"),  # the value of -k is no path
])
def test_any_other_run_starts_the_stack(args: tuple[str, ...]) -> None:
    assert not unit_only(*args)
