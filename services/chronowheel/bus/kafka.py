"""Kafka access: topic administration and producer/consumer/admin factories over aiokafka.

Every Kafka client of the package is made here, so each gets the security settings
(`security_options`): protocol, TLS context, SASL mechanism and credentials. The clients made
here also explain a failed `start()`: when aiokafka only says "Unable to bootstrap", the
endpoints are probed once more, directly, and the error names the endpoint and the cause
(refused, not TLS, untrusted certificate, bad credentials, ...), never a secret.

aiokafka marks its transient errors with `retriable = True`, which the shared retry policy reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.producer import sender as _aiokafka_sender

from chronowheel.core import wire
from chronowheel.errors import ConfigError, RetriableError
from chronowheel.security import quiet_loggers, speaks_tls, ssl_context, tls_failure
from chronowheel.settings import Settings
from chronowheel.timeouts import within

log = logging.getLogger(__name__)

# When a transaction begins right after the previous one committed, the broker may still be
# writing the previous one's markers and answers AddPartitionsToTxn with
# CONCURRENT_TRANSACTIONS; aiokafka then waits a fixed BACKOFF_OVERRIDE (20 ms) before asking
# again. A node commits back to back from a few hundred occurrences per second on, so that
# wait landed on most transactions and set the publish latency (a transaction took ~23 ms
# instead of ~3). The markers take a millisecond or two: ask again after 2 ms. Only the retry's
# timing changes: no record is produced before the partitions are added, and the broker still
# checks epochs and fences. (aiokafka reads the module global at each retry.)
CONCURRENT_TRANSACTIONS_RETRY_S = 0.002
_aiokafka_sender.BACKOFF_OVERRIDE = CONCURRENT_TRANSACTIONS_RETRY_S


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


def namespace_topics(settings: Settings, shards: int, replication: int) -> list[TopicSpec]:
    """The namespace's topics; the replication factor itself is passed to create_topics."""
    durable = {"min.insync.replicas": str(wire.min_insync_replicas(replication))}
    return [
        TopicSpec(settings.submit_topic, shards, durable),
        # Compacted, with short segments so a takeover reads little more than the latest
        # watermark of its partition even after months of commits.
        TopicSpec(settings.state_topic, shards, {
            **durable, "cleanup.policy": "compact", "segment.ms": "600000",
            "min.cleanable.dirty.ratio": "0.1", "delete.retention.ms": "3600000"}),
        TopicSpec(settings.fired_topic, shards, durable),
        TopicSpec(settings.rejected_topic, 1, durable),
        TopicSpec(settings.dead_topic, 1, durable),
    ]


# --- security -----------------------------------------------------------------------------


def check_kafka_security(settings: Settings) -> tuple[str, str] | None:
    """Refuse TLS files without TLS and SASL without credentials (ConfigError); the SASL user
    name and password when the protocol uses SASL. Shared by aiokafka's options (below) and
    librdkafka's (`bus/kafka_consumer_group.librdkafka_config`)."""
    if not settings.kafka_uses_ssl and (settings.kafka_ssl_cafile or settings.kafka_ssl_certfile):
        raise ConfigError(f"kafka_ssl_* files are set but kafka_security_protocol is "
                          f"{settings.kafka_security_protocol}: use SSL or SASL_SSL")
    if not settings.kafka_uses_sasl:
        return None
    if not settings.kafka_sasl_username or settings.kafka_sasl_password is None:
        raise ConfigError(
            f"kafka_security_protocol {settings.kafka_security_protocol} needs "
            "kafka_sasl_username and a password in CHRONOWHEEL_KAFKA_SASL_PASSWORD or "
            "CHRONOWHEEL_KAFKA_SASL_PASSWORD_FILE")
    return settings.kafka_sasl_username, settings.kafka_sasl_password.reveal()


def security_options(settings: Settings) -> dict[str, Any]:
    """The aiokafka arguments for the configured protocol, TLS and SASL (checked here)."""
    credentials = check_kafka_security(settings)
    opts: dict[str, Any] = {"security_protocol": settings.kafka_security_protocol}
    if settings.kafka_uses_ssl:
        opts["ssl_context"] = ssl_context(
            what="kafka", cafile=settings.kafka_ssl_cafile, certfile=settings.kafka_ssl_certfile,
            keyfile=settings.kafka_ssl_keyfile, key_password=settings.kafka_ssl_key_password,
            check_hostname=settings.kafka_ssl_check_hostname)
    if credentials is not None:
        opts.update(sasl_mechanism=settings.kafka_sasl_mechanism,
                    sasl_plain_username=credentials[0], sasl_plain_password=credentials[1])
    return opts


