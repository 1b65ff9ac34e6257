"""Access control of a namespace: the Kafka ACLs of its three principals, the Cassandra grants.

`chronowheel acl` prints both and, with `--apply`, creates the Kafka ACLs through the admin API
(CreateAcls, sent with aiokafka's connection: aiokafka has no ACL call of its own) and runs the
CQL on Cassandra. Creating an ACL or a grant that exists is a no-op, so applying is idempotent.

Who needs what (least privilege), as the code uses it:

- the **submitter** (any producer of jobs) may only write `<ns>.submit`;
- a **worker** reads `<ns>.fired` and the target topics it handles, with its consumer group
  (`<ns>-workers-<topics>` by default), and writes `<ns>.submit` (retries) and `<ns>.dead`
  (handler failures); in Cassandra it reads and writes its idempotency tables only;
- the **node** reads and writes `<ns>.submit` (forwarded commands) and `<ns>.state` (shard
  records, read back at a takeover), writes `<ns>.fired`, `<ns>.rejected`, `<ns>.dead`
  (occurrences it cannot deliver) and the target topics, reads its consumer group `<ns>-nodes`
  and writes the transactional ids `<ns>-node-<node id>` (its own and those it fences) and
  `<ns>-shard-<k>` (claims); in Cassandra it reads and writes the scheduling tables.

Names are exact (LITERAL) except where they cannot be known in advance: node ids, shard
numbers, the default worker groups. Those are PREFIXED with `<ns>-node-`, `<ns>-shard-` and
`<ns>-workers-`. Another namespace's names start with such a prefix only if that namespace is
`<ns>-node` or starts with `<ns>-node-` (likewise `shard`, `workers`): a namespace one of
whose `-`-separated parts after the first is `node`, `shard` or `workers`. `acl` refuses to
secure such a namespace, and with `--apply` refuses to create prefixes that would cover a
namespace already present on the cluster.

`chronowheel init` (topic creation) is run by an administrator, not by these principals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from chronowheel.errors import ConfigError
from chronowheel.settings import Settings

# Kafka's wire codes (org.apache.kafka.common.resource / acl enums).
RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {"READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8,
              "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11, "IDEMPOTENT_WRITE": 12}
ALLOW = 3


@dataclass(frozen=True)
class KafkaAcl:
    role: str  # submitter | worker | node (who it is for, for display)
    principal: str  # User:name
    resource_type: str
    resource_name: str
    pattern: str
    operation: str
    host: str = "*"

    def describe(self) -> str:
        name = self.resource_name + ("*" if self.pattern == "PREFIXED" else "")
        return (f"{self.role:<9} {self.principal:<24} ALLOW {self.operation:<8} "
                f"{self.resource_type} {name}")

    def kafka_acls_args(self) -> str:
        """The same ACL as arguments of Kafka's own kafka-acls tool."""
        flag = {"TOPIC": "--topic", "GROUP": "--group",
                "TRANSACTIONAL_ID": "--transactional-id", "CLUSTER": "--cluster"}
        target = flag[self.resource_type]
        target += "" if self.resource_type == "CLUSTER" else f" '{self.resource_name}'"
        pattern = " --resource-pattern-type prefixed" if self.pattern == "PREFIXED" else ""
        return (f"--add --allow-principal '{self.principal}' --operation "
                f"{self.operation.title().replace('_', '')} {target}{pattern}")


@dataclass(frozen=True)
class Principals:
    submitter: str
    worker: str
    node: str

    @classmethod
    def defaults(cls, namespace: str) -> Principals:
        return cls(f"User:{namespace}-submitter", f"User:{namespace}-worker",
                   f"User:{namespace}-node")


def _principal(text: str, what: str) -> str:
    if ":" not in text or not text.split(":", 1)[1]:
        raise ConfigError(f"{what}: a principal is TYPE:NAME, for example User:alice "
                          f"(got {text!r})")
    return text


