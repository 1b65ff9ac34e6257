"""`chronowheel acl`: the Kafka ACLs and Cassandra grants of a namespace; `--apply` sets them."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from chronowheel.settings import add_settings_arguments, settings_from_args


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "acl", help="print (and with --apply set) a namespace's Kafka ACLs and Cassandra grants",
        description="Print the Kafka ACLs of the namespace's three principals (a submitter may "
                    "only write <ns>.submit; a worker reads <ns>.fired and its target topics "
                    "with its group and writes <ns>.submit and <ns>.dead; the node reads and "
                    "writes <ns>.submit and <ns>.state, writes <ns>.fired, <ns>.rejected, "
                    "<ns>.dead and the target topics, reads its group <ns>-nodes and writes "
                    "the transactional ids <ns>-node-* and <ns>-shard-*) and the Cassandra "
                    "grants (node and worker read/write the tables they use, ops reads the "
                    "keyspace). Names are exact except those prefixes and the default worker "
                    "groups <ns>-workers-*; a namespace that another namespace's prefixes would "
                    "cover (a '-'-separated part node, shard or workers after the first) is "
                    "refused. With --apply, create them: the Kafka ACLs through the admin API "
                    "(refused if a prefix would cover a namespace present on the cluster) and "
                    "the grants as CQL, connecting with the given (administrator's) "
                    "credentials.")
    add_settings_arguments(p, ("namespace", "kafka", "cassandra"))
    p.add_argument("--submitter-principal", default=None, metavar="User:NAME",
                   help="Kafka principal of job submitters (default User:<ns>-submitter)")
    p.add_argument("--worker-principal", default=None, metavar="User:NAME",
                   help="Kafka principal of workers (default User:<ns>-worker)")
    p.add_argument("--node-principal", default=None, metavar="User:NAME",
                   help="Kafka principal of nodes (default User:<ns>-node)")
    p.add_argument("--target-topic", action="append", default=[], metavar="TOPIC[*]",
                   help="a target topic jobs fire to, besides <ns>.fired (nodes write it); "
                        "a trailing * makes it a prefix; repeatable")
    p.add_argument("--worker-topic", action="append", default=[], metavar="TOPIC[*]",
                   help="a topic workers read besides <ns>.fired; repeatable")
    p.add_argument("--worker-group", default=None,
                   help="the workers' consumer group (default: the prefix <ns>-workers-)")
    p.add_argument("--cassandra-node-role", default=None, metavar="ROLE",
                   help="Cassandra role of nodes (default <keyspace>_node)")
    p.add_argument("--cassandra-worker-role", default=None, metavar="ROLE",
                   help="Cassandra role of workers (default <keyspace>_worker)")
    p.add_argument("--cassandra-ops-role", default=None, metavar="ROLE",
                   help="read-only Cassandra role of operators (default <keyspace>_ops)")
    p.add_argument("--apply", action="store_true",
                   help="create the ACLs and run the grants (as an administrator)")
    p.add_argument("--remove-kafka", action="store_true",
                   help="remove these Kafka ACLs instead (taking the namespace's rights away; "
                        "Cassandra: REVOKE by hand)")
    p.add_argument("--only", choices=("kafka", "cassandra"), default=None,
                   help="print or apply one side only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.acl import CassandraRoles, Principals, cassandra_grants, kafka_acls

    settings = settings_from_args(args)
    base = Principals.defaults(settings.namespace)
    principals = Principals(args.submitter_principal or base.submitter,
                            args.worker_principal or base.worker,
                            args.node_principal or base.node)
    default_roles = CassandraRoles.defaults(settings.keyspace)
    roles = CassandraRoles(args.cassandra_node_role or default_roles.node,
                           args.cassandra_worker_role or default_roles.worker,
                           args.cassandra_ops_role or default_roles.ops)
    acls = kafka_acls(settings, principals, target_topics=args.target_topic,
                      worker_topics=args.worker_topic, worker_group=args.worker_group)
    grants = cassandra_grants(settings, roles)
    if args.only != "cassandra":
        print(f"# Kafka ACLs of namespace {settings.namespace} (ALLOW, any host)")
        for acl in acls:
            print(acl.describe())
    if args.only != "kafka":
        print(f"\n# Cassandra grants on keyspace {settings.keyspace}")
        for stmt in grants:
            print(stmt + ";")
    if args.remove_kafka:
        removed = asyncio.run(_remove_kafka(settings, acls))
        print(f"removed {removed} Kafka ACLs at {settings.kafka}")
        return 0
    if not args.apply:
        return 0
    # Cassandra is reached first, before anything is applied: grants on a keyspace that holds
    # another namespace would give this namespace's roles that namespace's tables.
    cassandra = _open_owned_keyspace(settings) if args.only != "kafka" else None
    try:
        if args.only != "cassandra":
            asyncio.run(_apply_kafka(settings, acls))
            print(f"applied {len(acls)} Kafka ACLs at {settings.kafka}")
        if cassandra is not None:
            from chronowheel.acl import apply_cassandra_grants

            apply_cassandra_grants(cassandra[1], grants)
            print(f"applied {len(grants)} Cassandra statements at {settings.cassandra}")
    finally:
        if cassandra is not None:
            cassandra[0].shutdown()
    return 0


async def _apply_kafka(settings: Any, acls: Any) -> None:
    from chronowheel.acl import apply_kafka_acls, namespaces_of, reached
    from chronowheel.bus.kafka import open_admin
    from chronowheel.errors import ConfigError

    admin = await open_admin(settings)
    try:
        # A prefix must not grant anything in a namespace already on the cluster.
        exposed = reached(acls, namespaces_of(await admin.list_topics()), settings.namespace)
        if exposed:
            raise ConfigError("not applied: these prefixes would also cover another namespace's "
                              "names: " + "; ".join(f"{a.describe()} covers {name}"
                                                    for a, name in exposed))
        await apply_kafka_acls(admin, acls)
    finally:
        await admin.close()


async def _remove_kafka(settings: Any, acls: Any) -> int:
    from chronowheel.acl import remove_kafka_acls
    from chronowheel.bus.kafka import open_admin

    admin = await open_admin(settings)
    try:
        return await remove_kafka_acls(admin, acls)
    finally:
        await admin.close()


def _open_owned_keyspace(settings: Any) -> tuple[Any, Any]:
    """A connection to Cassandra on the namespace's initialised keyspace: refused when the
    keyspace holds another namespace or is not initialised (the grants name its tables)."""
    from chronowheel.errors import ConfigError
    from chronowheel.store.cassandra import connect, owned_meta

    cluster, session = connect(settings)
    try:
        meta = owned_meta(session, settings)
        if meta is not None and "shards" not in meta:
            raise ConfigError(
                f"namespace {settings.namespace!r} is not initialised in keyspace "
                f"{settings.keyspace}: run `chronowheel init --namespace "
                f"{settings.namespace}{settings.keyspace_flag} --shards N` first (the "
                "grants name its tables)")
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, session
