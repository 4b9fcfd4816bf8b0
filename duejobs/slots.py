"""What a worker's slots use: bookkeeping connections and each slot's event loop.

A worker runs one delivery at a time per slot: the process's main thread with
``--concurrency 1``, a thread of its pool otherwise. A connection in the middle of one
statement, or an event loop running one slot's handler, cannot serve another at the same
time. Bookkeeping connections are therefore checked out for one step (a batch of claims or
outcomes, a verdict, a stale record) and put back for the next, so a process holds as many
as run at once — a few, however many slots (the group commit of :mod:`duejobs.batches` runs
one statement for many of them) — not one per slot. An event loop is made on a slot's first
``async def`` handler and kept for its next.

What they promise: :class:`Bookkeeping` drops a broken connection (the error surfaces; the
next step opens a new one) and never returns one to the App's pool, since its session
settings must not reach anyone else's transactions. :class:`EventLoops` runs an ``async def``
handler to completion, cancels it at its timeout when given one, and leaves no task of an
attempt running into the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from duejobs import store
from duejobs.core import Core
from duejobs.errors import HandlerTimeoutError

log = logging.getLogger("duejobs.worker")


def lock_busy(exc: DBAPIError) -> bool:
    """The statement gave up waiting for a row lock (``lock_timeout``)."""
    return getattr(exc.orig, "sqlstate", None) == "55P03"


class Bookkeeping:
    """The worker's connections for claims and outcomes, checked out one step at a time.

    In autocommit: each bookkeeping step is one statement, so it commits without
    BEGIN/COMMIT round trips. A connection that met an error other than a lock timeout is
    dropped, the error surfaces (RQ records the job as failed, the row stays for the
    reconciler), and the next step opens a new one.
    """

    def __init__(self, core: Core, lock_timeout: timedelta, durable: bool) -> None:
        self._core = core
        self._lock_timeout, self._durable = lock_timeout, durable
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._lock = threading.Lock()

    @property
    def opened(self) -> int:
        """Connections open now, idle or checked out."""
        with self._lock:
            return len(self._open)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.invalidated or conn.closed:
            conn = self._core.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            with self._lock:
                self._open.add(conn)
            try:
                # A row lock held by an application's open transaction must not hold the
                # worker.
                store.bookkeeping_session(conn, self._lock_timeout, self._durable)
            except BaseException:
                self._discard(conn)
                raise
        try:
            yield conn
        except BaseException as exc:
            # The connection is fine after a lock timeout; after anything else — a statement
            # that failed, or one cut short by a handler's timeout landing in it — it is
            # not trusted with the next step.
            if not (isinstance(exc, DBAPIError) and lock_busy(exc)):
                self._discard(conn)
                raise
            self._put_back(conn)
            raise
        self._put_back(conn)

    def _put_back(self, conn: Connection) -> None:
        with self._lock:
            if conn in self._open:
                self._idle.append(conn)

    def _discard(self, conn: Connection) -> None:
        with self._lock:
            self._open.discard(conn)
        with contextlib.suppress(DBAPIError):
            conn.invalidate()
            conn.close()

    def close(self) -> None:
        """Discard every connection (the slots must have stopped)."""
        with self._lock:
            open_, self._idle = list(self._open), []
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
            # A task that swallowed its cancellation, or one made while the others were
            # cancelled, must not run into the next attempt either.
            if any(not t.done() for t in asyncio.all_tasks(loop)):
                self._discard(loop)

    def _discard(self, loop: asyncio.AbstractEventLoop) -> None:
        """A task of the attempt swallowed its cancellation: the loop it waits on is closed
        and the slot's next handler gets a new one, so the task never runs again (Python
        warns that it was destroyed pending)."""
        stubborn = [t for t in asyncio.all_tasks(loop) if not t.done()]
        log.warning(
            "%d task(s) left by a handler would not be cancelled: %s; dropped with their loop",
            len(stubborn),
            ", ".join(t.get_name() for t in stubborn),
        )
        self._local.loop = None
        with self._lock:
            self._all.remove(loop)
        loop.close()

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