def _topic_patterns(topics: Iterable[str]) -> list[tuple[str, str]]:
    """`name` is LITERAL, `prefix*` is PREFIXED (a bare `*`, every topic, is refused)."""
    out = []
    for t in topics:
        t = t.strip()
        if not t:
            continue
        if t == "*":
            raise ConfigError("a topic prefix '*' would match every topic of every namespace: "
                              "name the topics, or a prefix of them")
        out.append((t[:-1], "PREFIXED") if t.endswith("*") else (t, "LITERAL"))
    return out


# The parts of a name after `<ns>-` that only a prefix can grant: node ids (`<ns>-node-<id>`),
# shard claimers (`<ns>-shard-<k>`) and default worker groups (`<ns>-workers-<topics>`).
PREFIX_WORDS = ("node", "shard", "workers")
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]+")


def check_namespace(namespace: str) -> str:
    """The namespace, if `acl` can secure it: made of topic-name characters, and out of reach
    of every other namespace's prefixes.

    A prefix `<a>-node-` matches the names `<b>-node-…`, `<b>-shard-…`, `<b>-workers-…`,
    `<b>-nodes` of a namespace b exactly when b is `<a>-node` or starts with `<a>-node-`, that
    is when a `-`-separated part of b after the first is `node` (likewise `shard`, `workers`).
    Refusing such names here means no namespace secured by `acl` can be covered by another's
    prefixes, and a namespace's own prefixes cannot reach one secured by `acl` either."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(f"namespace {namespace!r}: only letters, digits, '.', '_' and '-' "
                          f"(it names topics)")
    parts = namespace.split("-")
    reserved = sorted(set(parts[1:]) & set(PREFIX_WORDS))
    if reserved:
        owner = "-".join(parts[:parts.index(reserved[0], 1)])
        raise ConfigError(
            f"namespace {namespace!r}: its names would fall under the ACL prefix "
            f"{owner}-{reserved[0]}- of namespace {owner!r} (a '-'-separated part "
            f"{', '.join(repr(w) for w in reserved)}); choose a name without "
            f"{', '.join('-' + w for w in PREFIX_WORDS)} as a part")
    return namespace


def namespace_resources(namespace: str, *, node_id: str = "host-1", shard: int = 0,
                        worker_topics: Sequence[str] = ()) -> dict[str, set[str]]:
    """Names a namespace's principals use, per Kafka resource type, made by the code that
    uses them (one node id, one shard, the default worker group of `worker_topics`)."""
    from chronowheel.core import wire
    from chronowheel.node.transactions import node_transactional_id
    from chronowheel.ops.cluster import nodes_group
    from chronowheel.worker.service import default_group_id

    topics = [wire.fired_topic(namespace), *worker_topics]
    return {
        "TOPIC": {wire.submit_topic(namespace), wire.state_topic(namespace),
                  wire.fired_topic(namespace), wire.rejected_topic(namespace),
                  wire.dead_topic(namespace)},
        "GROUP": {nodes_group(Settings(namespace=namespace)),
                  default_group_id(namespace, topics)},
        "TRANSACTIONAL_ID": {node_transactional_id(namespace, node_id),
                             wire.claimer_transactional_id(namespace, shard)},
    }


def _id_prefixes(namespace: str) -> dict[str, str]:
    """The prefixes of the names only known at run time, from the code that makes them."""
    from chronowheel.core import wire
    from chronowheel.node.transactions import node_transactional_id
    from chronowheel.worker.service import default_group_id

    out = {"node": node_transactional_id(namespace, ""),
           "shard": wire.claimer_transactional_id(namespace, 0).removesuffix("0"),
           "workers": default_group_id(namespace, [])}
    for word, prefix in out.items():  # `<ns>-<word>-`: what check_namespace relies on
        if prefix != f"{namespace}-{word}-":
            raise RuntimeError(f"the {word} names changed form ({prefix!r}): check_namespace "
                               f"no longer keeps namespaces out of each other's prefixes")
    return out


def matches(acl: KafkaAcl, resource_type: str, name: str) -> bool:
    """Whether the ACL's resource pattern covers the resource (as Kafka's authorizer does)."""
    if acl.resource_type != resource_type:
        return False
    if acl.pattern == "PREFIXED":
        return name.startswith(acl.resource_name)
    return acl.resource_name == name


def reached(acls: Sequence[KafkaAcl], namespaces: Iterable[str],
            own: str) -> list[tuple[KafkaAcl, str]]:
    """(ACL, name) for each PREFIXED ACL that covers a name of another of `namespaces`."""
    out = []
    for other in sorted(set(namespaces) - {own}):
        for rtype, names in namespace_resources(other).items():
            out += [(a, n) for a in acls if a.pattern == "PREFIXED"
                    for n in sorted(names) if matches(a, rtype, n)]
    return out


def namespaces_of(topics: Iterable[str]) -> set[str]:
    """The namespaces that have topics among `topics` (by their `<ns>.submit` topic)."""
    suffix = ".submit"
    return {t[:-len(suffix)] for t in topics if t.endswith(suffix) and len(t) > len(suffix)}


def kafka_acls(settings: Settings, principals: Principals, *,
               target_topics: Sequence[str] = (), worker_topics: Sequence[str] = (),
               worker_group: str | None = None) -> list[KafkaAcl]:
    """Every ALLOW ACL the namespace's three principals need (nothing else is allowed)."""
    from chronowheel.ops.cluster import nodes_group

    ns = check_namespace(settings.namespace)
    sub = _principal(principals.submitter, "submitter principal")
    wrk = _principal(principals.worker, "worker principal")
    nod = _principal(principals.node, "node principal")
    prefixes = _id_prefixes(ns)
    acls: list[KafkaAcl] = []

    def topic(role: str, who: str, name: str, ops: Sequence[str],
              pattern: str = "LITERAL") -> None:
        acls.extend(KafkaAcl(role, who, "TOPIC", name, pattern, op) for op in ops)

    # submitter: write the submit topic, nothing else
    topic("submitter", sub, settings.submit_topic, ("WRITE", "DESCRIBE"))
    # worker: consumes fired and its topics, retries into submit, dead-letters into dead
    topic("worker", wrk, settings.fired_topic, ("READ", "DESCRIBE"))
    for name, pattern in _topic_patterns(worker_topics):
        topic("worker", wrk, name, ("READ", "DESCRIBE"), pattern)
    topic("worker", wrk, settings.submit_topic, ("WRITE", "DESCRIBE"))
    topic("worker", wrk, settings.dead_topic, ("WRITE", "DESCRIBE"))
    group, group_pattern = ((worker_group, "LITERAL") if worker_group
                            else (prefixes["workers"], "PREFIXED"))
    acls.append(KafkaAcl("worker", wrk, "GROUP", group, group_pattern, "READ"))
    # node: consumes submit (group <ns>-nodes, offsets committed in its transactions),
    # forwards into submit, reads back and writes state, fires, rejects, dead-letters
    # (target topic missing, occurrence too large) and writes the target topics; it reads
    # the max.message.bytes of every topic it publishes to (DESCRIBE_CONFIGS), so that an
    # occurrence too large for its topic is dead-lettered before it is sent
    publish = ("WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")
    topic("node", nod, settings.submit_topic, ("READ", *publish))
    topic("node", nod, settings.state_topic, ("READ", "WRITE", "DESCRIBE"))
    topic("node", nod, settings.fired_topic, publish)
    topic("node", nod, settings.rejected_topic, publish)
    topic("node", nod, settings.dead_topic, publish)
    for name, pattern in _topic_patterns(target_topics):
        topic("node", nod, name, publish, pattern)
    # READ: its membership and offsets; ALTER_CONFIGS and DESCRIBE_CONFIGS: with
    # node_group_protocol=consumer the group's session and heartbeat are the group's own
    # configs, which each node sets from its settings when it starts.
    acls.extend(KafkaAcl("node", nod, "GROUP", nodes_group(settings), "LITERAL", op)
                for op in ("READ", "ALTER_CONFIGS", "DESCRIBE_CONFIGS"))
    # `<ns>-node-*`: each node's own producer, and the ones it starts to fence a previous
    # owner; `<ns>-shard-*`: the producer that commits a takeover's claim of a shard.
    acls.extend(KafkaAcl("node", nod, "TRANSACTIONAL_ID", prefixes[kind], "PREFIXED", op)
                for kind in ("node", "shard") for op in ("WRITE", "DESCRIBE"))
    return acls


