"""The Grafana dashboard and the Prometheus alert rules: valid, tested with promtool, and
naming only metrics the code exports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import DEPLOY, exported_metric_names, metric_names_in, tool

DASHBOARD = DEPLOY / "grafana" / "chronowheel.json"
RULES = DEPLOY / "prometheus" / "chronowheel-alerts.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "chronowheel-alerts.test.yaml"

# The alerts issue 14 asks for, by the name the rules give them.
REQUIRED_ALERTS = {
    "ChronowheelShardsUnowned", "ChronowheelNodeDown", "ChronowheelDispatchLagHigh",
    "ChronowheelLatenessP99High", "ChronowheelDispatchBlockedByClockSkew",
    "ChronowheelRejectedSpike", "ChronowheelDeadLetterGrowth", "ChronowheelWorkerLag",
}


def dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t) for p in doc["panels"] if p.get("type") != "row"
            for t in p["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_the_dashboard_datasource_is_templated_everywhere() -> None:
    doc = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in doc["panels"] if p.get("type") != "row"]
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_expression_names_only_exported_metrics() -> None:
    exported = exported_metric_names()
    used: set[str] = set()
    for title, target in dashboard_targets():
        names = metric_names_in(target["expr"])
        assert names, f"{title}: no metric in {target['expr']!r}"
        unknown = names - exported
        assert not unknown, f"panel {title!r}: {sorted(unknown)} not exported by the code"
        used |= names
    # The panels the issue lists, by the metric each one needs.
    for needed in ("chronowheel_fired_total", "chronowheel_lateness_seconds_bucket",
                   "chronowheel_dispatch_lag_seconds", "chronowheel_watermark_seconds",
                   "chronowheel_wheel_entries", "chronowheel_loaded_horizon_seconds",
                   "chronowheel_ingested_total", "chronowheel_rejected_total",
                   "chronowheel_transaction_seconds_bucket", "chronowheel_clock_skew_seconds",
                   "chronowheel_dispatch_blocked", "chronowheel_owned_shards",
                   "chronowheel_worker_handled_total", "chronowheel_worker_dead_lettered_total",
                   "chronowheel_worker_consumer_lag", "chronowheel_upcoming_rows"):
        assert needed in used, f"no panel shows {needed}"


def test_the_metric_name_extraction_sees_through_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, topic) (rate(a_bucket{job="$j",x=~"b|c"}'
            '[$__rate_interval]))) / on(instance) group_left(topic) b_total offset 5m > 1')
    assert metric_names_in(expr) == {"a_bucket", "b_total"}


def test_every_alert_names_only_exported_metrics_and_the_required_alerts_exist() -> None:
    exported = exported_metric_names()
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= REQUIRED_ALERTS
    for rule in rules:
        unknown = metric_names_in(rule["expr"]) - exported
        assert not unknown, f"{rule['alert']}: {sorted(unknown)} not exported by the code"
        assert rule["labels"]["severity"] in ("page", "ticket")


def test_promtool_checks_the_rules_and_every_alert_has_a_firing_unit_test() -> None:
    promtool = tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", ())
             if case.get("exp_alerts")}
    assert {r["alert"] for r in alert_rules()} <= fired


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    promtool = tool("promtool")
    # Grafana's variables replaced by what they stand for, each expression a recording rule.
    rules = [{"record": f"dashboard:expr_{i}",
              "expr": t["expr"].replace("$__rate_interval", "5m")
                               .replace("$node_job", "chronowheel-node")
                               .replace("$worker_job", "chronowheel-worker")}
             for i, (_, t) in enumerate(dashboard_targets())]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
