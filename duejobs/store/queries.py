"""Every statement duejobs runs, by name: the ``sql/*.sql`` files beside this module.

A file holds named blocks, grouped by concern (schedules, claims, attempts, ...)::

    -- name: claim_runs
    -- Deliveries turned into running attempts, many in one statement.
    WITH req AS (...) SELECT ... FROM /*schema*/scheduled_jobs ...

Each block is the statement PostgreSQL receives, whole: its whole-line comments left out and
its ``:name`` parameters sent as the driver's ``%(name)s``. Every table of duejobs' is written
after the schema marker ``/*schema*/`` — a comment, so the text runs as it stands on the
default schema, and the one substitution made for another (``App(schema="billing")``:
``/*schema*/scheduled_jobs`` becomes ``billing.scheduled_jobs``), which keeps the statements
independent of a connection's ``search_path``. A rule several statements share (a job id's
spelling, the skip verdict, the default quota) is spelled out in each; ``tests/test_queries.py``
holds every copy to one spelling.

The files are read once, at import; a name seen twice, SQL before the first name or an empty
block is an error then, not at the first call. The name is what a plan test EXPLAINs and what
an error names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files

from psycopg import sql as pgsql

DEFAULT_QUOTA_TENANT = "*"  # the tenant_quotas row whose caps apply to every other tenant
SCHEMA_MARK = "/*schema*/"
"""What precedes each table of duejobs' in a statement: where its schema goes."""

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True)
class Query:
    """One named statement: as written (``:name`` parameters), and as psycopg takes it."""

    name: str
    sql: str
    driver_sql: str


def parse(text: str, source: str) -> dict[str, Query]:
    """The named blocks of one file."""
    parts = _NAME.split(text)
    if parts[0].strip() and not all(
        line.startswith("--") or not line.strip() for line in parts[0].splitlines()
    ):
        raise ValueError(f"{source}: SQL before the first '-- name:' line")
    found: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # Whole-line comments say why; the statement is sent without them.
        code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
        sql = code.strip().rstrip(";").strip()
        if not sql:
            raise ValueError(f"{source}: query {name} is empty")
        if name in found:
            raise ValueError(f"{source}: query {name} appears twice")
        driver_sql = _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
        found[name] = Query(name, sql, driver_sql)
    return found


def load() -> dict[str, Query]:
    """Every named statement of every ``sql/*.sql`` file."""
    queries: dict[str, Query] = {}
    for path in sorted(files("duejobs.store").joinpath("sql").iterdir(), key=lambda p: p.name):
        if not path.name.endswith(".sql"):
            continue
        for name, query in parse(path.read_text(encoding="utf-8"), path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: query {name} is already defined elsewhere")
            queries[name] = query
    return queries


QUERIES = load()


def ddl(name: str) -> pgsql.SQL:
    """The DDL template ``sql/ddl/<name>.sql`` (partitioned mode's functions and triggers): its
    identifiers, written ``{name}``, are the only thing its caller fills in (``.format``)."""
    text = files("duejobs.store").joinpath("sql", "ddl", f"{name}.sql").read_text("utf-8")
    return pgsql.SQL("\n".join(line for line in text.splitlines() if not line.startswith("--")))


_IN_SCHEMA: dict[str, dict[str, Query]] = {}


def in_schema(schema: str) -> dict[str, Query]:
    """Every statement with duejobs' tables in ``schema`` (a checked identifier): its marks
    filled in, once per schema."""
    if schema == "public":
        return QUERIES
    found = _IN_SCHEMA.get(schema)
    if found is None:
        put = f"{schema}."
        found = _IN_SCHEMA[schema] = {
            name: Query(
                name, q.sql.replace(SCHEMA_MARK, put), q.driver_sql.replace(SCHEMA_MARK, put)
            )
            for name, q in QUERIES.items()
        }
    return found


SCHEMA_OPTION = "duejobs_schema"
"""The execution option (on an engine or a connection) naming the schema of duejobs' tables."""

TABLES = (
    "scheduled_jobs",
    "scheduled_job_events",
    "scheduled_job_attempts",
    "scheduled_job_effects",
    "scheduled_job_keys",
    "scheduled_job_results",
    "recurring_schedules",
    "tenant_quotas",
    "rate_limits",
    "duejobs_partitioning",
)
# Of those, the tables only partitioned mode has (duejobs/store/partitions.py).
PARTITIONED_MODE_TABLES = ("scheduled_job_keys", "duejobs_partitioning")
