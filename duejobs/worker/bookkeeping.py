"""The worker's bookkeeping connections: claims, outcomes, verdicts.

A worker runs one delivery at a time per slot: the process's main thread with
``--concurrency 1``, a thread of its pool otherwise. A connection in the middle of one
statement cannot serve another at the same time. Bookkeeping connections are therefore
checked out for one step (a batch of claims or outcomes, a verdict, a stale record) and put
back for the next, so a process holds as many as run at once — a few, however many slots
(the group commit of :mod:`duejobs.worker.group_commit` runs one statement for many of them) — not
one per slot. Steps of single slots (a verdict, a claim made ahead renewed, a stale record)
can still come together when a loaded machine holds many slots up at once: a process opens
at most ``MAX_CONNECTIONS``, and a step beyond them waits for one put back (each step holds
its connection for its statements alone, never while it waits for another), so 200 slots
cannot fill a server's ``max_connections``.

What they promise: each step's statement carries its own limits for its own transaction (a
row lock waited for at most ``claim_lock_timeout``; the commit durable only with
``durable_bookkeeping``), so nothing outlives it on a pooled server session; an idle
connection the server ended meanwhile (``idle_session_timeout``, a pooler's restart, a
failover, an administrator) is replaced before the step, not found dead by it; a connection
that broke during a step is dropped (the error surfaces; the next step opens a new one).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.core import Core, connection_ended
from duejobs.store import dbapi

if TYPE_CHECKING:
    from sqlalchemy import Connection

# The bookkeeping connections a worker process opens at most.
MAX_CONNECTIONS = 8


def lock_busy(exc: dbapi.DBAPIError) -> bool:
    """The statement gave up waiting for a row lock (``lock_timeout``)."""
    return getattr(exc.orig, "sqlstate", None) == "55P03"


def unreachable(exc: dbapi.DBAPIError) -> bool:
    """The database was not reached (a refused or timed-out connect) or the connection broke
    (ended by the server, a pooler, a failover): worth another try on a fresh connection,
    unlike a statement's own error or a lock timeout."""
    if lock_busy(exc):
        return False
    return exc.connection_invalidated or isinstance(
        exc, dbapi.OperationalError | dbapi.InterfaceError
    )


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
        self._room = threading.BoundedSemaphore(MAX_CONNECTIONS)

    @property
    def opened(self) -> int:
        """Connections open now, idle or checked out."""
        with self._lock:
            return len(self._open)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        with self._room, self._checked_out() as conn:
            yield conn

    @contextlib.contextmanager
    def _checked_out(self) -> Iterator[Connection]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None and connection_ended(conn):
            self._discard(conn)
            conn = None
        if conn is None:
            # A row lock held by an application's open transaction must not hold the worker.
            new = self._core.connect_directly()
            conn = store.for_bookkeeping(new, self._lock_timeout, self._durable)
            with self._lock:
                self._open.add(conn)
        try:
            yield conn
        except BaseException as exc:
            # The connection is fine after a lock timeout; after anything else — a statement
            # that failed, or one cut short by a handler's timeout landing in it — it is
            # not trusted with the next step.
            if not (isinstance(exc, dbapi.DBAPIError) and lock_busy(exc)):
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
        try:  # the class is looked up only if an error comes (store.dbapi)
            conn.invalidate()
            conn.close()
        except dbapi.DBAPIError:
            pass

    def close(self) -> None:
        """Discard every connection (the slots must have stopped)."""
        with self._lock:
            open_, self._idle = list(self._open), []
        for conn in open_:
            self._discard(conn)
