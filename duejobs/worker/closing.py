"""The worker's outcomes: an attempt closes only while it is still the current one.

:class:`Completer` records what a handler came to: ``succeeded``; or, on an exception, another
attempt after the type's backoff (``run_at`` is never touched; ``due_at`` and the attempt row
carry the retry time), or ``failed`` with ``last_error`` once attempts are exhausted. If the
schedule changed meanwhile (cancelled, rescheduled, rescued), the attempt is recorded
``stale`` and its outcome is not applied. Outcomes that arrive together share one statement
(:mod:`duejobs.worker.group_commit`).

What it promises: a finished handler's outcome is kept while an application transaction holds
its row — the close waits for the lock in rounds of ``claim_lock_timeout``, up to the lease —
and while its connection drops or the database cannot be reached (terminated, a pooler
restarting, a failover): the outcome is recorded again on a fresh connection, in capped
backoff, up to the lease; an outcome that a lost answer hides is found committed (the
attempt's own row says so) and not applied twice, nor recorded stale. A group commit that
broke is retried outcome by outcome, so one dead connection never fails the outcomes it
carried. A handler past its timeout and grace has its attempt closed as timed out on a
connection of its own (:meth:`Completer.overrun`), within ``_CLOSE_WITHIN`` seconds.

A handler that failed only because its database connection broke — a pooler restarted, a
failover, an administrator's terminate, its error or its cause one of those
(:func:`duejobs.store.dbapi.broke_connection`) — is *interrupted*: its attempt is retried
after a backoff of 1 s doubling up to a minute, whatever ``retry_on`` says (``Permanent``
and ``never_retry`` still fail it at once), and is not counted against ``max_attempts``; its
``retried`` event says ``interrupted``, and its outcome is counted apart
(``duejobs_deliveries{outcome="interrupted"}``). Up to ``MAX_INTERRUPTIONS`` per version:
past that (a connection that breaks at every try is no passing fault), an interruption
counts as any failure does. A session the server ended for what the handler did — idle in
the fence past its limit, a statement timeout — is the handler's failure, not an
interruption. What a handler did outside the database before its connection broke is done
again by the retry, as with any retry. An interruption whose close cannot be recorded within
the lease (a failover longer than that) is rescued by the reconciler as abandoned, which
counts against ``max_attempts``.

What it does not promise: an outcome recorded when the database stays unreachable, or the row
stays locked, past the lease (the error surfaces; the lease expires and the reconciler
rescues the attempt, whose handler then runs again: docs/guarantees.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from duejobs import store
from duejobs.core import Core
from duejobs.errors import HandlerTimeoutError, describe
from duejobs.handlers import Handler
from duejobs.models import Status
from duejobs.observability import tracing
from duejobs.store import Closing, SkipReason, dbapi
from duejobs.worker.bookkeeping import Bookkeeping, lock_busy, unreachable
from duejobs.worker.config import EXIT_WEDGED, Outcome, WorkerConfig
from duejobs.worker.context import Context
from duejobs.worker.group_commit import GroupCommit
from duejobs.worker.slot_pool import SlotPool

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("duejobs.worker")

_CLOSED = {
    Status.SUCCEEDED: Outcome.SUCCEEDED,
    Status.SCHEDULED: Outcome.RETRYING,
    Status.FAILED: Outcome.FAILED,
}
# How long the watchdog tries to record a timed-out attempt before the process ends anyway.
_CLOSE_WITHIN = 5.0
# Interrupted attempts of one version retried without using up the handler's budget.
MAX_INTERRUPTIONS = 10
_INTERRUPTED_WAIT_MOST = 60.0
# The waits between tries of an outcome whose connection broke: the first at once (a
# connection the server ended is replaced by a working one), then doubling up to a second.
_RETRY_FIRST, _RETRY_MOST = 0.05, 1.0


class Completer:
    """Closes the attempts of one worker (its slots, if it has several)."""

    def __init__(
        self,
        core: Core,
        config: WorkerConfig,
        bookkeeping: Bookkeeping,
        slots: SlotPool | None,
    ) -> None:
        self._core, self._config, self._bookkeeping, self._slots = core, config, bookkeeping, slots
        self._closings = GroupCommit("outcome", self._close_batch)

    def failed(
        self, ctx: Context, handler: Handler, cause: BaseException, conn: Connection | None = None
    ) -> Outcome:
        """Close an attempt that failed with ``cause`` by the type's retry policy: another
        attempt after backoff (``run_at`` untouched), or ``failed`` once attempts are
        exhausted or when ``cause`` is not one to retry; an interruption (see the module's
        docstring) is retried apart."""
        error = describe(cause)
        if interrupts(ctx, handler, cause):
            wait = timedelta(seconds=min(2.0**ctx.interruptions, _INTERRUPTED_WAIT_MOST))
            return self.close(
                ctx, Status.SCHEDULED, error=error, retry_in=wait, conn=conn, interrupted=True
            )
        if not is_last(ctx, handler, cause):
            wait = handler.retry.delay_before(ctx.attempt - ctx.interruptions)
            return self.close(ctx, Status.SCHEDULED, error=error, retry_in=wait, conn=conn)
        return self.close(ctx, Status.FAILED, error=error, conn=conn)

    def close(
        self,
        ctx: Context,
        outcome: Status,
        *,
        error: str | None = None,
        retry_in: timedelta | None = None,
        conn: Connection | None = None,
        interrupted: bool = False,
    ) -> Outcome:
        """Record the attempt's outcome: with the outcomes of the slots beside it, or on
        ``conn`` (a transaction of the caller's). A row lock another transaction holds (an
        application's cancel, say) is waited for in rounds of ``claim_lock_timeout``, up to
        the lease, so a finished handler's outcome is kept."""
        closing = Closing(ctx.delivery, outcome, error, retry_in, interrupted=interrupted)
        with tracing.span("duejobs.outcome", outcome=_outcome(closing).value):
            return self._record(ctx, closing, conn)

    def stale(self, ctx: Context, reason: SkipReason) -> Outcome:
        """The schedule moved on while the handler ran: nothing of its outcome applies."""
        with self._bookkeeping.connection() as conn:
            store.record_stale(conn, ctx.delivery, reason)
        return Outcome.STALE

    def overrun(self, ctx: Context, handler: Handler, where: dict[str, Any]) -> None:
        """The handler is past its timeout and its grace and has not returned. Close its
        attempt as timed out (on a connection of its own); then, unless other slots still
        work, end the process so its supervisor starts a fresh one. If the attempt could not
        be closed — the database unreachable, or the handler holding its row inside
        ``ctx.transaction()`` — the process ends whatever the other slots do: only that ends
        the handler's transaction and lets the lease expire for the reconciler's rescue."""
        grace = self._config.timeout_grace.total_seconds()
        timed_out = HandlerTimeoutError(
            f"handler ran past its timeout of {handler.timeout.total_seconds():g} s and did "
            f"not return within {grace:g} s more"
        )
        error = describe(timed_out)
        closed = threading.Event()

        def close() -> None:
            try:
                with self._core.engine.begin() as conn:
                    store.bounded_locks(conn)
                    self.failed(ctx, handler, timed_out, conn)
                closed.set()
            except Exception:
                log.exception("could not close the timed-out attempt; its lease will expire")

        closing = threading.Thread(target=close, name="duejobs-timed-out", daemon=True)
        closing.start()
        closing.join(_CLOSE_WITHIN)  # an unreachable database must not keep the process
        left = self._slots.give_up() if self._slots is not None else 0
        if left > 0 and closed.is_set():
            log.error("%s; its slot waits for it (%d slots work)", error, left, extra=where)
            return
        log.critical("%s; the worker exits (status %d)", error, EXIT_WEDGED, extra=where)
        os._exit(EXIT_WEDGED)

    def _close_batch(self, closings: Sequence[Closing]) -> list[bool]:
        with self._bookkeeping.connection() as conn:
            return store.finish(conn, closings)

    def _record(self, ctx: Context, closing: Closing, conn: Connection | None) -> Outcome:
        landed = False  # a try whose answer was lost may have committed
        if conn is None:
            try:
                if self._closings.submit(closing):
                    return _outcome(closing)
            except dbapi.DBAPIError as exc:
                if not unreachable(exc):
                    raise
                landed = True
                log.warning("the outcome was not recorded (%s); recording it again", exc.orig)
        # The heartbeat stopped when the handler returned, its last renewal at most a beat
        # before: past a lease less a beat from now the reconciler may rescue the attempt.
        give_up = time.monotonic() + (self._config.lease - self._config.heartbeat).total_seconds()
        wait = 0.0
        while True:
            try:
                closed = self._close_locked(closing, conn, landed)
            except dbapi.DBAPIError as exc:
                broken = unreachable(exc)
                if conn is not None or not (broken or lock_busy(exc)):
                    raise
                if time.monotonic() + wait > give_up:
                    raise
                landed = landed or broken
                closed = None
                if broken:
                    time.sleep(wait)
                    wait = min(_RETRY_MOST, max(_RETRY_FIRST, 2 * wait))
                    continue
            if closed is not None:
                return closed
            if time.monotonic() > give_up:
                raise RuntimeError(
                    f"row {ctx.schedule_id} stayed locked; the outcome of attempt "
                    f"{ctx.attempt} was not recorded (its lease will expire)"
                )
            log.info("row %s is locked; recording the outcome again", ctx.schedule_id)

    def _close_locked(
        self, closing: Closing, conn: Connection | None, landed: bool
    ) -> Outcome | None:
        """Wait for the row's lock, then close the attempt or record it stale. None: the
        row was locked again before the close (only between two autocommit statements).
        ``landed``: an earlier try's answer was lost, so the attempt may be closed already,
        by that try: then it is not closed again, nor recorded stale."""
        with contextlib.nullcontext(conn) if conn else self._bookkeeping.connection() as conn:
            closed_as = store.attempt_closed(conn, closing.delivery) if landed else None
            if closed_as is not None:
                return _outcome(closing) if closed_as is closing.outcome else _CLOSED[closed_as]
            fence_idle = self._config.fence_idle_timeout  # the close locks the row, as a fence
            change = store.change_since_claim(conn, closing.delivery, fence_idle=fence_idle)
            if change is None:
                return _outcome(closing) if store.finish(conn, [closing])[0] else None
            store.record_stale(conn, closing.delivery, change)
        return Outcome.STALE


def _outcome(closing: Closing) -> Outcome:
    return Outcome.INTERRUPTED if closing.interrupted else _CLOSED[closing.outcome]


def interrupts(ctx: Context, handler: Handler, error: BaseException) -> bool:
    """Whether an attempt that failed with ``error`` is retried as an interruption (see the
    module's docstring): its connection broke, nothing refuses ``error``, and the version's
    interruptions are under ``MAX_INTERRUPTIONS``."""
    if handler.refuses(error) or ctx.interruptions >= MAX_INTERRUPTIONS:
        return False
    return dbapi.broke_connection(error)


def is_last(ctx: Context, handler: Handler, error: BaseException) -> bool:
    """Whether an attempt that failed with ``error`` gets no other, as :meth:`Completer.failed`
    decides it: what a handler that keeps its own record of failures (Django's task results)
    asks."""
    if interrupts(ctx, handler, error):
        return False
    used = ctx.attempt - ctx.interruptions
    return not handler.retries(error) or used >= handler.retry.max_attempts
