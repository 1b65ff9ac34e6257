"""The node's group membership settings: session timeout, heartbeats, static membership, and
the error a node gives when the brokers would refuse its session timeout."""

from __future__ import annotations

import argparse

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
    assert s.node_loop_stall_limit_ms == 15_000


@pytest.mark.parametrize("limit", [0, 2_999, 3_000])
def test_a_stall_limit_not_over_the_session_timeout_is_refused(limit: int) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(node_session_timeout_ms=3_000, node_loop_stall_limit_ms=limit)
    why = str(refused.value)
    assert f"node_loop_stall_limit_ms: {limit} must exceed" in why
    assert "node_session_timeout_ms (3000)" in why


def test_the_stall_limit_comes_from_its_environment_variable_and_shows_in_help() -> None:
    from chronowheel.cli import build_parser

    s = Settings.from_env({"CHRONOWHEEL_NODE_LOOP_STALL_LIMIT_MS": "4000"})
    assert s.node_loop_stall_limit_ms == 4_000
    [commands] = [a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction)]
    text = commands.choices["node"].format_help()
    assert "--node-loop-stall-limit-ms" in text
    assert "CHRONOWHEEL_NODE_LOOP_STALL_LIMIT_MS" in text


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
    consumer = group._new_consumer()
    assert consumer._session_timeout_ms == 4_000
    assert consumer._heartbeat_interval_ms == 400
    assert consumer._group_instance_id == "host-7"
    dynamic = KafkaSubmitGroup(Settings(), group_id="g", client_id="c",
                               session_timeout_ms=3_000, on_assigned=_nothing,
                               on_revoked=_nothing)
    assert dynamic._new_consumer()._group_instance_id is None
