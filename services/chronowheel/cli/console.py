"""`chronowheel console`: the operations console in the browser (docs/console.md)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from chronowheel.ops.status import BEHIND_MS_DEFAULT
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    add_secret_notes,
    add_settings_arguments,
    settings_from_args,
)

CONSOLE_SETTINGS = (*CONNECTION_SETTINGS, "allowed_topics", "max_clock_skew_ms")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8089


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "console", help="serve the operations console (cluster, upcoming load, jobs, tails)",
        description=(
            "Serve a web console for one namespace: the cluster (nodes, shards, watermarks, "
            "dispatch lag, clock skew; refreshed live), the upcoming load (a heat map of the "
            "next 24 hours, minute x shard, with the due rows of each minute), jobs (look up, "
            "next occurrences in the job's zone, last fired occurrences, cancel) and the "
            "rejected and dead-letter tails. Listens on loopback unless told otherwise and "
            "refuses any other address without a token. Actions (cancel) need the token as a "
            "bearer token or as the basic-auth password; without a token they are disabled."))
    add_settings_arguments(p, CONSOLE_SETTINGS)
    p.add_argument("--http-host", dest="console_host", default=DEFAULT_HOST, metavar="HOST",
                   help=f"address to listen on ({DEFAULT_HOST}; another address needs the "
                        f"token)")
    p.add_argument("--http-port", dest="console_port", type=int, default=DEFAULT_PORT,
                   metavar="PORT", help=f"port to listen on ({DEFAULT_PORT}; 0 = a free one)")
    p.add_argument("--behind-ms", type=int, default=BEHIND_MS_DEFAULT, metavar="MS",
                   help=f"a shard whose watermark is older is behind ({BEHIND_MS_DEFAULT})")
    add_secret_notes(p, ["console_token"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.console.app import check_bind, serve
    from chronowheel.ops.cluster import quiet_kafka_logs
    from chronowheel.supervise import install_stop_signals

    quiet_kafka_logs()
    settings = settings_from_args(args)
    check_bind(args.console_host, settings.console_token)  # before connecting to anything

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(stop.set, graceful="closing the console")
        await serve(settings, host=args.console_host, port=args.console_port,
                    behind_ms=args.behind_ms, stop=stop,
                    started=lambda port: print(
                        f"console: http://{_url_host(args.console_host)}:{port}/", flush=True))

    asyncio.run(main())
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
