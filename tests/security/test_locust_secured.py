"""The locust kit against the secured local stack (Kafka SASL_SSL + SCRAM-SHA-512, Cassandra TLS
+ password): configured only by CHRONOWHEEL_* variables and `..._FILE` secrets, as every
command is, it loads a namespace served by a node, its jobs fire and are measured, and no
password shows in its output or in any command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.fleet import until
from testkit.locust import run_locust
from tests.security.support import REPO, Secured

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.timeout(300)]


def _ps() -> str:
    return subprocess.run(["ps", "-eo", "pid,args", "--no-headers", "-ww"], capture_output=True,
                          text=True, check=True).stdout


class _Log:
    """The node's log, whose tail a failed wait shows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def tails(self, chars: int = 3000) -> str:
        return "\n" + self.path.read_text(errors="replace")[-chars:]


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
        node_log = _Log(log_path)

        def both_taken_over() -> bool:
            assert node.poll() is None, node_log.tails()
            return log_path.read_text(errors="replace").count(": taken over") >= 2

        await until(both_taken_over, 90, "the node to take over both shards", node_log)

        # While it runs: its bridge's command line names files and users, never a password.
        seen_bridge: list[bool] = []

        def no_password_in_ps() -> None:
            ps = _ps()
            for value in secured.all_secrets():
                assert value not in ps, "a password appears in ps output"
            if "kafka_bridge.py" in ps:
                seen_bridge.append(True)

        code, out = await run_locust(
            REPO / "loadtest" / "locustfile.py",
            ["--headless", "-u", "2", "-r", "2", "-t", "12s", "--namespace", ns,
             "--cw-rate", "10", "--cw-lead-s", "1.5", "--csv", str(tmp_path / "run"),
             "--only-summary", "SteadyUser"],
            secured.child_env("admin", "admin"), 150, watch=no_password_in_ps)
        assert seen_bridge
        assert code == 0, out[-4000:]
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