def _endpoints(settings: Settings) -> list[tuple[str, int]]:
    out = []
    for item in settings.kafka.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


async def diagnose(settings: Settings, timeout_s: float = 10.0) -> str:
    """Probe each bootstrap endpoint directly; say what fails where, in one line.

    Used after a client failed to start, to replace aiokafka's "Unable to bootstrap" by the
    cause: refused, timed out, not TLS, untrusted certificate, SASL refused, ...
    """
    from aiokafka.conn import create_conn

    opts = security_options(settings)
    causes = []
    for host, port in _endpoints(settings) or [(settings.kafka, 0)]:
        where = f"Kafka at {host}:{port} ({settings.kafka_security_protocol})"
        try:
            conn = await within(
                create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **opts),
                timeout_s)
        except BaseException as exc:  # each failure is reported, never raised from here
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                raise
            causes.append(f"{where}: {await _explain(settings, host, port, exc)}")
            continue
        conn.close()
        causes.append(f"{where}: a direct connection works; the broker it advertises may be "
                      "unreachable or refuse this client")
    return "; ".join(causes)


async def _explain(settings: Settings, host: str, port: int, exc: BaseException) -> str:
    tls = tls_failure(exc)
    if tls is not None:
        return tls
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    lowered = text.lower()
    if "authentication" in lowered or "sasl" in lowered:
        return (f"SASL {settings.kafka_sasl_mechanism} authentication of user "
                f"{settings.kafka_sasl_username!r} was refused (wrong user name or password?)")
    if isinstance(exc, ConnectionRefusedError) or "refused" in lowered:
        return "connection refused (nothing listens there)"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "no answer in time"
    if not settings.kafka_uses_ssl and await asyncio.to_thread(speaks_tls, host, port):
        return (f"the port speaks TLS but kafka_security_protocol is "
                f"{settings.kafka_security_protocol}: use SSL or SASL_SSL")
    return f"the connection failed ({text})"


class KafkaAccessError(ConfigError):
    """Kafka refused this client: authentication, TLS or authorization. Not retried."""


async def _start(client: Any, settings: Settings, what: str) -> None:
    try:
        with quiet_loggers("aiokafka.client", "aiokafka.conn", "aiokafka"):
            await client.start()
    except (KafkaConnectionError, OSError) as exc:
        with contextlib.suppress(Exception):
            await _close(client)
        cause = await diagnose(settings)
        fatal = any(word in cause for word in ("TLS", "certificate", "SASL", "speaks TLS"))
        message = f"{what} cannot start: {cause}"
        if fatal:
            raise KafkaAccessError(message) from None
        raise RetriableError(message) from exc
    except (TopicAuthorizationFailedError, TransactionalIdAuthorizationFailed) as exc:
        with contextlib.suppress(Exception):
            await _close(client)
        raise KafkaAccessError(f"{what} at {settings.kafka}: {authorization_message(exc, settings)}"
                               ) from None


async def _close(client: Any) -> None:
    if isinstance(client, AIOKafkaAdminClient):
        await client.close()
    else:
        await client.stop()


def authorization_message(exc: BaseException, settings: Settings) -> str:
    """Kafka said no: who was refused what, and where to look."""
    who = (f"user {settings.kafka_sasl_username!r}" if settings.kafka_uses_sasl
           else "this client")
    detail = str(exc) or type(exc).__name__
    return (f"{who} is not authorized ({type(exc).__name__}: {detail}); see "
            "`chronowheel acl` for the ACLs each principal needs")


def is_authorization_error(exc: BaseException) -> bool:
    return isinstance(exc, KafkaError) and "Authorization" in type(exc).__name__


