"""A caller's own connection, lent to the store for one call (``conn=``).

The store runs its statements inside the caller's transaction on SQLAlchemy's ``Connection``
or on a plain psycopg one; :class:`Lent` gives the latter what the store calls on the former,
and :class:`Awaited` awaits psycopg's ``AsyncConnection`` from the greenlet SQLAlchemy's
``run_sync`` gives the AsyncApp. What it promises: the store never begins, commits, rolls back
or closes a lent transaction, and reads and writes on it as on its own connections
(:func:`adapted`), whatever the caller's adapters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import psycopg
from psycopg.types.json import JsonbLoader

from duejobs.store.connecting import absolute_durations
from duejobs.store.queries import SCHEMA_OPTION

if TYPE_CHECKING:
    from sqlalchemy import Connection

T = TypeVar("T")


AsyncDriver: TypeAlias = psycopg.AsyncConnection[Any]
Driver: TypeAlias = psycopg.Connection[Any] | AsyncDriver
"""A caller's own psycopg connection, given as ``conn=`` instead of SQLAlchemy's."""


def lent(conn: object, *, awaited: bool = False, schema: str = "public") -> Connection:
    """The connection the store runs on for a caller's ``conn=``: SQLAlchemy's as it is, a
    plain psycopg one through :class:`Lent` (``awaited``: psycopg's ``AsyncConnection``,
    for :class:`~duejobs.AsyncApp`). Either way the caller's transaction holds the
    statements, which reach duejobs' tables in ``schema``. Anything else is a ``TypeError``
    naming what was given."""
    if isinstance(conn, Lent):
        return cast("Connection", conn)
    if isinstance(conn, psycopg.AsyncConnection if awaited else psycopg.Connection):
        return cast("Connection", Lent(conn, schema))
    from sqlalchemy import Connection  # loaded already where a caller has one

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


class Lent:
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
    def connection(self) -> Lent:
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


def await_only(awaitable: Awaitable[T]) -> T:
    """SQLAlchemy's ``await_only``: the result of ``awaitable``, awaited from the greenlet an
    AsyncApp's ``run_sync`` runs the store in (SQLAlchemy is loaded there)."""
    from sqlalchemy.util import await_only as awaited

    return awaited(awaitable)


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


class Awaited:
    """psycopg's ``AsyncConnection`` offering what this module calls on a ``Connection``."""

    def __init__(self, driver: psycopg.AsyncConnection[Any]) -> None:
        self._driver = driver

    @property
    def closed(self) -> bool:
        return self._driver.closed

    @property
    def autocommit(self) -> bool:
        return self._driver.autocommit

    @property
    def adapters(self) -> Any:
        return self._driver.adapters

    @contextlib.contextmanager
    def cursor(self, **options: Any) -> Iterator[AwaitedCursor]:
        with _entered(self._driver.cursor(**options)) as cursor:
            yield AwaitedCursor(cursor)

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[AwaitedPipeline]:
        with _entered(self._driver.pipeline()) as pipeline:
            yield AwaitedPipeline(pipeline)

    def execute(self, query: Any, params: Any) -> None:
        await_only(self._driver.execute(query, params))


class AwaitedPipeline:
    def __init__(self, pipeline: psycopg.AsyncPipeline) -> None:
        self._pipeline = pipeline

    def sync(self) -> None:
        await_only(self._pipeline.sync())


class AwaitedCursor:
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
    def copy(self, statement: Any) -> Iterator[AwaitedCopy]:
        with _entered(self._cursor.copy(statement)) as copy:
            yield AwaitedCopy(copy)


class AwaitedCopy:
    def __init__(self, copy: psycopg.AsyncCopy) -> None:
        self._copy = copy

    def set_types(self, types: Sequence[str]) -> None:
        self._copy.set_types(types)

    def write_row(self, row: Sequence[Any]) -> None:
        await_only(self._copy.write_row(row))


def adapted(conn: Lent, cursor: Any) -> None:
    """A cursor on a caller's connection, reading and writing as duejobs' own connections do
    (:mod:`duejobs.store.connecting`), whatever the caller's adapters: durations as absolute
    time, jsonb decoded."""
    absolute_durations(cursor.adapters)
    if conn.json_as_text:
        cursor.adapters.register_loader("jsonb", JsonbLoader)
