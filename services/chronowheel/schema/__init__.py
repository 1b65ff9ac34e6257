"""The Cassandra schema of a namespace, shipped inside the package.

`cassandra.cql` beside this module is the only copy of the schema. It is package data (see
`[tool.setuptools.package-data]` in pyproject.toml) and is read with `importlib.resources`, so
`chronowheel init` works the same from a checkout, an editable install or an installed wheel.
The layout of the tables is explained in docs/design.md, section "Storage layout".
"""

from __future__ import annotations

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


def cql_statements(keyspace: str, replication: int) -> list[str]:
    """The schema's statements for one keyspace, comments removed, in file order.

    Every statement is `CREATE ... IF NOT EXISTS`, so applying the list again is harmless.
    """
    lines = [ln for ln in cql_text().splitlines() if not ln.strip().startswith("--")]
    body = "\n".join(ln.split("--")[0] for ln in lines)
    body = body.format(keyspace=keyspace, replication=replication)
    return [s.strip() for s in body.split(";") if s.strip()]
