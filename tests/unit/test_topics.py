"""The namespace's topics as `chronowheel init` creates them."""

from __future__ import annotations

from chronowheel.bus.kafka import namespace_topics
from chronowheel.core import wire
from chronowheel.settings import Settings


def test_min_insync_replicas_is_every_replica_but_one() -> None:
    assert [wire.min_insync_replicas(rf) for rf in (1, 2, 3, 5)] == [1, 1, 2, 4]


def test_every_topic_of_a_replicated_namespace_needs_two_in_sync_replicas() -> None:
    settings = Settings(namespace="acme", replication="3")
    specs = namespace_topics(settings, 12, settings.topic_replication)
    assert {s.name for s in specs} == {"acme.submit", "acme.state", "acme.fired",
                                       "acme.rejected", "acme.dead"}
    assert all(s.config["min.insync.replicas"] == "2" for s in specs)
    state = next(s for s in specs if s.name == "acme.state")
    assert state.config["cleanup.policy"] == "compact"


def test_a_single_replica_namespace_keeps_one() -> None:
    specs = namespace_topics(Settings(namespace="dev"), 4, 1)
    assert all(s.config["min.insync.replicas"] == "1" for s in specs)
