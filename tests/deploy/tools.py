"""Where the deploy tests find helm, promtool and hadolint, and which metric names the code
exports (collected from the real registries, so the dashboard and alerts are checked against
the code, not against a list kept by hand)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from chronowheel.node.metrics import NodeMetrics
from chronowheel.worker.handling import WorkerStats
from chronowheel.worker.metrics import WorkerMetrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def tool(name: str) -> str:
    """The tool's path: PATH, the project's venv, then where `./run tools` builds it. Missing:
    skipped with the reason, except under CI (CI=true), where .ci/run installs it first and a
    missing tool is a failure."""
    cache = Path(os.environ.get("CHRONOWHEEL_CACHE_DIR",
                                Path.home() / ".cache" / "chronowheel"))
    for candidate in (shutil.which(name), REPO / ".venv" / "bin" / name,
                      cache / "tools" / "bin" / name):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    reason = (f"{name} is not installed (`./run tools` builds helm and promtool; "
              f"`./run bootstrap` installs hadolint)")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def exported_metric_names() -> set[str]:
    """Every series name node and worker can export, with the suffixes Prometheus sees."""
    names = {"up"}  # Prometheus's own, per scrape target
    for registry in (NodeMetrics().registry, WorkerMetrics(WorkerStats()).registry):
        for family in registry.collect():
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
            else:
                names.add(family.name)
    return names


_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan"}


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label matchers,
    grouping lists, ranges and strings left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"(?<![A-Za-z0-9_:])\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])?", "", text)
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        after = text[m.end():].lstrip()
        if after.startswith("(") or word.lower() in _KEYWORDS:
            continue
        out.add(word)
    return out
