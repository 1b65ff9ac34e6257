"""The unit tier's way into the load-test kit: its scripts are not a package and import their
siblings by bare name, so each is imported with its folder on `sys.path` for that import only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

LOADTEST = Path(__file__).resolve().parents[2] / "loadtest"
BENCH = LOADTEST / "bench"


def load(name: str, folder: Path = LOADTEST) -> ModuleType:
    """The module `name` of `folder` (`loadtest/` by default, or `BENCH`)."""
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
