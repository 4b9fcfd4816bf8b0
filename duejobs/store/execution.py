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
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias, TypeVar, cast

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import namedtuple_row
from psycopg.types.json import JsonbLoader
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.util import await_only

from duejobs.store.queries import QUERIES, SCHEMA_OPTION, TABLES, Query, in_schema

T = TypeVar("T")


def _driver(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn``, inside the transaction the caller will commit
    (begun here if the caller has not run a statement yet, as SQLAlchemy would).

    Under an async engine (:class:`~duejobs.AsyncApp`) the connection is psycopg's
    ``AsyncConnection`` and this code runs in the greenlet SQLAlchemy's ``run_sync`` gives it:
    :class:`_Awaited` awaits each call there, so the event loop serves other coroutines while
    PostgreSQL works."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection | psycopg.AsyncConnection)
    if not driver.autocommit and not conn.in_transaction():
        conn.begin()
    if isinstance(driver, psycopg.AsyncConnection):
        # The part of psycopg.Connection's API this module uses, with the same results.
        return cast("psycopg.Connection[Any]", _Awaited(driver))
    return driver


AsyncDriver: TypeAlias = psycopg.AsyncConnection[Any]
Driver: TypeAlias = psycopg.Connection[Any] | AsyncDriver
"""A caller's own psycopg connection, given as ``conn=`` instead of SQLAlchemy's."""


def lent(conn: object, *, awaited: bool = False, schema: str = "public") -> Connection:
    """The connection the store runs on for a caller's ``conn=``: SQLAlchemy's as it is, a
    plain psycopg one through :class:`_Lent` (``awaited``: psycopg's ``AsyncConnection``,
    for :class:`~duejobs.AsyncApp`). Either way the caller's transaction holds the
    statements, which reach duejobs' tables in ``schema``. Anything else is a ``TypeError``
    naming what was given."""
    if isinstance(conn, _Lent):
        return cast(Connection, conn)
    if isinstance(conn, psycopg.AsyncConnection if awaited else psycopg.Connection):
        return cast(Connection, _Lent(conn, schema))
    if isinstance(conn, Connection) and not awaited:
        if conn.get_execution_options().get(SCHEMA_OPTION, "public") != schema:
            conn.execution_options(**{SCHEMA_OPTION: schema})
        return conn
    wanted = (
        "a SQLAlchemy AsyncConnection or AsyncSession or a psycopg AsyncConnection"
        if awaited
        else "a SQLAlchemy Connection or a psycopg Connection"
    )
    given = f"{type(conn).__module__}.{type(conn).__qualname__}"
    raise TypeError(f"conn= takes {wanted}, got {given}")


class _Lent:
    """A caller's psycopg connection offering what the store calls on SQLAlchemy's.

    It is only lent: the store never begins, commits, rolls back or closes the caller's
    transaction (a broken connection stays the caller's to close). One outside any
    transaction in autocommit mode is refused: each statement would commit on its own, and
    a schedule and its history event must commit together."""

    def __init__(self, driver: Driver, schema: str) -> None:
        self.schema = schema
        idle = driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if driver.autocommit and idle:
            raise TypeError(
                "conn= is a psycopg connection in autocommit mode outside a transaction: "
                "open one first (with conn.transaction(): ...)"
            )
        self.driver_connection = driver
        # Some callers load jsonb as text (Django does, for its JSONField): the store's own
        # statements decode it, on their cursors only.
        jsonb = driver.adapters.types["jsonb"].oid
        loader = driver.adapters.get_loader(jsonb, psycopg.pq.Format.TEXT)
        self.json_as_text = not (loader and issubclass(loader, JsonbLoader))

    @property
    def connection(self) -> _Lent:
        return self

    def in_transaction(self) -> bool:
        return True  # psycopg begins one at the first statement

    def invalidate(self, exc: BaseException) -> None:
        """Nothing: the connection is the caller's."""

    def begin_nested(self) -> contextlib.AbstractContextManager[Any]:
        """A savepoint, released at the end of the block or rolled back on an error.

        On a connection whose transaction has not begun yet, psycopg's ``transaction()``
        would begin one and commit it at the end of the block: the caller's transaction is
        begun first (by a statement, as the caller's next one would begin it), so that the
        block stays a savepoint inside it."""
        driver = self.driver_connection
        idle = driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if isinstance(driver, psycopg.AsyncConnection):
            if idle:
                await_only(driver.execute("SELECT 1"))
            return _entered(driver.transaction())
        if idle:
            driver.execute("SELECT 1")
        return driver.transaction()


@contextlib.contextmanager
def _entered(manager: contextlib.AbstractAsyncContextManager[T]) -> Iterator[T]:
    """An async context manager entered and left from synchronous code in the greenlet."""
    value = await_only(manager.__aenter__())
    try:
        yield value
    except BaseException as exc:
        if not await_only(manager.__aexit__(type(exc), exc, exc.__traceback__)):
            raise
    else:
        await_only(manager.__aexit__(None, None, None))


class _Awaited:
    """psycopg's ``AsyncConnection`` offering what this module calls on a ``Connection``."""

    def __init__(self, driver: psycopg.AsyncConnection[Any]) -> None:
        self._driver = driver

    @property
    def closed(self) -> bool:
        return self._driver.closed

    @property
    def autocommit(self) -> bool:
        return self._driver.autocommit

    @contextlib.contextmanager
    def cursor(self, **options: Any) -> Iterator[_AwaitedCursor]:
        with _entered(self._driver.cursor(**options)) as cursor:
            yield _AwaitedCursor(cursor)

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[None]:
        with _entered(self._driver.pipeline()):
            yield

    def execute(self, query: Any, params: Any) -> None:
        await_only(self._driver.execute(query, params))


class _AwaitedCursor:
    def __init__(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        self._cursor = cursor

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def adapters(self) -> Any:
        return self._cursor.adapters

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def execute(self, query: Any, params: Any, *, prepare: bool | None = None) -> None:
        await_only(self._cursor.execute(query, params, prepare=prepare))

    def fetchall(self) -> list[Any]:
        return await_only(self._cursor.fetchall())

    @contextlib.contextmanager
    def copy(self, statement: Any) -> Iterator[_AwaitedCopy]:
        with _entered(self._cursor.copy(statement)) as copy:
            yield _AwaitedCopy(copy)


class _AwaitedCopy:
    def __init__(self, copy: psycopg.AsyncCopy) -> None:
        self._copy = copy

    def set_types(self, types: Sequence[str]) -> None:
        self._copy.set_types(types)

    def write_row(self, row: Sequence[Any]) -> None:
        await_only(self._copy.write_row(row))


def _schema(conn: Connection) -> str:
    """The schema of duejobs' tables for statements on ``conn``."""
    if isinstance(conn, _Lent):
        return conn.schema
    schema: str = conn.get_execution_options().get(SCHEMA_OPTION, "public")
    return schema


def _query(conn: Connection, name: str) -> Query:
    schema = _schema(conn)
    return (QUERIES if schema == "public" else in_schema(schema))[name]


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
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            if isinstance(conn, _Lent) and conn.json_as_text:
                cursor.adapters.register_loader("jsonb", JsonbLoader)
            cursor.execute(query.driver_sql, params or {}, prepare=prepare)
            return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, name, params, exc) from exc


def run_one(conn: Connection, name: str, params: dict[str, Any] | None = None) -> Any | None:
    """The first row of the statement ``name``, or None."""
    rows = run(conn, name, params)
    return rows[0] if rows else None


def run_count(conn: Connection, name: str, params: dict[str, Any] | None = None) -> int:
    """Run the statement ``name``; how many rows it changed."""
    query = _query(conn, name)
    driver = _driver(conn)
    try:
        with driver.cursor() as cursor:
            cursor.execute(query.driver_sql, params or {})
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
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
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
