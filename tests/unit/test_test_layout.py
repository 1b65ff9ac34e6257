"""The test folders are not packages (no __init__.py), so pytest imports each test module by
its file name alone: two test modules of one name in different folders make a whole run fail
at collection ("import file mismatch"), which a run of either folder alone never shows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique_across_the_test_folders() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if (path.parent / "__init__.py").exists():
            continue  # imported under its package's name
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert clashes == {}
