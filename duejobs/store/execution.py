"""The one execution path to PostgreSQL: named statements, COPY, error conversion.

Every statement is one of :data:`~duejobs.store.queries.QUERIES`, run by name straight on
psycopg inside the caller's SQLAlchemy transaction (beginning it if the caller has not): the
same transaction the caller commits, without SQLAlchemy's per-execution work (about 0.15 ms a
statement, paid once or twice per job by the scheduler and the worker). Rows come back as
named tuples. A psycopg error surfaces as SQLAlchemy's (``OperationalError``,
``IntegrityError``, ...) naming the statement, and a broken connection leaves the pool.

What it does not do: SQLAlchemy's execution events (``before_cursor_execute``, an
instrumentation hooked there) do not see these statements; instrument psycopg instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import namedtuple_row

from duejobs.store import dbapi
from duejobs.store.connecting import absolute_durations, sends_absolute_durations
from duejobs.store.lent import Awaited, Lent, adapted
from duejobs.store.queries import SCHEMA_OPTION, TABLES, Query, in_schema

if TYPE_CHECKING:
    from sqlalchemy import Connection

T = TypeVar("T")
# A connection's execution option: (statement name, parameters) of a ``set_config(..., true)``
# statement run ahead of its statements (see :func:`with_local_settings`).
LOCAL_SETTINGS_OPTION = "duejobs_local_settings"


def with_local_settings(conn: Connection, name: str, params: dict[str, Any]) -> Connection:
    """``conn``, in autocommit, with the statement ``name`` (settings made with
    ``set_config(..., true)``) sent ahead of each of its statements, in the same round trip
    and the same transaction — or, to a statement that sets one of them itself, given as its
    parameters (see :func:`_settings_first`): the settings hold for that statement and end
    with it, so a pooler that hands the server session to another client hands over none."""
    return conn.execution_options(
        isolation_level="AUTOCOMMIT", **{LOCAL_SETTINGS_OPTION: (name, params)}
    )


@contextlib.contextmanager
def _settings_first(
    conn: Connection, driver: psycopg.Connection[Any], query: Query, params: dict[str, Any]
) -> Iterator[Callable[[], None]]:
    """Around one statement on ``conn``: its local settings sent first, in one pipeline (the
    statements up to the pipeline's sync are one transaction: PostgreSQL's extended protocol
    commits an implicit transaction at the sync, not after each statement). Yields what to
    call once the statement is sent, before its result is read. A statement that sets one of
    them itself (it names its parameter: the worker's hot path, which waits for no lock) is
    given their values in ``params`` and runs alone, without the pipeline's cost."""
    options = {} if isinstance(conn, Lent) else conn.get_execution_options()
    setup = options.get(LOCAL_SETTINGS_OPTION)
    if setup is None:
        yield _nothing
        return
    assert driver.autocommit, "local settings are for autocommit connections"
    name, settings = setup
    own = {k: v for k, v in settings.items() if f"%({k})s" in query.driver_sql}
    if own:
        params.update(own)
        yield _nothing
        return
    with driver.pipeline() as pipeline:
        driver.execute(_query(conn, name).driver_sql, settings)
        yield pipeline.sync


def _nothing() -> None:
    """No pipeline to sync."""


def _driver(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn``, inside the transaction the caller will commit
    (begun here if the caller has not run a statement yet, as SQLAlchemy would).

    Under an async engine (:class:`~duejobs.AsyncApp`) the connection is psycopg's
    ``AsyncConnection`` and this code runs in the greenlet SQLAlchemy's ``run_sync`` gives it:
    :class:`~duejobs.store.lent.Awaited` awaits each call there, so the event loop serves
    other coroutines while PostgreSQL works."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection | psycopg.AsyncConnection)
    if not driver.autocommit and not conn.in_transaction():
        conn.begin()
    if isinstance(driver, psycopg.AsyncConnection):
        # The part of psycopg.Connection's API this module uses, with the same results.
        return cast("psycopg.Connection[Any]", Awaited(driver))
    return driver


def _schema(conn: Connection) -> str:
    """The schema of duejobs' tables for statements on ``conn``."""
    if isinstance(conn, Lent):
        return conn.schema
    schema: str = conn.get_execution_options().get(SCHEMA_OPTION, "public")
    return schema


def _query(conn: Connection, name: str) -> Query:
    schema = _schema(conn)
    return in_schema(schema)[name]


def run(
    conn: Connection,
    name: str,
    params: dict[str, Any] | None = None,
    *,
    prepare: bool | None = None,
) -> list[Any]:
    """Run the statement ``name``; its rows (none for a statement without a result).

    ``prepare=True`` prepares it on the connection from its first run (psycopg otherwise
    prepares a statement at its sixth), unless the connection disables prepared statements
    (a caller's own, ``conn=``, made with ``prepare_threshold=None``). psycopg drops a
    connection's prepared statements at a rollback: the next run prepares it again."""
    query = _query(conn, name)
    driver = _driver(conn)
    try:
        params = dict(params or {})
        with (
            _settings_first(conn, driver, query, params) as sent,
            driver.cursor(row_factory=namedtuple_row) as cursor,
        ):
            _as_ours(conn, driver, cursor)
            cursor.execute(query.driver_sql, params, prepare=prepare)
            sent()
            return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, name, params, exc) from exc


def _as_ours(conn: Connection, driver: psycopg.Connection[Any], cursor: Any) -> None:
    """A cursor on a caller's connection (``conn=``, SQLAlchemy's or psycopg's) reading and
    writing as duejobs' own do: durations as absolute time, jsonb decoded."""
    if isinstance(conn, Lent):
        adapted(conn, cursor)
    elif not sends_absolute_durations(driver.adapters):
        absolute_durations(cursor.adapters)


def run_one(conn: Connection, name: str, params: dict[str, Any] | None = None) -> Any | None:
    """The first row of the statement ``name``, or None."""
    rows = run(conn, name, params)
    return rows[0] if rows else None


def run_count(conn: Connection, name: str, params: dict[str, Any] | None = None) -> int:
    """Run the statement ``name``; how many rows it changed."""
    query = _query(conn, name)
    driver = _driver(conn)
    try:
        params = dict(params or {})
        with _settings_first(conn, driver, query, params) as sent, driver.cursor() as cursor:
            _as_ours(conn, driver, cursor)
            cursor.execute(query.driver_sql, params)
            sent()
            return cursor.rowcount
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, name, params, exc) from exc


