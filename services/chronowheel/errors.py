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
        # The path may hold a submitted field name: escaped, it cannot forge a log line or
        # reorder the text around it.
        super().__init__(f"{harmless(_truncate_text(path))}: {rule}{shown}")


UNSAFE_CHARACTERS = frozenset(
    [chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7F, 0xA0)]
    + ["\u061c", "\u200e", "\u200f", "\u2028", "\u2029"]
    + [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)])
"""Control characters (C0, DEL, C1), line and paragraph separators and the bidirectional
controls: refused in job ids and header names, escaped wherever input is quoted."""


def harmless(text: str) -> str:
    """`text` with every unsafe character written as an escape (`\\n`, `\\u202e`)."""
    if not any(ch in UNSAFE_CHARACTERS for ch in text):
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii") if ch in UNSAFE_CHARACTERS
                   else ch for ch in text)


def harmless_within(text: str, limit: int) -> str:
    """The longest start of `harmless(text)` of at most `limit` characters that cuts no
    escape in two (a cut `\\u202e` would read as the text `\\u20`)."""
    if len(text) <= limit and UNSAFE_CHARACTERS.isdisjoint(text):
        return text
    out: list[str] = []
    size = 0
    for ch in text:
        piece = ch.encode("unicode_escape").decode("ascii") if ch in UNSAFE_CHARACTERS else ch
        size += len(piece)
        if size > limit:
            break
        out.append(piece)
    return "".join(out)


def _truncate_text(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _truncate(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
