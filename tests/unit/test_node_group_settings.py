"""The node's group membership settings: session timeout, heartbeats, static membership, and
the error a node gives when the brokers would refuse its session timeout."""

from __future__ import annotations

import pytest
from chronowheel.bus.kafka import session_timeout_refusal
from chronowheel.bus.kafka_node import KafkaSubmitGroup
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings


async def _nothing(shards: list[int]) -> None:
    del shards


def test_the_defaults_move_a_dead_nodes_shards_within_seconds() -> None:
    s = Settings()
    assert s.node_session_timeout_ms == 3_000
    assert s.node_heartbeat_interval_ms * 3 <= s.node_session_timeout_ms
    assert s.node_instance_id == ""


@pytest.mark.parametrize("heartbeat", [0, 1_001, 3_000])
def test_a_heartbeat_over_a_third_of_the_session_is_refused(heartbeat: int) -> None:
    with pytest.raises(ConfigError, match="node_heartbeat_interval_ms"):
        Settings(node_session_timeout_ms=3_000, node_heartbeat_interval_ms=heartbeat)


def test_the_refusal_names_the_broker_its_limits_and_both_ways_out() -> None:
    limits = {"k1:9092": (6_000, 1_800_000), "k2:9092": (1_000, 1_800_000)}
    why = session_timeout_refusal(3_000, limits)
    assert why is not None
    assert "k1:9092" in why and "k2:9092" not in why
    assert "group.min.session.timeout.ms 6000" in why
    assert "at most 3000" in why and "at least 6000" in why
    assert session_timeout_refusal(6_000, limits) is None
    assert session_timeout_refusal(2_000_000, limits) is not None


async def test_the_group_consumer_gets_the_heartbeat_and_the_static_member_id() -> None:
    s = Settings(node_session_timeout_ms=4_000, node_heartbeat_interval_ms=400,
                 node_instance_id="host-7")
    group = KafkaSubmitGroup(s, group_id="g", client_id="c", session_timeout_ms=4_000,
                             on_assigned=_nothing, on_revoked=_nothing)
    consumer = group._consumer
    assert consumer._session_timeout_ms == 4_000
    assert consumer._heartbeat_interval_ms == 400
    assert consumer._group_instance_id == "host-7"
    dynamic = KafkaSubmitGroup(Settings(), group_id="g", client_id="c",
                               session_timeout_ms=3_000, on_assigned=_nothing,
                               on_revoked=_nothing)
    assert dynamic._consumer._group_instance_id is None
