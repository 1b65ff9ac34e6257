"""`chronowheel stack install|up|down|status|logs`: the local Cassandra + Kafka.

A thin wrapper around deploy/local/stack.py of a source checkout, which does the work; it is
run with this interpreter so that its readiness checks find the project's drivers. The local
stack is a development tool and is not part of the package: the command finds the script in
the checkout it is run from (the current folder or one above it), or where
CHRONOWHEEL_STACK_SCRIPT says, and otherwise says so (in a checkout, `./run stack` does the
same).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from chronowheel.errors import ConfigError
from chronowheel.settings import add_settings_arguments, settings_from_args

SCRIPT_ENV = "CHRONOWHEEL_STACK_SCRIPT"


SCRIPT_IN_CHECKOUT = Path("deploy") / "local" / "stack.py"


def stack_script(cwd: Path | None = None) -> Path:
    """deploy/local/stack.py of the source checkout `cwd` (default: the current folder) is in,
    or the script CHRONOWHEEL_STACK_SCRIPT names."""
    override = os.environ.get(SCRIPT_ENV)
    if override:
        script = Path(override).expanduser()
        if not script.is_file():
            raise ConfigError(f"{SCRIPT_ENV}: no file at {script}")
        return script
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        script = folder / SCRIPT_IN_CHECKOUT
        if script.is_file() and (folder / "pyproject.toml").is_file():
            return script
    raise ConfigError(
        f"`chronowheel stack` runs the local Cassandra + Kafka of a chronowheel source "
        f"checkout ({SCRIPT_IN_CHECKOUT}), and {here} is not inside one: the installed package "
        f"does not include the local stack. Run it from a checkout (where `./run stack` does "
        f"the same), or set {SCRIPT_ENV} to a checkout's {SCRIPT_IN_CHECKOUT}"
    )


PROFILE_ENV = "CHRONOWHEEL_STACK_PROFILE"


def stack_command(args: argparse.Namespace) -> list[str]:
    settings = settings_from_args(args)
    profile = getattr(args, "profile", None) or os.environ.get(PROFILE_ENV) or "plain"
    if profile in ("secured", "cluster"):
        # Its own state folder beside the plain one's, so that both can run at once.
        state = settings.state_dir.rstrip("/") + "-" + profile
        cmd = [sys.executable, str(stack_script()), "--profile", profile, "--state-dir", state]
    else:
        cmd = [sys.executable, str(stack_script()), "--state-dir", settings.state_dir]
    if args.json:
        cmd.append("--json")
    cmd.append(args.stack_command)
    cmd.extend(args.servers)
    if args.stack_command == "up" and args.timeout is not None:
        cmd.extend(["--timeout", str(args.timeout)])
    if args.stack_command == "down" and args.grace is not None:
        cmd.extend(["--grace", str(args.grace)])
    if args.stack_command == "logs":
        cmd.extend(["--lines", str(args.lines)])
        if args.follow:
            cmd.append("--follow")
    return cmd


def run(args: argparse.Namespace) -> int:
    return subprocess.run(stack_command(args), check=False).returncode


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "stack",
        help="run a real Cassandra and Kafka on 127.0.0.1 for development and tests (in a "
             "source checkout only)",
        description=(
            "Local Apache Cassandra 5.0 (127.0.0.1:9042) and Apache Kafka 4 "
            "(127.0.0.1:9092) from pinned Maven Central artifacts on Java 17. "
            "Data and logs live in the state folder; the Maven cache in "
            "$CHRONOWHEEL_CACHE_DIR (default ~/.cache/chronowheel). Works inside a "
            "source checkout only (its deploy/local/stack.py; `./run stack` there does the "
            f"same), or with {SCRIPT_ENV} naming that script."
        ),
    )
    actions = parser.add_subparsers(dest="stack_command", metavar="ACTION", required=True)

    def action(name: str, help: str, servers: bool = True) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help)
        add_settings_arguments(p, ["state_dir"])
        p.add_argument("--profile", choices=("plain", "secured", "cluster"), default=None,
                       help="plain (9042/9092, no auth), secured (9142/9094: TLS, SASL "
                            "SCRAM, ACLs, passwords; state folder <state-dir>-secured) or "
                            "cluster (three Cassandra nodes on 127.0.0.2-4:9042 and three "
                            "Kafka nodes on 127.0.0.1:9192-9194, replication 3; state folder "
                            f"<state-dir>-cluster) [env {PROFILE_ENV}; default plain]")
        p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
        if servers:
            p.add_argument(
                "servers",
                nargs="*",
                metavar="SERVER",
                help="cassandra and/or kafka (default: both); in the cluster profile also "
                     "one node: cassandra-1..3, kafka-1..3",
            )
        else:
            p.set_defaults(servers=[])
        p.set_defaults(func=run, timeout=None, grace=None, lines=40, follow=False)
        return p

    action("install", "resolve the pinned Maven artifacts only (no server is started)")
    p = action("up", "start what is not running and wait until it answers (idempotent)")
    p.add_argument("--timeout", type=float, help="seconds to wait for readiness (default 180)")
    p = action("down", "stop gracefully what this state folder started (idempotent)")
    p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL (default 45)")
    action("status", "tell what runs and answers; exit 3 when not everything is up", False)
    p = action("logs", "print the servers' logs")
    p.add_argument("-n", "--lines", type=int, default=40, help="lines per log (default 40)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
