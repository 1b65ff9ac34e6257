"""The Helm chart: `helm lint` and `helm template` pass, and the rendered manifests have the
kinds, hooks, probes, non-root security, resources and secret references the deployment needs;
no credential can be given as a plain value; the NetworkPolicy admits only the scrapers to the
node and worker pods' HTTP port."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chronowheel.settings import Settings, env_name

from tests.deploy.tools import DEPLOY, tool

CHART = DEPLOY / "helm" / "chronowheel"
FULL = ["--set", "worker.enabled=true", "--set", "worker.topics={acme.fired}",
        "--set", "worker.handlers={myapp.handlers:send}", "--set", "console.enabled=true",
        "--set", "secrets.kafkaSaslPassword.name=kafka-credentials",
        "--set", "secrets.cassandraPassword.name=cassandra-credentials",
        "--set", "secrets.cassandraPassword.key=pw", "--set", "tlsSecret=chronowheel-tls",
        "--set", "config.KAFKA_SECURITY_PROTOCOL=SASL_SSL",
        "--set", "env.OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318"]
SECRET_SETTINGS = {env_name(f.name) for f in dataclasses.fields(Settings)
                   if f.metadata.get("secret")}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("helm"), *args], capture_output=True, text=True, check=False,
                          timeout=120)


def render(*args: str) -> list[dict[str, Any]]:
    run = helm("template", "rel", str(CHART), *args)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if spec:
            for container in spec["containers"]:
                yield doc, container


@pytest.mark.parametrize("extra", [[], FULL], ids=["defaults", "everything on"])
def test_helm_lint_passes(extra: list[str]) -> None:
    run = helm("lint", str(CHART), "--strict", *extra)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_rendered_kinds_and_the_init_hook() -> None:
    docs = render(*FULL)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [
        ("Deployment", "rel-chronowheel-console"), ("Deployment", "rel-chronowheel-worker"),
        ("Job", "rel-chronowheel-init"), ("NetworkPolicy", "rel-chronowheel-http"),
        ("PodDisruptionBudget", "rel-chronowheel-node"),
        ("PodDisruptionBudget", "rel-chronowheel-worker"),
        ("Service", "rel-chronowheel-node"), ("Service", "rel-chronowheel-worker"),
        ("ServiceMonitor", "rel-chronowheel"), ("StatefulSet", "rel-chronowheel-node")]
    [job] = [d for d in docs if d["kind"] == "Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["init"]
    [worker] = [c for d, c in containers(docs) if c["name"] == "worker"]
    assert worker["args"] == ["worker", "--topic", "acme.fired", "--handler",
                              "myapp.handlers:send"]
    [console] = [c for d, c in containers(docs) if c["name"] == "console"]
    assert console["args"] == ["console"]
    # Without the optional parts: node, its service and budget, the hook, the monitor, the
    # network policy.
    assert {d["kind"] for d in render()} == {"StatefulSet", "Service", "PodDisruptionBudget",
                                             "Job", "ServiceMonitor", "NetworkPolicy"}


def test_probes_resources_and_non_root_everywhere() -> None:
    docs = render(*FULL)
    for doc, c in containers(docs):
        pod = doc["spec"]["template"]["spec"]
        where = f"{doc['kind']}/{c['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] != 0, where
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], where
        if c["name"] in ("node", "worker"):
            assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}, where
            assert c["livenessProbe"]["httpGet"] == {"path": "/healthz/live",
                                                     "port": "http"}, where
            assert {p["name"] for p in c["ports"]} == {"http"}, where
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["CHRONOWHEEL_HTTP_HOST"] == "0.0.0.0", where


def test_credentials_come_only_from_secret_references() -> None:
    docs = render(*FULL)
    settings_env = {env_name(f.name) for f in dataclasses.fields(Settings)}
    for _doc, c in containers(docs):
        for e in c["env"]:
            assert e["name"] in settings_env or e["name"].startswith("OTEL_"), e["name"]
            if e["name"] in SECRET_SETTINGS:
                assert "value" not in e, f"{e['name']} given as a plain value"
                assert e["valueFrom"]["secretKeyRef"]["name"], e
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
        assert refs == {
            "CHRONOWHEEL_KAFKA_SASL_PASSWORD": {"name": "kafka-credentials", "key": "password"},
            "CHRONOWHEEL_CASSANDRA_PASSWORD": {"name": "cassandra-credentials", "key": "pw"}}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/etc/chronowheel/tls"]["readOnly"] is True
    # The schema refuses a secret smuggled in as a plain setting.
    for where in ("config.KAFKA_SASL_PASSWORD", "config.CASSANDRA_PASSWORD", "config.HTTP_TOKEN",
                  "env.CHRONOWHEEL_HTTP_TOKEN", "env.OTEL_EXPORTER_OTLP_HEADERS_TOKEN"):
        run = helm("template", "rel", str(CHART), "--set", f"{where}=hunter2")
        assert run.returncode != 0 and "values don't meet the specifications" in run.stderr, where


def test_values_yaml_holds_no_secret_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["secrets"]) and all(ref["name"] == "" for ref in values["secrets"].values())

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if re.search(r"password|token|secret", key, re.I) and isinstance(value, str):
                    assert value == "", f"{path}.{key} holds a value"
                walk(value, f"{path}.{key}")

    walk(values, "values")


def test_the_scrape_jobs_are_the_ones_the_alerts_and_dashboard_expect() -> None:
    docs = render(*FULL)
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    label = monitor["spec"]["jobLabel"]
    jobs = {d["metadata"]["labels"][label] for d in docs if d["kind"] == "Service"}
    assert jobs == {"chronowheel-node", "chronowheel-worker"}
    rules = (DEPLOY / "prometheus" / "chronowheel-alerts.yaml").read_text()
    dashboard = (DEPLOY / "grafana" / "chronowheel.json").read_text()
    assert 'job="chronowheel-node"' in rules
    assert all(job in dashboard for job in jobs)


# --- the NetworkPolicy -----------------------------------------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Does a Kubernetes label selector (matchLabels, matchExpressions) select these labels?"""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if not {"In": key in labels and labels[key] in values,
                "NotIn": labels.get(key) not in values,
                "Exists": key in labels,
                "DoesNotExist": key not in labels}[op]:
            return False
    return True


