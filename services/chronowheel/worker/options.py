"""What a worker is told, in one frozen value (the worker's counterpart of `Settings`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace

from chronowheel.worker.ledger import DEFAULT_KEEP_S, DEFAULT_LEASE_S
from chronowheel.worker.overlap import DEFAULT_POLL_S, DEFAULT_REPLACE_WAIT_S


def default_group_id(namespace: str, topics: Sequence[str]) -> str:
    return f"{namespace}-workers-{'+'.join(sorted(topics))}"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """A worker's options (docs/worker.md); the connection comes from `Settings`."""

    group_id: str | None = None
    """The Kafka consumer group; None: `<ns>-workers-<topics joined by +>`."""
    concurrency: int = 16
    """Most handlers running at once."""
    idempotency: bool = True
    """Fence partitions and record outcomes in the store (off: every delivery runs)."""
    idempotency_scope: str | None = None
    """Whose leases, marks and claims this worker shares; None: the group."""
    lease_s: int = DEFAULT_LEASE_S
    keep_s: int = DEFAULT_KEEP_S
    shutdown_deadline_s: float = 30.0
    commit_interval_s: float = 0.5
    session_timeout_ms: int = 10_000
    prefetch: int | None = None
    """Most records received and not yet handled, over all partitions; None: max(1000, 8 x
    concurrency). Handled records waiting for their marks to be written do not count (up to
    8 x prefetch of them), so the write latency of the marks does not throttle fetching."""
    worker_id: str | None = None
    """None: `<host name>-<pid>`."""
    overlap_poll_s: float = DEFAULT_POLL_S
    replace_wait_s: float = DEFAULT_REPLACE_WAIT_S
    http_port: int | None = None
    """Serve /metrics and /healthz on this port (settings.http_host); None: no endpoint."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.lease_s < 1:
            raise ValueError(f"lease_s must be at least 1, got {self.lease_s}")
        if self.prefetch is not None and self.prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {self.prefetch}")

    def resolved(self, namespace: str, topics: Sequence[str]) -> WorkerSettings:
        """The same with every default that depends on the deployment filled in."""
        group = self.group_id or default_group_id(namespace, topics)
        return replace(self, group_id=group, idempotency_scope=self.idempotency_scope or group,
                       prefetch=self.prefetch or max(1000, 8 * self.concurrency),
                       worker_id=self.worker_id or f"{socket.gethostname()}-{os.getpid()}")
