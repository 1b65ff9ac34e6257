"""Control of the local stack's cluster profile (`./run stack up --profile cluster`) for
fault tests: which server is which, kill -9 one of them, start it again, find the Kafka broker
leading the most partitions of some topics and the active KRaft controller.

The layout (addresses, pids, folders) comes from the stack script's `status --json`, and a
restart is the script's `up <server>`, which waits until the server answers and the whole
cluster has formed again: nothing about ports or folders is repeated here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronowheel.bus.kafka import open_admin
from chronowheel.settings import Settings

from testkit import STACK_SCRIPT

STATE_DIR_ENV = "CHRONOWHEEL_CLUSTER_STATE_DIR"
"""The cluster profile's state folder (default: the plain stack's folder + `-cluster`)."""


class ClusterError(RuntimeError):
    """The cluster is not up, or a server did not stop or start as asked."""


@dataclass(frozen=True)
class Member:
    """One server of the cluster profile, as `stack.py status --json` describes it."""

    name: str
    """cassandra-1..3, kafka-1..3"""
    kind: str
    member: int
    """1..3; for Kafka also its node.id"""
    address: str
    ready: bool
    pid: int | None
    home: Path
    log: Path


def default_state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    plain = os.environ.get("CHRONOWHEEL_STATE_DIR")
    base = Path(plain).expanduser() if plain else Path.home() / ".cache" / "chronowheel" / "stack"
    return base.with_name(base.name + "-cluster")


class LocalCluster:
    """The cluster profile of the local stack in `state_dir`."""

    def __init__(self, state_dir: Path | None = None, script: Path | None = None) -> None:
        self.state_dir = (state_dir or default_state_dir()).resolve()
        self.script = script or STACK_SCRIPT

    def _stack(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(self.script), "--profile", "cluster", "--state-dir",
             str(self.state_dir), "--json", *args],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout_s,
            check=False)

    # --- layout -------------------------------------------------------------------------------
    def members(self) -> dict[str, Member]:
        out = self._stack("status")
        if out.returncode not in (0, 3) or not out.stdout.strip():
            raise ClusterError(f"stack status failed (exit {out.returncode}): {out.stderr}")
        raw: dict[str, dict[str, Any]] = json.loads(out.stdout)
        return {name: Member(name, info["kind"], int(info["member"]), info["address"],
                             bool(info["ready"]), info["pid"], Path(info["home"]),
                             Path(info["log"]))
                for name, info in raw.items()}

    def require_up(self) -> dict[str, Member]:
        members = self.members()
        down = [m.name for m in members.values() if not (m.ready and m.pid)]
        if down:
            raise ClusterError(
                f"the cluster profile is not fully up ({', '.join(down)} down, state "
                f"{self.state_dir}): start it with `./run stack up --profile cluster`")
        return members

    def addresses(self) -> tuple[str, str]:
        """(Cassandra contact points, Kafka bootstrap servers) of the whole cluster."""
        members = self.members().values()
        return (",".join(m.address for m in members if m.kind == "cassandra"),
                ",".join(m.address for m in members if m.kind == "kafka"))

    # --- faults -------------------------------------------------------------------------------
    def kill(self, name: str, timeout_s: float = 30) -> float:
        """SIGKILL one server (no shutdown of any kind); return when it is gone, in seconds."""
        member = self.members()[name]
        if member.pid is None:
            raise ClusterError(f"{name} is not running")
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(member.pid, signal.SIGKILL)
        while _alive(member.pid):
            if time.monotonic() - t0 > timeout_s:
                raise ClusterError(f"{name} (pid {member.pid}) survived SIGKILL for {timeout_s}s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def start(self, name: str, timeout_s: float = 300) -> float:
        """Start one server again and wait until it answers and the cluster has formed; return
        the seconds that took."""
        t0 = time.monotonic()
        out = self._stack("up", name, "--timeout", str(timeout_s), timeout_s=timeout_s + 60)
        if out.returncode != 0:
            raise ClusterError(f"starting {name} failed (exit {out.returncode}):\n"
                               f"{out.stderr[-3000:]}")
        return time.monotonic() - t0

    def start_all(self, timeout_s: float = 300) -> list[str]:
        """Start whatever of the cluster is down; the names of the servers started."""
        out = self._stack("up", "--timeout", str(timeout_s), timeout_s=timeout_s + 120)
        if out.returncode != 0:
            raise ClusterError(f"the cluster profile did not come up (exit {out.returncode}):"
                               f"\n{out.stderr[-3000:]}")
        return list(json.loads(out.stdout)["started"])

    def stop_all(self, names: Iterable[str] = ()) -> None:
        """Stop the named servers (default: all) gracefully."""
        out = self._stack("down", *names, timeout_s=300)
        if out.returncode != 0:
            raise ClusterError(f"stopping the cluster failed: {out.stderr[-2000:]}")

    # --- Kafka roles --------------------------------------------------------------------------
    async def partition_leaders(self, settings: Settings,
                                topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """{(topic, partition): id of its leader broker} (-1 while it has none)."""
        admin = await open_admin(settings)
        try:
            out: dict[tuple[str, int], int] = {}
            for desc in await admin.describe_topics(sorted(set(topics))):
                for p in desc.get("partitions", []):
                    out[(desc["topic"], int(p["partition"]))] = int(p["leader"])
            return out
        finally:
            await admin.close()

    async def busiest_leader(self, settings: Settings, topics: Iterable[str]) -> tuple[str, int]:
        """(server name, partitions led) of the broker leading the most partitions of
        `topics`; the lowest id wins a tie."""
        leaders = Counter((await self.partition_leaders(settings, topics)).values())
        leaders.pop(-1, None)
        if not leaders:
            raise ClusterError("no partition of those topics has a leader")
        broker, count = min(leaders.items(), key=lambda kv: (-kv[1], kv[0]))
        return self.kafka_name(broker), count

    async def wait_in_sync(self, settings: Settings, topics: Iterable[str], replicas: int,
                           timeout_s: float = 120) -> float:
        """Until every partition of `topics` has a leader and `replicas` in-sync replicas;
        the seconds that took."""
        names = sorted(set(topics))
        t0 = time.monotonic()
        lagging: list[str] = []
        while True:
            admin = await open_admin(settings)
            try:
                lagging = [f"{d['topic']}/{p['partition']} isr={p['isr']}"
                           for d in await admin.describe_topics(names)
                           for p in d.get("partitions", [])
                           if p["leader"] < 0 or len(p["isr"]) < replicas]
            finally:
                await admin.close()
            if not lagging:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise ClusterError(f"partitions not back in sync after {timeout_s:.0f}s: "
                                   f"{lagging[:6]}")
            await asyncio.sleep(0.5)

    def quorum_leader(self) -> str | None:
        """The server name of the KRaft quorum's leader (the active controller) as the live
        nodes know it now, or None while none knows one (an election under way).

        Read from the quorum state each controller keeps beside its metadata log (a broker
        answers a client's metadata request with an arbitrary broker as "controller" under
        KRaft, so the admin API cannot tell); the newest epoch among live nodes wins. While
        the survivors of a killed leader stand as candidates, each state reads leaderId -1,
        so "no leader known" is a normal moment of a failover, not an error.
        """
        best: tuple[int, int] | None = None
        for m in self.members().values():
            if m.kind != "kafka" or m.pid is None:
                continue
            state_file = m.home / "data" / "__cluster_metadata-0" / "quorum-state"
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(state_file.read_text())
                leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
                if leader > 0 and (best is None or epoch > best[0]):
                    best = (epoch, leader)
        return None if best is None else self.kafka_name(best[1])

    def active_controller(self, timeout_s: float = 60, poll_s: float = 0.2) -> str:
        """The quorum's leader, waiting up to `timeout_s` while an election is under way."""
        t0 = time.monotonic()
        while (leader := self.quorum_leader()) is None:
            if time.monotonic() - t0 > timeout_s:
                raise ClusterError(f"no live Kafka node knew a quorum leader for {timeout_s:.0f}s")
            time.sleep(poll_s)
        return leader

    def kafka_name(self, node_id: int) -> str:
        for m in self.members().values():
            if m.kind == "kafka" and m.member == node_id:
                return m.name
        raise ClusterError(f"no Kafka node with id {node_id}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is dead
            return False
    return True
