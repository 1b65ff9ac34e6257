"""Measurement tools run against a local stack only (a load test pointed at a shared cluster by
mistake would harm it), on scratch namespaces they drop afterwards."""

from __future__ import annotations

import asyncio
import ipaddress
import sys
import threading

from chronowheel.bus.kafka import open_admin
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings


def non_loopback_hosts(servers: str) -> list[str]:
    """The hosts of `servers` (host:port,...) that are not loopback addresses (`localhost`
    counts as loopback; any other name does not, whatever it resolves to)."""
    out = []
    for item in servers.split(","):
        host = item.strip().rsplit(":", 1)[0].strip("[]")
        if not host:
            continue
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            out.append(host)
    return out


def require_loopback(what: str, servers: str) -> None:
    """Raise SystemExit unless every host of `servers` (host:port,...) is a loopback address."""
    remote = non_loopback_hosts(servers)
    if remote:
        raise SystemExit(f"{what}: {remote[0]!r} is not a loopback address; only a local stack "
                         "may be used")


async def drop_namespace(settings: Settings) -> None:
    """Delete a scratch namespace: every topic named `<ns>.*` and its keyspace. A keyspace
    that init recorded for another namespace, or a named one (`cassandra_keyspace`) that does
    not record this one, is left alone, and nothing is deleted: ConfigError."""
    from chronowheel.store.cassandra import check_keyspace_owner, connect, recorded_meta

    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        owner = (await asyncio.to_thread(recorded_meta, session, settings.keyspace)).get(
            "namespace")
        check_keyspace_owner(owner, settings)
        if owner is None and settings.keyspace != settings.derived_keyspace:
            raise ConfigError(f"cassandra_keyspace: keyspace {settings.keyspace!r} does not "
                              f"record namespace {settings.namespace!r}; not dropped")
        admin = await open_admin(settings)
        try:
            prefix = settings.namespace + "."
            mine = [t for t in await admin.list_topics() if t.startswith(prefix)]
            if mine:
                await admin.delete_topics(mine, timeout_ms=60_000)
        finally:
            await admin.close()
        await asyncio.to_thread(session.execute,
                                f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
    finally:
        await asyncio.to_thread(cluster.shutdown)


def drop_namespace_quietly(settings: Settings, timeout_s: float = 120.0) -> None:
    """`drop_namespace` for synchronous teardown code: runs in a thread with an event loop of its
    own (so it leaves a test runner's loop alone), and reports a failure on stderr instead of
    raising, since cleanup must not fail a test that passed."""

    def run() -> None:
        try:
            asyncio.run(drop_namespace(settings))
        except Exception as exc:
            print(f"dropping namespace {settings.namespace} failed: {exc!r}", file=sys.stderr)

    dropper = threading.Thread(target=run, name=f"drop-{settings.namespace}", daemon=True)
    dropper.start()
    dropper.join(timeout_s)
    if dropper.is_alive():
        print(f"dropping namespace {settings.namespace} did not finish within {timeout_s:.0f} s",
              file=sys.stderr)
