"""The locust kit against the secured local stack (Kafka SASL_SSL + SCRAM-SHA-512, Cassandra TLS
+ password): configured only by CHRONOWHEEL_* variables and `..._FILE` secrets, as every
command is, it loads a namespace served by a node, its jobs fire and are measured, and no
password shows in its output or in any command line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.security.support import REPO, Secured

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.timeout(300)]


def _ps() -> str:
    return subprocess.run(["ps", "-eo", "pid,args", "--no-headers", "-ww"], capture_output=True,
                          text=True, check=True).stdout


async def test_the_locust_kit_loads_the_secured_stack(secured: Secured, secured_ns: str,
                                                      tmp_path: Path) -> None:
    ns = secured_ns
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log:
        node = subprocess.Popen(
            [sys.executable, "-m", "chronowheel", "node", "--namespace", ns, "--http-port", "0"],
            env=secured.child_env("node", "node"), cwd=REPO, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while log_path.read_text(errors="replace").count(": taken over") < 2:  # both shards
            assert node.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            await asyncio.sleep(0.2)

        locust = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py"),
            "--headless", "-u", "2", "-r", "2", "-t", "12s", "--namespace", ns,
            "--cw-rate", "10", "--cw-lead-s", "1.5", "--csv", str(tmp_path / "run"),
            "--only-summary", "SteadyUser",
            env=secured.child_env("admin", "admin"), cwd=REPO,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        output = asyncio.create_task(locust.communicate())
        # While it runs: its bridge's command line names files and users, never a password.
        seen_bridge = False
        while not output.done():
            ps = _ps()
            for value in secured.all_secrets():
                assert value not in ps, "a password appears in ps output"
            seen_bridge = seen_bridge or "kafka_bridge.py" in ps
            await asyncio.sleep(0.5)
        assert seen_bridge
        out = (await asyncio.wait_for(output, 150))[0].decode(errors="replace")
        assert locust.returncode == 0, out[-4000:]
        for value in secured.all_secrets():
            assert value not in out, "a password appears in locust's output"
        assert (f"about to load namespace {ns}; Kafka {secured.kafka} (SASL_SSL, SASL "
                f"SCRAM-SHA-512 as admin, CA {secured.ca_file}); Cassandra {secured.cassandra} "
                f"(TLS, CA {secured.ca_file}, user admin") in out, out[-4000:]
        summary = json.loads((tmp_path / "run_chronowheel.json").read_text())
        assert summary["expected_fires"] > 0, summary
        assert summary["received"] == summary["expected_fires"], summary
        assert (summary["missing"], summary["duplicates"], summary["early_fired"],
                summary["early_received"], summary["submit_failed"]) == (0, 0, 0, 0, 0), summary
        assert summary["clock_offset_ms"]["measurements"] >= 1
    finally:
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(10)
