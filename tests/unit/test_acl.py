"""`chronowheel acl`: which ACLs each principal gets, the Cassandra grants, the wire request."""

from __future__ import annotations

import inspect
import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.protocol.types import UnsignedVarInt32
from chronowheel.acl import (
    CassandraRoles,
    CreateAcls,
    CreateAclsRequestV3,
    CreateAclsResponseV3,
    DeleteAcls,
    DeleteAclsRequestV3,
    KafkaAcl,
    Principals,
    cassandra_grants,
    check_namespace,
    kafka_acls,
    matches,
    namespace_resources,
    namespaces_of,
    reached,
)
from chronowheel.cli import main
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore
from chronowheel.store.cassandra_history import CassandraRunHistory
from chronowheel.store.cassandra_marks import CassandraMarks

S = Settings(namespace="acme")
P = Principals("User:sub", "User:wrk", "User:nod")


def allowed(principal: str, acls: list[KafkaAcl]) -> set[tuple[str, str, str, str]]:
    return {(a.resource_type, a.resource_name, a.pattern, a.operation)
            for a in acls if a.principal == principal}


def test_the_submitter_may_only_write_the_submit_topic() -> None:
    acls = kafka_acls(S, P)
    assert allowed("User:sub", acls) == {("TOPIC", "acme.submit", "LITERAL", "WRITE"),
                                         ("TOPIC", "acme.submit", "LITERAL", "DESCRIBE")}


def test_the_worker_reads_fired_and_its_topics_and_writes_retries_and_dead_letters() -> None:
    acls = kafka_acls(S, P, worker_topics=["emails.out", "jobs.*"])
    got = allowed("User:wrk", acls)
    assert ("TOPIC", "acme.fired", "LITERAL", "READ") in got
    assert ("TOPIC", "emails.out", "LITERAL", "READ") in got
    assert ("TOPIC", "jobs.", "PREFIXED", "READ") in got
    assert ("TOPIC", "acme.submit", "LITERAL", "WRITE") in got
    assert ("TOPIC", "acme.dead", "LITERAL", "WRITE") in got
    assert ("GROUP", "acme-workers-", "PREFIXED", "READ") in got
    assert not {a for a in got if a[1] in ("acme.state", "acme.rejected")}
    assert not {a for a in got if a[0] == "TOPIC" and a[1] == "acme.fired" and a[3] == "WRITE"}
    named = allowed("User:wrk", kafka_acls(S, P, worker_group="mail-senders"))
    assert ("GROUP", "mail-senders", "LITERAL", "READ") in named


def test_the_node_owns_the_internal_topics_its_group_and_transactional_ids() -> None:
    got = allowed("User:nod", kafka_acls(S, P, target_topics=["emails.out"]))
    writes = {"WRITE", "DESCRIBE"}
    # DESCRIBE_CONFIGS: the node reads max.message.bytes of every topic it publishes to.
    publishes = {*writes, "DESCRIBE_CONFIGS"}
    assert got == {
        *{("TOPIC", "acme.submit", "LITERAL", op) for op in ("READ", *publishes)},
        *{("TOPIC", "acme.state", "LITERAL", op) for op in ("READ", *writes)},
        *{("TOPIC", topic, "LITERAL", op) for op in publishes
          for topic in ("acme.fired", "acme.rejected", "acme.dead", "emails.out")},
        # ALTER_CONFIGS, DESCRIBE_CONFIGS: the consumer protocol's session and heartbeat.
        *{("GROUP", "acme-nodes", "LITERAL", op)
          for op in ("READ", "ALTER_CONFIGS", "DESCRIBE_CONFIGS")},
        *{("TRANSACTIONAL_ID", prefix, "PREFIXED", op) for op in writes
          for prefix in ("acme-node-", "acme-shard-")},
    }  # and no CLUSTER right, no READ of what it only writes


def test_the_node_may_dead_letter_undeliverable_occurrences() -> None:
    got = allowed("User:nod", kafka_acls(S, P))
    assert ("TOPIC", S.dead_topic, "LITERAL", "WRITE") in got
    assert ("TOPIC", S.dead_topic, "LITERAL", "READ") not in got