class Producer(AIOKafkaProducer):
    """AIOKafkaProducer whose start() failure says what and where."""

    def __init__(self, settings: Settings, what: str, **kw: Any) -> None:
        self._cw_settings = settings
        self._cw_what = what
        super().__init__(bootstrap_servers=settings.kafka, **security_options(settings), **kw)

    async def start(self) -> None:
        await _start(super(), self._cw_settings, self._cw_what)

    def _refused(self, exc: KafkaError, topic: str | None = None) -> KafkaAccessError:
        s = self._cw_settings
        who = f"user {s.kafka_sasl_username!r}" if s.kafka_uses_sasl else "this client"
        if isinstance(exc, TopicAuthorizationFailedError):
            named = topic or ", ".join(sorted(_names(exc))) or "?"
            what = f"may not write topic {named}"
        elif isinstance(exc, TransactionalIdAuthorizationFailed):
            what = f"may not use transactional id {self._cw_what.rsplit(' ', 1)[-1]}"
        else:
            what = "was refused by Kafka's authorizer"
        return KafkaAccessError(
            f"{self._cw_what} at {s.kafka}: {who} {what} ({type(exc).__name__}); see "
            "`chronowheel acl` for the ACLs each principal needs")

    async def send(self, topic: str, *args: Any, **kw: Any) -> Any:
        """As aiokafka's, but a refusal by the broker's authorizer names who, what and where."""
        try:
            return await super().send(topic, *args, **kw)
        except KafkaError as exc:
            if not is_authorization_error(exc):
                raise
            raise self._refused(exc, topic) from None

    async def commit_transaction(self) -> None:
        """As aiokafka's; an ACL revoked meanwhile (a topic, the transactional id, the group)
        surfaces here, and is reported as a KafkaAccessError saying who may not do what."""
        try:
            await super().commit_transaction()
        except KafkaError as exc:
            if not is_authorization_error(exc):
                raise
            raise self._refused(exc) from None

    async def send_offsets_to_transaction(self, *args: Any, **kw: Any) -> None:
        try:
            await super().send_offsets_to_transaction(*args, **kw)
        except KafkaError as exc:
            if not is_authorization_error(exc):
                raise
            raise self._refused(exc) from None


def _names(exc: BaseException) -> set[str]:
    """The topic names an aiokafka authorization error carries (a name or a set of them)."""
    out: set[str] = set()
    for arg in exc.args:
        if isinstance(arg, str):
            out.add(arg)
        elif isinstance(arg, set | frozenset | list | tuple):
            out.update(str(a) for a in arg)
    return out


class Consumer(AIOKafkaConsumer):
    """AIOKafkaConsumer whose start() failure says what and where."""

    def __init__(self, settings: Settings, what: str, *topics: str, **kw: Any) -> None:
        self._cw_settings = settings
        self._cw_what = what
        super().__init__(*topics, bootstrap_servers=settings.kafka,
                         **security_options(settings), **kw)

    async def start(self) -> None:
        await _start(super(), self._cw_settings, self._cw_what)


def admin_client(settings: Settings, *, request_timeout_ms: int = 15000) -> AIOKafkaAdminClient:
    """An admin client with the security settings, not started (see `open_admin`)."""
    return AIOKafkaAdminClient(bootstrap_servers=settings.kafka,
                               request_timeout_ms=request_timeout_ms,
                               **security_options(settings))


async def open_admin(settings: Settings) -> AIOKafkaAdminClient:
    admin = admin_client(settings)
    await _start(admin, settings, f"Kafka admin client for {settings.kafka}")
    return admin


async def partition_counts(admin: AIOKafkaAdminClient, names: Iterable[str]) -> dict[str, int]:
    """Partition count of each named topic that exists."""
    wanted = set(names)
    existing = set(await admin.list_topics()) & wanted
    if not existing:
        return {}
    out: dict[str, int] = {}
    for desc in await admin.describe_topics(sorted(existing)):
        if desc.get("error_code", 0) == 0:
            out[desc["topic"]] = len(desc["partitions"])
    return out


async def ensure_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec],
                        replication: int) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    counts = await partition_counts(admin, (s.name for s in specs))
    missing = [s for s in specs if s.name not in counts]
    for s in specs:
        if s.name in counts and counts[s.name] != s.partitions:
            raise ConfigError(f"topic {s.name} has {counts[s.name]} partitions, "
                              f"expected {s.partitions}")
    if not missing:
        return []
    new = [NewTopic(s.name, s.partitions, replication, topic_configs=dict(s.config))
           for s in missing]
    # A concurrent init may win the race: fine, creation is idempotent.
    with contextlib.suppress(TopicAlreadyExistsError):
        await admin.create_topics(new, timeout_ms=30000)
    return [s.name for s in missing]


