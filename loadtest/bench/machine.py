"""The machine a benchmark ran on: CPUs, memory, versions of Python, Java, Kafka, Cassandra."""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from chronowheel.settings import Settings
from chronowheel.store.cassandra import connect
from common import ROOT


def _first_match(path: str, pattern: str) -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1).strip() if m else None


def _proc_cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _java_version(java: str) -> str | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else None


def _kafka_process() -> tuple[str | None, str | None]:
    """(java binary, Kafka version) of a local broker process, when one can be seen."""
    for cmdline_path in glob.glob("/proc/[0-9]*/cmdline"):
        pid = cmdline_path.split("/")[2]
        args = _proc_cmdline(pid)
        if "kafka.Kafka" not in args:
            continue
        java: str | None = None
        with contextlib.suppress(OSError):
            java = os.readlink(f"/proc/{pid}/exe")
        version = None
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            m = re.search(r"kafka_[0-9.]+-([0-9][0-9A-Za-z.\-]*?)\.jar", env)
            version = m.group(1) if m else None
        return java, version
    return None, None


def _pinned(pom: Path, prop: str) -> str | None:
    return _first_match(str(pom), rf"<{re.escape(prop)}>([^<]+)</")


def machine_info(settings: Settings) -> dict[str, Any]:
    java_bin, kafka_version = _kafka_process()
    java = _java_version(java_bin or "java")
    cassandra_version = None
    with contextlib.suppress(Exception):
        cluster, session = connect(settings)
        try:
            row = session.execute("SELECT release_version FROM system.local").one()
            cassandra_version = str(row[0])
        finally:
            cluster.shutdown()
    mem_kb = _first_match("/proc/meminfo", r"^MemTotal:\s+(\d+)")
    code = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, timeout=10,
                              capture_output=True, text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "services", "pyproject.toml"],
                               cwd=ROOT, timeout=10, capture_output=True, text=True,
                               check=False).stdout.strip()
        code = head + (" with uncommitted changes under services/" if dirty else "")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": _first_match("/proc/cpuinfo", r"^model name\s*:\s*(.+)$") or platform.processor(),
        "memory_gib": round(int(mem_kb) / 1024 / 1024, 1) if mem_kb else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": java,
        "kafka": kafka_version or (
            (_pinned(ROOT / "deploy/local/kafka/pom.xml", "kafka.version") or "?")
            + " (pinned in deploy/local)"),
        "cassandra": cassandra_version,
        "loadavg_start": os.getloadavg(),
        "code": code,
    }


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, {m['os']}; Python "
            f"{m['python']}; Java: {m['java']}; Kafka {m['kafka']}; Cassandra {m['cassandra']}; "
            f"code {m.get('code')}; load average at start "
            f"{' '.join(f'{x:.2f}' for x in m['loadavg_start'])}, at end "
            f"{' '.join(f'{x:.2f}' for x in m.get('loadavg_end', ()))}")
