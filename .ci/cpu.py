"""Where the CPU of a CI step went: the machine's, and the stack's servers' (Linux /proc).

    python .ci/cpu.py start FILE PID...   record the machine's CPU counters and each server's
    python .ci/cpu.py report FILE         print what was used since, per server and the rest

The rest is everything else on the machine: the test processes, the nodes and workers they
start, servers started during the step (the secured pair the security tests start and stop),
and whatever else runs there. A server that exited before the report is not counted apart:
its share lands in the rest.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, float]:
    """Seconds of all cores together: busy, idle, waiting for the disk."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return {"busy": (user + nice + system + irq + softirq + steal) / TICKS,
            "idle": idle / TICKS, "iowait": iowait / TICKS}


def process_cpu(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def process_name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    for arg in args:
        if arg.startswith(b"-Dchronowheel.stack="):
            return Path(arg.split(b"=", 1)[1].decode()).name
    return str(pid)


def start(file: Path, pids: list[int]) -> None:
    servers = {str(pid): {"name": process_name(pid), "cpu": process_cpu(pid)} for pid in pids}
    file.write_text(json.dumps({"wall": time.monotonic(), "machine": machine(),
                                "servers": servers}))


def report(file: Path) -> None:
    before = json.loads(file.read_text())
    wall = time.monotonic() - before["wall"]
    now = machine()
    used = {k: now[k] - before["machine"][k] for k in now}
    cores = os.cpu_count() or 1
    total = sum(used.values()) or 1.0
    print(f"cpu over {wall:.0f} s on {cores} cores: busy {used['busy']:.0f} s "
          f"({100 * used['busy'] / total:.0f} %), idle {used['idle']:.0f} s, "
          f"waiting for the disk {used['iowait']:.0f} s")
    servers_total = 0.0
    for pid, info in before["servers"].items():
        cpu = process_cpu(int(pid))
        if cpu is None or info["cpu"] is None:
            print(f"  {info['name']}: gone before the end")
            continue
        spent = cpu - info["cpu"]
        servers_total += spent
        share = 100 * spent / max(used["busy"], 1)
        print(f"  {info['name']}: {spent:.0f} s ({share:.0f} % of busy)")
    rest = used["busy"] - servers_total
    print(f"  the rest (tests, their nodes and workers, anything else): {rest:.0f} s "
          f"({100 * rest / max(used['busy'], 1):.0f} % of busy)")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "start":
        start(Path(argv[1]), [int(p) for p in argv[2:]])
        return 0
    if len(argv) == 2 and argv[0] == "report":
        report(Path(argv[1]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
