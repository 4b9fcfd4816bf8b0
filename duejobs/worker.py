"""The worker: runs a delivery only if the database says it is current and due.

For each delivery (schedule id, version, attempt, tenant — never the payload) the worker:

1. **Claims the row in one statement**: the tenant's row, ``scheduled`` at the delivered
   version, this being the next attempt, and ``due_at`` reached by the **database's** clock →
   ``running`` with an attempt row, a ``started`` event and a lease. The worker's own clock is
   never consulted, so a worker whose clock is ten minutes off behaves like any other.
   Deliveries taken from Redis together (one per free slot) are claimed in that same one
   statement, and so are outcomes that arrive together (:mod:`duejobs.batches`).
2. **Otherwise skips, and records why**: missing, cancelled, superseded (another version),
   duplicate (already running or done — RQ can deliver one id twice), expired (later than
   the schedule's ``expires_after``; the schedule is then cancelled). A delivery that arrived
   early waits up to ``max_early_wait`` (measured against the database's answer), or is put
   back into the scheduled registry for ``due_at`` under its own id; no attempt is consumed.
   A delivery of a type this worker has no handler for is not claimed either: it goes back
   for a worker that has one (a rolling deploy updates producers first), after as long again
   as it has been put back (1 s to 1 min), for ``unknown_type_grace`` after the first; then
   it fails for good, naming its type (counted in ``duejobs_unknown_type_deliveries_total``).
3. **Runs the handler** with ``ctx`` (ids, version, attempt, ``effect_key``, ``run_at``, and
   the payload read from the row now) under the type's timeout, while a heartbeat thread
   extends the lease so the reconciler can tell a slow handler from a dead worker. An
   ``async def`` handler runs to completion on an event loop of its slot (``ctx``'s methods
   are synchronous and may be called from it).

   **Hard time limits.** At the timeout :class:`~duejobs.errors.HandlerTimeoutError` — a
   ``BaseException``, so ``except Exception`` cannot swallow it — is raised in the handler,
   and again every second until it returns; the attempt fails and is retried per the type's
   policy. A handler still running ``timeout_grace`` after its timeout loses its lease (the
   heartbeat stops renewing it), its attempt is closed as timed out by the heartbeat thread,
   and the worker process exits with status 70 (``EXIT_WEDGED``) for its supervisor to start
   a fresh one (compose ``restart: unless-stopped``, systemd ``Restart=always``); if the
   database cannot be reached then, the lease expires and the reconciler rescues the row.

   **Slots** (``concurrency`` N > 1: each delivery in a thread of the worker's pool, see
   :class:`~duejobs.delivery.DuejobsWorker`). A thread cannot be interrupted from outside: a
   sync handler gets the timeout at its next Python instruction (not inside a blocking call,
   see :func:`~duejobs.lease.time_limit`); an ``async def`` one is cancelled at its timeout.
   A handler still running ``timeout_grace`` later is given up as above — attempt closed,
   lease released, whatever it does afterwards recorded ``stale`` by the fence — but only its
   slot waits for it: the process exits with ``EXIT_WEDGED`` once every slot is given up.
4. **Closes the attempt** only if it is still current: ``succeeded``; or, on an exception,
   another attempt after exponential backoff with full jitter (``run_at`` is never touched;
   ``due_at`` and the attempt row carry the retry time), or ``failed`` with ``last_error``
   once attempts are exhausted; rows are never deleted. If the schedule changed meanwhile,
   the attempt is recorded as ``stale``.

Effects: ``ctx.ensure_current()`` raises :class:`~duejobs.errors.ScheduleChangedError` before
an external effect if the schedule moved on. ``with ctx.transaction() as conn:`` fences on the
current attempt (row lock), records ``effect_key`` in the ledger and commits the handler's own
writes together with ``succeeded``: exactly once for effects in the same database, and
cancel-safe (a cancel waits for the fence and then finds the schedule finished).

What it does not promise: exactly-once for external effects (pass ``ctx.effect_key`` as the
idempotency key). It can run a handler twice when: its worker is killed (SIGKILL, cold
shutdown) — the row stays ``running`` until its lease expires and the reconciler rescues it;
or PostgreSQL itself crashes — the worker's claim and outcome commits use
``synchronous_commit = off`` (about 1 ms per job less), so the last fraction of a second of
them can be lost and the schedule runs again. Effects committed through ``ctx.transaction()``
use the application's durable commits and stay exactly-once in both cases.

A claim waits at most ``claim_lock_timeout`` (2 s) for a row lock an application
transaction holds; then the delivery goes back to the scheduled registry for a second later,
under its own id, without using an attempt.

Knobs (:class:`WorkerConfig`, checked when built): ``lease`` (20 s), ``heartbeat`` (5 s, at
most half the lease), ``max_early_wait`` (1 s), ``durable_bookkeeping`` (False: set True
to fsync every claim and outcome), ``timeout_grace`` (10 s), ``claim_lock_timeout`` (2 s),
``concurrency`` (1: deliveries one at a time, in the main thread; the App's connection pool
grows to two connections per slot), ``take_window`` (10 ms, at most 1 s, 0 for none;
with ``concurrency`` above 1 only: how long a slot freed while others run waits for the
handlers taken together with its own (once per batch) before the worker takes jobs — jobs
taken together are claimed and started together, which costs far less per job; see
:class:`~duejobs.delivery.DuejobsWorker`), ``switch_interval`` (20 ms, at most 1 s; with
``concurrency`` above 1 only: the interpreter's switch interval while the worker works,
restored after — how long a thread may hold the GIL while another waits for it. Python's
5 ms makes many slots' threads hand the GIL over more often than their work needs; a handler
that computes keeps the others waiting up to this long), ``unknown_type_grace`` (15 min).

Metrics: ``duejobs_deliveries_total{tenant,type,outcome}``, ``duejobs_lag_seconds``, and
``duejobs_worker_batch_size{kind}`` (claims or outcomes per bookkeeping statement).
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from duejobs import metrics, store, tracing
from duejobs.batches import GroupCommit
from duejobs.config import check_count, check_duration, redacted
from duejobs.context import Context
from duejobs.core import HasCore
from duejobs.delivery import EXIT_WEDGED, STUCK_AFTER, Delivered, Deliverer, DuejobsWorker
from duejobs.errors import (
    ConfigurationError,
    EffectAlreadyAppliedError,
    HandlerTimeoutError,
    ScheduleChangedError,
    describe,
)
from duejobs.handlers import Handler
from duejobs.lease import Heartbeat, Watched, time_limit
from duejobs.models import Status
from duejobs.slots import Bookkeeping, EventLoops, lock_busy
from duejobs.store import Closing, Delivery, RunClaim, SkipReason
from duejobs.timespec import spell_duration

# DuejobsWorker (the RQ side) lives in duejobs.delivery; it is named here too, beside the
# Runtime it runs, for code that embeds a worker.
__all__ = [
    "EXIT_WEDGED",
    "Context",
    "DuejobsWorker",
    "Outcome",
    "Runtime",
    "WorkerConfig",
    "perform",
]

log = logging.getLogger("duejobs.worker")
_MINUTE = timedelta(minutes=1)
# Slots per process: past this, more processes serve better than more threads.
MAX_CONCURRENCY = 512
# The longest take window: a free slot waiting longer for the others is a slot wasted.
_TAKE_WINDOW_MAX = timedelta(seconds=1)
# The longest switch interval: slots waiting longer for the GIL are slots wasted.
_SWITCH_INTERVAL_MAX = timedelta(seconds=1)


@dataclass(frozen=True)
class WorkerConfig:
    """Worker knobs: the lease a running attempt holds, how often it is renewed, how long an
    early delivery may wait for its time instead of going back to the scheduler, whether
    the worker's own claim/outcome commits wait for the disk (see the module docstring), how
    long a handler past its timeout may take to return before the worker ends itself, how
    long a claim waits for a row lock an application transaction holds, how many deliveries
    run at once, how long a slot freed while others run waits for the handlers taken
    with its own before jobs are taken (so that they are taken together), and the
    interpreter's switch interval while slots work (the last two ignored with one slot)."""

    lease: timedelta = timedelta(seconds=20)
    heartbeat: timedelta = timedelta(seconds=5)
    max_early_wait: timedelta = timedelta(seconds=1)
    durable_bookkeeping: bool = False
    timeout_grace: timedelta = timedelta(seconds=10)
    claim_lock_timeout: timedelta = timedelta(seconds=2)
    concurrency: int = 1
    take_window: timedelta = timedelta(milliseconds=10)
    switch_interval: timedelta = timedelta(milliseconds=20)
    unknown_type_grace: timedelta = timedelta(minutes=15)

    def __post_init__(self) -> None:
        check_count("concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        check_duration("take_window", self.take_window, zero_ok=True, at_most=_TAKE_WINDOW_MAX)
        check_duration("switch_interval", self.switch_interval, at_most=_SWITCH_INTERVAL_MAX)
        for name in (
            "lease",
            "heartbeat",
            "timeout_grace",
            "claim_lock_timeout",
            "unknown_type_grace",
        ):
            check_duration(name, getattr(self, name))
        check_duration("max_early_wait", self.max_early_wait, zero_ok=True, at_most=_MINUTE)
        if self.heartbeat * 2 > self.lease:
            raise ConfigurationError(
                f"heartbeat ({self.heartbeat}) must be at most half the lease ({self.lease}), "
                "or a slow handler can lose its lease between two beats"
            )
        if self.claim_lock_timeout >= STUCK_AFTER:
            raise ConfigurationError(
                f"claim_lock_timeout must be shorter than {STUCK_AFTER.total_seconds():g} s"
            )


class Outcome(enum.StrEnum):
    """What handling one delivery came to."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    FAILED = "failed"
    SKIPPED = "skipped"
    DEFERRED = "deferred"
    STALE = "stale"


_CLOSED = {
    Status.SUCCEEDED: Outcome.SUCCEEDED,
    Status.SCHEDULED: Outcome.RETRYING,
    Status.FAILED: Outcome.FAILED,
}
# How long the watchdog tries to record a timed-out attempt before the process ends anyway.
_CLOSE_WITHIN = 5.0
# A delivery whose row another transaction held is put back with this score: the next
# promotion (by the database clock) moves it onto the queue again; its claim then waits for
# the lock once more, at most ``claim_lock_timeout``.
_AT_ONCE = datetime.fromtimestamp(0, UTC)
# Threads that run the claims of deliveries taken together (:meth:`Runtime.claim_ahead`).
_CLAIMERS = 4
# How long a delivery of a type with no handler here waits before it is delivered again: as
# long as it has been put back for that reason, within these bounds.
_UNKNOWN_TYPE_BACKOFF = (timedelta(seconds=1), timedelta(minutes=1))


@dataclass(frozen=True)
class _ClaimAhead:
    """A delivery's places in the claim of a batch taken together (running or done), and
    when that claim was asked for (``time.monotonic()``: its lease began no earlier)."""

    claims: Future[list[RunClaim | None]]
    places: list[int]
    asked_at: float

    def claim(self) -> RunClaim | None:
        """The claim this batch made of the delivery, once it committed; None when it made
        none or failed (logged once for the batch): the slot then claims alone."""
        try:
            made = self.claims.result()
        except Exception:
            return None
        return next((made[at] for at in self.places if made[at] is not None), None)


class Runtime:
    """Handles deliveries for one App: the logic of the worker, without RQ around it."""

    def __init__(self, app: HasCore, config: WorkerConfig | None = None, name: str | None = None):
        self.core = app.core
        self.config = config or WorkerConfig()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        # At most: a ctx.transaction() per slot, and a bookkeeping step per slot (a few run
        # at once, however many slots: the group commit carries many in one statement).
        self.core.ensure_pool(2 * self.config.concurrency + 2)
        self._heartbeat = Heartbeat(self.core, self.config.heartbeat, self.config.lease)
        self.bookkeeping = Bookkeeping(
            self.core, self.config.claim_lock_timeout, self.config.durable_bookkeeping
        )
        self._loops = EventLoops()
        # Claims and outcomes of deliveries that arrive together, one statement per batch.
        self._claims = GroupCommit("claim", self._claim_batch)
        self._closings = GroupCommit("outcome", self._close_batch)
        # Deliveries taken from Redis together, each with the claims of the batches that
        # carried it (running or done) and its places in them (copies of one delivery may
        # arrive together, or in two batches), until a slot runs it. The claims run on
        # threads of their own, so the thread that takes jobs goes on taking while they
        # commit; a few of them, so batches that queue meanwhile share the next statement.
        self._claimed_ahead: dict[Delivery, list[_ClaimAhead]] = {}
        self._ahead_lock = threading.Lock()
        self._claimers = ThreadPoolExecutor(_CLAIMERS, thread_name_prefix="duejobs-claim")
        # Slots whose handler ran past its timeout and grace and has not returned.
        self._wedged = 0
        self._wedged_lock = threading.Lock()

    def close(self) -> None:
        self._claimers.shutdown(wait=True)
        self._heartbeat.stop()
        self.bookkeeping.close()
        self._loops.close()

    @property
    def concurrency(self) -> int:
        return self.config.concurrency

    @property
    def take_window(self) -> float:
        return self.config.take_window.total_seconds()

    @property
    def switch_interval(self) -> float:
        return self.config.switch_interval.total_seconds()

    @property
    def wedged(self) -> int:
        with self._wedged_lock:
            return self._wedged

    @property
    def lease(self) -> float:
        return self.config.lease.total_seconds()

    def redis_url_for(self, queues: Sequence[str]) -> str:
        """The Redis node ``queues`` live on: a worker serves the queues of one node (RQ's
        dequeue waits on their lists in one call), so queues on several are refused."""
        homes = {queue: self.core.settings.redis_url_for(queue) for queue in queues}
        if len(set(homes.values())) > 1:
            where = ", ".join(f"{queue} on {redacted(url)}" for queue, url in homes.items())
            raise ConfigurationError(
                f"a worker serves queues of one Redis node; these live on several: {where}"
            )
        return next(iter(homes.values()))

    @property
    def default_queue(self) -> str:
        return self.core.queue

    def deliverer(self) -> Deliverer:
        return self.core.deliverer()

    def handle(self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str) -> Outcome:
        """Claim, run and close one delivery; returns what happened."""
        return Outcome(self.deliver(schedule_id, version, attempt, tenant).outcome)

    def deliver(self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str) -> Delivered:
        """Claim, run and close one delivery: what happened, and when to put the job back if
        it must wait (an early delivery: its due time; a row locked by an application: at
        once)."""
        put_back_at: datetime | None = None
        job_type = ""
        where = {"schedule_id": str(schedule_id), "version": version, "attempt": attempt}
        with tracing.span("duejobs.claim", tenant=tenant, **where):
            claim = self._claim(Delivery(schedule_id, tenant, version, attempt))
        if claim is None:
            # Someone holds the row (an open application transaction): try again shortly,
            # under the same id, without using an attempt.
            log.info("row %s is locked; delivery put back", schedule_id)
            outcome, put_back_at = Outcome.DEFERRED, _AT_ONCE
        else:
            job_type = claim.type
            lag = None
            if claim.db_now is not None and claim.due_at is not None:
                lag = round((claim.db_now - claim.due_at).total_seconds() * 1000)
            with tracing.attempt(
                job_type, claim.trace_context, tenant=tenant, lag_ms=lag, **where
            ) as span:
                outcome = self._run(claim, schedule_id, version, attempt, tenant)
                if span is not None:
                    span.set_attribute("duejobs.outcome", outcome.value)
            if outcome is Outcome.DEFERRED:
                put_back_at = self._put_back_at(claim)
        metrics.DELIVERIES.labels(
            metrics.tenant_label(tenant), self._type_label(job_type), outcome.value
        ).inc()
        return Delivered(outcome.value, put_back_at)

    def _type_label(self, job_type: str) -> str:
        """A type label from a bounded set: the types this worker has handlers for."""
        if not job_type:
            return "-"
        return job_type if self.core.handler_for(job_type) is not None else "unregistered"

    def _run(
        self,
        claim: store.RunClaim,
        schedule_id: uuid.UUID,
        version: int,
        attempt: int,
        tenant: str,
    ) -> Outcome:
        where = {
            "schedule_id": str(schedule_id),
            "version": version,
            "tenant": tenant,
            "attempt": attempt,
        }
        delivery = Delivery(schedule_id, tenant, version, attempt)
        if claim.skip is SkipReason.NOT_DUE:
            assert claim.due_at is not None
            with self.bookkeeping.connection() as conn:
                store.record_deferred(conn, delivery, claim.skip, self.name)
            log.info("not due until %s: deferred", claim.due_at, extra=where)
            return Outcome.DEFERRED
        if claim.skip is SkipReason.UNKNOWN_TYPE:
            return self._unknown_type(delivery, claim, where)
        if claim.skip is SkipReason.EXPIRED:
            with self.bookkeeping.connection() as conn:
                store.expire(conn, schedule_id, version)
        if claim.skip is not None:
            log.info("skipped: %s", claim.skip.value, extra=where)
            return Outcome.SKIPPED
        assert claim.run_at is not None and claim.due_at is not None and claim.db_now is not None
        metrics.LAG.labels(metrics.tenant_label(tenant), self._type_label(claim.type)).observe(
            (claim.db_now - claim.due_at).total_seconds()
        )
        ctx = Context(
            schedule_id,
            tenant,
            claim.type,
            version,
            attempt,
            claim.run_at,
            claim.payload,
            self.core,
        )
        handler = self.core.handler_for(claim.type)
        assert handler is not None  # claimed for the types with a handler only
        if attempt > handler.retry.max_attempts:  # a rescued attempt beyond the policy
            error = f"attempts exhausted ({attempt - 1} of {handler.retry.max_attempts})"
            return self._close(ctx, Status.FAILED, error=error)
        give_up = time.monotonic() + (handler.timeout + self.config.timeout_grace).total_seconds()
        watched = Watched(
            schedule_id, version, attempt, give_up, lambda: self._overrun(ctx, handler, where)
        )
        try:
            with (
                self._given_up(watched),
                self._heartbeat.watching(watched),
                tracing.span("duejobs.handler"),
            ):
                self._invoke(handler, ctx, claim.payload)
        except ScheduleChangedError as exc:
            log.info("changed while running: %s", exc.reason, extra=where)
            return self._stale(ctx, SkipReason(exc.reason))
        except EffectAlreadyAppliedError:
            return self._close(ctx, Status.SUCCEEDED)
        except (Exception, HandlerTimeoutError) as exc:
            log.warning("attempt failed: %s", describe(exc), extra=where, exc_info=True)
            return self._failed(None, ctx, handler, describe(exc))
        if ctx._finished:
            return Outcome.SUCCEEDED
        return self._close(ctx, Status.SUCCEEDED)

    def _unknown_type(self, delivery: Delivery, claim: RunClaim, where: dict[str, Any]) -> Outcome:
        """A delivery of a type this worker has no handler for: put back for a worker that
        has one (a rolling deploy, producers updated before workers, a worker serving the
        queue for other types), backing off, without using an attempt — until
        ``unknown_type_grace`` has passed, by the database clock, since a worker first put it
        back: then it fails for good, naming its type (a typo, or a type no worker runs any
        more)."""
        metrics.UNKNOWN_TYPES.labels(metrics.tenant_label(delivery.tenant)).inc()
        if _unknown_for(claim) < self.config.unknown_type_grace:
            with self.bookkeeping.connection() as conn:
                store.defer_unknown_type(conn, delivery, self._put_back_at(claim), self.name)
            log.warning("no handler for type %r here: put back", claim.type, extra=where)
            return Outcome.DEFERRED
        grace = self.config.unknown_type_grace
        error = (
            f"no handler registered for type {claim.type!r} in any worker that took it "
            f"within {spell_duration(grace)}"
        )
        with self.bookkeeping.connection() as conn:
            failed = store.fail_unknown_type(conn, delivery, error, self.name)
        log.error(error, extra=where)
        return Outcome.FAILED if failed else Outcome.SKIPPED

    def _put_back_at(self, claim: RunClaim) -> datetime:
        """When a deferred delivery goes back on its queue (by the database clock): an early
        one at its due time; one of an unknown type after as long again as it has been put
        back for that (at least ``_UNKNOWN_TYPE_BACKOFF[0]``, at most ``[1]``), so that a
        worker with its handler, started meanwhile, gets it soon, and one that never comes
        costs a few deliveries an hour. The row is due then too
        (:func:`~duejobs.store.defer_unknown_type`), so the reconciler leaves its job there."""
        assert claim.due_at is not None
        if claim.skip is not SkipReason.UNKNOWN_TYPE:
            return claim.due_at
        assert claim.db_now is not None
        least, most = _UNKNOWN_TYPE_BACKOFF
        return claim.db_now + min(max(_unknown_for(claim), least), most)

    def _invoke(self, handler: Handler, ctx: Context, payload: Any) -> None:
        """Call the handler under its time limit; an ``async def`` one (or any awaitable it
        returns) runs to completion on this slot's event loop. In a slot of a concurrent
        worker an ``async def`` handler is cancelled at its timeout instead (see
        :func:`~duejobs.lease.time_limit` for what a sync one gets)."""
        if _in_slot() and inspect.iscoroutinefunction(handler.func):
            self._loops.run(handler.func(ctx, payload), handler.timeout)
            return
        with time_limit(handler.timeout):
            result = handler.func(ctx, payload)
            if inspect.isawaitable(result):
                self._loops.run(result)

    @contextlib.contextmanager
    def _given_up(self, watched: Watched) -> Iterator[None]:
        """After a handler the heartbeat gave up on (its ``overrun`` closed the attempt):
        with one slot, the process is ending — wait for it; with several, the slot is free
        again, and what the handler did next finds its attempt closed (``stale``)."""
        try:
            yield
        finally:
            if watched.fired:
                if self.config.concurrency == 1:
                    threading.Event().wait()
                with self._wedged_lock:
                    self._wedged -= 1
                log.warning("a handler given up on returned; its slot works again")

    def _failed(
        self, conn: Connection | None, ctx: Context, handler: Handler, error: str
    ) -> Outcome:
        """Close a failed attempt by the type's retry policy: another attempt after backoff
        (``run_at`` untouched), or ``failed`` once attempts are exhausted."""
        if ctx.attempt < handler.retry.max_attempts:
            wait = handler.retry.delay_before(ctx.attempt)
            return self._close(ctx, Status.SCHEDULED, error=error, retry_in=wait, conn=conn)
        return self._close(ctx, Status.FAILED, error=error, conn=conn)

    def _overrun(self, ctx: Context, handler: Handler, where: dict[str, Any]) -> None:
        """The handler is past its timeout and its grace and has not returned. Close its
        attempt as timed out (on a connection of its own); then, unless other slots still
        work, end the process so its supervisor starts a fresh one. If the attempt could not
        be closed — the database unreachable, or the handler holding its row inside
        ``ctx.transaction()`` — the process ends whatever the other slots do: only that ends
        the handler's transaction and lets the lease expire for the reconciler's rescue."""
        grace = self.config.timeout_grace.total_seconds()
        error = (
            f"HandlerTimeoutError: handler ran past its timeout of "
            f"{handler.timeout.total_seconds():g} s and did not return within {grace:g} s more"
        )

        closed = threading.Event()

        def close() -> None:
            try:
                with self.core.engine.begin() as conn:
                    store.bounded_locks(conn)
                    self._failed(conn, ctx, handler, error)
                closed.set()
            except Exception:
                log.exception("could not close the timed-out attempt; its lease will expire")

        closing = threading.Thread(target=close, name="duejobs-timed-out", daemon=True)
        closing.start()
        closing.join(_CLOSE_WITHIN)  # an unreachable database must not keep the process
        with self._wedged_lock:
            self._wedged += 1
            left = self.config.concurrency - self._wedged
        if left > 0 and closed.is_set():
            log.error("%s; its slot waits for it (%d slots work)", error, left, extra=where)
            return
        log.critical("%s; the worker exits (status %d)", error, EXIT_WEDGED, extra=where)
        os._exit(EXIT_WEDGED)

    def claim_ahead(self, deliveries: Sequence[tuple[uuid.UUID, int, int, str]]) -> None:
        """Have deliveries taken from Redis together claimed in one statement, each for the
        slot that will run it (see :meth:`_claim`); returns at once, the statement running
        meanwhile. A delivery that cannot run now, or a statement that failed, is left to
        its slot, which claims it alone and says why."""
        batch = [
            Delivery(s, tenant, version, attempt) for s, version, attempt, tenant in deliveries
        ]
        if not batch:
            return
        asked_at = time.monotonic()
        claims = self._claimers.submit(self._claim_together, batch)
        places: dict[Delivery, list[int]] = {}
        for place, delivery in enumerate(batch):
            places.setdefault(delivery, []).append(place)
        with self._ahead_lock:
            for delivery, at in places.items():
                ahead = _ClaimAhead(claims, at, asked_at)
                self._claimed_ahead.setdefault(delivery, []).append(ahead)

    def forget_ahead(self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str) -> None:
        """A delivery claimed ahead that no slot will run: its claim is no longer kept (its
        lease ends for the reconciler)."""
        with self._ahead_lock:
            self._claimed_ahead.pop(Delivery(schedule_id, tenant, version, attempt), None)

    def _claim_together(self, batch: list[Delivery]) -> list[RunClaim | None]:
        try:
            return self._claims.submit_all(batch)
        except Exception:
            log.exception("could not claim %d deliveries together", len(batch))
            raise

    def _claim(self, delivery: Delivery) -> RunClaim | None:
        """Claim (with the deliveries claimed beside it); one that cannot run now is told why
        (:func:`~duejobs.store.claim_verdict`), and one that came early waits for its time
        when that is close, by the database's own reading of how far away it is, then
        claims again. None: its row stayed locked past ``claim_lock_timeout``."""
        with self._ahead_lock:  # its copies taken with it find none, and claim alone
            ahead = self._claimed_ahead.pop(delivery, [])
        for taken in ahead:
            claim = taken.claim()
            if claim is not None:
                return self._in_time(delivery, claim, taken.asked_at)
        give_up = time.monotonic() + self.config.max_early_wait.total_seconds()
        locked_until = time.monotonic() + self.config.claim_lock_timeout.total_seconds()
        while True:
            claim = self._claims.submit(delivery)
            if claim is not None:
                return claim
            try:
                with self.bookkeeping.connection() as conn:
                    verdict = store.claim_verdict(
                        conn, delivery, worker=self.name, types=self._types()
                    )
            except DBAPIError as exc:
                if not lock_busy(exc):
                    raise
                return None
            if verdict.skip is None:  # its row was locked when the claim looked
                if time.monotonic() > locked_until:
                    return None
                continue
            if verdict.skip is not SkipReason.NOT_DUE:
                return verdict
            assert verdict.due_at is not None and verdict.db_now is not None
            remaining = (verdict.due_at - verdict.db_now).total_seconds()
            if time.monotonic() + remaining > give_up:
                return verdict
            time.sleep(remaining)

    def _in_time(self, delivery: Delivery, claim: RunClaim, asked_at: float) -> RunClaim:
        """A claim made ahead, if its handler may still start on it: made less than a
        heartbeat ago (the heartbeat's first renewal comes a heartbeat after the handler
        starts, well within the lease); otherwise renewed first — its start was held up
        (Redis failing as it started, say) — and, once the reconciler has rescued it, never
        used: the attempt the rescue pushed runs instead. No handler starts on a claim the
        reconciler may take back before its first heartbeat."""
        if time.monotonic() - asked_at < self.config.heartbeat.total_seconds():
            return claim  # a heartbeat renews it before a lease less a heartbeat has passed
        with self.bookkeeping.connection() as conn:
            renewed = store.renew_claim(conn, delivery, self.config.lease)
        if renewed:
            return claim
        return RunClaim(skip=SkipReason.LAPSED, type=claim.type)

    def _claim_batch(self, deliveries: Sequence[Delivery]) -> list[RunClaim | None]:
        with self.bookkeeping.connection() as conn:
            return store.claim_runs(
                conn, deliveries, worker=self.name, lease=self.config.lease, types=self._types()
            )

    def _types(self) -> list[str]:
        """The types this worker has handlers for: the only ones it claims."""
        return list(self.core.handlers)

    def _close_batch(self, closings: Sequence[Closing]) -> list[bool]:
        with self.bookkeeping.connection() as conn:
            return store.finish(conn, closings)

    def _close(
        self,
        ctx: Context,
        outcome: Status,
        *,
        error: str | None = None,
        retry_in: timedelta | None = None,
        conn: Connection | None = None,
    ) -> Outcome:
        """Record the attempt's outcome: with the outcomes of the slots beside it, or on
        ``conn`` (a transaction of the caller's). A row lock another transaction holds (an
        application's cancel, say) is waited for in rounds of ``claim_lock_timeout``, up to
        the lease, so a finished handler's outcome is kept."""
        closing = Closing(ctx.schedule_id, ctx.version, ctx.attempt, outcome, error, retry_in)
        with tracing.span("duejobs.outcome", outcome=outcome.value):
            return self._record(ctx, closing, conn)

    def _record(self, ctx: Context, closing: Closing, conn: Connection | None) -> Outcome:
        if conn is None and self._closings.submit(closing):
            return _CLOSED[closing.outcome]
        give_up = time.monotonic() + self.config.lease.total_seconds()
        while True:
            try:
                closed = self._close_locked(ctx, closing, conn)
            except DBAPIError as exc:
                if conn is not None or not lock_busy(exc) or time.monotonic() > give_up:
                    raise
                closed = None
            if closed is not None:
                return closed
            if time.monotonic() > give_up:
                raise RuntimeError(
                    f"row {ctx.schedule_id} stayed locked; the outcome of attempt "
                    f"{ctx.attempt} was not recorded (its lease will expire)"
                )
            log.info("row %s is locked; recording the outcome again", ctx.schedule_id)

    def _close_locked(
        self, ctx: Context, closing: Closing, conn: Connection | None
    ) -> Outcome | None:
        """Wait for the row's lock, then close the attempt or record it stale. None: the
        row was locked again before the close (only between two autocommit statements)."""
        with contextlib.nullcontext(conn) if conn else self.bookkeeping.connection() as conn:
            change = store.change_since_claim(
                conn, ctx.schedule_id, ctx.version, ctx.attempt, lock=True
            )
            if change is None:
                return _CLOSED[closing.outcome] if store.finish(conn, [closing])[0] else None
            store.record_stale(conn, ctx.schedule_id, ctx.version, ctx.attempt, change)
        return Outcome.STALE

    def _stale(self, ctx: Context, reason: SkipReason) -> Outcome:
        with self.bookkeeping.connection() as conn:
            store.record_stale(conn, ctx.schedule_id, ctx.version, ctx.attempt, reason)
        return Outcome.STALE


def _unknown_for(claim: RunClaim) -> timedelta:
    """How long, by the database clock, workers have put this delivery back for want of a
    handler for its type (zero the first time)."""
    assert claim.db_now is not None
    return claim.db_now - (claim.unknown_since or claim.db_now)


def _in_slot() -> bool:
    """Running in a slot of a concurrent worker (not the main thread)."""
    return threading.current_thread() is not threading.main_thread()


def perform(schedule_id: str, version: int, attempt: int, tenant: str) -> str:
    """The function every duejobs RQ job names (``JOB_FUNCTION``). A duejobs worker runs the
    delivery itself (:class:`~duejobs.delivery.DuejobsWorker`) and never calls it; a plain RQ
    worker that took the job does, and is told why it cannot run it."""
    raise RuntimeError(
        f"duejobs job for schedule {schedule_id} (v{version}, attempt {attempt}, tenant "
        f"{tenant!r}) taken by a plain RQ worker: run `duejobs worker --app MODULE:APP`"
    )
