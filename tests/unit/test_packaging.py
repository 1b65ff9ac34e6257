"""Nothing in the package looks for the checkout around it (the fault harness and the local
stack stay in the checkout: testkit/, deploy/local/), read from the sources. Building the wheel
and running it installed outside the checkout needs the package index and tens of seconds:
tests/deploy/test_wheel_package.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "services" / "chronowheel"
# Only in a checkout: the fault harness, the local stack, the load tools and the tests.
CHECKOUT_ONLY = ("testkit", "deploy", "loadtest", "tests")


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants of a module other than its docstrings."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                          | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_of_the_package_looks_for_the_checkout_around_it() -> None:
    """Nothing finds files relative to where the package is installed (`__file__` and its
    parents), and nothing imports the checkout's harness. The two commands that name a
    checkout's folders do so as text only: `stack` looks in the folder it is run in and says
    clearly when that is no checkout, `capacity` names where its shipped figures came from."""
    named_checkout: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, rel)
        assert "__file__" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}, rel
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module or ""])
                assert not any(m.split(".")[0] in CHECKOUT_ONLY for m in modules), (rel, modules)
        for const in _code_strings(tree):
            first = const.value.strip("`'\" ").split("/", 1)[0]
            if first in CHECKOUT_ONLY and (
                    "/" in const.value or const.value in CHECKOUT_ONLY):
                named_checkout.setdefault(rel, []).append(const.value)
    assert set(named_checkout) <= {"chronowheel/cli/stack.py", "chronowheel/cli/capacity.py"}, \
        named_checkout


def test_every_kafka_compression_codec_can_be_read() -> None:
    # A producer may compress with any codec Kafka knows; a node that cannot decompress one
    # record stops reading its partition (and did: one zstd record stopped the node).
    from aiokafka.codec import has_gzip, has_lz4, has_snappy, has_zstd

    assert has_gzip() and has_snappy() and has_lz4() and has_zstd()
