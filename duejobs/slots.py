"""What each worker slot owns: its bookkeeping connection and its event loop.

A worker runs one delivery at a time per slot: the process's main thread with
``--concurrency 1``, a thread of its pool otherwise. Whatever a delivery uses between its
claim and its outcome must therefore be the slot's own, never shared with a delivery running
beside it: a connection in the middle of one slot's statement, or an event loop running one
slot's handler, cannot serve another. Both are made on a slot's first use and kept for the
next delivery (no pool round trip per job, no loop set up per job).

What they promise: :class:`Bookkeeping` drops a broken connection (the error surfaces; the
next delivery opens a new one) and never returns one to the App's pool, since its session
settings must not reach anyone else's transactions. :class:`EventLoops` runs an ``async def``
handler to completion, cancels it at its timeout when given one, and leaves no task of an
attempt running into the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from duejobs import store
from duejobs.core import Core
from duejobs.errors import HandlerTimeoutError


def lock_busy(exc: DBAPIError) -> bool:
    """The statement gave up waiting for a row lock (``lock_timeout``)."""
    return getattr(exc.orig, "sqlstate", None) == "55P03"


class Bookkeeping:
    """Each slot's own connection for claims and outcomes.

    Kept checked out and in autocommit: each bookkeeping step is one statement, so it commits
    without BEGIN/COMMIT round trips. A broken connection is dropped, the error surfaces (RQ
    records the job as failed, the row stays for the reconciler), and the next job opens a
    new one.
    """

    def __init__(self, core: Core, lock_timeout: timedelta, durable: bool) -> None:
        self._core = core
        self._lock_timeout, self._durable = lock_timeout, durable
        self._local = threading.local()
        self._open: set[Connection] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.invalidated or conn.closed:
            conn = self._core.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            # A row lock held by an application's open transaction must not hold the worker.
            store.bookkeeping_session(conn, self._lock_timeout, self._durable)
            self._local.conn = conn
            with self._lock:
                self._open.add(conn)
        try:
            yield conn
        except BaseException as exc:
            # The connection is fine after a lock timeout; after anything else — a statement
            # that failed, or one cut short by a handler's timeout landing in it — it is
            # not trusted with the next delivery.
            if not (isinstance(exc, DBAPIError) and lock_busy(exc)):
                self._discard(conn)
            raise

    def _discard(self, conn: Connection) -> None:
        with self._lock:
            self._open.discard(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with contextlib.suppress(DBAPIError):
            conn.invalidate()
            conn.close()

    def close(self) -> None:
        """Discard every slot's connection (the slots must have stopped)."""
        with self._lock:
            open_ = list(self._open)
        for conn in open_:
            self._discard(conn)


class EventLoops:
    """One event loop per slot, on which its ``async def`` handlers run."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[asyncio.AbstractEventLoop] = []
        self._lock = threading.Lock()

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            with self._lock:
                self._all.append(loop)
        return loop

    def run(self, awaitable: Awaitable[Any], timeout: timedelta | None = None) -> None:
        """Run ``awaitable`` to completion on this slot's loop — never a success without a
        run. With ``timeout``, it is cancelled then and :class:`HandlerTimeoutError` raised
        (a ``TimeoutError`` of the handler's own stays what it is)."""
        loop = self._loop()
        task = loop.create_task(_bounded(awaitable, timeout))
        try:
            loop.run_until_complete(task)
        finally:
            # Nothing of this attempt may run on into the next one: the handler's task if
            # a timeout struck, and any task it left behind.
            leftover = asyncio.all_tasks(loop)
            for pending in leftover:
                pending.cancel()
            if leftover:
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(asyncio.wait(leftover, timeout=1))

    def close(self) -> None:
        with self._lock:
            loops, self._all = self._all, []
        for loop in loops:
            loop.close()


async def _bounded(awaitable: Awaitable[Any], timeout: timedelta | None) -> None:
    if timeout is None:
        await awaitable
        return
    scope = asyncio.timeout(timeout.total_seconds())
    try:
        async with scope:
            await awaitable
    except TimeoutError as exc:
        if scope.expired():
            raise HandlerTimeoutError(
                f"handler ran past its timeout of {timeout.total_seconds():g} s"
            ) from exc
        raise
