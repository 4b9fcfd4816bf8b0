"""The worker: runs a delivery only if the database says it is current and due.

For each delivery (schedule id, version, attempt, tenant — never the payload) the worker:

1. **Claims the row in one statement**: the tenant's row, ``scheduled`` at the delivered
   version, this being the next attempt, and ``due_at`` reached by the **database's** clock →
   ``running`` with an attempt row, a ``started`` event and a lease. The worker's own clock is
   never consulted, so a worker whose clock is ten minutes off behaves like any other.
2. **Otherwise skips, and records why**: missing, cancelled, superseded (another version),
   duplicate (already running or done — RQ can deliver one id twice), expired (later than
   the schedule's ``expires_after``; the schedule is then cancelled). A delivery that arrived
   early waits up to ``max_early_wait`` (measured against the database's answer), or is put
   back into the scheduled registry for ``due_at`` under its own id; no attempt is consumed.
3. **Runs the handler** with ``ctx`` (ids, version, attempt, ``effect_key``, ``run_at``, and
   the payload read from the row now) under the type's timeout, while a heartbeat thread
   extends the lease so the reconciler can tell a slow handler from a dead worker.
4. **Closes the attempt** only if it is still current: ``succeeded``; or, on an exception,
   another attempt after exponential backoff with full jitter (``run_at`` is never touched;
   ``due_at`` and the attempt row carry the retry time), or ``failed`` with ``last_error``
   once attempts are exhausted. An unknown type fails at once, naming the type; rows are
   never deleted. If the schedule changed meanwhile, the attempt is recorded as ``stale``.

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

Knobs (:class:`WorkerConfig`): ``lease`` (20 s), ``heartbeat`` (5 s), ``max_early_wait``
(1 s), ``durable_bookkeeping`` (False: set True to fsync every claim and outcome).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from duejobs import metrics, store
from duejobs.app import App
from duejobs.errors import (
    EffectAlreadyAppliedError,
    HandlerTimeoutError,
    ScheduleChangedError,
)
from duejobs.models import Status
from duejobs.store import SkipReason

log = logging.getLogger("duejobs.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """Worker knobs: the lease a running attempt holds, how often it is renewed, how long an
    early delivery may wait for its time instead of going back to the scheduler, and whether
    the worker's own claim/outcome commits wait for the disk (see the module docstring)."""

    lease: timedelta = timedelta(seconds=20)
    heartbeat: timedelta = timedelta(seconds=5)
    max_early_wait: timedelta = timedelta(seconds=1)
    durable_bookkeeping: bool = False


class Outcome(enum.StrEnum):
    """What handling one delivery came to."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    FAILED = "failed"
    SKIPPED = "skipped"
    DEFERRED = "deferred"
    STALE = "stale"


@dataclass
class Context:
    """What a handler gets besides the payload."""

    schedule_id: uuid.UUID
    tenant: str
    type: str
    version: int
    attempt: int
    run_at: datetime
    payload: Any
    _app: App = field(repr=False)
    _finished: bool = field(default=False, repr=False)

    @property
    def effect_key(self) -> str:
        """``"{type}:{schedule_id}:{version}"``: the same for every attempt of one intent."""
        return f"{self.type}:{self.schedule_id}:{self.version}"

    def ensure_current(self) -> None:
        """Raise :class:`ScheduleChangedError` if the schedule was cancelled, rescheduled or
        rescued since this attempt started. Call it right before an external effect."""
        with self._app.engine.begin() as conn:
            change = store.change_since_claim(conn, self.schedule_id, self.version, self.attempt)
        if change is not None:
            raise ScheduleChangedError(self.schedule_id, change.value)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A transaction fenced on this attempt that records the effect and succeeds it.

        Locks the row and re-checks it (:class:`ScheduleChangedError` if it moved on),
        inserts ``effect_key`` into the ledger (:class:`EffectAlreadyAppliedError` if it is
        there), yields the connection for the handler's own writes, then marks the schedule
        ``succeeded`` in the same commit.
        """
        if self._finished:
            raise RuntimeError("this attempt already committed its effect")
        with self._app.engine.begin() as conn:
            change = store.change_since_claim(
                conn, self.schedule_id, self.version, self.attempt, lock=True
            )
            if change is not None:
                raise ScheduleChangedError(self.schedule_id, change.value)
            if not store.record_effect(
                conn, self.effect_key, self.schedule_id, self.tenant, self.version
            ):
                raise EffectAlreadyAppliedError(f"effect {self.effect_key} was already applied")
            yield conn
            store.finish(
                conn, self.schedule_id, self.version, self.attempt, outcome=Status.SUCCEEDED
            )
        self._finished = True


