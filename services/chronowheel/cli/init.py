"""`chronowheel init`: create (or verify) a namespace's keyspace, tables and topics."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from chronowheel.settings import add_settings_arguments, settings_from_args


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "init", help="create or verify a namespace (idempotent; the shard count is fixed)",
        description="Apply the Cassandra schema (chronowheel/schema/cassandra.cql, shipped in "
                    "the package) and create the namespace's Kafka topics. Safe to repeat; "
                    "refuses a different --shards than the namespace has.")
    add_settings_arguments(p, ("namespace", "cassandra", "kafka", "shards", "replication"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.admin import init_namespace

    settings = settings_from_args(args)
    report = asyncio.run(init_namespace(settings))
    created = ", ".join(report.created_topics) or "none (all existed)"
    print(f"namespace {report.namespace}: {report.shards} shards; "
          f"keyspace {'created' if report.keyspace_created else 'existed'}; "
          f"topics created: {created}")
    return 0
