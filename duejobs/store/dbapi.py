"""The database errors duejobs raises and catches: SQLAlchemy's classes, named here without
loading SQLAlchemy.

The store runs its statements on psycopg and surfaces a failure as SQLAlchemy would
(:mod:`duejobs.store.execution`), whichever connection ran it: the App's engine, a caller's
own, or a worker's bookkeeping connection (:mod:`duejobs.store.direct`). Code that catches
them writes ``except dbapi.OperationalError``: the name is looked up when an error reaches
the clause, so SQLAlchemy (a tenth of a second to import) is loaded by the first error or
the first use of an engine, not by a worker's start, whose claims and closes need neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.exc import (
        DBAPIError,
        DisconnectionError,
        IntegrityError,
        InterfaceError,
        OperationalError,
        ProgrammingError,
        SQLAlchemyError,
        StatementError,
    )
    from sqlalchemy.exc import TimeoutError as PoolTimeoutError

    __all__ = [
        "DBAPIError",
        "DisconnectionError",
        "IntegrityError",
        "InterfaceError",
        "OperationalError",
        "PoolTimeoutError",
        "ProgrammingError",
        "SQLAlchemyError",
        "StatementError",
    ]

_NAMES = {
    "DBAPIError": "DBAPIError",
    "DisconnectionError": "DisconnectionError",
    "IntegrityError": "IntegrityError",
    "InterfaceError": "InterfaceError",
    "OperationalError": "OperationalError",
    "PoolTimeoutError": "TimeoutError",  # the pool's wait for a connection ran out
    "ProgrammingError": "ProgrammingError",
    "SQLAlchemyError": "SQLAlchemyError",
    "StatementError": "StatementError",
}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # The package first, as its own import does it: another thread importing SQLAlchemy at
    # the same moment (an engine made) then finishes before its submodule is read.
    importlib.import_module("sqlalchemy")
    value = getattr(importlib.import_module("sqlalchemy.exc"), _NAMES[name])
    globals()[name] = value
    return value


# What PostgreSQL says when it ends a session for the server's reasons (a terminate, a crash,
# a shutdown, a server not ready yet); with the class of connection exceptions (08): a break.
# 08P01 (protocol violation) is left out: a pooler's own timeouts and a bind of the wrong
# size say it on a connection that lives on.
_BROKEN_STATES = frozenset({"57P01", "57P02", "57P03"})


def broke_connection(error: BaseException) -> bool:
    """Whether ``error`` (a handler's) is its database connection breaking: the driver's error
    (or, through SQLAlchemy's, Django's or the handler's own wrappers, its cause) says the
    session ended for the server's reasons or the connection failed — not a statement's own
    error, a lock or statement timeout, the server ending an idle fence, a pool's wait, nor a
    connection the handler closed itself. An error raised ``from None`` hides its context."""
    import psycopg  # the driver's classes, only once something failed
    import sqlalchemy.exc

    seen: set[int] = set()
    found: BaseException | None = error
    invalidated = False
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, sqlalchemy.exc.DBAPIError):
            invalidated = invalidated or bool(found.connection_invalidated)
        if isinstance(found, psycopg.Error):
            return _broken(found, invalidated)
        inner = found.orig if isinstance(found, sqlalchemy.exc.DBAPIError) else None
        if isinstance(inner, BaseException):
            found = inner
        else:
            hidden = found.__suppress_context__
            found = found.__cause__ or (None if hidden else found.__context__)
    return invalidated


def _broken(error: Any, invalidated: bool) -> bool:
    """A driver's error: a break by its SQLSTATE; without one (the client's own word), a
    connection lost as it ran — not a closed one reused, nor a pool's wait (psycopg_pool)."""
    import psycopg

    state = error.sqlstate
    if state is not None:
        return (state.startswith("08") and state != "08P01") or state in _BROKEN_STATES
    if type(error).__module__.startswith("psycopg_pool"):
        return False
    if isinstance(error, psycopg.InterfaceError):  # "the connection is closed": whose doing?
        return invalidated
    return isinstance(error, psycopg.OperationalError | psycopg.InternalError)
