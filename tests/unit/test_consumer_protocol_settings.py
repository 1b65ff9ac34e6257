"""The consumer group protocol member (`bus/kafka_consumer_group.py`, node_group_protocol):
the setting, how the Kafka settings become librdkafka's, and what an operator is told when
the brokers refuse the group's session or heartbeat. Its behaviour in a group is tested
against a real broker (tests/integration/test_scale_out.py)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from chronowheel.bus.kafka_consumer_group import (
    ConsumerProtocolGroup,
    _error_name,
    admin_config,
    group_config_refusal,
    librdkafka_config,
    stops_the_member,
)
from chronowheel.bus.kafka_node import KafkaNodeBus, KafkaSubmitGroup
from chronowheel.bus.ports import BusError
from chronowheel.core import wire
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from confluent_kafka import KafkaError, KafkaException


async def _nothing(shards: list[int]) -> None:
    del shards


def test_the_protocol_is_kip_848s_unless_asked_and_any_other_value_is_refused() -> None:
    assert Settings().node_group_protocol == "consumer"
    assert Settings(node_group_protocol=" Classic ").node_group_protocol == "classic"
    with pytest.raises(ConfigError) as refused:
        Settings(node_group_protocol="cooperative")
    assert "node_group_protocol" in str(refused.value)
    assert "classic, consumer" in str(refused.value) and "'cooperative'" in str(refused.value)


def test_the_protocol_comes_from_its_environment_variable_and_shows_in_the_nodes_help() -> None:
    from chronowheel.cli import build_parser

    s = Settings.from_env({"CHRONOWHEEL_NODE_GROUP_PROTOCOL": "consumer"})
    assert s.node_group_protocol == "consumer"
    [commands] = [a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction)]
    text = commands.choices["node"].format_help()
    assert "--node-group-protocol" in text
    assert "CHRONOWHEEL_NODE_GROUP_PROTOCOL" in text


@pytest.mark.parametrize(("protocol", "kind"), [("classic", KafkaSubmitGroup),
                                                ("consumer", ConsumerProtocolGroup)])
def test_the_node_bus_makes_the_member_of_the_configured_protocol(protocol: str,
                                                                   kind: type) -> None:
    bus = KafkaNodeBus(Settings(node_group_protocol=protocol))
    member = bus.submit_group(group_id="ns-nodes", client_id="n1", session_timeout_ms=3_000,
                              on_assigned=_nothing, on_revoked=_nothing)
    assert isinstance(member, kind)


def test_plaintext_brokers_need_nothing_but_their_addresses() -> None:
    conf = librdkafka_config(Settings(kafka="k1:9092,k2:9092"))
    assert conf == {"bootstrap.servers": "k1:9092,k2:9092", "security.protocol": "PLAINTEXT"}


def test_tls_and_sasl_settings_become_librdkafkas() -> None:
    s = Settings(kafka="k1:9093", kafka_security_protocol="SASL_SSL",
                 kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="node",
                 kafka_sasl_password="pw", kafka_ssl_cafile="/etc/ca.pem",
                 kafka_ssl_certfile="/etc/c.pem", kafka_ssl_keyfile="/etc/k.pem",
                 kafka_ssl_key_password="kp", kafka_ssl_check_hostname=False)
    conf = librdkafka_config(s)
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["ssl.ca.location"] == "/etc/ca.pem"
    assert conf["ssl.certificate.location"] == "/etc/c.pem"
    assert conf["ssl.key.location"] == "/etc/k.pem"
    assert conf["ssl.key.password"] == "kp"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert (conf["sasl.mechanism"], conf["sasl.username"], conf["sasl.password"]) == (
        "SCRAM-SHA-512", "node", "pw")


def test_tls_without_a_ca_file_uses_the_systems_and_checks_the_host_name() -> None:
    conf = librdkafka_config(Settings(kafka_security_protocol="SSL"))
    assert conf["ssl.ca.location"] == "probe"
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    assert "ssl.certificate.location" not in conf and "sasl.username" not in conf


def test_sasl_without_a_password_and_tls_files_without_tls_are_refused() -> None:
    with pytest.raises(ConfigError, match="CHRONOWHEEL_KAFKA_SASL_PASSWORD"):
        librdkafka_config(Settings(kafka_security_protocol="SASL_PLAINTEXT",
                                   kafka_sasl_username="node"))
    with pytest.raises(ConfigError, match="use SSL or SASL_SSL"):
        librdkafka_config(Settings(kafka_ssl_cafile="/etc/ca.pem"))


def test_a_refused_session_names_the_brokers_limits_and_the_permissions() -> None:
    exc = KafkaException(KafkaError(KafkaError.INVALID_CONFIG, "session below the minimum"))
    why = group_config_refusal("ns-nodes", {"consumer.session.timeout.ms": 3000,
                                            "consumer.heartbeat.interval.ms": 300}, exc)
    assert "group ns-nodes" in why
    assert "consumer.session.timeout.ms 3000" in why and "consumer.heartbeat.interval.ms 300" in why
    assert "group.consumer.min.session.timeout.ms" in why
    assert "group.consumer.min.heartbeat.interval.ms" in why
    assert "ALTER_CONFIGS" in why


def test_error_names_come_from_librdkafkas_error() -> None:
    stale = KafkaException(KafkaError(KafkaError.STALE_MEMBER_EPOCH))
    assert _error_name(stale) == "STALE_MEMBER_EPOCH"
    assert _error_name(KafkaException(KafkaError(KafkaError._STATE))) == "_STATE"
    assert _error_name(ValueError("not Kafka's")) == ""


def test_admin_clients_log_only_warnings_and_errors() -> None:
    s = Settings(kafka="k1:9092")
    assert admin_config(s) == {**librdkafka_config(s), "log_level": 4}


def test_a_refused_read_of_the_submit_topic_stops_the_member_and_a_passing_error_does_not() -> None:
    assert stops_the_member(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert stops_the_member(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    assert stops_the_member(KafkaError(KafkaError._AUTHENTICATION))
    assert stops_the_member(KafkaError(KafkaError._FATAL, fatal=True))
    assert not stops_the_member(KafkaError(KafkaError._TRANSPORT))
    assert not stops_the_member(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))


class _Committing:
    """The call of librdkafka's consumer that the membership check makes."""

    def __init__(self, refuse: str | None = None) -> None:
        self._refuse = refuse
        self.commits: list[list[tuple[str, int, int, str | None]]] = []

    def commit(self, *, offsets: list[Any], asynchronous: bool) -> None:
        assert not asynchronous
        if self._refuse is not None:
            raise KafkaException(KafkaError(getattr(KafkaError, self._refuse)))
        self.commits.append([(tp.topic, tp.partition, tp.offset, tp.metadata)
                             for tp in offsets])