def test_the_acls_cover_every_name_the_code_makes_for_its_namespace() -> None:
    acls = kafka_acls(S, P)
    nodes = [a for a in acls if a.principal == "User:nod"]
    workers = [a for a in acls if a.principal == "User:wrk"]
    for node_id, shard in (("host-1", 0), ("10.0.0.7-4242", 255), ("node-a.b_c", 17)):
        names = namespace_resources("acme", node_id=node_id, shard=shard)
        for txn in names["TRANSACTIONAL_ID"]:
            assert any(matches(a, "TRANSACTIONAL_ID", txn) and a.operation == "WRITE"
                       for a in nodes), txn
    for topics in ([], ["emails.out"], ["a-workers-b", "x.y"]):
        group = next(g for g in namespace_resources("acme", worker_topics=topics)["GROUP"]
                     if g != "acme-nodes")
        assert any(matches(a, "GROUP", group) and a.operation == "READ" for a in workers)


# Namespaces whose names look alike: none may reach another's names through a prefix.
ALIKE = ["acme", "acmecorp", "acme-corp", "acme.node", "acme_node", "acme-nodes", "acme-x",
         "acme-x-y", "acme-workersx", "acme-shards", "acme.submit", "node", "node-acme",
         "shard-1", "workers", "a", "a-b", "a.b", "x-nodes-node2"]
TRICKY_IDS = ["host-1", "node-1", "x-node-y", "shard-3", "workers-z", ""]


def _all_names(namespace: str) -> list[tuple[str, str]]:
    out = []
    for node_id in TRICKY_IDS:
        for topics in ([], ["node-x"], ["workers-y.fired"]):
            for rtype, names in namespace_resources(namespace, node_id=node_id, shard=7,
                                                    worker_topics=topics).items():
                out += [(rtype, n) for n in names]
    return out


def test_no_prefix_of_acme_matches_a_name_of_acmecorp_or_acme_node() -> None:
    prefixed = [a for a in kafka_acls(S, P) if a.pattern == "PREFIXED"]
    assert prefixed  # the check must look at something
    for rtype, name in _all_names("acmecorp"):
        assert not [a for a in prefixed if matches(a, rtype, name)], name
    # `acme-node` lies under `acme-node-` (`acme-node-node-<id>`, `acme-node-shard-<k>`): it
    # is refused, and applying acme's ACLs on a cluster that has it is refused too.
    hits = {name for rtype, name in _all_names("acme-node")
            if any(matches(a, rtype, name) for a in prefixed)}
    assert "acme-node-node-host-1" in hits and "acme-node-shard-7" in hits
    with pytest.raises(ConfigError, match="prefix acme-node- of namespace 'acme'"):
        check_namespace("acme-node")
    with pytest.raises(ConfigError, match="namespace 'acme-node'"):
        kafka_acls(Settings(namespace="acme-node"), P)
    assert {n for _a, n in reached(prefixed, ["acme", "acmecorp", "acme-node"], "acme")} \
        == {"acme-node-node-host-1", "acme-node-shard-0"}
    assert reached(prefixed, ["acme", "acmecorp", "acme.node", "acme-nodes"], "acme") == []


def test_no_namespace_acl_accepts_reaches_another_through_a_prefix() -> None:
    for own in ALIKE:
        prefixed = [a for a in kafka_acls(Settings(namespace=own), Principals.defaults(own))
                    if a.pattern == "PREFIXED"]
        for other in ALIKE:
            if other == own:
                continue
            for rtype, name in _all_names(other):
                assert not [a for a in prefixed if matches(a, rtype, name)], (own, other, name)


@pytest.mark.parametrize("namespace", ["acme-node", "acme-node-x", "a-b-shard", "acme-workers",
                                       "x-shard-1", "acme/x", "acme*", ""])
def test_namespaces_under_another_namespaces_prefix_are_refused(namespace: str) -> None:
    with pytest.raises(ConfigError, match="namespace"):
        check_namespace(namespace)


