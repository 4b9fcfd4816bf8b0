"""``duejobs.AsyncApp``: the App for asyncio code (FastAPI, Starlette, aiohttp, ...).

Built from an :class:`~duejobs.App` — ``AsyncApp(app)`` — it shares that App's handler
registrations, tenant scope and settings, and runs the App's own code on psycopg's async
connections: every write and read of the App, awaited, with the same validation, the same
errors and the same results. One registration of handlers serves the worker (which takes the
App) and the endpoints (which take the AsyncApp).

Why a separate object rather than ``a``-prefixed methods on the App: the App's methods take a
synchronous connection (``conn=``), an AsyncApp's take an asynchronous one; keeping them apart
keeps each signature exact for type checkers, and the App stays usable with no event loop.

Promises:

* No event loop is blocked: each statement is awaited (SQLAlchemy's ``run_sync`` bridge); the
  best-effort removal of a superseded job from Redis runs in a thread.
* ``conn=`` takes the caller's SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` (on
  psycopg), or a plain psycopg ``AsyncConnection`` (in a transaction: one in autocommit mode
  outside a transaction block is refused): the change and its history event commit or roll
  back with the caller's work, and nothing is removed from Redis (the caller may still roll
  back; the worker's check is the guarantee). Without it, each call is a transaction of its
  own.
* An outage raises :class:`~duejobs.errors.DatabaseUnavailableError`, as the App does.

Knobs: ``pool_size`` (default 5, plus 10 lent at a peak) of the async engine, which is the
AsyncApp's own. ``await aclose()`` (or ``async with``) closes it.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import uuid
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.util import greenlet_spawn

from duejobs import store
from duejobs.app.application import App, ScheduleId
from duejobs.core import POOL_SIZE, make_async_engine
from duejobs.models import (
    Attempt,
    Event,
    Page,
    QueueJob,
    Recurring,
    Schedule,
    ScheduleRequest,
    Status,
)

__all__ = ["AsyncApp", "AsyncConn"]

P = ParamSpec("P")
T = TypeVar("T")

AsyncConn: TypeAlias = AsyncConnection | AsyncSession | store.AsyncDriver
"""What ``conn=`` takes: the caller's transaction, on SQLAlchemy's asyncio extension or on a
plain psycopg ``AsyncConnection``."""


class _Bridged(App):
    """The App run inside the bridge: superseded queue jobs are noted, not removed, so that
    their removal (a Redis call) leaves the event loop."""

    superseded: list[QueueJob]

    def _discard_queue_job(self, job: QueueJob | None) -> None:
        if job is not None:
            self.superseded.append(job)


def _awaited(
    method: Callable[Concatenate[App, P], T],
) -> Callable[Concatenate[AsyncApp, P], Coroutine[Any, Any, T]]:
    """The App's ``method`` (one without ``conn=``) as a coroutine method of the AsyncApp."""

    async def call(self: AsyncApp, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._call(method, None, *args, **kwargs)

    call.__name__ = method.__name__
    call.__doc__ = f":meth:`App.{method.__name__}`, awaited."
    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return call


class AsyncApp:
    """An App's asyncio face (see the module docstring): ``AsyncApp(App())``."""

    def __init__(self, app: App, *, pool_size: int = POOL_SIZE) -> None:
        shared = app.core
        where = shared.settings
        prepared = where.prepared_statements
        self._engine: AsyncEngine = make_async_engine(
            where.database_url, pool_size, where.schema, prepared
        )
        self._read_engine: AsyncEngine | None = None
        if where.read_database_url is not None:  # the operators' reads go there
            self._read_engine = make_async_engine(
                where.read_database_url, pool_size, where.schema, prepared
            )
        self._core = shared.with_engines(
            self._engine.sync_engine,
            None if self._read_engine is None else self._read_engine.sync_engine,
        )
        self._app = app
        self._tenant = app.scope

    @classmethod
    def _scoped(cls, parent: AsyncApp, app: App) -> AsyncApp:
        scoped = cls.__new__(cls)
        scoped._engine, scoped._core = parent._engine, parent._core
        scoped._read_engine = parent._read_engine
        scoped._app, scoped._tenant = app, app.scope
        return scoped

    @property
    def app(self) -> App:
        """The App this one was built from (register handlers there)."""
        return self._app

    @property
    def scope(self) -> str | None:
        """The tenant this AsyncApp is limited to, or None."""
        return self._tenant

    def tenant(self, name: str) -> AsyncApp:
        """An AsyncApp that sees and changes only ``name``'s schedules (shares the engine)."""
        return AsyncApp._scoped(self, self._app.tenant(name))

    async def aclose(self) -> None:
        """Close the async engine's pooled connections and the Redis client, once the
        superseded jobs handed over are removed."""
        if self._core._removals is not None:
            await asyncio.to_thread(self._core._removals.close)
        if self._core._wakes is not None:
            self._core._wakes.close()
        await self._engine.dispose()
        if self._read_engine is not None:
            await self._read_engine.dispose()
        if self._core._deliverer is not None:
            self._core._deliverer.close()

    async def __aenter__(self) -> AsyncApp:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- writing -----------------------------------------------------------------------

    async def schedule(
        self,
        job_type: str,
        payload: Any,
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        timezone: str | None = None,
        key: str | None = None,
        tenant: str | None = None,
        jitter: timedelta | float | None = None,
        expires_after: timedelta | float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        """:meth:`App.schedule`, awaited."""
        return await self._call(
            App.schedule,
            conn,
            job_type,
            payload,
            delay=delay,
            run_at=run_at,
            timezone=timezone,
            key=key,
            tenant=tenant,
            jitter=jitter,
            expires_after=expires_after,
            queue=queue,
            priority=priority,
        )

    async def schedule_many(
        self, requests: Iterable[ScheduleRequest], *, conn: AsyncConn | None = None
    ) -> list[uuid.UUID]:
        """:meth:`App.schedule_many`, awaited (the requests are read before the first
        statement)."""
        return await self._call(App.schedule_many, conn, list(requests))

    async def reschedule(
        self,
        schedule_id: ScheduleId,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        expected_version: int | None = None,
        priority: int | None = None,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        """:meth:`App.reschedule`, awaited."""
        return await self._call(
            App.reschedule,
            conn,
            schedule_id,
            run_at=run_at,
            delay=delay,
            timezone=timezone,
            expected_version=expected_version,
            priority=priority,
        )

    async def cancel(self, schedule_id: ScheduleId, *, conn: AsyncConn | None = None) -> bool:
        """:meth:`App.cancel`, awaited."""
        return await self._call(App.cancel, conn, schedule_id)

    async def retry(
        self,
        schedule_id: ScheduleId,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        """:meth:`App.retry`, awaited."""
        return await self._call(
            App.retry, conn, schedule_id, run_at=run_at, delay=delay, timezone=timezone
        )

    async def run_now(
        self,
        schedule_id: ScheduleId,
        *,
        expected_version: int | None = None,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        """:meth:`App.run_now`, awaited."""
        return await self._call(App.run_now, conn, schedule_id, expected_version=expected_version)

    async def get_by_key(
        self, key: str, *, tenant: str | None = None, conn: AsyncConn | None = None
    ) -> Schedule | None:
        """:meth:`App.get_by_key`, awaited."""
        return await self._call(App.get_by_key, conn, key, tenant=tenant)

    async def cancel_by_key(
        self, key: str, *, tenant: str | None = None, conn: AsyncConn | None = None
    ) -> bool:
        """:meth:`App.cancel_by_key`, awaited."""
        return await self._call(App.cancel_by_key, conn, key, tenant=tenant)

    async def reschedule_by_key(
        self,
        key: str,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        """:meth:`App.reschedule_by_key`, awaited."""
        return await self._call(
            App.reschedule_by_key,
            conn,
            key,
            run_at=run_at,
            delay=delay,
            timezone=timezone,
            tenant=tenant,
            priority=priority,
        )

    # -- reading -----------------------------------------------------------------------

    async def get(
        self, schedule_id: ScheduleId, *, conn: AsyncConn | None = None
    ) -> Schedule | None:
        """:meth:`App.get`, awaited."""
        return await self._call(App.get, conn, schedule_id)

    async def history(
        self,
        schedule_id: ScheduleId,
        *,
        newest: int | None = None,
        before: int | None = None,
        conn: AsyncConn | None = None,
    ) -> list[Event]:
        """:meth:`App.history`, awaited."""
        return await self._call(App.history, conn, schedule_id, newest=newest, before=before)

    async def list(
        self,
        *,
        status: Status | str | Iterable[Status | str] | None = None,
        type: str | None = None,
        tenant: str | None = None,
        key: str | None = None,
        queue: str | None = None,
        due_from: datetime | None = None,
        due_before: datetime | None = None,
        recurring: str | None = None,
        limit: int = 50,
        after: str | None = None,
        latest_first: bool = False,
        conn: AsyncConn | None = None,
    ) -> Page:
        """:meth:`App.list`, awaited."""
        return await self._call(
            App.list,
            conn,
            status=status,
            type=type,
            tenant=tenant,
            key=key,
            queue=queue,
            due_from=due_from,
            due_before=due_before,
            recurring=recurring,
            limit=limit,
            after=after,
            latest_first=latest_first,
        )

    async def attempts(
        self, schedule_id: ScheduleId, *, newest: int | None = None, conn: AsyncConn | None = None
    ) -> builtins.list[Attempt]:
        """:meth:`App.attempts`, awaited."""
        return await self._call(App.attempts, conn, schedule_id, newest=newest)

    async def is_past_deadline(
        self, schedule_id: ScheduleId, *, conn: AsyncConn | None = None
    ) -> bool:
        """:meth:`App.is_past_deadline`, awaited."""
        return await self._call(App.is_past_deadline, conn, schedule_id)

    now = _awaited(App.now)

    # -- recurring definitions and quotas (each a transaction of its own) -------------

    recurring = _awaited(App.recurring)
    get_recurring = _awaited(App.get_recurring)
    list_recurring = _awaited(App.list_recurring)

    def next_occurrences(self, definition: Recurring, count: int = 3) -> builtins.list[datetime]:
        """:meth:`App.next_occurrences` (no I/O: not awaited)."""
        return self._app.next_occurrences(definition, count)

    async def update_recurring(
        self, name: str, *, tenant: str | None = None, **changes: Any
    ) -> Recurring:
        """:meth:`App.update_recurring`, awaited."""
        return await self._call(App.update_recurring, None, name, tenant=tenant, **changes)

    pause_recurring = _awaited(App.pause_recurring)
    resume_recurring = _awaited(App.resume_recurring)
    delete_recurring = _awaited(App.delete_recurring)
    set_quota = _awaited(App.set_quota)
    quotas = _awaited(App.quotas)
    set_rate_limit = _awaited(App.set_rate_limit)
    rate_limits = _awaited(App.rate_limits)

    # -- the bridge --------------------------------------------------------------------

    async def _call(
        self,
        method: Callable[..., T],
        conn: AsyncConn | None,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """Run the App's ``method`` on an async connection: the caller's (``conn=``), else
        a transaction of the method's own; then remove what it superseded from Redis."""
        app = _Bridged.__new__(_Bridged)
        app._core, app._tenant, app.superseded = self._core, self._tenant, []
        if isinstance(conn, AsyncConnection | AsyncSession):
            connection = await _connection(conn)

            def in_callers_transaction(c: Connection) -> T:
                return method(app, *args, conn=c, **kwargs)

            result = await connection.run_sync(in_callers_transaction)
        else:  # a transaction of its own, or the caller's psycopg AsyncConnection
            if conn is not None:
                kwargs["conn"] = store.lent(conn, awaited=True, schema=self._core.settings.schema)
            result = await greenlet_spawn(method, app, *args, **kwargs)
        for job in app.superseded:  # handed to the removals' thread: nothing to wait for
            App._discard_queue_job(app, job)
        return result


async def _connection(conn: AsyncConnection | AsyncSession) -> AsyncConnection:
    """The SQLAlchemy ``AsyncConnection`` behind ``conn=``, which must be on psycopg."""
    if isinstance(conn, AsyncSession):
        conn = await conn.connection()
    if (conn.dialect.name, conn.dialect.driver) != ("postgresql", "psycopg"):
        raise TypeError(
            "conn= must use the psycopg driver (postgresql+psycopg://), "
            f"not {conn.dialect.name}+{conn.dialect.driver}"
        )
    return conn
