"""The design document is the one the code and docs cite, and the sections they cite exist."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"
SCANNED = ("README.md", "docs", "schema", "deploy", "services", "tests", "loadtest")
SKIPPED_PARTS = {".venv", "__pycache__", ".git", ".state"}
# docs/design.md followed by ", section" and the quoted heading (which may wrap onto the
# next line), also when the file name is a Markdown link.
CITATION = re.compile(r"design\.md\)?,\s+section\s+\"([^\"]+)\"")
# Spelt in two parts so that this file does not cite it.
ABSENT_DOC = "DESIGN" + ".md"


def text_files() -> Iterator[Path]:
    for name in SCANNED:
        root = REPO / name
        paths = [root] if root.is_file() else root.rglob("*")
        for path in paths:
            if path.suffix in {".py", ".md", ".cql", ".json", ".toml"} and path.is_file() \
                    and not SKIPPED_PARTS.intersection(path.relative_to(REPO).parts) \
                    and not any(p.endswith(".egg-info") for p in path.parts):
                yield path


def headings() -> set[str]:
    return {m.group(1).strip()
            for m in re.finditer(r"^#{1,6} (.+)$", DESIGN.read_text(), re.MULTILINE)}


def test_every_cited_section_of_the_design_exists() -> None:
    known = headings()
    cited: list[tuple[str, str]] = []
    for path in text_files():
        for m in CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            cited.append((str(path.relative_to(REPO)), " ".join(m.group(1).split())))
    assert cited, "expected the code to cite docs/design.md by section"
    missing = [(where, name) for where, name in cited if name not in known]
    assert not missing, f"sections cited but not in docs/design.md: {missing}"


def test_nothing_cites_a_design_document_the_repository_does_not_hold() -> None:
    citing = [str(p.relative_to(REPO)) for p in text_files()
              if ABSENT_DOC in p.read_text(encoding="utf-8", errors="replace")]
    assert not citing, f"cite docs/design.md instead: {citing}"


def test_in_page_links_of_the_design_resolve() -> None:
    text = DESIGN.read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings()}
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links <= anchors, links - anchors