def test_a_topic_prefix_covering_another_namespace_is_found() -> None:
    assert namespaces_of(["acme.submit", "acmecorp.submit", "acme.fired", ".submit", "x"]) \
        == {"acme", "acmecorp"}
    acls = kafka_acls(S, P, target_topics=["acme*"])
    assert [(a.operation, n) for a, n in reached(acls, {"acme", "acmecorp"}, "acme")
            if n == "acmecorp.submit"] == [("WRITE", "acmecorp.submit"),
                                           ("DESCRIBE", "acmecorp.submit"),
                                           ("DESCRIBE_CONFIGS", "acmecorp.submit")]
    with pytest.raises(ConfigError, match="every topic"):
        kafka_acls(S, P, worker_topics=["*"])


def test_principals_are_checked() -> None:
    with pytest.raises(ConfigError, match="TYPE:NAME"):
        kafka_acls(S, Principals("alice", "User:w", "User:n"))
    assert Principals.defaults("acme").node == "User:acme-node"


def test_cassandra_grants() -> None:
    grants = cassandra_grants(S, CassandraRoles.defaults(S.keyspace))
    assert grants[:3] == ["CREATE ROLE IF NOT EXISTS acme_node",
                          "CREATE ROLE IF NOT EXISTS acme_worker",
                          "CREATE ROLE IF NOT EXISTS acme_ops"]
    assert "GRANT MODIFY ON TABLE acme.due TO acme_node" in grants
    assert "GRANT SELECT ON TABLE acme.worker_marks TO acme_worker" in grants
    assert "GRANT SELECT ON KEYSPACE acme TO acme_ops" in grants
    assert not [g for g in grants if g.endswith("TO acme_ops") and "MODIFY" in g]
    # nothing keyspace-wide for node and worker; earlier versions' keyspace grants revoked
    # before any grant
    assert not [g for g in grants if g.startswith("GRANT") and "ON KEYSPACE" in g
                and not g.endswith("TO acme_ops")]
    revokes = [i for i, g in enumerate(grants) if g.startswith("REVOKE")]
    assert {grants[i] for i in revokes} == {f"REVOKE {p} ON KEYSPACE acme FROM {r}"
                                            for p in ("SELECT", "MODIFY")
                                            for r in ("acme_node", "acme_worker")}
    assert max(revokes) < min(i for i, g in enumerate(grants) if g.startswith("GRANT"))
    with pytest.raises(ConfigError, match="role"):
        cassandra_grants(S, CassandraRoles("node; DROP KEYSPACE x", "w", "o"))


def test_the_worker_may_not_modify_due_or_jobs() -> None:
    grants = cassandra_grants(S, CassandraRoles.defaults(S.keyspace))
    worker = [g for g in grants if g.endswith(" TO acme_worker")]
    assert worker and not [g for g in worker if "MODIFY" in g and
                           (" acme.due " in g or " acme.jobs " in g or "KEYSPACE" in g)]
    assert not [g for g in worker if " acme.due " in g or " acme.jobs " in g]


