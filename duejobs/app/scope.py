"""What every part of the App stands on: its Core, the tenant it is scoped to, the rules
that place a write (whose tenant, which queue, which registration) and tidy up after one (a
superseded job left in Redis), and the checks every schedule request passes before anything
is written — its type, tenant, queue, key, payload, time, jitter and expiry, each refusal an
:class:`~duejobs.errors.InvalidScheduleError` naming what is wrong."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from duejobs import store
from duejobs.config import Settings
from duejobs.core import Core
from duejobs.delivery import Deliverer
from duejobs.delivery.wakes import SOON
from duejobs.errors import (
    InvalidScheduleError,
    InvalidScheduleIdError,
    TenantMismatchError,
    UnknownTypeError,
)
from duejobs.handlers import Handler
from duejobs.models import QueueJob, Schedule, ScheduleRequest, Status
from duejobs.timespec import When, as_delay, parse_when
from duejobs.validation import (
    DEFAULT_PRIORITY,
    DEFAULT_TENANT,
    check_key,
    check_priority,
    check_queue,
    check_tenant,
    check_type,
    payload_encoder,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

# How long an App trusts the live quota it read for a tenant (one query saved per schedule()).
QUOTA_CACHE_SECONDS = 10.0

log = logging.getLogger("duejobs")

ScheduleId = uuid.UUID | str


def schedule_id_of(value: object) -> uuid.UUID:
    """A schedule id as a UUID, from a UUID or its text; refused naming the value."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise InvalidScheduleIdError(f"schedule id must be a UUID, got {value!r}") from exc


class Scoped:
    """The App's state and its shared rules; the App's parts (quotas, recurring definitions,
    schedules) are built on it."""

    _core: Core
    _tenant: str | None

    @property
    def core(self) -> Core:
        """What this App shares with its tenant scopes and hands to the services."""
        return self._core

    @property
    def settings(self) -> Settings:
        return self._core.settings

    @property
    def engine(self) -> Engine:
        return self._core.engine

    @property
    def queue(self) -> str:
        """The RQ queue this App's jobs are delivered on."""
        return self._core.queue

    @property
    def scope(self) -> str | None:
        """The tenant this App is limited to, or None for the unscoped App."""
        return self._tenant

    def deliverer(self) -> Deliverer:
        """The delivery side (RQ on Redis) of this App, created on first use."""
        return self._core.deliverer()

    def handler_for(self, job_type: str) -> Handler | None:
        """The registration for ``job_type`` (no copy: the worker asks once per job)."""
        return self._core.handler_for(job_type)

    def _discard_queue_job(self, job: QueueJob | None) -> None:
        """Hand a superseded delivery that may still wait in Redis to the Core's removals
        (:mod:`~duejobs.delivery.removals`: off the caller's path, batched).

        Best effort by design: the worker re-reads the row and skips a stale delivery, so a
        Redis error there is logged, never the caller's — the database change already
        committed. With ``conn=`` nothing is removed, since the caller may still roll back; in
        a host framework's transaction (Django's ``atomic()``) only once it commits. A job left
        on a node its queue has moved away from is the reconciler's orphan removal's to find.
        """
        if job is None or not self.settings.has_redis:
            return
        removals = self._core.removals()
        self._core.after_commit(lambda: removals.add(job))

    def _moved(self, old_job: QueueJob | None, schedule: Schedule, conn: object) -> None:
        """After a schedule moved: the job it superseded to the removals (without ``conn=``),
        and a scheduler woken if it is due soon."""
        if conn is None:
            self._discard_queue_job(old_job)
        self._wake_if_due_soon(schedule, conn)

    def _wake_if_due_soon(self, schedule: Schedule, conn: object) -> None:
        """Wake a scheduler for a schedule due within ``SOON`` of its write
        (:mod:`~duejobs.delivery.wakes`: off the caller's path), once committed: not with
        ``conn=`` (the caller may still roll back; the poll finds it), in a host framework's
        transaction once it commits."""
        if conn is not None or not self.settings.has_redis:
            return
        if schedule.status is not Status.SCHEDULED or schedule.created is False:
            return
        if (schedule.due_at - schedule.updated_at).total_seconds() > SOON:
            return
        wakes = self._core.wakes()
        self._core.after_commit(wakes.wake)

    def _route(self, handler: Handler | None, queue: str | None) -> str:
        """The queue a schedule goes to: the one asked for, else its type's, else the App's."""
        if queue is not None:
            return check_queue(queue)
        return handler.queue if handler and handler.queue else self._core.queue

    def _read_tenant(self, tenant: str | None) -> str | None:
        """The tenant a read is limited to: this App's, else the one named, else none (every
        tenant, for the unscoped App)."""
        if self._tenant is None:
            return None if tenant is None else check_tenant(tenant)
        if tenant is not None and tenant != self._tenant:
            raise TenantMismatchError(
                f"this App is scoped to tenant {self._tenant!r} and cannot read {tenant!r}'s"
            )
        return self._tenant

    def _write_tenant(self, tenant: str | None) -> str:
        if self._tenant is None:
            return check_tenant(tenant if tenant is not None else DEFAULT_TENANT)
        if tenant is not None and tenant != self._tenant:
            raise TenantMismatchError(
                f"this App is scoped to tenant {self._tenant!r} and cannot write for {tenant!r}"
            )
        return self._tenant

    def _live_quota(self, conn: Connection, tenant: str) -> int | None:
        """The tenant's cap on live schedules, checked before a write: read at most every
        :data:`QUOTA_CACHE_SECONDS` (one query saved per schedule())."""
        cached = self._core.quotas.get(tenant)
        if cached is not None and time.monotonic() - cached[0] < QUOTA_CACHE_SECONDS:
            return cached[1]
        cap = store.live_quota(conn, tenant)
        self._core.quotas[tenant] = (time.monotonic(), cap)
        return cap


