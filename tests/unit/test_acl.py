"""`chronowheel acl`: which ACLs each principal gets, the Cassandra grants, the wire request."""

from __future__ import annotations

import io

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
    kafka_acls,
)
from chronowheel.cli import main
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings

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
    for topic, ops in (("acme.submit", {"READ", "WRITE"}), ("acme.state", {"READ", "WRITE"}),
                       ("acme.fired", {"WRITE"}), ("acme.rejected", {"WRITE"}),
                       ("emails.out", {"WRITE"})):
        assert {op for t, name, _p, op in got if t == "TOPIC" and name == topic} \
            == ops | {"DESCRIBE"}, topic
    assert ("GROUP", "acme-nodes", "LITERAL", "READ") in got
    for prefix in ("acme-node-", "acme-shard-"):
        assert ("TRANSACTIONAL_ID", prefix, "PREFIXED", "WRITE") in got
        assert ("TRANSACTIONAL_ID", prefix, "PREFIXED", "DESCRIBE") in got
    assert not {a for a in got if a[0] == "CLUSTER"}  # no cluster-wide rights


def test_principals_are_checked() -> None:
    with pytest.raises(ConfigError, match="TYPE:NAME"):
        kafka_acls(S, Principals("alice", "User:w", "User:n"))
    assert Principals.defaults("acme").node == "User:acme-node"


def test_cassandra_grants() -> None:
    grants = cassandra_grants(S, CassandraRoles.defaults(S.keyspace))
    assert grants[:3] == ["CREATE ROLE IF NOT EXISTS acme_node",
                          "CREATE ROLE IF NOT EXISTS acme_worker",
                          "CREATE ROLE IF NOT EXISTS acme_ops"]
    assert "GRANT MODIFY ON KEYSPACE acme TO acme_node" in grants
    assert "GRANT MODIFY ON KEYSPACE acme TO acme_worker" in grants
    assert "GRANT SELECT ON KEYSPACE acme TO acme_ops" in grants
    assert not [g for g in grants if g.endswith("TO acme_ops") and "MODIFY" in g]
    with pytest.raises(ConfigError, match="role"):
        cassandra_grants(S, CassandraRoles("node; DROP KEYSPACE x", "w", "o"))


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
