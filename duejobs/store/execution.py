"""The one execution path to PostgreSQL: fast statements, COPY, error conversion, the clock."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, TextClause, text
from sqlalchemy.exc import DBAPIError, StatementError

_LIVE = "status IN ('scheduled', 'running')"
_TENANT = "(CAST(:tenant AS text) IS NULL OR tenant = :tenant)"
_RUN_AT = "COALESCE(CAST(:run_at AS timestamptz), statement_timestamp() + CAST(:delay AS interval))"


@functools.cache
def _driver_sql(clause: TextClause) -> str:
    """A ``text()`` statement in psycopg's own parameter style (``:name`` → ``%(name)s``)."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", clause.text.replace("%", "%%"))


def _fast(conn: Connection, clause: TextClause, params: dict[str, Any]) -> list[Any]:
    """Run a hot-path statement straight on psycopg, inside the connection's transaction.

    Same SQL, same transaction; it skips SQLAlchemy's per-execution work (about 0.15 ms a
    statement), which the scheduler and the worker pay once or twice per job.
    """
    driver = conn.connection.driver_connection
    assert driver is not None
    sql = _driver_sql(clause)
    try:
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, sql, params, exc) from exc


@contextlib.contextmanager
def _meanwhile(conn: Connection, clause: TextClause, params: dict[str, Any]) -> Iterator[None]:
    """Send a statement, and run the block while PostgreSQL works on it (psycopg's pipeline
    mode); the statement's errors surface when the block ends."""
    driver = conn.connection.driver_connection
    assert driver is not None
    sql = _driver_sql(clause)
    try:
        with driver.pipeline():
            driver.execute(sql, params)
            yield
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, sql, params, exc) from exc


def _surfaced(
    conn: Connection,
    driver: psycopg.Connection[Any],
    statement: str,
    params: dict[str, Any] | None,
    exc: psycopg.Error,
) -> StatementError:
    """A psycopg error as SQLAlchemy would raise it; a broken connection leaves the pool (a
    lock timeout does not break it)."""
    broken = driver.closed or (
        isinstance(exc, psycopg.OperationalError)
        and not isinstance(exc, psycopg.errors.LockNotAvailable)
    )
    if broken:
        conn.invalidate(exc)
    return DBAPIError.instance(statement, params, exc, psycopg.Error, connection_invalidated=broken)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


@contextlib.contextmanager
def _copying(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    types: Sequence[str] | None = None,
) -> Iterator[psycopg.Copy]:
    """A COPY into ``table`` inside the connection's transaction; errors surface as
    SQLAlchemy's, and a broken connection leaves the pool.

    With ``types`` (psycopg's names of the adapters to write each field with) the COPY is
    binary: the client formats little, and PostgreSQL parses no text."""
    driver = conn.connection.driver_connection
    assert driver is not None
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    if types is not None:
        statement += " (FORMAT BINARY)"
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            if types is not None:
                copy.set_types(types)
            yield copy
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, statement, None, exc) from exc


def database_now(conn: Connection) -> datetime:
    """The database's clock, the only one duejobs trusts for "is it due?"."""
    value: datetime = conn.execute(text("SELECT statement_timestamp()")).scalar_one()
    return value.astimezone(UTC)


# -- what other modules used to say in SQL -----------------------------------------------------


def server_answers(url: str) -> bool:
    """Whether the PostgreSQL server at ``url`` (a libpq URL) answers a trivial query."""
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def create_database(url: str, database: str) -> None:
    """Create ``database`` on the server at ``url`` unless it exists (safe when several
    processes race to create it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        if exists.fetchone() is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(database)))


def is_missing_table(exc: BaseException | None) -> bool:
    """Whether a driver error says a table does not exist (the schema was never migrated)."""
    return isinstance(exc, psycopg.errors.UndefinedTable)


def advisory_lock(conn: Connection, key: int) -> None:
    """Hold PostgreSQL's advisory lock ``key`` until the transaction ends (migrators queue
    behind one another)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
