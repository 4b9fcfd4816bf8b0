"""An attempt that failed only because its database connection broke — a pooler restarted, a
failover, an administrator's terminate — is an *interruption*: retried after a short backoff
without using up the handler's ``max_attempts``, its ``retried`` event marked
``interrupted`` and its outcome counted apart (``interrupted``). Up to ``MAX_INTERRUPTIONS``
of them per version; past that, and for what the handler brought on itself (idle past the
fence's limit, a statement timeout), the attempt counts as any failure does.

Seen failing against a worker that counted every broken connection as an attempt (the first
three), one that took the fence's idle limit for an interruption, and one without the cap.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from sqlalchemy import text
from sqlalchemy.exc import InterfaceError, OperationalError

from duejobs import Permanent, Status
from duejobs.services.reconciler import Reconciler
from duejobs.store.dbapi import broke_connection as interruption
from duejobs.worker import Outcome
from duejobs.worker.closing import MAX_INTERRUPTIONS
from tests.support.system import System

_TYPES = itertools.count()


def _terminating(system: System, *, max_attempts: int, on_attempts: set[int]) -> str:
    """A new type whose handler, on the attempts named, has its own fence's session ended by
    the server mid-transaction (what a pooler's restart or a failover does to it)."""
    job_type = f"interrupted-{next(_TYPES)}"

    @system.app.handler(job_type, max_attempts=max_attempts)
    def handler(ctx: Any, payload: Any) -> None:
        with ctx.transaction() as conn:
            if ctx.attempt in on_attempts:
                conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    return job_type


def _due_now(system: System, schedule_id: object) -> None:
    """The retry's backoff skipped: what the next claim sees a second later."""
    with system.app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET due_at = now() WHERE id = :id"), {"id": schedule_id}
        )


def _attempt_statuses(system: System, schedule_id: object) -> list[str]:
    with system.app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT status FROM scheduled_job_attempts WHERE schedule_id = :id ORDER BY attempt"
            ),
            {"id": schedule_id},
        )
        return [r.status for r in rows]


def test_an_attempt_whose_connection_broke_does_not_use_up_the_budget(system: System) -> None:
    job_type = _terminating(system, max_attempts=1, on_attempts={1})
    s = system.app.schedule(job_type, {}, delay=0)
    assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.INTERRUPTED
    stored = system.app.get(s.id)
    assert stored.status is Status.SCHEDULED and stored.due_at > stored.run_at
    _due_now(system, s.id)
    assert system.runtime.handle(s.id, 1, 2, "default") is Outcome.SUCCEEDED
    assert system.status(s.id) == "succeeded"
    assert _attempt_statuses(system, s.id) == ["failed", "succeeded"]


def test_an_interruption_is_recorded_apart_in_the_history(system: System) -> None:
    job_type = _terminating(system, max_attempts=3, on_attempts={1})
    s = system.app.schedule(job_type, {}, delay=0)
    system.runtime.handle(s.id, 1, 1, "default")
    retried = [e for e in system.app.history(s.id) if e.kind.value == "retried"]
    assert len(retried) == 1 and retried[0].detail.get("interrupted") is True


def test_a_rescued_attempt_is_not_failed_for_the_interruptions_before_it(system: System) -> None:
    job_type = _terminating(system, max_attempts=2, on_attempts={1})
    s = system.app.schedule(job_type, {}, delay=0)
    system.runtime.handle(s.id, 1, 1, "default")
    _due_now(system, s.id)
    with system.app.engine.begin() as conn:  # attempt 2 claimed by a worker that then died
        conn.execute(
            text(
                "UPDATE scheduled_jobs SET status = 'running', attempts = 2, "
                "lease_expires_at = now() - interval '1 second' WHERE id = :id"
            ),
            {"id": s.id},
        )
    Reconciler(system.app.core).run_once()
    assert system.status(s.id) == "scheduled"


