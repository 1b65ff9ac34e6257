"""`chronowheel node` as a child process: started with a namespace's settings, its metrics port
found in its log, its /healthz and /metrics read, stopped with SIGTERM (killed past a deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from chronowheel.settings import Settings, env_name

if TYPE_CHECKING:
    from chronowheel.node.service import Node

# What the node logs once its HTTP endpoint listens (observe/http.py).
PORT_MARKER = "serving /metrics and /healthz on http://127.0.0.1:"


class NodeProcessError(RuntimeError):
    """The node process exited, or did not get ready in time (the message ends with its log)."""


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {'name{labels}': value} (comments and unparsable lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def metric_sum(metrics: Mapping[str, float], name: str) -> float:
    """Sum of a metric over all its label sets."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


async def wait_owned(node: Node, shards: int | None = None, timeout_s: float = 60) -> None:
    """Until an in-process node owns `shards` shards (default: all of its namespace's), each
    taken over; raises NodeProcessError when the node failed or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        want = node.shards if shards is None else shards
        if want and len(node.owned) == want and all(o.actor.ready for o in node.owned.values()):
            return
        if node._failure is not None:
            raise NodeProcessError(f"node failed: {node._failure!r}")
        if time.monotonic() > deadline:
            raise NodeProcessError(f"node owns {sorted(node.owned)} after {timeout_s:.0f}s")
        await asyncio.sleep(0.05)


class NodeProcess:
    """`python -m chronowheel node` for one namespace, logging to `log_path` (appended to).

    `args` runs another subcommand instead (e.g. `worker --topic ... --handler ...`) with the
    same environment, log and stop; the port, /healthz and /metrics are a node's."""

    def __init__(self, settings: Settings, log_path: Path, *, name: str = "node",
                 env: Mapping[str, str] | None = None, profile_path: Path | None = None,
                 cwd: Path | None = None, args: Sequence[str] = ("node",)) -> None:
        self.settings = settings
        self.args = tuple(args)
        self.log_path = log_path
        self.name = name
        self.env = dict(env or {})
        """CHRONOWHEEL_* (or other) variables for the child, over the namespace's"""
        self.profile_path = profile_path
        """run the node under cProfile and write its stats here"""
        self.cwd = cwd
        self.args_prefix: list[str] = []
        """a command that runs the node (e.g. in a network namespace of its own)"""
        self.proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_start = 0  # where this run's lines begin in the (appended) log
        self._terminated = False  # SIGTERM sent to the running process

    def start(self, **env_overrides: str) -> None:
        env = dict(os.environ)
        env.update({
            env_name("namespace"): self.settings.namespace,
            env_name("cassandra"): self.settings.cassandra,
            env_name("kafka"): self.settings.kafka,
            # always, "" too: not a keyspace of this process's environment
            env_name("cassandra_keyspace"): self.settings.cassandra_keyspace,
            env_name("http_port"): "0",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.env)
        env.update(env_overrides)
        cmd = [*self.args_prefix, sys.executable]
        if self.profile_path is not None:
            cmd += ["-m", "cProfile", "-o", str(self.profile_path)]
        cmd += ["-m", "chronowheel", *self.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._port = None  # a restarted node listens on a new port
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self._log_start = log.tell()
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.cwd)
        self._terminated = False

    # --- the process ------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None, "start() first"
        self.proc.send_signal(sig)
        if sig == signal.SIGTERM:
            self._terminated = True

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (which also ends a SIGSTOPped process) and reap it."""
        self.signal(signal.SIGKILL)
        self.wait()

    def stop(self, timeout_s: float = 60) -> int | None:
        """SIGTERM (a graceful stop), then SIGKILL past `timeout_s`; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            # Once: a node takes a second SIGTERM as "abort now" (an impatient operator's
            # second Ctrl-C), which would turn a graceful stop into a crash.
            if not self._terminated:
                self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode

    def rss_bytes(self) -> int | None:
        """Resident memory (VmRSS) of the process, where /proc has it."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    # --- its log ----------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]

    def http_port(self) -> int | None:
        """The port of /metrics and /healthz, once the node logged it."""
        if self._port is None:
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(self._log_start)
                    text = f.read().decode(errors="replace")
            except OSError:
                return None
            for line in text.splitlines():
                if PORT_MARKER in line:
                    self._port = int(line.split(PORT_MARKER, 1)[1].split()[0])
                    break
        return self._port

    # --- its endpoint -----------------------------------------------------------------------
    def http_get(self, path: str, timeout_s: float = 20) -> tuple[int, bytes]:
        """(status, body) of GET path; raises OSError when the node does not answer."""
        port = self.http_port()
        if port is None:
            raise ConnectionError(f"{self.name} has not logged its HTTP port yet")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                        timeout=timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:  # /healthz answers 503 when unhealthy
            return e.code, e.read()

    def health(self, timeout_s: float = 2) -> dict[str, Any] | None:
        """/healthz as a dict (also when unhealthy), None when it does not answer."""
        try:
            _status, body = self.http_get("/healthz", timeout_s)
            return dict(orjson.loads(body))
        except (OSError, ValueError):
            return None

    def metrics(self, timeout_s: float = 20) -> dict[str, float]:
        """/metrics as {'name{labels}': value}; raises OSError when the node does not answer."""
        _status, body = self.http_get("/metrics", timeout_s)
        return parse_metrics(body.decode())

    async def wait_owning(self, predicate: Callable[[list[int]], bool], timeout_s: float = 90,
                          *, progress: Callable[[list[int] | None], None] | None = None,
                          progress_every_s: float = 5.0) -> list[int]:
        """Poll /healthz until the shards the node owns satisfy `predicate`; return them.
        `progress` is told the shards owned so far every `progress_every_s` while waiting."""
        deadline = time.monotonic() + timeout_s
        next_progress = time.monotonic() + progress_every_s
        while True:
            h = await asyncio.to_thread(self.health)
            shards = None if h is None else list(h.get("shards", []))
            if shards is not None and predicate(shards):
                return shards
            if not self.alive():
                raise NodeProcessError(f"{self.name} exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise NodeProcessError(f"{self.name}: shards {shards} after {timeout_s:.0f}s\n"
                                       f"{self.log_tail()}")
            if progress is not None and time.monotonic() >= next_progress:
                progress(shards)
                next_progress = time.monotonic() + progress_every_s
            await asyncio.sleep(0.2)

    async def wait_ready(self, timeout_s: float = 120, **kw: Any) -> list[int]:
        """Until the node owns every shard of the namespace (settings.shards)."""
        shards = self.settings.shards
        return await self.wait_owning(lambda owned: len(owned) == shards, timeout_s, **kw)