def _granted(grants: list[str], role: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for g in grants:
        m = re.fullmatch(rf"GRANT (\w+) ON TABLE acme\.(\w+) TO {role}", g)
        if m:
            out.setdefault(m.group(2), set()).add(m.group(1))
    return out


def _needed(package: str) -> dict[str, set[str]]:
    """The permissions of the statements behind every store call in a package's code: the
    store built on a session that only records what is prepared."""
    session = SimpleNamespace(prepare=lambda q: SimpleNamespace(query_string=q))
    objects: list[Any] = [CassandraStore(S, None, session),
                          CassandraMarks(session, S.keyspace),
                          CassandraRunHistory(session, S.keyspace)]
    called: set[str] = set()
    code = Path(__file__).parents[2] / "services" / "chronowheel"
    # Both run a run history writer (history.py) besides their own package's code.
    for f in [*(code / package).glob("*.py"), code / "history.py"]:
        called |= set(re.findall(r"\bstore\.(\w+)\(", f.read_text()))
    assert called
    needed: dict[str, set[str]] = {}
    seen: set[tuple[type, str]] = set()

    def visit(obj: Any, name: str) -> None:
        if (type(obj), name) in seen:
            return
        seen.add((type(obj), name))
        stmt = vars(obj).get(name)
        if stmt is not None and hasattr(stmt, "query_string"):
            q = stmt.query_string
            verb = q.split()[0].upper()
            perms = {"SELECT"} if verb == "SELECT" else {"MODIFY"}
            if " IF " in q:  # a conditional write reads too
                perms.add("SELECT")
            for table in re.findall(rf"\b{S.keyspace}\.(\w+)", q):
                needed.setdefault(table, set()).update(perms)
            return
        method = getattr(type(obj), name, None)
        if callable(method):
            for attr in re.findall(r"self\.(\w+)", inspect.getsource(method)):
                visit(obj, attr)

    for name in sorted(called):
        owners = [o for o in objects if callable(getattr(type(o), name, None))]
        assert owners, f"{package} calls store.{name}, found on no store"
        for o in owners:
            visit(o, name)
    return needed


def test_the_worker_gets_exactly_the_tables_its_code_uses() -> None:
    grants = cassandra_grants(S, CassandraRoles.defaults(S.keyspace))
    needed = _needed("worker")
    # The keyspace's owner, read by CassandraStore.open before anything is prepared
    # (test_keyspace_setting.py shows that read).
    needed.setdefault("meta", set()).add("SELECT")
    assert _granted(grants, "acme_worker") == needed


def test_the_node_gets_exactly_the_tables_its_code_uses() -> None:
    grants = cassandra_grants(S, CassandraRoles.defaults(S.keyspace))
    needed = _needed("node")
    needed.setdefault("meta", set()).add("SELECT")  # the shard count, read at the start
    assert _granted(grants, "acme_node") == needed


def test_every_granted_table_is_in_the_schema() -> None:
    schema = (Path(__file__).parents[2] / "services" / "chronowheel" / "schema"
              / "cassandra.cql").read_text()
    tables = set(re.findall(r"CREATE TABLE IF NOT EXISTS \{keyspace\}\.(\w+)", schema))
    grants = cassandra_grants(S, CassandraRoles.defaults(S.keyspace))
    granted = set(_granted(grants, "acme_node")) | set(_granted(grants, "acme_worker"))
    assert granted <= tables and granted


def test_the_create_acls_request_encodes_the_flexible_v3_layout() -> None:
    acl = kafka_acls(S, P)[0]
    struct = CreateAcls([acl]).prepare({30: (2, 3)})
    assert isinstance(struct, CreateAclsRequestV3) and struct.FLEXIBLE_VERSION
    data = io.BytesIO(struct.encode())
    assert UnsignedVarInt32.decode(data) == 2  # compact array: one creation
    assert data.read(1) == b"\x02"  # TOPIC
    name_len = UnsignedVarInt32.decode(data) - 1
    assert data.read(name_len) == b"acme.submit"
    assert data.read(1) == b"\x03"  # LITERAL
    # and a response decodes
    response = CreateAclsResponseV3.decode(b"\x00\x00\x00\x00" + b"\x02" + b"\x00\x00" + b"\x00"
                                           + b"\x00" + b"\x00")
    assert response.results == [(0, None, {})]


def test_the_command_prints_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acl", "--namespace", "acme", "--node-principal", "User:n1"]) == 0
    out = capsys.readouterr().out
    assert "User:n1" in out and "TRANSACTIONAL_ID acme-shard-*" in out
    assert "GRANT SELECT ON KEYSPACE acme TO acme_ops;" in out
    assert main(["acl", "--namespace", "acme", "--only", "kafka"]) == 0
    assert "GRANT" not in capsys.readouterr().out


def test_the_delete_acls_request_is_one_exact_filter_per_acl() -> None:
    acls = kafka_acls(S, P)[:2]
    struct = DeleteAcls(acls).prepare({31: (2, 3)})
    assert isinstance(struct, DeleteAclsRequestV3) and struct.FLEXIBLE_VERSION
    assert [f[:7] for f in struct.filters] == [
        (2, "acme.submit", 3, "User:sub", "*", 4, 3),  # WRITE, ALLOW, LITERAL
        (2, "acme.submit", 3, "User:sub", "*", 8, 3),  # DESCRIBE
    ]
    data = io.BytesIO(struct.encode())
    assert UnsignedVarInt32.decode(data) == 3  # compact array of two filters
