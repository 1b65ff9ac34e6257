"""Node tunables are settings: a `chronowheel node` flag and a CHRONOWHEEL_* variable each."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from chronowheel.cli import build_parser
from chronowheel.errors import ConfigError
from chronowheel.settings import NODE_TUNABLES, Settings, env_name, flag_name, settings_from_args

# The values these had as module constants of the node, before they became settings.
FORMER_CONSTANTS = {
    "ingest_batch": 2_000, "ingest_concurrency": 64, "ingest_slack_ms": 50,
    "catch_up_grace_ms": 60_000, "idle_commit_ms": 2_000, "idle_commit_clearance_ms": 250,
    "skip_empty_after_ms": 600_000, "stop_drain_ms": 20_000, "stop_deadline_ms": 30_000,
    "missing_watermark_lookback_ms": 3_600_000, "skew_check_interval_ms": 5_000,
    "pump_fetch_records": 5_000, "pump_pause_rows": 20_000, "pump_resume_rows": 5_000,
    "warm_grace_ms": 30_000,  # WARM_GRACE_MS of node/registry.py
}
# Deliberate changes since, and tunables added later (issue 10: ingest in logged groups, its
# offset committed every few hundred records; a submit backlog left in Kafka rather than
# queued in the node's memory; the node process's young GC threshold and malloc thresholds;
# issue 13: backfill pacing, how long a named calendar is cached; issue 28: how late an
# occurrence may be before its catch-up policy applies, and how fast late ones are caught up;
# issue 26: the urgent lane, new one-shots due soon applied ahead of a backlog, and few
# bucket count requests in flight per shard, so a long-horizon herd does not flood Cassandra;
# fewer ingest writes in flight while an occurrence is due soon; issue 27: when a shard given
# up as claimed elsewhere, but still assigned to the node, is taken over again).
CHANGED_SINCE = {"ingest_batch": 500, "ingest_group_bytes": 4_500, "ingest_group_jobs": 16,
                 "pump_pause_rows": 2_000, "pump_resume_rows": 1_000,
                 "gc_young_threshold": 50_000, "malloc_threshold_bytes": 131_072,
                 "backfill_rows_per_cycle": 100, "backfill_cycle_ms": 100,
                 "calendar_refresh_ms": 30_000, "catch_up_lag_ms": 5_000,
                 "catch_up_rate": 500, "urgent_ms": 30_000,
                 "urgent_lookahead_records": 20_000, "ingest_writes_in_flight": 32,
                 "ingest_writes_in_flight_due_soon": 8, "ingest_due_soon_ms": 500,
                 "ingest_counts_in_flight": 2, "lost_shard_retry_ms": 1_000}


def _node_parser() -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["node"]
    raise AssertionError("no `node` command")


def test_every_tunable_keeps_its_former_default_unless_changed_on_purpose() -> None:
    expected = {**FORMER_CONSTANTS, **CHANGED_SINCE}
    assert set(NODE_TUNABLES) == set(expected)
    defaults = Settings()
    assert {name: getattr(defaults, name) for name in NODE_TUNABLES} == expected


def test_every_tunable_is_a_node_flag_whose_help_names_its_variable_and_default() -> None:
    by_dest = {a.dest: a for a in _node_parser()._actions}
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for name in NODE_TUNABLES:
        action = by_dest[name]
        assert flag_name(name) in action.option_strings
        assert env_name(name) in (action.help or "")
        assert f"default {fields[name].default!r}" in (action.help or "")


@pytest.mark.parametrize("name", NODE_TUNABLES)
def test_a_tunable_comes_from_its_variable_and_the_flag_wins(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name(name), "7_000")
    assert getattr(settings_from_args(build_parser().parse_args(["node"])), name) == 7_000
    args = build_parser().parse_args(["node", flag_name(name), "9"])
    assert getattr(settings_from_args(args), name) == 9


@pytest.mark.parametrize("value", [0, -1])
def test_a_shard_needs_at_least_one_count_request_in_flight(value: int) -> None:
    with pytest.raises(ConfigError, match=r"ingest_counts_in_flight: must be at least 1, got"):
        Settings(namespace="unit", ingest_counts_in_flight=value)