@dataclass(frozen=True)
class CassandraRoles:
    node: str
    worker: str
    ops: str

    @classmethod
    def defaults(cls, keyspace: str) -> CassandraRoles:
        return cls(f"{keyspace}_node", f"{keyspace}_worker", f"{keyspace}_ops")


def _role(name: str) -> str:
    if not name.replace("_", "a").isalnum():
        raise ConfigError(f"Cassandra role {name!r}: letters, digits and '_' only")
    return name


# The tables each role's code touches (store/cassandra.py, store/cassandra_marks.py, admin.py)
# and what it does there. A conditional (IF) write also needs SELECT.
NODE_TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("SELECT",),  # the shard count and the namespace recorded by init
    "jobs": ("SELECT", "MODIFY"),
    "due": ("SELECT", "MODIFY"),
    "due_retired": ("SELECT", "MODIFY"),  # due rows taken back before they were published
    "job_requests": ("SELECT", "MODIFY"),
    "bucket_counts": ("SELECT", "MODIFY"),
    "calendars": ("SELECT", "MODIFY"),
    # the runs it published (history.py); read: a job's streak of failed runs (auto-pause)
    "run_history": ("SELECT", "MODIFY"),
    "run_counters": ("MODIFY",),
}
WORKER_TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("SELECT",),  # the namespace recorded by init, checked at the start
    "processed": ("SELECT", "MODIFY"),  # per-occurrence claims (conditional writes)
    "job_runs": ("SELECT", "MODIFY"),  # one run per job at a time (conditional writes)
    "worker_leases": ("SELECT", "MODIFY"),  # per-partition leases (conditional writes)
    "worker_marks": ("SELECT", "MODIFY"),  # done marks
    "run_history": ("MODIFY",),  # each handling's run (history.py)
    "run_counters": ("MODIFY",),
}