def network_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return policy


def test_the_network_policy_admits_only_the_scrapers_to_the_http_port_of_node_and_worker(
        ) -> None:
    docs = render(*FULL)
    policy = network_policy(docs)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    # It selects the node and worker pods of this release, not the console or the init Job.
    chosen = {c["name"] for d, c in containers(docs)
              if selects(spec["podSelector"], d["spec"]["template"]["metadata"]["labels"])}
    assert chosen == {"node", "worker"}
    assert not selects(spec["podSelector"], {
        "app.kubernetes.io/name": "chronowheel", "app.kubernetes.io/instance": "other",
        "app.kubernetes.io/component": "node"})
    # One rule: the HTTP port the containers listen on, from the default scrapers.
    [rule] = spec["ingress"]
    ports = {p["containerPort"] for d, c in containers(docs) if c["name"] in chosen
             for p in c["ports"] if p["name"] == "http"}
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}] and ports == {8080}
    assert rule["from"] == [{"namespaceSelector": {},
                             "podSelector": {"matchLabels": {
                                 "app.kubernetes.io/name": "prometheus"}}}]
    # The port follows httpPort.
    [rule] = network_policy(render("--set", "httpPort=9100"))["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9100}]


def test_the_network_policy_scrapers_come_from_the_values(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True, "scrapers": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        {"podSelector": {"matchExpressions": [
            {"key": "role", "operator": "In", "values": ["checker"]}]}},
        {"ipBlock": {"cidr": "10.0.0.0/8"}}]}}))
    [rule] = network_policy(render("-f", str(values)))["spec"]["ingress"]
    assert rule["from"] == yaml.safe_load(values.read_text())["networkPolicy"]["scrapers"]
    assert helm("lint", str(CHART), "--strict", "-f", str(values)).returncode == 0
    # No scrapers: no rule at all (an empty `from` would admit everyone).
    values.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True, "scrapers": []}}))
    spec = network_policy(render("-f", str(values)))["spec"]
    assert spec["policyTypes"] == ["Ingress"] and spec["ingress"] == []
    # Off: no policy.
    assert not [d for d in render("--set", "networkPolicy.enabled=false")
                if d["kind"] == "NetworkPolicy"]
    # The schema refuses an empty peer and an unknown key.
    bad_values: list[dict[str, Any]] = [
        {"scrapers": [{}]}, {"scrapers": [{"podSelector": {"labels": {"a": "b"}}}]},
        {"scrapers": [], "allowAll": True}]
    for bad in bad_values:
        values.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True, **bad}}))
        run = helm("template", "rel", str(CHART), "-f", str(values))
        assert run.returncode != 0 and "values don't meet the specifications" in run.stderr, bad


def test_static_membership_names_each_node_by_its_pod_when_enabled() -> None:
    def node_env(*args: str) -> list[dict[str, Any]]:
        (container,) = [c for d, c in containers(render(*args))
                        if d["kind"] == "StatefulSet" and c["name"] == "node"]
        return list(container["env"])

    assert "CHRONOWHEEL_NODE_INSTANCE_ID" not in {e["name"] for e in node_env()}
    env = {e["name"]: e for e in node_env("--set", "node.staticMembership.enabled=true",
                                          "--set", "node.staticMembership.sessionTimeoutMs=45000")}
    assert env["CHRONOWHEEL_NODE_INSTANCE_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS"]["value"] == "45000"
    assert {env_name("node_instance_id"), env_name("node_session_timeout_ms")} <= set(env)
    # The node starts with what the chart gives it: the loop-stall limit above the session
    # timeout (at the chart's own default, 30 s, the node's default limit of 15 s is not).
    for session in ("45000", None):
        args = ["--set", "node.staticMembership.enabled=true"]
        if session is not None:
            args += ["--set", f"node.staticMembership.sessionTimeoutMs={session}"]
        plain = {e["name"]: e["value"] for e in node_env(*args) if "value" in e}
        settings = Settings.from_env(plain)  # raises ConfigError on a combination it refuses
        assert settings.node_loop_stall_limit_ms > settings.node_session_timeout_ms
        assert settings.node_session_timeout_ms == int(session or 30000)
    # An operator's own limit (`config`; the schema keeps CHRONOWHEEL_* names out of `env`) is
    # theirs: set once, not overridden by a second entry.
    entries = [e for e in node_env("--set", "node.staticMembership.enabled=true",
                                   "--set", "config.NODE_LOOP_STALL_LIMIT_MS=90000")
               if e["name"] == "CHRONOWHEEL_NODE_LOOP_STALL_LIMIT_MS"]
    assert [e["value"] for e in entries] == ["90000"]
