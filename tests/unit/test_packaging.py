"""The built wheel is self-contained: installed outside the checkout, `init` finds its schema.

The wheel is built from a copy of the sources (so no stale `build/` directory of the checkout
can leak into it), installed without dependencies into a new virtualenv in a temporary
directory, and imported from there. That virtualenv borrows the test interpreter's third-party
packages through a `.pth` line; `.pth` files inside a borrowed directory are not executed, so
the editable install of the checkout stays invisible and `chronowheel` can only come from the
wheel. Building fetches the build backend (setuptools) from the package index, as
`./run bootstrap` does.
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

REPO = Path(__file__).resolve().parents[2]
CQL_IN_PACKAGE = "chronowheel/schema/cassandra.cql"
CORE_TABLES = {"meta", "jobs", "due", "bucket_counts"}


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


def test_an_install_outside_the_checkout_loads_the_schema_init_applies(
        wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
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

    # The function object `chronowheel init` (admin.init_namespace) applies, not a copy of it.
    probe = (
        "import json, chronowheel, chronowheel.admin as admin\n"
        "print(json.dumps({'package': chronowheel.__file__,\n"
        "                  'statements': admin.cql_statements('cw_pkg', 3)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
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


def test_every_kafka_compression_codec_can_be_read() -> None:
    # A producer may compress with any codec Kafka knows; a node that cannot decompress one
    # record stops reading its partition (and did: one zstd record stopped the node).
    from aiokafka.codec import has_gzip, has_lz4, has_snappy, has_zstd

    assert has_gzip() and has_snappy() and has_lz4() and has_zstd()