def test_the_membership_check_commits_the_probe_and_never_a_submit_offset() -> None:
    member = ConsumerProtocolGroup(Settings(namespace="ns"), group_id="ns-nodes",
                                   client_id="n1", session_timeout_ms=3_000,
                                   on_assigned=_nothing, on_revoked=_nothing)
    member._assigned.update({0, 1, 2})
    consumer = _Committing()
    assert member._check_membership_on_group(consumer) is True
    assert consumer.commits == [[("ns.state", wire.MEMBERSHIP_PROBE_PARTITION,
                                  wire.MEMBERSHIP_PROBE_OFFSET, wire.MEMBERSHIP_PROBE_METADATA)]]
    for passing_or_not in ("STALE_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"):
        assert member._check_membership_on_group(_Committing(passing_or_not)) is False
    with pytest.raises(BusError) as failed:
        member._check_membership_on_group(_Committing("_TRANSPORT"))
    assert "ns.state[0]" in str(failed.value)


class _Seeking:
    """The parts of a librdkafka consumer a seek, a hand-over and a revocation touch."""

    def __init__(self, log_end: int) -> None:
        self.seeks: list[tuple[int, int]] = []
        self.log_end = log_end

    def seek(self, tp: Any) -> None:
        self.seeks.append((tp.partition, tp.offset))

    def get_watermark_offsets(self, tp: Any, *, cached: bool) -> tuple[int, int]:
        assert cached  # on the group thread, between polls: never a request
        return 0, self.log_end  # librdkafka's OFFSET_INVALID (-1001) until a fetch told it

    def incremental_unassign(self, partitions: list[Any]) -> None:
        del partitions