def run_composed(conn: Connection, what: str, statement: pgsql.SQL | pgsql.Composed) -> list[Any]:
    """Run a statement composed around identifiers (DDL naming a partition: no named
    statement can hold those); its rows, if any. ``what`` names it in errors."""
    driver = _driver(conn)
    try:
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(statement)
            return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, what, None, exc) from exc


def schema_of(conn: Connection) -> str:
    """The schema of duejobs' tables for statements on ``conn``."""
    return _schema(conn)


@contextlib.contextmanager
def meanwhile(conn: Connection, name: str, params: dict[str, Any]) -> Iterator[None]:
    """Send the statement ``name`` and run the block while PostgreSQL works on it (psycopg's
    pipeline mode); the statement's errors surface when the block ends."""
    query = _query(conn, name)
    driver = _driver(conn)
    try:
        with driver.pipeline():
            driver.execute(query.driver_sql, params)
            yield
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, name, params, exc) from exc


@contextlib.contextmanager
def copying(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    types: Sequence[str] | None = None,
) -> Iterator[psycopg.Copy]:
    """A COPY into ``table`` (a name of duejobs' own, never input) inside the connection's
    transaction.

    With ``types`` (psycopg's names of the adapters to write each field with) the COPY is
    binary: the client formats little, and PostgreSQL parses no text."""
    driver = _driver(conn)
    statement = pgsql.SQL("COPY {} ({}) FROM STDIN{}").format(
        # duejobs' tables in their schema; a temporary staging table in the session's own
        pgsql.Identifier(_schema(conn), table) if table in TABLES else pgsql.Identifier(table),
        pgsql.SQL(", ").join(map(pgsql.Identifier, columns)),
        pgsql.SQL(" (FORMAT BINARY)" if types is not None else ""),
    )
    try:
        with driver.cursor() as cursor:
            _as_ours(conn, driver, cursor)
            with cursor.copy(statement) as copy:
                if types is not None:
                    copy.set_types(types)
                yield copy
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, f"COPY {table}", None, exc) from exc


