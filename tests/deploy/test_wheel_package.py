"""The built wheel is self-contained: installed outside the checkout, `init` finds its schema
and `capacity` its measured figures, and it carries no fault harness (that stays in the
checkout: testkit/, deploy/local/).

The wheel is built from a copy of the sources (so no stale `build/` directory of the checkout
can leak into it), installed without dependencies into a new virtualenv in a temporary
directory, and imported from there. That virtualenv borrows the test interpreter's third-party
packages through a `.pth` line; `.pth` files inside a borrowed directory are not executed, so
the editable install of the checkout stays invisible and `chronowheel` can only come from the
wheel. Building fetches the build backend (setuptools) from the package index, as
`./run bootstrap` does: these tests need the index and take tens of seconds (marker `slow`),
so they live here beside the image's install replay and not in the unit tier
(tests/unit/test_packaging.py keeps the source checks that need neither).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.deploy.tools import REPO

CQL_IN_PACKAGE = "chronowheel/schema/cassandra.cql"
MEASURED_IN_PACKAGE = "chronowheel/cli/measured.json"
CORE_TABLES = {"meta", "jobs", "due", "bucket_counts"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "services", src / "services",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "--wheel-dir", str(out), str(src)],
                   check=True, timeout=300)
    (built,) = out.glob("chronowheel-*.whl")
    return built


def test_the_wheel_carries_the_schema_unchanged(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        assert CQL_IN_PACKAGE in zf.namelist()
        shipped = zf.read(CQL_IN_PACKAGE).decode("utf-8")
    assert shipped == (REPO / "services" / CQL_IN_PACKAGE).read_text(encoding="utf-8")


def test_the_wheel_holds_the_package_and_its_data_but_no_fault_harness(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert zf.read(MEASURED_IN_PACKAGE) == (REPO / "loadtest" / "results" /
                                                "measured.json").read_bytes()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"chronowheel"}, tops
    testing = sorted(n.removeprefix("chronowheel/testing/") for n in names
                     if n.startswith("chronowheel/testing/"))
    assert testing == ["__init__.py", "collect.py", "entry_memory.py", "lateness.py",
                       "local.py", "node_process.py"], testing




@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, dict[str, str]]:
    """(the venv, the environment to run it in) of the wheel installed outside the checkout."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "--no-index", "--quiet", "--disable-pip-version-check",
                    str(wheel)], check=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                                              "'purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    borrowed = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site) / "borrowed_dependencies.pth").write_text("\n".join(sorted(borrowed)) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("CHRONOWHEEL_")}
    return venv, env


def test_an_install_outside_the_checkout_loads_the_schema_init_applies(
        installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    venv, env = installed
    python = venv / "bin" / "python"

    # The function object `chronowheel init` (admin.init_namespace) applies, not a copy of it.
    probe = (
        "import json, chronowheel, chronowheel.admin as admin\n"
        "print(json.dumps({'package': chronowheel.__file__,\n"
        "                  'statements': admin.cql_statements('cw_pkg', 3)}))\n"
    )
    result = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)

    assert Path(found["package"]).is_relative_to(venv), found["package"]
    statements: list[str] = found["statements"]
    assert statements[0].startswith("CREATE KEYSPACE IF NOT EXISTS cw_pkg")
    assert "'replication_factor': 3" in statements[0]
    assert all(" IF NOT EXISTS " in s for s in statements)
    tables = {s.split("cw_pkg.", 1)[1].split()[0] for s in statements
              if s.startswith("CREATE TABLE")}
    assert tables >= CORE_TABLES

    # The console script is installed and reaches the init command.
    help_text = subprocess.run([str(venv / "bin" / "chronowheel"), "init", "--help"],
                               cwd=tmp_path, env=env, check=True, capture_output=True,
                               text=True, timeout=120).stdout
    assert "--shards" in help_text


def test_an_install_outside_the_checkout_plans_capacity_and_refuses_the_local_stack(
        installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    venv, env = installed
    cli = str(venv / "bin" / "chronowheel")
    plan = subprocess.run([cli, "capacity", "--jobs-per-day", "1e6", "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    measured = json.loads(plan.stdout)["measured"]
    assert measured["source"] == "loadtest/results/measured.json, as shipped with chronowheel"
    stack = subprocess.run([cli, "stack", "status"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert stack.returncode != 0
    assert "installed package does not include the local stack" in stack.stderr
    assert "./run stack" in stack.stderr
    # The public test tools import without the checkout's harness.
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import chronowheel.testing as t, chronowheel.testing.entry_memory;"
                            " print(t.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(venv)