def cassandra_grants(settings: Settings, roles: CassandraRoles) -> list[str]:
    """CQL: the roles (created without login if missing) and their permissions.

    Node and worker get SELECT/MODIFY on the tables they use, nothing keyspace-wide (the
    keyspace-wide grants of earlier versions are revoked first); the ops role reads the whole
    keyspace. Give a login role one of these with `GRANT <role> TO <login>` (or name the login
    roles here). Table grants need the tables: run `chronowheel init` first.
    """
    ks = settings.keyspace
    node, worker, ops = _role(roles.node), _role(roles.worker), _role(roles.ops)
    out = [f"CREATE ROLE IF NOT EXISTS {r}" for r in dict.fromkeys((node, worker, ops))]
    for r in dict.fromkeys((node, worker)):
        out += [f"REVOKE {perm} ON KEYSPACE {ks} FROM {r}" for perm in ("MODIFY", "SELECT")]
    for r, tables in ((node, NODE_TABLES), (worker, WORKER_TABLES)):
        out += [f"GRANT {perm} ON TABLE {ks}.{table} TO {r}"
                for table, perms in tables.items() for perm in perms]
    out.append(f"GRANT SELECT ON KEYSPACE {ks} TO {ops}")
    return out


# --- CreateAcls over aiokafka's connection ---------------------------------------------------
# Kafka 4 serves CreateAcls v2+ only (flexible encoding); aiokafka 0.14 declares v0-v1 and no
# admin call, so the request is declared here from the protocol's published schema.


