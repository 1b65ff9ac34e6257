"""How long the stack's servers take to start, and how much CPU, with and without their class
archives (`deploy/local/stack.py`, CHRONOWHEEL_STACK_CDS).

Each round starts the servers of a throwaway state folder with `stack.py --json up` (its
`seconds` until each answered), reads each server's CPU from /proc at that moment, and stops
them with `down`; the rounds alternate with the archives (CHRONOWHEEL_STACK_CDS=1) and
without (0), each on a state folder of its own that an uncounted first round made (a restart
on its data). The archives must exist already (a first `up` and `down` writes them).
The ports are the profile's: stop a stack of that profile that is running first.

    .venv/bin/python loadtest/bench/server_start.py --rounds 3 [SERVER...]
    .venv/bin/python loadtest/bench/server_start.py --rounds 3 --profile cluster --fresh

`--fresh`: a fresh state folder for every round (the cluster profile from empty).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STACK = Path(__file__).resolve().parents[2] / "deploy" / "local" / "stack.py"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def stack(state: Path, profile: str, cds: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CHRONOWHEEL_STATE_DIR=str(state), CHRONOWHEEL_STACK_CDS=cds)
    return subprocess.run([sys.executable, str(STACK), "--profile", profile, *args], env=env,
                          capture_output=True, text=True, check=False)


def one_round(state: Path, profile: str, cds: str, servers: list[str]) -> dict[str, object]:
    t0 = time.monotonic()
    up = stack(state, profile, cds, "--json", "up", *servers)
    wall = time.monotonic() - t0
    if up.returncode != 0:
        raise SystemExit(f"up failed ({up.returncode}):\n{up.stderr[-2000:]}")
    status = json.loads(stack(state, profile, cds, "--json", "status").stdout)
    cpu = {name: round(cpu_s(info["pid"]), 2) for name, info in status.items()
           if isinstance(info, dict) and info.get("pid")}
    down = stack(state, profile, cds, "down")
    if down.returncode != 0:
        raise SystemExit(f"down failed ({down.returncode}):\n{down.stderr[-2000:]}")
    return {"cds": cds, "up_s": round(wall, 1), "answered_s": json.loads(up.stdout)["seconds"],
            "cpu_s": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("servers", nargs="*", help="as for `stack.py up` (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--profile", default="plain", choices=("plain", "cluster"))
    parser.add_argument("--fresh", action="store_true", help="a fresh state folder each round")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="server-start-"))
    results: list[dict[str, object]] = []
    try:
        if not args.fresh:  # the first start of a state folder formats and creates: not counted
            for cds in ("1", "0"):
                one_round(base / f"s{cds}" / "stack", args.profile, cds, args.servers)
        for i in range(args.rounds):
            for cds in ("1", "0"):
                state = base / (f"s{cds}-{i}" if args.fresh else f"s{cds}") / "stack"
                result = one_round(state, args.profile, cds, args.servers)
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for cds, label in (("0", "without archives"), ("1", "with archives")):
        mine = [r for r in results if r["cds"] == cds]
        ups = [float(r["up_s"]) for r in mine]  # type: ignore[arg-type]
        cpu: dict[str, list[float]] = {}
        for r in mine:
            for name, value in r["cpu_s"].items():  # type: ignore[attr-defined]
                cpu.setdefault(name.rstrip("0123456789-"), []).append(value)
        parts = ", ".join(f"{kind} CPU {min(v):.1f}-{max(v):.1f} s (median "
                          f"{statistics.median(v):.1f})" for kind, v in sorted(cpu.items()))
        print(f"{label}: up {min(ups):.1f}-{max(ups):.1f} s (median "
              f"{statistics.median(ups):.1f}); {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
