"""The node processes of one fault run, and the bounded poller the fault tests wait with."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from chronowheel.settings import Settings
from chronowheel.testing.node_process import NodeProcess, metric_sum

from testkit.verdict import HasTails

POLL_S = 0.1


async def until(cond: Callable[[], bool | Awaitable[bool]], timeout_s: float, what: str,
                nodes: HasTails | None = None, *, thread: bool = False,
                poll_s: float = POLL_S) -> float:
    """Poll `cond` until true; the seconds it took. Fails (AssertionError) after `timeout_s`
    naming `what` and the log tails of `nodes`; an exception `cond` raises ends the wait at
    once. `cond` may be a coroutine function (awaited: e.g. a read from a server). `thread`:
    call `cond` in a worker thread (it may block, e.g. on HTTP)."""
    t0 = time.monotonic()
    while not await _holds(cond, thread):
        if time.monotonic() - t0 > timeout_s:
            tails = nodes.tails() if nodes is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{tails}")
        await asyncio.sleep(poll_s)
    return time.monotonic() - t0


async def _holds(cond: Callable[[], bool | Awaitable[bool]], thread: bool) -> bool:
    result = await asyncio.to_thread(cond) if thread else cond()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


class Fleet:
    """The `chronowheel node` processes of one run, logging to `<log_dir>/<name>.log`;
    whatever still runs at `close()` is killed."""

    def __init__(self, settings: Settings, log_dir: Path, *,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.env = dict(env or {})
        self.cwd = cwd
        self.nodes: list[NodeProcess] = []

    # --- starting and stopping ----------------------------------------------------------------
    def start(self, name: str, **env: str) -> NodeProcess:
        node = NodeProcess(self.settings, self.log_dir / f"{name}.log", name=name,
                           env=self.env, cwd=self.cwd)
        node.start(**env)
        self.nodes.append(node)
        return node

    def start_many(self, count: int) -> list[NodeProcess]:
        """`count` nodes named node-1, node-2, ..."""
        return [self.start(f"node-{len(self.nodes) + 1}") for _ in range(count)]

    def restart(self, node: NodeProcess, **env: str) -> None:
        node.start(**env)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM to every live node at once, then each waited for (SIGKILL past
        `timeout_s`)."""
        for n in self.nodes:
            if n.alive():
                n.signal(signal.SIGTERM)
        for n in self.nodes:
            n.stop(timeout_s)

    def close(self) -> None:
        """SIGKILL whatever still runs (also a SIGSTOPped node) and reap every node."""
        for n in self.nodes:
            if n.alive():
                n.kill()
            elif n.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.wait(30)

    # --- what they do ---------------------------------------------------------------------------
    def dead(self) -> list[str]:
        return [n.name for n in self.nodes if not n.alive()]

    def tails(self, chars: int = 2_500) -> str:
        return "".join(f"\n--- {n.name} log tail ---\n{n.log_tail(chars)}" for n in self.nodes)

    def owned(self, node: NodeProcess) -> set[int] | None:
        """The shards a live, healthy node owns (each taken over), else None."""
        if not node.alive():
            return None
        h = node.health()
        if h is None or not h.get("ok"):
            return None
        return set(h.get("shards", []))

    def sharing(self, *members: NodeProcess) -> bool:
        """Every member (default: every node) healthy and owning some shard; together every
        shard, each once."""
        union: set[int] = set()
        for m in members or tuple(self.nodes):
            mine = self.owned(m)
            if not mine or union & mine:
                return False
            union |= mine
        return union == set(range(self.settings.shards))

    def ingested(self, *members: NodeProcess) -> float:
        total = 0.0
        for m in members or tuple(self.nodes):
            if m.alive() and m.http_port() is not None:
                with contextlib.suppress(OSError):
                    total += metric_sum(m.metrics(timeout_s=5), "chronowheel_ingested_total")
        return total

    # --- waiting --------------------------------------------------------------------------------
    async def until(self, cond: Callable[[], bool], timeout_s: float, what: str) -> float:
        """`until` with this fleet's log tails, `cond` called in a thread (it may do HTTP)."""
        return await until(cond, timeout_s, what, self, thread=True)

    async def wait_sharing(self, timeout_s: float = 120) -> float:
        """Until every node is healthy and they own all shards between them, each once; fails
        at once when a node exited."""
        def check() -> bool:
            if dead := self.dead():
                raise AssertionError(f"nodes exited while waiting for them to share the "
                                     f"shards: {dead}{self.tails()}")
            return self.sharing()

        return await until(check, timeout_s, "the nodes sharing the shards", self, thread=True,
                           poll_s=0.5)
