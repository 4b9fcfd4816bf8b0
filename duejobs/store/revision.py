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
SCHEMA_HEAD = "0017"
# No revision table (42P01), or no such schema (3F000): never migrated there.
_NOT_THERE = frozenset({"42P01", "3F000"})


def schema_revision(conn: Connection) -> str | None:
    """The revision the database's duejobs tables are at; None where ``duejobs migrate``
    never ran (no revision table in the schema: in a transaction of the caller's, that
    error ends it)."""
    try:
        row = run_one(conn, "schema_revision")
    except dbapi.ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) in _NOT_THERE:
            return None
        raise  # not allowed to read it, say: not for this check to decide
    return None if row is None else str(row.version_num)