_NO_JITTER = timedelta(0)


class Placement(NamedTuple):
    """Where a schedule goes: its checked type and tenant, the type's registration, its queue."""

    job_type: str
    tenant: str
    handler: Handler | None
    queue: str


def registration(app: Scoped, job_type: str) -> Handler | None:
    """The handler registered for ``job_type`` in this App, None if there is none; refused
    (:class:`UnknownTypeError`) when the App refuses unknown types."""
    handler = app.handler_for(job_type)
    if handler is None and app.core.refuses_unknown_types():
        known = ", ".join(sorted(app.core.handlers)) or "none"
        raise UnknownTypeError(
            f"no handler for type {job_type!r} in this App (its types: {known}); a producer "
            "that schedules another service's types is made with App(strict_types=False)"
        )
    return handler


def _placement(app: Scoped, request: ScheduleRequest) -> Placement:
    """The request's checked type, tenant, registration and queue."""
    job_type = check_type(request.type)
    tenant = app._write_tenant(request.tenant)
    handler = registration(app, job_type)
    return Placement(job_type, tenant, handler, app._route(handler, request.queue))


class RequestChecks:
    """Every check :meth:`~duejobs.App.schedule` makes, for the requests of one call.

    What repeats across a batch is checked once: each (type, tenant, queue)'s checks and
    registration are kept (a batch has few), and one JSON encoder serves every payload. One
    batch, one thread: a refused request ends the batch (the encoder is then left dirty)."""

    def __init__(self, app: Scoped) -> None:
        self._app = app
        self._seen: dict[tuple[object, object, object], Placement] = {}
        self._encode = payload_encoder(app.core.max_payload_bytes)

    def row(self, request: ScheduleRequest) -> store.NewRow:
        """The row to insert for a request, or the error that names what is wrong with it."""
        if not isinstance(request, ScheduleRequest):
            raise InvalidScheduleError(
                f"expected a duejobs.ScheduleRequest, got {type(request).__name__}"
            )
        where = (request.type, request.tenant, request.queue)
        try:
            placement = self._seen.get(where)
        except TypeError:  # unhashable, so not a str: the checks say what is wrong
            placement = None
        if placement is None:
            placement = _placement(self._app, request)
            if len(self._seen) < 1024:
                self._seen[where] = placement
        job_type, tenant, handler, route = placement
        key = check_key(request.key)
        payload_json = self._encode(request.payload)
        when = parse_when(delay=request.delay, run_at=request.run_at, timezone=request.timezone)
        if request.jitter is None:
            spread = handler.jitter if handler else _NO_JITTER
        else:
            spread = as_delay(request.jitter, "jitter")
        expiry = request.expires_after
        if request.priority is None:
            rank = handler.priority if handler else DEFAULT_PRIORITY
        else:
            rank = check_priority(request.priority)
        return store.NewRow(  # positional: a third cheaper, and this runs once per row
            tenant,
            job_type,
            key,
            payload_json,
            when,
            spread,
            None if expiry is None else as_delay(expiry, "expires_after"),
            handler.retry.max_attempts if handler else None,
            route,
            rank,
        )


def change_of(
    delay: timedelta | float | None,
    run_at: datetime | None,
    timezone: str | None,
    priority: object,
    expected_version: object = None,
) -> tuple[When, int | None]:
    """A reschedule's arguments, checked: its new time, and its new priority (None: kept)."""
    when = parse_when(delay=delay, run_at=run_at, timezone=timezone)
    if expected_version is not None and (
        isinstance(expected_version, bool) or not isinstance(expected_version, int)
    ):
        raise InvalidScheduleError(f"expected_version must be an int, got {expected_version!r}")
    return when, None if priority is None else check_priority(priority)