def test_interruptions_past_the_cap_use_the_budget(system: System) -> None:
    job_type = _terminating(system, max_attempts=1, on_attempts={MAX_INTERRUPTIONS + 1})
    s = system.app.schedule(job_type, {}, delay=0)
    with system.app.engine.begin() as conn:  # as after that many attempts interrupted
        conn.execute(
            text("UPDATE scheduled_jobs SET attempts = :n, interruptions = :n WHERE id = :id"),
            {"id": s.id, "n": MAX_INTERRUPTIONS},
        )
    assert system.runtime.handle(s.id, 1, MAX_INTERRUPTIONS + 1, "default") is Outcome.FAILED
    assert system.status(s.id) == "failed"


def test_a_handler_idle_past_the_fence_limit_uses_an_attempt(system: System) -> None:
    job_type = f"idle-{next(_TYPES)}"

    @system.app.handler(job_type, max_attempts=1)
    def idle(ctx: Any, payload: Any) -> None:
        with ctx.transaction() as conn:
            conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = '100ms'"))
            time.sleep(0.5)  # idle past the limit the handler set: the server ends the session
            conn.execute(text("SELECT 1"))

    s = system.app.schedule(job_type, {}, delay=0)
    assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.FAILED
    assert system.status(s.id) == "failed"


def _psycopg_error(cls: type[psycopg.Error], sqlstate: str | None) -> psycopg.Error:
    error = cls("from the server")
    if sqlstate is not None:
        assert error.sqlstate == sqlstate  # the class PostgreSQL's code maps to
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_psycopg_error(pg_errors.AdminShutdown, "57P01"), True),
        (_psycopg_error(pg_errors.CrashShutdown, "57P02"), True),
        (_psycopg_error(pg_errors.ConnectionFailure, "08006"), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.InternalError("received 2 results from command 'BEGIN'"), True),
        (psycopg.InterfaceError("the connection is closed"), False),  # closed by whom?
        (_psycopg_error(pg_errors.ProtocolViolation, "08P01"), False),  # a pooler's timeout
        (_psycopg_error(pg_errors.IdleInTransactionSessionTimeout, "25P03"), False),
        (_psycopg_error(pg_errors.QueryCanceled, "57014"), False),
        (_psycopg_error(pg_errors.LockNotAvailable, "55P03"), False),
        (_psycopg_error(pg_errors.UniqueViolation, "23505"), False),
        (ValueError("the handler's own"), False),
        (ConnectionError("the handler's own network"), False),
    ],
)
def test_an_interruption_is_a_broken_database_connection(
    error: BaseException, expected: bool
) -> None:
    assert interruption(error) is expected


def test_an_interruption_is_found_behind_the_wrappers() -> None:
    broken = psycopg.OperationalError("server closed the connection unexpectedly")
    wrapped = OperationalError("SELECT 1", {}, broken)
    assert interruption(wrapped)
    try:  # Django's wrapper, or a handler's own: the driver's error as its cause
        raise RuntimeError("could not save") from wrapped
    except RuntimeError as exc:
        assert interruption(exc)
    idle = _psycopg_error(pg_errors.IdleInTransactionSessionTimeout, "25P03")
    assert not interruption(OperationalError("SELECT 1", {}, idle, connection_invalidated=True))
    closed = psycopg.InterfaceError("the connection is closed")
    assert interruption(InterfaceError("SELECT 1", {}, closed, connection_invalidated=True))
    try:  # raised from None: the handler's own word, whatever broke before it
        try:
            raise wrapped
        except OperationalError:
            raise RuntimeError("the order is gone") from None
    except RuntimeError as exc:
        assert not interruption(exc)


def test_a_permanent_failure_is_not_retried_for_a_broken_connection_behind_it(
    system: System,
) -> None:
    job_type = f"permanent-{next(_TYPES)}"

    @system.app.handler(job_type, max_attempts=3)
    def gives_up(ctx: Any, payload: Any) -> None:
        try:
            with ctx.transaction() as conn:
                conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        except OperationalError as exc:
            raise Permanent("the order is gone") from exc

    s = system.app.schedule(job_type, {}, delay=0)
    assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.FAILED
    assert system.status(s.id) == "failed"
