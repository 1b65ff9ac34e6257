"""The locust kit's cluster and figures, kept apart from locust (whose import patches the whole
process for gevent) so that they can be tested alone and shared with kafka_bridge.py.

- the options: each locust file's own `--cw-*` options as a table (`add_options`);
- the cluster: the same settings as every other command (`add_cluster_arguments`, `resolve`:
  flags, then CHRONOWHEEL_* variables, secrets from the environment or `..._FILE` only), the
  arguments that hand them to the bridge (`bridge_arguments`), a description without secrets
  (`describe`) and the refusal of a cluster off this machine unless asked for (`refusal`);
- the figures: each locust process sums up what it measured in a `part`; `summarize` turns
  the parts of every process into the run's summary (distributed runs add up).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from chronowheel.settings import (
    CONNECTION_SETTINGS,
    SECURITY_SETTINGS,
    Settings,
    add_settings_arguments,
    env_name,
    flag_name,
    parse_bool,
)
from chronowheel.testing.lateness import summarize as summarize_values
from chronowheel.testing.local import non_loopback_hosts

CLUSTER_SETTINGS = CONNECTION_SETTINGS + SECURITY_SETTINGS
"""namespace, Kafka, Cassandra, consistency and their TLS/SASL/authentication settings"""
DEFAULT_NAMESPACE = "loadtest"
"""the namespace when neither --namespace nor CHRONOWHEEL_NAMESPACE names one (not the
package's default `chronowheel`: a load test does not pick a production namespace by itself)"""
ALLOW_REMOTE_FLAG = "--cw-allow-remote-cluster"
ALLOW_REMOTE_ENV = "CHRONOWHEEL_LOADTEST_ALLOW_REMOTE"


Options = Mapping[str, tuple[Any, str]]
"""A locust file's own options: flag -> (default, help)."""


def add_options(parser: Any, options: Options) -> None:
    """The options on locust's parser (or a group of it): each takes the type of its default,
    as locust's web UI does with them too; a `False` default makes a switch."""
    for flag, (default, help) in options.items():
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", default=default, help=help)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=help)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster's flags, as every chronowheel command has them, and the remote guard's."""
    add_settings_arguments(parser, CONNECTION_SETTINGS)
    parser.add_argument(
        ALLOW_REMOTE_FLAG, dest="cw_allow_remote_cluster", action="store_true", default=False,
        help=f"send load to Kafka or Cassandra servers that are not on this machine (without "
             f"it, or {ALLOW_REMOTE_ENV}=1, only loopback addresses are loaded)")


def resolve(options: Any, env: Mapping[str, str] | None = None) -> Settings:
    """The cluster's settings: flags given in `options`, then the environment, then defaults."""
    env = os.environ if env is None else env
    overrides = {name: getattr(options, name, None) for name in CLUSTER_SETTINGS}
    if overrides["namespace"] is None and not env.get(env_name("namespace")):
        overrides["namespace"] = DEFAULT_NAMESPACE
    return Settings.from_env(env, **overrides)


def bridge_arguments(settings: Settings) -> list[str]:
    """Flags that give the bridge exactly these cluster settings; it reads the secrets from the
    environment it inherits, as the settings did here (never a flag, never in `ps`)."""
    out: list[str] = []
    for name in CLUSTER_SETTINGS:
        value = getattr(settings, name)
        out += [flag_name(name), ("true" if value else "false") if isinstance(value, bool)
                else str(value)]
    return out


def describe(settings: Settings) -> str:
    """The cluster about to be loaded, in one line: addresses, namespace and how it is reached
    (protocol, mechanism, user names, files); never a password."""
    s = settings
    kafka = [s.kafka_security_protocol]
    if s.kafka_uses_sasl:
        kafka.append(f"SASL {s.kafka_sasl_mechanism} as {s.kafka_sasl_username or '(no user)'}")
    if s.kafka_uses_ssl:
        kafka.append(f"CA {s.kafka_ssl_cafile or 'system trust store'}")
        if s.kafka_ssl_certfile:
            kafka.append(f"mutual TLS with {s.kafka_ssl_certfile}")
        if not s.kafka_ssl_check_hostname:
            kafka.append("host names not checked")
    cassandra = []
    if s.cassandra_uses_ssl:
        cassandra.append(f"TLS, CA {s.cassandra_ssl_cafile or 'system trust store'}")
        if s.cassandra_ssl_certfile:
            cassandra.append(f"mutual TLS with {s.cassandra_ssl_certfile}")
        if not s.cassandra_ssl_check_hostname:
            cassandra.append("host names not checked")
    else:
        cassandra.append("plaintext")
    cassandra.append(f"user {s.cassandra_username}" if s.cassandra_username
                     else "no authentication")
    if s.cassandra_local_dc:
        cassandra.append(f"local data centre {s.cassandra_local_dc}")
    cassandra.append(f"consistency {s.consistency}")
    return (f"namespace {s.namespace}; Kafka {s.kafka} ({', '.join(kafka)}); "
            f"Cassandra {s.cassandra} ({', '.join(cassandra)})")


def remote_hosts(settings: Settings) -> dict[str, list[str]]:
    """The servers of each kind that are not on this machine (kinds with none are left out)."""
    cassandra = ",".join(f"{host}:{port}" for host, port in settings.cassandra_hosts())
    found = {"Kafka": non_loopback_hosts(settings.kafka),
             "Cassandra": non_loopback_hosts(cassandra)}
    return {kind: hosts for kind, hosts in found.items() if hosts}


def remote_allowed(options: Any, env: Mapping[str, str] | None = None) -> bool:
    """The flag, or the variable set to a true value (an unreadable value is an error)."""
    env = os.environ if env is None else env
    if getattr(options, "cw_allow_remote_cluster", False):
        return True
    raw = env.get(ALLOW_REMOTE_ENV, "").strip()
    if not raw:
        return False
    try:
        return parse_bool(raw)
    except ValueError:
        raise SystemExit(f"{ALLOW_REMOTE_ENV}: expected 1 or 0 (true or false), "
                         f"got {raw!r}") from None


def refusal(settings: Settings, allowed: bool) -> str | None:
    """Why this cluster is not loaded, or None when it may be: every server is on this machine,
    or the operator said that this one is meant."""
    remote = remote_hosts(settings)
    if not remote or allowed:
        return None
    where = "; ".join(f"{kind} {', '.join(hosts)}" for kind, hosts in remote.items())
    return (f"refusing to load a cluster that is not on this machine ({where}): a load test "
            f"submits jobs at the rate asked into namespace {settings.namespace} and leaves "
            f"them there. If this is the cluster you mean to load, run again with "
            f"{ALLOW_REMOTE_FLAG} (or {ALLOW_REMOTE_ENV}=1).")


# --- figures ---------------------------------------------------------------------------------

def _rounded(values: Sequence[float]) -> dict[str, Any]:
    return {k: v if k == "n" or v is None else round(float(v), 1)
            for k, v in summarize_values(values).items()}


def _tallied(parts: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, int]:
    return {k: sum(int(p.get(k) or 0) for p in parts) for k in keys}


COUNTS = ("submitted", "submit_failed", "expected_fires", "received", "missing", "not_yet_due",
          "duplicates", "early_fired", "early_received")
HANDLER_COUNTS = ("started", "missing", "not_yet_due", "duplicates", "early")


def summarize(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's summary from the parts of its locust processes (one part when not distributed).

    A part holds counts (COUNTS), the first and last submit times (`first_submit_ms`,
    `last_submit_ms`), the first-delivery lateness of each received occurrence on Cassandra's
    clock (`lateness_ms`) and by its cw-fired-at (`fired_lateness_ms`), the process's clock
    offsets to Cassandra as measured ([skew, uncertainty] in ms, `offsets`), and with the
    worker a `handler` part (HANDLER_COUNTS and `lateness_ms`)."""
    out: dict[str, Any] = {"processes": len(parts), **_tallied(parts, COUNTS)}
    firsts = [p["first_submit_ms"] for p in parts if p.get("first_submit_ms") is not None]
    lasts = [p["last_submit_ms"] for p in parts if p.get("last_submit_ms") is not None]
    span_s = (max(lasts) - min(firsts)) / 1000 if firsts and lasts else 0.0
    out["submit_seconds"] = round(span_s, 2)
    out["submitted_per_s"] = round(out["submitted"] / span_s) if span_s > 0 else None
    out["lateness_ms"] = {
        "received": _rounded([x for p in parts for x in p.get("lateness_ms", ())]),
        "cw_fired_at": _rounded([x for p in parts for x in p.get("fired_lateness_ms", ())]),
    }
    offsets = [(o[0], o[1]) for p in parts for o in p.get("offsets", ())]
    out["clock_offset_ms"] = None if not offsets else {
        "last": [p["offsets"][-1][0] for p in parts if p.get("offsets")],
        "min": min(o[0] for o in offsets), "max": max(o[0] for o in offsets),
        "uncertainty_max": max(o[1] for o in offsets), "measurements": len(offsets)}
    handlers = [p["handler"] for p in parts if p.get("handler") is not None]
    if handlers:
        out["handler_start"] = {
            **_tallied(handlers, HANDLER_COUNTS),
            "lateness_ms": _rounded([x for h in handlers for x in h.get("lateness_ms", ())])}
    return out