class CreateAclsResponseV3(Response):
    API_KEY = 30
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", CompactArray(("error_code", Int16), ("error_message", CompactString("utf-8")),
                                 ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class CreateAclsRequestV3(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 30
    API_VERSION = 3
    RESPONSE_TYPE = CreateAclsResponseV3
    SCHEMA = Schema(
        ("creations", CompactArray(
            ("resource_type", Int8), ("resource_name", CompactString("utf-8")),
            ("resource_pattern_type", Int8), ("principal", CompactString("utf-8")),
            ("host", CompactString("utf-8")), ("operation", Int8), ("permission_type", Int8),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class CreateAcls(Request[CreateAclsRequestV3]):
    API_KEY = 30

    def __init__(self, acls: Sequence[KafkaAcl]) -> None:
        self._acls = list(acls)

    def build(self, request_struct_class: type[CreateAclsRequestV3]) -> CreateAclsRequestV3:
        return request_struct_class([
            (RESOURCE_TYPES[a.resource_type], a.resource_name, PATTERN_TYPES[a.pattern],
             a.principal, a.host, OPERATIONS[a.operation], ALLOW, {})
            for a in self._acls], {})


class DeleteAclsResponseV3(Response):
    API_KEY = 31
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("filter_results", CompactArray(
            ("error_code", Int16), ("error_message", CompactString("utf-8")),
            ("matching_acls", CompactArray(
                ("error_code", Int16), ("error_message", CompactString("utf-8")),
                ("resource_type", Int8), ("resource_name", CompactString("utf-8")),
                ("pattern_type", Int8), ("principal", CompactString("utf-8")),
                ("host", CompactString("utf-8")), ("operation", Int8),
                ("permission_type", Int8), ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class DeleteAclsRequestV3(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 31
    API_VERSION = 3
    RESPONSE_TYPE = DeleteAclsResponseV3
    SCHEMA = Schema(
        ("filters", CompactArray(
            ("resource_type_filter", Int8), ("resource_name_filter", CompactString("utf-8")),
            ("pattern_type_filter", Int8), ("principal_filter", CompactString("utf-8")),
            ("host_filter", CompactString("utf-8")), ("operation", Int8),
            ("permission_type", Int8), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class DeleteAcls(Request[DeleteAclsRequestV3]):
    """Delete exactly the given ACLs (each is its own, fully specified filter)."""

    API_KEY = 31

    def __init__(self, acls: Sequence[KafkaAcl]) -> None:
        self._acls = list(acls)

    def build(self, request_struct_class: type[DeleteAclsRequestV3]) -> DeleteAclsRequestV3:
        return request_struct_class([
            (RESOURCE_TYPES[a.resource_type], a.resource_name, PATTERN_TYPES[a.pattern],
             a.principal, a.host, OPERATIONS[a.operation], ALLOW, {})
            for a in self._acls], {})


async def remove_kafka_acls(admin: Any, acls: Sequence[KafkaAcl]) -> int:
    """Delete the ACLs; return how many existed. Raises ConfigError with Kafka's reasons."""
    response = await admin._send_request(DeleteAcls(acls))
    failures, removed = [], 0
    for acl, result in zip(acls, response.filter_results, strict=False):
        code, message, matching, _tags = result
        if code != 0:
            failures.append(f"{acl.describe()}: error {code} {message or ''}".strip())
        removed += len(matching or ())
    if failures:
        raise ConfigError("Kafka refused to remove some ACLs: " + "; ".join(failures))
    return removed


async def apply_kafka_acls(admin: Any, acls: Sequence[KafkaAcl]) -> None:
    """Create the ACLs (an existing one is left as it is). Raises ConfigError with Kafka's
    reason for each that failed (for example: this admin principal may not alter ACLs)."""
    response = await admin._send_request(CreateAcls(acls))
    failures = [f"{acl.describe()}: error {code} {message or ''}".strip()
                for acl, (code, message, _tags) in zip(acls, response.results, strict=False)
                if code != 0]
    if failures:
        raise ConfigError("Kafka refused some ACLs: " + "; ".join(failures))


def apply_cassandra_grants(session: Any, statements: Sequence[str]) -> None:
    from cassandra import InvalidRequest

    for stmt in statements:
        try:
            session.execute(stmt, timeout=30)
        except InvalidRequest as exc:
            if "exist" not in str(exc):
                raise
            raise ConfigError(f"{stmt}: {exc} (table grants need the namespace's tables: "
                              f"run `chronowheel init` for it first)") from exc