def transactional_producer(settings: Settings, transactional_id: str) -> AIOKafkaProducer:
    return Producer(
        settings, f"transactional producer {transactional_id}",
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        # The node writes a transaction's records together, then commits: lingering would only
        # delay their produce request (by up to 2 ms per transaction).
        linger_ms=0,
        max_batch_size=1 << 20,
        max_request_size=4 << 20,
        request_timeout_ms=30000,
        transaction_timeout_ms=60000,
    )


def plain_producer(settings: Settings, *, linger_ms: int = 5) -> AIOKafkaProducer:
    return Producer(
        settings, "producer",
        enable_idempotence=True,
        acks="all",
        linger_ms=linger_ms,
        max_batch_size=1 << 20,
        max_request_size=4 << 20,
    )


def group_consumer(settings: Settings, group_id: str, *topics: str,
                   session_timeout_ms: int = 10000, heartbeat_interval_ms: int | None = None,
                   max_poll_interval_ms: int = 300000, **kw: Any) -> AIOKafkaConsumer:
    return Consumer(
        settings, f"consumer of group {group_id}",
        *topics,
        group_id=group_id,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms or max(500, session_timeout_ms // 5),
        max_poll_interval_ms=max_poll_interval_ms,
        **kw,
    )


SESSION_LIMITS = ("group.min.session.timeout.ms", "group.max.session.timeout.ms")


async def group_session_limits(settings: Settings) -> dict[str, tuple[int, int]] | None:
    """Per broker ("host:port"), the (min, max) group session timeout it accepts; None when
    the brokers' configuration cannot be read (e.g. no DescribeConfigs permission)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    try:
        admin = await open_admin(settings)
    except ConfigError:
        return None
    try:
        cluster = await admin.describe_cluster()
        brokers = {str(b["node_id"]): f"{b['host']}:{b['port']}" for b in cluster["brokers"]}
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, node) for node in brokers])
    except KafkaError as exc:
        log.info("cannot read the brokers' group session limits: %r", exc)
        return None
    finally:
        await admin.close()
    out: dict[str, tuple[int, int]] = {}
    for response in responses:
        for error_code, _message, _type, name, entries in response.resources:
            if error_code:
                continue
            values = {e[0]: e[1] for e in entries if e[0] in SESSION_LIMITS}
            if len(values) == len(SESSION_LIMITS):
                out[brokers.get(name, name)] = (int(values[SESSION_LIMITS[0]]),
                                                int(values[SESSION_LIMITS[1]]))
    return out or None


def session_timeout_refusal(session_timeout_ms: int,
                            limits: Mapping[str, tuple[int, int]]) -> str | None:
    """Why the brokers would refuse a group member with this session timeout, or None."""
    refusing = {where: lim for where, lim in limits.items()
                if not lim[0] <= session_timeout_ms <= lim[1]}
    if not refusing:
        return None
    where, (low, high) = sorted(refusing.items())[0]
    return (f"node_session_timeout_ms {session_timeout_ms} is outside what Kafka broker {where}"
            f"{f' (and {len(refusing) - 1} more)' if len(refusing) > 1 else ''} accepts: "
            f"group.min.session.timeout.ms {low}, group.max.session.timeout.ms {high}. Set "
            f"the brokers' group.min.session.timeout.ms to at most {session_timeout_ms} (see "
            f"the operations runbook), or raise node_session_timeout_ms to at least {low} "
            f"(a dead node's shards then wait that long)")


def reader(settings: Settings, **kw: Any) -> AIOKafkaConsumer:
    """A group-less consumer for assigned partitions (state, tail): read_committed unless
    `isolation_level` says otherwise."""
    kw.setdefault("isolation_level", "read_committed")
    kw.setdefault("auto_offset_reset", "earliest")
    return Consumer(
        settings, "reader",
        group_id=None,
        enable_auto_commit=False,
        **kw,
    )
