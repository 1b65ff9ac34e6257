"""Helpers of the security tests: how a client of the secured local stack is configured."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from chronowheel.settings import Settings

from testkit import REPO


@dataclass(frozen=True)
class Secured:
    kafka: str
    cassandra: str
    ca_file: str
    password_files: dict[str, str]
    started: tuple[str, ...]
    kafka_mtls: str = ""
    """The SSL listener that requires a client certificate."""
    client_cert: str = ""
    client_key: str = ""
    client_key_password_file: str = ""

    def password(self, user: str) -> str:
        return Path(self.password_files[user]).read_text().strip()

    def all_secrets(self) -> list[str]:
        folder = Path(self.ca_file).parent
        return [p.read_text().strip() for p in sorted(folder.glob("*.password"))]

    def mtls_env(self, with_certificate: bool = True) -> dict[str, str]:
        env = {"CHRONOWHEEL_KAFKA": self.kafka_mtls, "CHRONOWHEEL_KAFKA_SECURITY_PROTOCOL": "SSL",
               "CHRONOWHEEL_KAFKA_SSL_CAFILE": self.ca_file}
        if with_certificate:
            env.update({"CHRONOWHEEL_KAFKA_SSL_CERTFILE": self.client_cert,
                        "CHRONOWHEEL_KAFKA_SSL_KEYFILE": self.client_key,
                        "CHRONOWHEEL_KAFKA_SSL_KEY_PASSWORD_FILE":
                            self.client_key_password_file})
        return env

    def env(self, kafka_user: str | None, cassandra_user: str | None = None,
            **extra: str) -> dict[str, str]:
        """CHRONOWHEEL_* variables of a client: passwords by file, never by value."""
        env = {
            "CHRONOWHEEL_KAFKA": self.kafka,
            "CHRONOWHEEL_CASSANDRA": self.cassandra,
            "CHRONOWHEEL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "CHRONOWHEEL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "CHRONOWHEEL_KAFKA_SSL_CAFILE": self.ca_file,
            "CHRONOWHEEL_CASSANDRA_SSL_CAFILE": self.ca_file,
        }
        if kafka_user:
            env["CHRONOWHEEL_KAFKA_SASL_USERNAME"] = kafka_user
            env["CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE"] = self.password_files[kafka_user]
        if cassandra_user:
            env["CHRONOWHEEL_CASSANDRA_USERNAME"] = cassandra_user
            env["CHRONOWHEEL_CASSANDRA_PASSWORD_FILE"] = self.password_files[cassandra_user]
        env.update(extra)
        return env

    def settings(self, namespace: str, kafka_user: str | None,
                 cassandra_user: str | None = None, **overrides: object) -> Settings:
        return Settings.from_env(self.env(kafka_user, cassandra_user), namespace=namespace,
                                 **overrides)

    def child_env(self, kafka_user: str | None, cassandra_user: str | None = None,
                  **extra: str) -> dict[str, str]:
        """The environment of a child process: this one's without CHRONOWHEEL_* (the plain
        stack's addresses), plus the secured client's."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOWHEEL_")}
        return {**base, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
                **self.env(kafka_user, cassandra_user, **extra)}


def chronowheel_cli(secured: Secured, args: list[str], kafka_user: str | None,
                    cassandra_user: str | None = None,
                    timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chronowheel", *args],
                          env=secured.child_env(kafka_user, cassandra_user), cwd=REPO,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout, check=False)


def drop_namespace(secured: Secured, ns: str) -> None:
    """Best effort: drop the test's keyspace and `<ns>.*` topics as the admin user."""
    from chronowheel.testing import drop_namespace_quietly

    drop_namespace_quietly(secured.settings(ns, "admin", "admin"))
