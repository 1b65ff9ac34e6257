"""The Cassandra schema of a namespace, shipped inside the package.

`cassandra.cql` beside this module is the only copy of the schema. It is package data (see
`[tool.setuptools.package-data]` in pyproject.toml) and is read with `importlib.resources`, so
`chronowheel init` works the same from a checkout, an editable install or an installed wheel.
The layout of the tables is explained in docs/design.md, section "Storage layout".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources

from chronowheel.errors import ConfigError

CQL_RESOURCE = "cassandra.cql"


def cql_text() -> str:
    """The schema file as written: comments, `{keyspace}` and `{replication}` placeholders."""
    try:
        return resources.files(__name__).joinpath(CQL_RESOURCE).read_text(encoding="utf-8")
    except FileNotFoundError as exc:  # a broken install: package data left out
        raise ConfigError(f"{CQL_RESOURCE} is missing from the installed {__name__} "
                          "package") from exc


def replication_map(replication: int | Mapping[str, int]) -> str:
    """The CQL replication map: a factor means SimpleStrategy (one data centre), a mapping
    {dc: factor} NetworkTopologyStrategy. `{"replication_factor": n}` counts as a factor."""
    if isinstance(replication, Mapping) and set(replication) == {"replication_factor"}:
        replication = replication["replication_factor"]
    if isinstance(replication, int):
        if not 1 <= replication <= 9:
            raise ConfigError(f"replication: a factor must be 1..9, got {replication}")
        return f"{{'class': 'SimpleStrategy', 'replication_factor': {replication}}}"
    if not replication:
        raise ConfigError("replication: no data centre given")
    parts = ["'class': 'NetworkTopologyStrategy'"]
    for dc, factor in replication.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", dc) or not 1 <= int(factor) <= 9:
            raise ConfigError(f"replication: bad data centre {dc!r} or factor {factor!r}")
        parts.append(f"'{dc}': {int(factor)}")
    return "{" + ", ".join(parts) + "}"


def cql_statements(keyspace: str, replication: int | Mapping[str, int]) -> list[str]:
    """The schema's statements for one keyspace, comments removed, in file order.

    `replication` is a factor (SimpleStrategy) or {data centre: factor}
    (NetworkTopologyStrategy). Every statement is `CREATE ... IF NOT EXISTS` or
    `ALTER TABLE ... ADD IF NOT EXISTS`, so applying the list again is harmless, and applying
    it to a keyspace of an earlier version adds what that version lacks.
    """
    lines = [ln for ln in cql_text().splitlines() if not ln.strip().startswith("--")]
    body = "\n".join(ln.split("--")[0] for ln in lines)
    body = body.format(keyspace=keyspace, replication=replication_map(replication))
    return [s.strip() for s in body.split(";") if s.strip()]