def test_records_behind_a_seek_are_not_handed_over_and_a_revoked_shard_forgets_its_place(
) -> None:
    # librdkafka can go back behind a seek (bus/group_thread.py, _hand_over); the member
    # tells the hand-over where it sought, and forgets it with the shard.
    from chronowheel.bus.ports import FetchedRecord
    from confluent_kafka import TopicPartition

    settings = Settings(namespace="ns")
    member = ConsumerProtocolGroup(settings, group_id="ns-nodes", client_id="n1",
                                   session_timeout_ms=3_000, on_assigned=_nothing,
                                   on_revoked=_nothing)
    consumer = member._consumer = _Seeking(log_end=100)
    member._assigned.update({0, 1})

    def records(shard: int, *offsets: int) -> list[Any]:
        return [FetchedRecord(settings.submit_topic, shard, k, b"k", b"v", ()) for k in offsets]

    member._seek_on_group(consumer, 1, 7)
    assert consumer.seeks == [(1, 7)]
    member._seek_on_group(consumer, 2, 7)  # not assigned (being revoked): nothing moves
    assert consumer.seeks == [(1, 7)] and 2 not in member._next_offset
    member._hand_over({1: records(1, 3, 7, 8, 0, 1, 2, 9), 0: records(0, 0, 1)})
    assert {k: [r.offset for r in rs] for k, rs in member._ready.items()} == {
        1: [7, 8, 9], 0: [0, 1]}
    member._revoked_cb(consumer, [TopicPartition(settings.submit_topic, 1)])
    assert 1 not in member._ready and 1 not in member._next_offset
    member._assigned.add(1)  # assigned again: from wherever librdkafka starts it
    member._hand_over({1: records(1, 3)})
    assert [r.offset for r in member._ready[1]] == [3]
    member._hand_over({0: records(0, 1)})  # the log ends at 100: fetched again
    consumer.log_end = -1001  # not known: fetched again, as far as anyone can tell
    member._hand_over({0: records(0, 0, 1)})
    assert [r.offset for r in member._ready[0]] == [0, 1]
    # Cut back to end at 1: 0 was read before the cut, 1 is new.
    consumer.log_end = 1
    member._hand_over({0: records(0, 0, 1)})
    assert [r.offset for r in member._ready[0]] == [0, 1, 1]


class _Querier:
    """A querier whose look-ups of offsets fail with `code` (a librdkafka error name)."""

    def __init__(self, code: str, *, fatal: bool = False) -> None:
        self.code, self.fatal, self.calls = code, fatal, 0

    def get_watermark_offsets(self, tp: Any, *, timeout: float, cached: bool) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        raise KafkaException(KafkaError(getattr(KafkaError, self.code), fatal=self.fatal))

    def committed(self, tps: list[Any], *, timeout: float) -> list[Any]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        raise KafkaException(KafkaError(getattr(KafkaError, self.code), fatal=self.fatal))


async def test_a_log_start_no_leader_answers_for_is_the_partition_s_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Tried again until the deadline, then PartitionUnavailable: a takeover gives that one
    # shard up (node/takeover.py). A fatal error is the querier's, every shard's: a BusError.
    from chronowheel.bus import kafka_consumer_group
    from chronowheel.bus.ports import PartitionUnavailable

    monkeypatch.setattr(kafka_consumer_group, "QUERY_DEADLINE_S", 0.05)
    monkeypatch.setattr(kafka_consumer_group, "QUERY_RETRY_MS", 10)
    member = ConsumerProtocolGroup(Settings(namespace="ns"), group_id="ns-nodes",
                                   client_id="n1", session_timeout_ms=3_000,
                                   on_assigned=_nothing, on_revoked=_nothing)
    querier = member._querier = _Querier("_TIMED_OUT")
    with pytest.raises(PartitionUnavailable, match=r"log start of ns.submit\[3\]"):
        await member.seek(3, None)
    assert querier.calls >= 2  # tried again first
    # The committed offset comes from the group's coordinator, which every shard shares.
    with pytest.raises(BusError) as failed:
        await member.committed(3)
    assert not isinstance(failed.value, PartitionUnavailable)
    member._querier = _Querier("_FATAL", fatal=True)
    with pytest.raises(BusError) as failed:
        await member.seek(3, None)
    assert not isinstance(failed.value, PartitionUnavailable)
