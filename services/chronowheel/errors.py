"""Error types shared by every layer. `retriable` tells the one retry policy what to do."""

from __future__ import annotations


class ChronowheelError(Exception):
    """Base of every error this package raises on purpose."""

    retriable: bool = False


class RetriableError(ChronowheelError):
    """A transient failure (timeout, unavailable replica, broker not ready): try again."""

    retriable = True


class ConfigError(ChronowheelError):
    """A setting or an environment problem the operator must fix."""


class StoreRefused(ChronowheelError):
    """The store refused a write for what it holds (Cassandra's `InvalidRequest`: a batch
    over `batch_size_fail_threshold`, a TTL over 20 years, a value it cannot take). Permanent
    for the command or occurrence that made the write, never for the node: the command is
    quarantined with this message as its reason (docs/design.md, "Failure isolation")."""


class ValidationError(ChronowheelError):
    """A submitted command broke a rule. `path` names the field, `value` the bad input."""

    def __init__(self, path: str, rule: str, value: object = None) -> None:
        self.path = path
        self.rule = rule
        self.value = value
        shown = "" if value is None else f" (got {_truncate(value)})"
        super().__init__(f"{path}: {rule}{shown}")


def _truncate(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
