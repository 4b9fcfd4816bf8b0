"""Which revision of duejobs' schema a database holds, read without Alembic: what a service
asks at its start (one statement), so that code newer than its tables stops there, naming
``duejobs migrate``, instead of failing each pass on a column it does not find."""

from __future__ import annotations

from typing import TYPE_CHECKING

from duejobs.store import dbapi
from duejobs.store.execution import run_one

if TYPE_CHECKING:
    from sqlalchemy import Connection

# The newest revision of migrations/versions, which this code needs (a test holds it to
# Alembic's head). Revisions are four digits, so they compare in order as text.
SCHEMA_HEAD = "0014"


def schema_revision(conn: Connection) -> str | None:
    """The revision the database's duejobs tables are at; None where ``duejobs migrate``
    never ran (no revision table in the schema: in a transaction of the caller's, that
    error ends it)."""
    try:
        row = run_one(conn, "schema_revision")
    except dbapi.ProgrammingError:  # no revision table: never migrated
        return None
    return None if row is None else str(row.version_num)
