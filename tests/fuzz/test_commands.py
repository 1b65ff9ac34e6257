"""The generator itself (no servers): it covers every job field of the schema, is
reproducible from its seed, and its cases have the bytes and routing they claim."""

from __future__ import annotations

import pytest
from chronowheel.core.shard import shard_of

from tests.fuzz.commands import KINDS, Expect, Generator, fields_covered, load_schema

pytestmark = pytest.mark.fuzz


def test_every_job_field_of_the_schema_is_driven_to_an_edge() -> None:
    fields = set(load_schema()["$defs"]["job"]["properties"])
    assert fields - fields_covered() == set(), "job fields without an edge case"


def test_a_seed_gives_the_same_commands_and_a_small_run_has_every_kind() -> None:
    a = list(Generator(7, "ns", 2).cases(len(KINDS) + 50, lambda: 1_800_000_000_000))
    b = list(Generator(7, "ns", 2).cases(len(KINDS) + 50, lambda: 1_800_000_000_000))
    assert [(c.kind, c.key, c.value, c.partition) for c in a] == \
        [(c.kind, c.key, c.value, c.partition) for c in b]
    assert {c.kind for c in a} == {k.name for k in KINDS}


def test_cases_route_as_they_say() -> None:
    for c in Generator(11, "ns", 2).cases(400, lambda: 1_800_000_000_000):
        assert 0 <= c.partition < 2
        if c.expect is Expect.GOOD:
            assert c.at_ms is not None and c.job_id is not None
        route = c.calendar or c.job_id
        if route is not None and not c.misrouted:
            assert c.partition == shard_of(route, 2), c.describe(11)
        if c.misrouted and route is not None:
            assert c.partition != shard_of(route, 2), c.describe(11)