def _surfaced(
    conn: Connection,
    driver: psycopg.Connection[Any],
    statement: str,
    params: dict[str, Any] | None,
    exc: psycopg.Error,
) -> dbapi.StatementError:
    """A psycopg error as SQLAlchemy would raise it; a broken connection leaves the pool (a
    lock timeout does not break it)."""
    broken = driver.closed or (
        isinstance(exc, psycopg.OperationalError)
        and not isinstance(exc, psycopg.errors.LockNotAvailable)
    )
    if broken:
        conn.invalidate(exc)
    return dbapi.DBAPIError.instance(
        statement, params, exc, psycopg.Error, connection_invalidated=broken
    )


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def record(cls: type[T], row: Any, **converted: Any) -> T:
    """A ``cls`` dataclass from the row's columns of the same names, instants in UTC;
    ``converted`` gives the fields whose column needs more than that (an enum, say)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    values = dict(converted)
    for name in names:
        if name not in values:
            value = getattr(row, name)
            if isinstance(value, datetime) and value.tzinfo is not None:
                value = value.astimezone(UTC)
            values[name] = value
    return cls(**values)


def database_now(conn: Connection) -> datetime:
    """The database's clock, the only one duejobs trusts for "is it due?"."""
    row = run_one(conn, "database_now")
    assert row is not None
    now: datetime = row.now
    return now.astimezone(UTC)


def advisory_lock(conn: Connection, key: int) -> None:
    """Hold PostgreSQL's advisory lock ``key`` until the transaction ends (migrators queue
    behind one another)."""
    run(conn, "advisory_lock", {"key": key})


def use_schema(conn: Connection, schema: str) -> None:
    """Create ``schema`` (a checked identifier) if it does not exist, and put it first on the
    transaction's ``search_path``: the migrations' unqualified names then land in it."""
    driver = _driver(conn)
    driver.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
    driver.execute("SELECT set_config('search_path', %s, true)", (f'"{schema}", public',))


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


def drop_database(url: str, database: str) -> None:
    """Drop ``database`` on the server at ``url`` if it exists, ending its sessions."""
    with psycopg.connect(url, autocommit=True) as conn:
        statement = pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(statement.format(pgsql.Identifier(database)))


def is_missing_table(exc: BaseException | None) -> bool:
    """Whether a driver error says a table does not exist (the schema was never migrated)."""
    return isinstance(exc, psycopg.errors.UndefinedTable)


def is_statement_timeout(exc: BaseException | None) -> bool:
    """Whether a driver error says a statement was stopped: past its ``statement_timeout``,
    or cancelled (``pg_cancel_backend``). Both are SQLSTATE 57014; only the server's message
    tells them apart, and it is translated under a non-English ``lc_messages``, so an
    operator's read bounded by ``read_timeout`` reads a cancel as that bound."""
    return isinstance(exc, psycopg.errors.QueryCanceled)


def is_lock_timeout(exc: BaseException | None) -> bool:
    """Whether a driver error says a statement gave up waiting for a lock (``lock_timeout``:
    another transaction holds what it reads or writes)."""
    return isinstance(exc, psycopg.errors.LockNotAvailable)


def try_session_lock(conn: Connection, key: int) -> bool:
    """Take PostgreSQL's advisory lock ``key`` for the session, if no one holds it."""
    return bool(run(conn, "try_session_lock", {"key": key})[0].locked)


def session_unlock(conn: Connection, key: int) -> None:
    """Give back a session's advisory lock ``key``."""
    run(conn, "session_unlock", {"key": key})


def is_lock_conflict(exc: BaseException | None) -> bool:
    """Whether a driver error says a lock was not granted: not within ``lock_timeout``, or
    not at all (a deadlock, this transaction chosen to end it)."""
    return isinstance(
        getattr(exc, "orig", exc),
        psycopg.errors.LockNotAvailable | psycopg.errors.DeadlockDetected,
    )
