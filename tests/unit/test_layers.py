"""The package's floors: a module imports only from its own floor or below.

    4  console, cli (and what runs them: demo, testing, __main__)
    3  node, worker, client, ops (and admin, acl: namespace set-up and rights)
    2  store, bus (and observe: the HTTP endpoint and tracing)
    1  core
    0  settings, errors, the other one-module helpers, the wire contract (core/wire.py) and
       core/limits.py, which settings read

Every import counts: at the top of a module, inside a function (the lazy ones that keep the
CLI's start fast), under `if TYPE_CHECKING:`. Imports are read from the source (ast), nothing
is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import chronowheel

PACKAGE = Path(chronowheel.__file__).parent

FLOORS: dict[str, int] = {
    "chronowheel": 0,  # the package's __init__ (its version)
    "chronowheel.errors": 0,
    "chronowheel.settings": 0,
    "chronowheel.security": 0,
    "chronowheel.retry": 0,
    "chronowheel.timeouts": 0,
    "chronowheel.supervise": 0,
    "chronowheel.logs": 0,
    "chronowheel.schema": 0,
    "chronowheel.core.wire": 0,
    "chronowheel.core.limits": 0,
    "chronowheel.core": 1,
    "chronowheel.store": 2,
    "chronowheel.bus": 2,
    "chronowheel.observe": 2,
    "chronowheel.history": 2,  # the run history writer, under the node and the worker
    "chronowheel.node": 3,
    "chronowheel.worker": 3,
    "chronowheel.client": 3,
    "chronowheel.ops": 3,
    "chronowheel.admin": 3,
    "chronowheel.acl": 3,
    "chronowheel.console": 4,
    "chronowheel.cli": 4,
    "chronowheel.demo": 4,
    "chronowheel.testing": 4,
    "chronowheel.__main__": 4,
}

# Imports between two packages of one floor that are refused all the same: (importer, imported)
# prefixes, with the reason.
SIDEWAYS_REFUSED: dict[tuple[str, str], str] = {
    ("chronowheel.console", "chronowheel.cli"):
        "the CLI starts the console; what both show is read in chronowheel.ops",
}

# Upward imports tolerated for now, each with its reason: (importer module, imported module).
ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = ("chronowheel", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(name: str) -> int | None:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        prefix = ".".join(parts[:i])
        if prefix in FLOORS:
            return FLOORS[prefix]
    return FLOORS.get(name)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import of chronowheel in the module, wherever it is."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base_parts = base_parts[:len(base_parts) - drop]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                # `from chronowheel.core import wire` imports the module chronowheel.core.wire
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in MODULES else base


def edges() -> Iterator[tuple[str, int, str]]:
    return iter(_edges())


@cache
def _edges() -> tuple[tuple[str, int, str], ...]:
    """Every module parsed once per test process: the tests here read the same sources."""
    return tuple((module, line, imported)
                 for module, path in MODULES.items()
                 for line, imported in imports(module, path)
                 if within(imported, "chronowheel"))


def test_every_module_has_a_floor() -> None:
    missing = sorted(m for m in MODULES if floor_of(m) is None)
    assert not missing, f"modules without a floor (add them to FLOORS): {missing}"


def test_the_import_reader_sees_lazy_and_aliased_imports() -> None:
    found = {(m, i) for m, _, i in edges()}
    # inside a function (cli/status.py's run), and `from package import module`
    assert ("chronowheel.cli.status", "chronowheel.ops.cluster") in found
    assert ("chronowheel.settings", "chronowheel.core.wire") in found
    assert floor_of("chronowheel.core.model") == 1 and floor_of("chronowheel.core.wire") == 0
    assert floor_of("chronowheel.ops.status") == 3 and floor_of("chronowheel") == 0


def test_no_module_imports_from_a_higher_floor() -> None:
    upward = []
    for module, line, imported in edges():
        low, high = floor_of(module), floor_of(imported)
        if low is None or high is None or high <= low:
            continue
        if (module, imported) in ALLOWED:
            continue
        upward.append(f"{module} (floor {low}) imports {imported} (floor {high}), "
                      f"{MODULES[module].relative_to(PACKAGE)}:{line}")
    assert not upward, "imports from a higher floor:\n" + "\n".join(upward)


def test_refused_sideways_imports() -> None:
    found = [f"{module} imports {imported} ({MODULES[module].relative_to(PACKAGE)}:{line}): "
             f"{reason}"
             for module, line, imported in edges()
             for (src, dst), reason in SIDEWAYS_REFUSED.items()
             if within(module, src) and within(imported, dst)]
    assert not found, "\n".join(found)


def test_the_allow_list_holds_only_imports_that_exist() -> None:
    found = {(m, i) for m, _, i in edges()}
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"allowed imports that no longer exist (remove them): {stale}"
