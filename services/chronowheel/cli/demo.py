"""`chronowheel demo`: a node, a worker and a mixed workload on a fresh namespace."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from chronowheel.settings import add_settings_arguments, settings_from_args


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run a node and a worker on a fresh namespace with a demo workload",
        description="Create a fresh namespace, start a node and a worker in this process, "
                    "submit one-shot jobs, recurring jobs in several zones, a herd of jobs "
                    "due in one second and a few bad commands, print a live summary, then "
                    "stop. Exits 1 if anything fired or was handled early, twice, or not at all. "
                    "SIGINT/SIGTERM ends it early (with the summary); a second one aborts.")
    add_settings_arguments(p, ("cassandra", "kafka", "http_port"))
    p.add_argument("--namespace", default=None,
                   help="namespace to create (default: demo<epoch seconds>, always fresh)")
    p.add_argument("--seconds", type=int, default=100, help="how long the demo runs (>= 40)")
    p.add_argument("--one-shots", type=int, default=1500, help="one-shot jobs to spread out")
    p.add_argument("--herd", type=int, default=10_000, help="jobs due in the same second")
    p.add_argument("--shards", type=int, default=8, help="shards of the demo namespace")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.demo import run_demo
    from chronowheel.errors import ConfigError

    if args.seconds < 40:
        raise ConfigError(f"--seconds: at least 40, got {args.seconds}")
    if args.namespace is None:
        args.namespace = f"demo{int(time.time())}"
    settings = settings_from_args(args)
    return asyncio.run(run_demo(settings, seconds=args.seconds, one_shots=args.one_shots,
                                herd=args.herd, shards=args.shards, stop_on_signals=True))
