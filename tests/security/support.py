"""Helpers of the security tests: how a client of the secured local stack is configured."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from chronowheel.settings import Settings

REPO = Path(__file__).resolve().parents[2]


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
    """Best effort, as the admin principal: drop the keyspace and the `<ns>.*` topics."""
    import asyncio

    from chronowheel.bus.kafka import open_admin
    from chronowheel.store.cassandra import connect

    settings = secured.settings(ns, "admin", "admin")
    try:
        cluster, session = connect(settings)
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
        finally:
            cluster.shutdown()
    except Exception as exc:  # cleanup must not fail a test that passed
        print(f"dropping keyspace {ns} failed: {exc!r}", file=sys.stderr)

    async def drop_topics() -> None:
        admin = await open_admin(settings)
        try:
            mine = [t for t in await admin.list_topics() if t.startswith(f"{ns}.")]
            if mine:
                await admin.delete_topics(mine)
        finally:
            await admin.close()

    def in_own_thread() -> None:
        # asyncio.run in a thread of its own leaves pytest-asyncio's event loop alone.
        try:
            asyncio.run(drop_topics())
        except Exception as exc:
            print(f"deleting topics of {ns} failed: {exc!r}", file=sys.stderr)

    worker = threading.Thread(target=in_own_thread, name=f"drop-{ns}")
    worker.start()
    worker.join(60)
