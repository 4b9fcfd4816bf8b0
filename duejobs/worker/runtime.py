"""The worker's runtime: one delivery from claim to outcome, without RQ around it.

:class:`Runtime` is what the worker's loop (:class:`~duejobs.worker.loop.Worker`) hands each
job's delivery to: it claims the delivery (:mod:`.claims`), runs the
handler under its time limit while the heartbeat renews its lease (:mod:`.heartbeat`,
:mod:`.time_limits`), and closes the attempt (:mod:`.closing`). What the worker promises as a
whole, and its knobs, are stated in :mod:`duejobs.worker`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from duejobs import store
from duejobs.config import redacted
from duejobs.core import HasCore
from duejobs.delivery import Deliverer
from duejobs.errors import (
    ConfigurationError,
    EffectAlreadyAppliedError,
    ScheduleChangedError,
    describe,
)
from duejobs.handlers import Handler
from duejobs.models import Delivery, Status
from duejobs.observability import metrics, tracing
from duejobs.store import RunClaim, SkipReason, dbapi
from duejobs.timespec import spell_duration
from duejobs.worker.bookkeeping import Bookkeeping
from duejobs.worker.claims import Claimer
from duejobs.worker.closing import Completer
from duejobs.worker.config import Outcome, WorkerConfig
from duejobs.worker.context import Context
from duejobs.worker.event_loops import EventLoops
from duejobs.worker.heartbeat import Heartbeat, Watched
from duejobs.worker.slot_pool import SlotPool
from duejobs.worker.time_limits import time_limit

log = logging.getLogger("duejobs.worker")


@dataclass(frozen=True)
class Delivered:
    """What handling one delivery came to: the outcome (the RQ job's result), and when to
    put the job back into its scheduled registry (None: it is done)."""

    outcome: str
    put_back_at: datetime | None = None


# A delivery whose row another transaction held is put back with this score: the next
# promotion (by the database clock) moves it onto the queue again; its claim then waits for
# the lock once more, at most ``claim_lock_timeout``.
_AT_ONCE = datetime.fromtimestamp(0, UTC)
# How long a delivery of a type with no handler here waits before it is delivered again: as
# long as it has been put back for that reason, within these bounds.
_UNKNOWN_TYPE_BACKOFF = (timedelta(seconds=1), timedelta(minutes=1))


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
        # With one slot, deliveries run in the main thread, one at a time: no pool.
        self.slots = (
            SlotPool(self.config.concurrency, self.config.take_window.total_seconds())
            if self.config.concurrency > 1
            else None
        )
        self.claimer = Claimer(self.core, self.config, self.bookkeeping, self.name)
        self.completer = Completer(self.core, self.config, self.bookkeeping, self.slots)

    def close(self) -> None:
        self.claimer.close()
        self._heartbeat.stop()
        self.bookkeeping.close()
        self._loops.close()

    # -- what the loop asks of it ---------------------------------------------------------------

    @property
    def switch_interval(self) -> float:
        return self.config.switch_interval.total_seconds()

    @property
    def default_queue(self) -> str:
        return self.core.queue

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

    def deliverer(self) -> Deliverer:
        return self.core.deliverer()

    def claim_ahead(self, deliveries: Sequence[Delivery]) -> None:
        """Claim together deliveries taken together, before their slots run them."""
        self.claimer.claim_ahead(deliveries)

    def handle(
        self,
        schedule_id: uuid.UUID,
        version: int,
        attempt: int,
        tenant: str,
        queue: str | None = None,
    ) -> Outcome:
        """Claim, run and close one delivery (on the App's queue unless ``queue`` names
        another); returns what happened."""
        delivery = Delivery(schedule_id, tenant, version, attempt, queue or self.default_queue)
        return Outcome(self.deliver(delivery).outcome)

    def deliver(self, delivery: Delivery) -> Delivered:
        """Claim, run and close one delivery: what happened, and when to put the job back if
        it must wait (an early delivery: its due time; a row locked by an application: at
        once)."""
        put_back_at: datetime | None = None
        job_type = ""
        where = _where(delivery)
        with tracing.span("duejobs.claim", **where):
            claim = self.claimer.claim(delivery)
        if claim is None:
            # Someone holds the row (an open application transaction): try again shortly,
            # under the same id, without using an attempt.
            log.info("row %s is locked; delivery put back", delivery.schedule_id)
            outcome, put_back_at = Outcome.DEFERRED, _AT_ONCE
        else:
            job_type = claim.type
            lag = None
            began = claim.started_at or claim.db_now
            if began is not None and claim.due_at is not None:
                lag = round((began - claim.due_at).total_seconds() * 1000)
            with tracing.attempt(job_type, claim.trace_context, lag_ms=lag, **where) as span:
                outcome = self._run(claim, delivery)
                if span is not None:
                    span.set_attribute("duejobs.outcome", outcome.value)
            if outcome is Outcome.DEFERRED and claim.skip is not SkipReason.RATE_LIMITED:
                put_back_at = self._put_back_at(claim)  # a turn-back waits in the table
        metrics.DELIVERIES.labels(
            metrics.tenant_label(delivery.tenant), self._type_label(job_type), outcome.value
        ).inc()
        return Delivered(outcome.value, put_back_at)

    def warn_if_outcomes_can_be_lost(self) -> None:
        """Say at start, once, when a failover can lose outcomes this worker acknowledged:
        the server waits for synchronous standbys (``synchronous_standby_names``) but the
        bookkeeping commits do not (no ``durable_bookkeeping``), so the last claims and
        outcomes before a failover may be missing on the promoted standby, and those
        schedules run again (docs/deployment.md)."""
        try:
            with self.bookkeeping.connection() as conn:
                durability = store.bookkeeping_durability(conn)
        except dbapi.DBAPIError as exc:  # the database down at start: the worker waits it out
            log.warning("could not read how PostgreSQL commits (%s); going on", exc.orig)
            return
        if durability.standbys and durability.synchronous_commit == "off":
            log.warning(
                "PostgreSQL waits for synchronous standbys (%s), but this worker's claims and "
                "outcomes do not (--durable-bookkeeping is off): after a failover the last of "
                "them may be missing, and those schedules run again",
                durability.standbys,
            )

    def _type_label(self, job_type: str) -> str:
        """A type label from a bounded set: the types this worker has handlers for."""
        if not job_type:
            return "-"
        return job_type if self.core.handler_for(job_type) is not None else "unregistered"

    def _run(self, claim: RunClaim, delivery: Delivery) -> Outcome:
        where = _where(delivery)
        if claim.skip is SkipReason.NOT_DUE:
            assert claim.due_at is not None
            with self.bookkeeping.connection() as conn:
                store.record_deferred(conn, delivery, claim.skip, self.name)
            log.info("not due until %s: deferred", claim.due_at, extra=where)
            return Outcome.DEFERRED
        if claim.skip is SkipReason.UNKNOWN_TYPE:
            return self._unknown_type(delivery, claim, where)
        if claim.skip is SkipReason.RATE_LIMITED:  # back in the table with the claim
            metrics.RATE_LIMITED.labels(metrics.tenant_label(delivery.tenant)).inc()
            log.info(
                "rate limited: back to the scheduler (its next start %s)", claim.due_at, extra=where
            )
            return Outcome.DEFERRED
        if claim.skip is SkipReason.EXPIRED:
            with self.bookkeeping.connection() as conn:
                store.expire(conn, delivery)
        if claim.skip is not None:
            log.info("skipped: %s", claim.skip.value, extra=where)
            return Outcome.SKIPPED
        assert claim.run_at is not None and claim.due_at is not None and claim.db_now is not None
        tenant = metrics.tenant_label(delivery.tenant)
        metrics.LAG.labels(tenant, self._type_label(claim.type)).observe(
            ((claim.started_at or claim.db_now) - claim.due_at).total_seconds()
        )
        ctx = Context(
            delivery,
            claim.type,
            claim.run_at,
            claim.payload,
            self.core,
            _fence_idle=self.config.fence_idle_timeout,
            _interruptions=claim.interruptions,
        )
        handler = self.core.handler_for(claim.type)
        assert handler is not None  # claimed for the types with a handler only
        used = delivery.attempt - claim.interruptions
        if used > handler.retry.max_attempts:  # rescued beyond the policy
            error = f"attempts exhausted ({used - 1} of {handler.retry.max_attempts})"
            return self.completer.close(ctx, Status.FAILED, error=error)
        give_up = time.monotonic() + (handler.timeout + self.config.timeout_grace).total_seconds()
        watched = Watched(delivery, give_up, lambda: self.completer.overrun(ctx, handler, where))
        try:
            with (
                self._given_up(watched),
                self._heartbeat.watching(watched),
                tracing.span("duejobs.handler"),
            ):
                self._invoke(handler, ctx, claim.payload)
        except ScheduleChangedError as exc:
            log.info("changed while running: %s", exc.reason, extra=where)
            return self.completer.stale(ctx, SkipReason(exc.reason))
        except EffectAlreadyAppliedError:
            return self.completer.close(ctx, Status.SUCCEEDED)
        except BaseException as exc:  # a handler's sys.exit(), CancelledError...: its attempt's
            log.warning("attempt failed: %s", describe(exc), extra=where, exc_info=True)
            return self.completer.failed(ctx, handler, exc)
        if ctx._finished:
            return Outcome.SUCCEEDED
        return self.completer.close(ctx, Status.SUCCEEDED)

    def _unknown_type(self, delivery: Delivery, claim: RunClaim, where: dict[str, Any]) -> Outcome:
        """A delivery of a type this worker has no handler for: put back for a worker that
        has one (a rolling deploy, producers updated before workers, a worker serving the
        queue for other types), backing off, without using an attempt — until
        ``unknown_type_grace`` has passed, by the database clock, since a worker first put
        this attempt back (a retry's grace is its own): then it fails for good, naming its
        type (a typo, or a type no worker runs any more)."""
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
        one at its due time; one of
        an unknown type after as long again as it has been put back for that (at least
        ``_UNKNOWN_TYPE_BACKOFF[0]``, at most ``[1]``), so that a worker with its handler,
        started meanwhile, gets it soon, and one that never comes costs a few deliveries an
        hour. The row is due then too (:func:`~duejobs.store.defer_unknown_type`), so the
        reconciler leaves its job there."""
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
                if self.slots is None:  # one slot: the process is ending
                    threading.Event().wait()
                else:
                    self.slots.returned()
                log.warning("a handler given up on returned; its slot works again")


def _where(delivery: Delivery) -> dict[str, Any]:
    """A delivery's fields, for logs and spans."""
    return {
        "schedule_id": str(delivery.schedule_id),
        "version": delivery.version,
        "attempt": delivery.attempt,
        "tenant": delivery.tenant,
    }


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
    delivery itself (:class:`~duejobs.worker.loop.Worker`) and never calls it; a plain RQ
    worker that took the job does, and is told why it cannot run it."""
    raise RuntimeError(
        f"duejobs job for schedule {schedule_id} (v{version}, attempt {attempt}, tenant "
        f"{tenant!r}) taken by a plain RQ worker: run `duejobs worker --app MODULE:APP`"
    )
