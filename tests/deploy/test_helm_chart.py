"""The Helm chart: `helm lint` and `helm template` pass, and the rendered manifests have the
kinds, hooks, probes, non-root security, resources and secret references the deployment needs;
no credential can be given as a plain value."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Iterator
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
        ("Job", "rel-chronowheel-init"),
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
    # Without the optional parts: node, its service and budget, the hook, the monitor.
    assert {d["kind"] for d in render()} == {"StatefulSet", "Service", "PodDisruptionBudget",
                                             "Job", "ServiceMonitor"}


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