class _Heartbeat:
    """One thread per worker that renews the lease of the attempt running now."""

    def __init__(self, app: App, config: WorkerConfig) -> None:
        self._app = app
        self._config = config
        self._current: tuple[uuid.UUID, int, int] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duejobs-heartbeat", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watching(self, schedule_id: uuid.UUID, version: int, attempt: int) -> Iterator[None]:
        with self._lock:
            self._current = (schedule_id, version, attempt)
        try:
            yield
        finally:
            with self._lock:
                self._current = None

    def _run(self) -> None:
        while not self._stop.wait(self._config.heartbeat.total_seconds()):
            with self._lock:
                current = self._current
            if current is None:
                continue
            try:
                with self._app.engine.begin() as conn:
                    store.extend_lease(conn, *current, self._config.lease)
            except Exception:  # keep beating; the next beat may reach the database
                log.warning("could not renew the lease of %s", current[0], exc_info=True)

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def _time_limit(limit: timedelta) -> Iterator[None]:
    """Raise :class:`HandlerTimeoutError` in the handler after ``limit`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise HandlerTimeoutError(f"handler ran past its timeout of {limit.total_seconds():g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit.total_seconds())
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


class _Bookkeeping:
    """The worker's own connection for claims and outcomes.

    Kept checked out (no pool round trip per job) and in autocommit: each bookkeeping step
    is one statement, so it commits without BEGIN/COMMIT round trips. A broken connection is
    dropped, the error surfaces (RQ records the job as failed, the row stays for the
    reconciler), and the next job opens a new one.
    """

    def __init__(self, app: App, durable: bool) -> None:
        self._app = app
        self._durable = durable
        self._conn: Connection | None = None

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        if self._conn is None or self._conn.invalidated or self._conn.closed:
            self._conn = self._app.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if not self._durable:
                self._conn.exec_driver_sql("SET synchronous_commit = off")
        try:
            yield self._conn
        except DBAPIError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(DBAPIError):
                self._conn.close()
            self._conn = None


class Runtime:
    """Handles deliveries for one App: the logic of the worker, without RQ around it."""

    def __init__(self, app: App, config: WorkerConfig | None = None, name: str | None = None):
        self.app = app
        self.config = config or WorkerConfig()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._heartbeat = _Heartbeat(app, self.config)
        self._db = _Bookkeeping(app, self.config.durable_bookkeeping)
        # Set by handle() when the delivery came too early: the time to put it back for.
        self.deferred: datetime | None = None

    def close(self) -> None:
        self._heartbeat.stop()
        self._db.close()

    def handle(self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str) -> Outcome:
        """Claim, run and close one delivery; returns what happened."""
        self.deferred = None
        claim = self._claim(schedule_id, version, attempt, tenant)
        outcome = self._run(claim, schedule_id, version, attempt, tenant)
        metrics.DELIVERIES.labels(tenant, claim.type or "-", outcome.value).inc()
        return outcome

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
        if claim.skip is SkipReason.NOT_DUE:
            assert claim.due_at is not None
            with self._db.connection() as conn:
                store.record_deferred(conn, schedule_id, version, attempt)
            self.deferred = claim.due_at
            log.info("not due until %s: deferred", claim.due_at, extra=where)
            return Outcome.DEFERRED
        if claim.skip is SkipReason.EXPIRED:
            with self._db.connection() as conn:
                store.expire(conn, schedule_id, version)
        if claim.skip is not None:
            log.info("skipped: %s", claim.skip.value, extra=where)
            return Outcome.SKIPPED
        assert claim.run_at is not None and claim.due_at is not None and claim.db_now is not None
        metrics.LAG.labels(tenant, claim.type).observe(
            (claim.db_now - claim.due_at).total_seconds()
        )
        ctx = Context(
            schedule_id, tenant, claim.type, version, attempt, claim.run_at, claim.payload, self.app
        )
        handler = self.app.handler_for(claim.type)
        if handler is None:
            error = f"no handler registered for type {claim.type!r}"
            log.error(error, extra=where)
            return self._close(ctx, Status.FAILED, error=error)
        if attempt > handler.retry.max_attempts:  # a rescued attempt beyond the policy
            error = f"attempts exhausted ({attempt - 1} of {handler.retry.max_attempts})"
            return self._close(ctx, Status.FAILED, error=error)
        try:
            with (
                self._heartbeat.watching(schedule_id, version, attempt),
                _time_limit(handler.timeout),
            ):
                handler.func(ctx, claim.payload)
        except ScheduleChangedError as exc:
            log.info("changed while running: %s", exc.reason, extra=where)
            return self._stale(ctx, SkipReason(exc.reason))
        except EffectAlreadyAppliedError:
            return self._close(ctx, Status.SUCCEEDED)
        except Exception as exc:
            log.warning("attempt failed: %s", _describe(exc), extra=where, exc_info=True)
            if attempt < handler.retry.max_attempts:
                wait = handler.retry.delay_before(attempt)
                return self._close(ctx, Status.SCHEDULED, error=_describe(exc), retry_in=wait)
            return self._close(ctx, Status.FAILED, error=_describe(exc))
        if ctx._finished:
            return Outcome.SUCCEEDED
        return self._close(ctx, Status.SUCCEEDED)

    def _claim(
        self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str
    ) -> store.RunClaim:
        """Claim; an early delivery waits for its time when that is close (by the database's
        own reading of how far away it is), then claims again."""
        give_up = time.monotonic() + self.config.max_early_wait.total_seconds()
        while True:
            with self._db.connection() as conn:
                claim = store.claim_run(
                    conn,
                    schedule_id=schedule_id,
                    tenant=tenant,
                    version=version,
                    attempt=attempt,
                    worker=self.name,
                    lease=self.config.lease,
                )
            if claim.skip is not SkipReason.NOT_DUE:
                return claim
            assert claim.due_at is not None and claim.db_now is not None
            remaining = (claim.due_at - claim.db_now).total_seconds()
            if time.monotonic() + remaining > give_up:
                return claim
            time.sleep(remaining)

    def _close(
        self,
        ctx: Context,
        outcome: Status,
        *,
        error: str | None = None,
        retry_in: timedelta | None = None,
    ) -> Outcome:
        with self._db.connection() as conn:
            if store.finish(
                conn,
                ctx.schedule_id,
                ctx.version,
                ctx.attempt,
                outcome=outcome,
                error=error,
                retry_in=retry_in,
            ):
                return {
                    Status.SUCCEEDED: Outcome.SUCCEEDED,
                    Status.SCHEDULED: Outcome.RETRYING,
                    Status.FAILED: Outcome.FAILED,
                }[outcome]
            change = store.change_since_claim(conn, ctx.schedule_id, ctx.version, ctx.attempt)
            store.record_stale(
                conn, ctx.schedule_id, ctx.version, ctx.attempt, change or SkipReason.DUPLICATE
            )
        return Outcome.STALE

    def _stale(self, ctx: Context, reason: SkipReason) -> Outcome:
        with self._db.connection() as conn:
            store.record_stale(conn, ctx.schedule_id, ctx.version, ctx.attempt, reason)
        return Outcome.STALE


_runtime: Runtime | None = None


def perform(schedule_id: str, version: int, attempt: int, tenant: str) -> str:
    """The function every duejobs RQ job names. It runs inside a :class:`DuejobsWorker`."""
    if _runtime is None:
        raise RuntimeError("duejobs jobs run only in `duejobs worker --app MODULE:APP`")
    return _runtime.handle(uuid.UUID(schedule_id), int(version), int(attempt), str(tenant)).value


class DuejobsWorker(SimpleWorker):
    """An RQ SimpleWorker (no fork per job: one pooled database connection serves every job)
    with the JSON serializer. The first SIGTERM/SIGINT finishes the current job, then exits.

    ``queues``: the RQ queues to take jobs from, in priority order (default: the App's queue);
    schedules are routed to a queue by type (``App.handler(queue=)``) or one by one
    (``schedule(queue=)``), so a worker pool per queue keeps a slow type from starving a fast
    one.

    A delivery that came too early is put back into the scheduled registry under its own id,
    once RQ has finished with it (so no other process can push a second job meanwhile).
    """

    def __init__(self, runtime: Runtime, queues: Sequence[str] = (), **kwargs: Any):
        global _runtime
        _runtime = runtime
        connection = Redis.from_url(runtime.app.settings.require_redis())
        queues = list(queues) or [runtime.app.queue]
        super().__init__(queues, connection=connection, serializer=JSONSerializer, **kwargs)
        self._runtime = runtime

    def handle_job_success(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> None:
        super().handle_job_success(job, queue, *args, **kwargs)
        due_at, self._runtime.deferred = self._runtime.deferred, None
        if due_at is not None:
            try:
                self._runtime.app.deliverer().defer(job.id, due_at, job.origin)
            except RedisError:
                log.exception("could not put %s back for %s; the reconciler will", job.id, due_at)
