"""A locust file of loadtest/ run headless in the checkout, as the tests of the load kits run
it: one runner, so that each of them waits, times out and reports a failure the same way."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from testkit import REPO
from testkit.fleet import POLL_S, until


def cluster_env(*, kafka: str, cassandra: str, namespace: str,
                cassandra_keyspace: str = "") -> dict[str, str]:
    """This process's environment naming the cluster to load by CHRONOWHEEL_* variables, as
    every command takes it; without the remote guard's override, so that a run meant for the
    servers on this machine is refused if it names others."""
    env = {**os.environ, "CHRONOWHEEL_KAFKA": kafka, "CHRONOWHEEL_CASSANDRA": cassandra,
           "CHRONOWHEEL_NAMESPACE": namespace,
           # always, "" too: not a keyspace of this process's environment
           "CHRONOWHEEL_CASSANDRA_KEYSPACE": cassandra_keyspace}
    env.pop("CHRONOWHEEL_LOADTEST_ALLOW_REMOTE", None)
    return env


async def run_locust(locustfile: Path, args: Sequence[str], env: Mapping[str, str],
                     timeout_s: float, *, watch: Callable[[], object] | None = None,
                     watch_every_s: float = 0.5) -> tuple[int, str]:
    """`python -m locust -f locustfile *args` from the checkout's root: its exit status and
    its output (stdout and stderr together). Past `timeout_s` it is killed and the wait fails
    with the output's tail. `watch`, when given, is called every `watch_every_s` while locust
    runs (to look at the machine meanwhile); an assertion it raises kills locust and fails
    the same way."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "locust", "-f", str(locustfile), *args, env=dict(env), cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    output = asyncio.ensure_future(proc.communicate())

    def finished() -> bool:
        if watch is not None:
            watch()
        return output.done()

    try:
        await until(finished, timeout_s, f"locust -f {locustfile.name} to finish",
                    poll_s=POLL_S if watch is None else watch_every_s)
    except AssertionError as exc:
        if proc.returncode is None:
            proc.kill()
        out, _ = await output
        raise AssertionError(f"{exc}\n{out.decode(errors='replace')[-4000:]}") from None
    finally:
        if proc.returncode is None:  # cancelled (the test's own timeout): leave nothing behind
            proc.kill()
    out, _ = output.result()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")
