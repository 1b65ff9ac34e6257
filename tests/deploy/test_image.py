"""The Dockerfile: lint-clean (hadolint), and its install steps replayed in a fresh virtualenv,
so the image's dependencies cannot drift from pyproject.toml and constraints.txt. There is no
container engine here, so the replay runs the same pip command against the same build
context, with the virtualenv at a temporary path instead of /opt/chronowheel."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.tools import REPO, tool

DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "deploy" / "image" / "constraints.txt"
IMAGE_VENV = "/opt/chronowheel"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def build_stage() -> list[tuple[str, str]]:
    """The instructions of the first stage (the one that installs)."""
    steps = instructions()
    starts = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    return steps[starts[0]:starts[1]]


def pinned(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version
    return out


def test_hadolint_finds_nothing() -> None:
    run = subprocess.run([tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_image_is_pinned_non_root_and_runs_the_console_script() -> None:
    steps = instructions()
    bases = [args.split()[0] for word, args in steps if word == "FROM"]
    assert len(bases) == 2, "a build stage and a runtime stage"
    for base in bases:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    runtime = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][1]:]
    users = [args for word, args in runtime if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert ("ENTRYPOINT", '["chronowheel"]') in runtime
    assert any(w == "COPY" and args.startswith("--from=build") for w, args in runtime)


def test_the_constraints_cover_every_runtime_dependency_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = pinned(CONSTRAINTS)
    for spec in [*project["dependencies"], *project["optional-dependencies"]["otel"]]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency but not pinned in {CONSTRAINTS.name}"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {spec}"


@pytest.mark.slow
def test_replaying_the_install_gives_exactly_the_pinned_packages(tmp_path: Path) -> None:
    stage = build_stage()
    workdir = next(args for word, args in stage if word == "WORKDIR")
    context = tmp_path / "context"
    context.mkdir()
    for word, args in stage:  # COPY src... dest, dest relative to WORKDIR or absolute in it
        if word != "COPY":
            continue
        *sources, dest = shlex.split(args)
        target = context / Path(dest).relative_to(workdir) if dest.startswith("/") \
            else context / dest
        for source in sources:
            src = REPO / source
            into = target / src.name if dest.endswith("/") or len(sources) > 1 else target
            into.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, into, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, into)
    runs = [args for word, args in stage if word == "RUN"]
    assert runs and all("pip install" in r or "venv" in r for r in runs)
    venv = tmp_path / "venv"
    for command in runs:
        # The image's python is the interpreter running this test (same minor version as the
        # base image); pip's cache is kept here so a re-run does not download everything.
        command = command.replace(IMAGE_VENV, str(venv)).replace("--no-cache-dir", "")
        command = re.sub(r"^python ", f"{shlex.quote(sys.executable)} ", command)
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=context,
                             capture_output=True, text=True, check=False, timeout=300)
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
    python = venv / "bin" / "python"
    freeze = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze",
                             "--exclude-editable"], capture_output=True, text=True, check=True)
    installed = {canonicalize_name(n): v for n, _, v in
                 (line.partition("==") for line in freeze.stdout.split())}
    installed.pop("chronowheel")
    for seeded_by_venv in ("pip", "setuptools"):
        installed.pop(seeded_by_venv, None)
    assert installed == pinned(CONSTRAINTS), \
        "the image would install other packages than constraints.txt pins"
    assert subprocess.run([str(python), "-m", "pip", "check"], capture_output=True,
                          check=False).returncode == 0
    for command in ("node", "worker", "init", "submit"):
        helped = subprocess.run([str(venv / "bin" / "chronowheel"), command, "--help"],
                                capture_output=True, text=True, check=False)
        assert helped.returncode == 0, f"chronowheel {command} --help: {helped.stderr}"
