"""The one retry policy for Cassandra and Kafka calls: exponential backoff on retriable errors."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    first_delay_s: float = 0.05
    max_delay_s: float = 2.0
    jitter: bool = True
    """spread the delay over [half, all] of it: retries of many callers spread out"""

    def delay(self, attempt: int) -> float:
        """The wait before retry `attempt` (1: the first): doubling from `first_delay_s`, at
        most `max_delay_s`."""
        base = min(self.max_delay_s, self.first_delay_s * (2 ** min(attempt - 1, 64)))
        return base * (0.5 + random.random() / 2) if self.jitter else base


DEFAULT_POLICY = RetryPolicy()
STORE_POLICY = RetryPolicy(attempts=30)
"""Cassandra calls: a replica that was just killed, a long pause of a coordinator or an
overloaded cluster answer with timeouts for tens of seconds, and giving up after the default
six attempts (about 1.5 s of backoff) stopped every node of a namespace at once. Thirty
attempts back off for 25 to 50 s in all (plus each attempt's own timeout) before a failure
stops a shard, and with it the node."""


def is_retriable(exc: BaseException) -> bool:
    """True for errors the drivers or this package mark as transient."""
    return bool(getattr(exc, "retriable", False))


async def with_retries(
    op: Callable[[], Awaitable[T]],
    what: str,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> T:
    attempt = 1
    while True:
        try:
            return await op()
        except Exception as exc:
            if not is_retriable(exc) or attempt >= policy.attempts:
                raise
            delay = policy.delay(attempt)
            log.warning("%s failed (attempt %d/%d), retrying in %.2fs: %s",
                        what, attempt, policy.attempts, delay, exc)
            await asyncio.sleep(delay)
            attempt += 1
