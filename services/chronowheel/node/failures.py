"""Which errors are about one command or occurrence, and which about all of a node's work.

A node stops only for what concerns all its work: lost fencing, a store or broker still
unreachable once its retries are spent, a setting or a permission the operator must fix.
Everything else met while applying one command (a server's refusal of what it holds, a limit
found before writing, a bug on the per-command path) is permanent for that command alone: it
is quarantined with the reason and the node goes on (docs/design.md, "Failure isolation").
"""

from __future__ import annotations

from typing import Final

from chronowheel.bus.ports import BusError
from chronowheel.errors import ConfigError, StoreRefused, ValidationError
from chronowheel.node.transactions import ShardLost
from chronowheel.retry import is_retriable

LIMIT: Final = "limit"
"""Reason label: over a limit a server enforces, found before anything was written."""
STORE_REFUSED: Final = "store_refused"
"""Reason label: the store refused the write (Cassandra's InvalidRequest)."""
INTERNAL: Final = "internal"
"""Reason label: any other error on the per-command path, a bug."""


def concerns_the_node(exc: BaseException) -> bool:
    """True when `exc` is about all of a node's work and must stop the shard (and the node);
    False when it is about the one command or occurrence being applied."""
    if not isinstance(exc, Exception):  # cancellation, exit: never swallowed
        return True
    if is_retriable(exc):  # its retries are spent: the server is unreachable past its deadline
        return True
    if isinstance(exc, ConfigError | ShardLost | BusError):
        return True
    # The process's or the machine's trouble, which no command caused: out of memory, a
    # socket or file that failed, the interpreter itself.
    if isinstance(exc, MemoryError | OSError | SystemError):
        return True
    # A driver's error that the store or the bus did not translate (a missing table, a
    # protocol error) is about the server or the schema, which every command needs.
    return type(exc).__module__.split(".")[0] in _DRIVER_PACKAGES


_DRIVER_PACKAGES: Final = frozenset({"cassandra", "aiokafka", "kafka"})


def reason_label(exc: BaseException) -> str:
    """The `reason` label of chronowheel_quarantined_total for a per-command error."""
    if isinstance(exc, ValidationError):
        return LIMIT
    if isinstance(exc, StoreRefused):
        return STORE_REFUSED
    return INTERNAL


def describe(exc: BaseException) -> str:
    """The reason a quarantined command carries: the error's own words, its type for a bug."""
    if isinstance(exc, ValidationError | StoreRefused):
        return str(exc)
    return f"internal error while applying: {type(exc).__name__}: {exc}"
