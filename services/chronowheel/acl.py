"""Access control of a namespace: the Kafka ACLs of its three principals, the Cassandra grants.

`chronowheel acl` prints both and, with `--apply`, creates the Kafka ACLs through the admin API
(CreateAcls, sent with aiokafka's connection: aiokafka has no ACL call of its own) and runs the
CQL on Cassandra. Creating an ACL or a grant that exists is a no-op, so applying is idempotent.

Who needs what (least privilege):

- the **submitter** (any producer of jobs) may only write `<ns>.submit`;
- a **worker** reads `<ns>.fired` and the target topics it handles, with its consumer group
  (`<ns>-workers-*` by default), and writes `<ns>.submit` (retries) and `<ns>.dead`;
- the **node** owns the internal topics (reads and writes `<ns>.submit` and `<ns>.state`, writes
  `<ns>.fired`, `<ns>.rejected` and the target topics), its consumer group `<ns>-nodes` and the
  transactional ids `<ns>-node-*` (its own and those it fences) and `<ns>-shard-*` (claims).

`chronowheel init` (topic creation) is run by an administrator, not by these principals.
"""

from __future__ import annotations

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
              "IDEMPOTENT_WRITE": 12}
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
    """`name` is LITERAL, `prefix*` is PREFIXED."""
    out = []
    for t in topics:
        t = t.strip()
        if not t:
            continue
        out.append((t[:-1], "PREFIXED") if t.endswith("*") else (t, "LITERAL"))
    return out


def kafka_acls(settings: Settings, principals: Principals, *,
               target_topics: Sequence[str] = (), worker_topics: Sequence[str] = (),
               worker_group: str | None = None) -> list[KafkaAcl]:
    """Every ALLOW ACL the namespace's three principals need (nothing else is allowed)."""
    ns = settings.namespace
    sub = _principal(principals.submitter, "submitter principal")
    wrk = _principal(principals.worker, "worker principal")
    nod = _principal(principals.node, "node principal")
    acls: list[KafkaAcl] = []

    def topic(role: str, who: str, name: str, ops: Sequence[str],
              pattern: str = "LITERAL") -> None:
        acls.extend(KafkaAcl(role, who, "TOPIC", name, pattern, op) for op in ops)

    # submitter: write the submit topic, nothing else
    topic("submitter", sub, settings.submit_topic, ("WRITE", "DESCRIBE"))
    # worker
    topic("worker", wrk, settings.fired_topic, ("READ", "DESCRIBE"))
    for name, pattern in _topic_patterns(worker_topics):
        topic("worker", wrk, name, ("READ", "DESCRIBE"), pattern)
    topic("worker", wrk, settings.submit_topic, ("WRITE", "DESCRIBE"))
    topic("worker", wrk, settings.dead_topic, ("WRITE", "DESCRIBE"))
    group, group_pattern = ((worker_group, "LITERAL") if worker_group
                            else (f"{ns}-workers-", "PREFIXED"))
    acls.append(KafkaAcl("worker", wrk, "GROUP", group, group_pattern, "READ"))
    # node
    topic("node", nod, settings.submit_topic, ("READ", "WRITE", "DESCRIBE"))
    topic("node", nod, settings.state_topic, ("READ", "WRITE", "DESCRIBE"))
    topic("node", nod, settings.fired_topic, ("WRITE", "DESCRIBE"))
    topic("node", nod, settings.rejected_topic, ("WRITE", "DESCRIBE"))
    for name, pattern in _topic_patterns(target_topics):
        topic("node", nod, name, ("WRITE", "DESCRIBE"), pattern)
    acls.append(KafkaAcl("node", nod, "GROUP", f"{ns}-nodes", "LITERAL", "READ"))
    # `<ns>-node-*`: each node's own producer, and the ones it starts to fence a previous
    # owner; `<ns>-shard-*`: the producer that commits a takeover's claim of a shard.
    acls.extend(KafkaAcl("node", nod, "TRANSACTIONAL_ID", f"{ns}-{kind}-", "PREFIXED", op)
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


def cassandra_grants(settings: Settings, roles: CassandraRoles) -> list[str]:
    """CQL: the roles (created without login if missing) and their permissions.

    Node and worker read and write the namespace's keyspace; the ops role only reads it. Give
    a login role one of these with `GRANT <role> TO <login>` (or name the login roles here).
    """
    ks = settings.keyspace
    node, worker, ops = _role(roles.node), _role(roles.worker), _role(roles.ops)
    out = [f"CREATE ROLE IF NOT EXISTS {r}" for r in dict.fromkeys((node, worker, ops))]
    for r in dict.fromkeys((node, worker)):
        out += [f"GRANT SELECT ON KEYSPACE {ks} TO {r}", f"GRANT MODIFY ON KEYSPACE {ks} TO {r}"]
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
    for stmt in statements:
        session.execute(stmt, timeout=30)
