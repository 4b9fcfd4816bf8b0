"""``duejobs.App``: what application code uses to write, change and read schedules.

Promises:

* Every write is validated first; a refused call raises a ``ValueError`` subclass from
  :mod:`duejobs.errors` naming the problem, and nothing is written.
* A change and its history event commit together, in the caller's transaction when ``conn=``
  is given (rolled back → nothing exists), otherwise in a transaction of its own.
* Times come from the database clock: ``delay`` is added to PostgreSQL's time, and
  :meth:`App.is_past_deadline` answers with it.
* An App scoped with :meth:`App.tenant` sees and changes only that tenant's rows: another
  tenant's id behaves exactly like an id that does not exist.
* A database outage raises :class:`~duejobs.errors.DatabaseUnavailableError`; the transaction
  is rolled back, so nothing is half-written.

Knobs: ``database_url`` / ``redis_url`` (default: ``DUEJOBS_DATABASE_URL`` /
``DUEJOBS_REDIS_URL``), ``max_payload_bytes`` (default 64 KiB), ``queue`` (the RQ queue,
default ``duejobs``). Cancel and reschedule also remove the superseded job from Redis when it
is still waiting there (best effort; the worker's check is the guarantee).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from redis.exceptions import RedisError
from sqlalchemy import Connection, Engine

from duejobs import metrics, migrate, store
from duejobs.config import Settings
from duejobs.core import Core, make_engine
from duejobs.delivery import DEFAULT_QUEUE, Deliverer
from duejobs.errors import (
    InvalidHandlerError,
    InvalidScheduleError,
    InvalidScheduleIdError,
    QuotaExceededError,
    ScheduleNotFoundError,
    ScheduleNotLiveError,
    TenantMismatchError,
    VersionConflictError,
)
from duejobs.handlers import Handler, RetryPolicy
from duejobs.models import (
    DstGap,
    DstOverlap,
    Event,
    Misfire,
    Recurring,
    RecurringSpec,
    Schedule,
    ScheduleRequest,
)
from duejobs.recurring import Rule, check_cron, plan
from duejobs.timespec import as_delay, parse_when, zone
from duejobs.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_TENANT,
    check_key,
    check_queue,
    check_tenant,
    check_text,
    check_type,
    encode_payload,
    payload_encoder,
)

log = logging.getLogger("duejobs")
# How long an App trusts the quota it read for a tenant (one query saved per schedule()).
QUOTA_CACHE_SECONDS = 10.0
F = TypeVar("F", bound=Callable[..., Any])


class Unset(enum.Enum):
    """Marks an argument that was not given (``None`` has a meaning of its own)."""

    UNSET = "unset"


UNSET = Unset.UNSET
ScheduleId = uuid.UUID | str


def _schedule_id(value: object) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise InvalidScheduleIdError(f"schedule id must be a UUID, got {value!r}") from exc


E = TypeVar("E", DstGap, DstOverlap, Misfire)


def _choice(kind: type[E], value: object, name: str) -> E:
    try:
        return kind(str(value))
    except ValueError as exc:
        choices = ", ".join(repr(k.value) for k in kind)
        raise InvalidScheduleError(f"{name} must be one of {choices}, got {value!r}") from exc


_NO_JITTER = timedelta(0)


# What update_recurring may change: every field of a definition but its identity.
_UPDATABLE = frozenset(
    ("cron", "type", "payload", "timezone", "dst_gap", "dst_overlap", "misfire", "grace", "queue")
)


class _Placement(NamedTuple):
    """Where a schedule goes: its checked type and tenant, the type's registration, its queue."""

    job_type: str
    tenant: str
    handler: Handler | None
    queue: str


class App:
    """The entry point: ``App()`` reads the URLs from the environment."""

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        queue: str = DEFAULT_QUEUE,
    ) -> None:
        settings = Settings.from_env(database_url, redis_url)
        engine = make_engine(settings.database_url)
        self._core = Core(settings, engine, max_payload_bytes, check_queue(queue))
        self._tenant: str | None = None

    @classmethod
    def _scoped(cls, core: Core, tenant: str) -> App:
        app = cls.__new__(cls)
        app._core = core
        app._tenant = tenant
        return app

    # -- configuration -----------------------------------------------------------------

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

    def deliverer(self) -> Deliverer:
        """The delivery side (RQ on Redis) of this App, created on first use."""
        return self._core.deliverer()

    @property
    def scope(self) -> str | None:
        """The tenant this App is limited to, or None for the unscoped App."""
        return self._tenant

    def tenant(self, name: str) -> App:
        """An App that sees and changes only ``name``'s schedules (shares engine, handlers)."""
        return App._scoped(self._core, check_tenant(name))

    def migrate(self) -> tuple[str | None, str | None]:
        """Create or upgrade the schema; returns (revision before, revision after)."""
        with self._core.database():
            return migrate.upgrade(self.engine)

    def close(self) -> None:
        """Close pooled database and Redis connections."""
        self._core.close()

    # -- handlers ----------------------------------------------------------------------

    def handler(
        self,
        job_type: str,
        *,
        max_attempts: int = 5,
        backoff: timedelta | float = timedelta(seconds=1),
        backoff_cap: timedelta | float = timedelta(minutes=10),
        timeout: timedelta | float = timedelta(minutes=5),
        jitter: timedelta | float = timedelta(0),
        queue: str | None = None,
    ) -> Callable[[F], F]:
        """Register the function that runs schedules of ``job_type`` in workers.

        ``jitter``: the default spread for this type's schedules written through this App
        (see :meth:`schedule`); leave it at zero for types whose time must be exact.
        ``queue``: the RQ queue this type's schedules are delivered on (default: the App's),
        so that a pool of workers (``duejobs worker --queue``) serves it apart from the
        others — a slow type then cannot hold up a fast one. Durations: a ``timedelta`` or
        seconds.
        """
        route = None if queue is None else check_queue(queue)
        spread = as_delay(jitter, "jitter")
        policy = RetryPolicy(
            max_attempts=max_attempts,
            backoff=as_delay(backoff, "backoff"),
            backoff_cap=as_delay(backoff_cap, "backoff_cap"),
        )
        job_type = check_type(job_type)
        limit = as_delay(timeout, "timeout")
        if limit <= timedelta(0):
            raise InvalidHandlerError(f"timeout must be positive, got {limit}")

        def register(func: F) -> F:
            self._core.handlers[job_type] = Handler(job_type, func, policy, limit, spread, route)
            return func

        return register

    def handler_for(self, job_type: str) -> Handler | None:
        """The registration for ``job_type`` (no copy: the worker asks once per job)."""
        return self._core.handler_for(job_type)

    # -- writing -----------------------------------------------------------------------

    def schedule(
        self,
        job_type: str,
        payload: Any,
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        timezone: str | None = None,
        key: str | None = None,
        tenant: str | None = None,
        jitter: timedelta | float | None = None,
        expires_after: timedelta | float | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
    ) -> Schedule:
        """Persist the intent to run ``job_type`` with ``payload`` at a time.

        ``key``: while a schedule with that key is live (scheduled or running) for the tenant,
        scheduling it again returns that schedule unchanged.

        ``jitter`` (default: the type's, from :meth:`handler`, else none): spreads the start
        over ``[run_at, run_at + jitter)`` — never before the intended instant — at a point
        fixed by the schedule's id, so a re-push, a reconcile or a reschedule never moves it.
        ``run_at`` keeps the intended instant; ``due_at`` is the effective one. For peaks
        (thousands of reminders at 09:00) whose exact second does not matter.

        ``expires_after``: a delivery that would start later than this after its due time is
        skipped and the schedule cancelled, recorded as expired (a reminder three days late
        may be better not sent). By default a late schedule runs anyway.

        ``queue``: the RQ queue to deliver it on (default: its type's, else the App's) — to
        route by tenant, say.
        """
        new = _Checks(self).row(
            ScheduleRequest(
                job_type,
                payload,
                delay,
                run_at,
                timezone,
                key,
                tenant,
                jitter,
                expires_after,
                queue,
            )
        )
        with self._core.transaction(conn) as c:
            cap = self._live_quota(c, new.tenant)
            if cap is not None and store.count_live_up_to(c, new.tenant, cap) >= cap:
                existing = store.live_by_key(c, new.tenant, new.key) if new.key else None
                if existing is not None:
                    return existing
                metrics.QUOTA_REFUSALS.labels(metrics.tenant_label(new.tenant)).inc()
                raise QuotaExceededError(new.tenant, cap)
            schedule, _created = store.insert_schedule(c, new)
        return schedule

    def schedule_many(
        self, requests: Iterable[ScheduleRequest], *, conn: Connection | None = None
    ) -> list[uuid.UUID]:
        """Persist many schedules at once (COPY); their ids, in order.

        Each :class:`~duejobs.ScheduleRequest` means what the same arguments mean to
        :meth:`schedule`, including keys (a live key's holder's id is returned) and jitter.
        All or nothing: a bad request raises its error, prefixed with its position, and
        nothing is written; so does a batch that would take a tenant over its live quota.
        ``conn=`` joins your transaction (under a savepoint: a refused batch leaves it usable).
        """
        requests = list(requests)
        if not requests:
            return []
        tenants: Counter[str] = Counter()
        with self._core.transaction(conn) as c:
            scope = c.begin_nested() if conn is not None else contextlib.nullcontext()
            with scope:
                ids = store.insert_schedules(c, self._new_rows(requests, tenants))
                for tenant, wanted in sorted(tenants.items()):  # one lock order for all
                    cap = self._live_quota(c, tenant)
                    if cap is not None and store.count_live_up_to(c, tenant, cap + 1) > cap:
                        metrics.QUOTA_REFUSALS.labels(metrics.tenant_label(tenant)).inc(wanted)
                        raise QuotaExceededError(tenant, cap)
        return ids

    def _new_rows(
        self, requests: Iterable[ScheduleRequest], tenants: Counter[str]
    ) -> Iterator[store.NewRow]:
        """Validate requests one by one while COPY takes in the ones before (an error names
        the request's position and aborts the batch); counts each tenant's rows."""
        checks = _Checks(self)
        for position, request in enumerate(requests):
            try:
                row = checks.row(request)
            except InvalidScheduleError as exc:
                raise type(exc)(f"request {position}: {exc}") from exc
            tenants[row.tenant] += 1
            yield row

    def _placement(self, request: ScheduleRequest) -> _Placement:
        """The request's checked type, tenant, registration and queue."""
        job_type = check_type(request.type)
        tenant = self._write_tenant(request.tenant)
        handler = self.handler_for(job_type)
        return _Placement(job_type, tenant, handler, self._route(handler, request.queue))

    def reschedule(
        self,
        schedule_id: ScheduleId,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        expected_version: int | None = None,
        conn: Connection | None = None,
    ) -> Schedule:
        """Move a live schedule to a new time; returns it at version + 1.

        The delivery of the old version becomes stale: a worker that receives it skips it.
        """
        sid = _schedule_id(schedule_id)
        when = parse_when(delay=delay, run_at=run_at, timezone=timezone)
        if expected_version is not None and (
            isinstance(expected_version, bool) or not isinstance(expected_version, int)
        ):
            raise InvalidScheduleError(f"expected_version must be an int, got {expected_version!r}")
        with self._core.transaction(conn) as c:
            schedule, old_job = store.reschedule(c, sid, self._tenant, when, expected_version)
            if schedule is None:
                self._explain_refusal(c, sid, expected_version)
        assert schedule is not None
        if conn is None:
            self._discard_queue_job(old_job)
        return schedule

    def cancel(self, schedule_id: ScheduleId, *, conn: Connection | None = None) -> bool:
        """Cancel a schedule: True when it was scheduled or running, False otherwise.

        A running handler finds out through ``ctx.ensure_current()`` before its effect.
        """
        sid = _schedule_id(schedule_id)
        with self._core.transaction(conn) as c:
            cancelled, job = store.cancel(c, sid, self._tenant)
        if conn is None:
            self._discard_queue_job(job)
        return cancelled

    # -- quotas --------------------------------------------------------------------------

    def set_quota(
        self,
        tenant: str,
        *,
        max_live: int | Unset | None = UNSET,
        max_inflight: int | Unset | None = UNSET,
    ) -> None:
        """Set a tenant's caps; only the caps given change, ``None`` clears one.

        * ``max_live``: live (scheduled or running) schedules. A :meth:`schedule` beyond it
          raises :class:`~duejobs.errors.QuotaExceededError` and writes nothing.
        * ``max_inflight``: jobs pushed to Redis or running at once. The scheduler pushes
          such a tenant's rows only when due and only while it has room: the rest wait in
          the table, so a tenant's burst never sits in the queue ahead of other tenants.

        Tenant ``"*"`` holds the defaults; a tenant's cleared cap follows the default.
        Other processes apply a ``max_live`` change within ``QUOTA_CACHE_SECONDS``; the
        scheduler reads ``max_inflight`` on every claim.
        """
        if self._tenant is not None:
            raise TenantMismatchError("quotas are set through an unscoped App")
        if tenant != store.DEFAULT_QUOTA_TENANT:
            check_tenant(tenant)
        caps = {
            name: value
            for name, value in (("max_live", max_live), ("max_inflight", max_inflight))
            if not isinstance(value, Unset)
        }
        if not caps:
            raise InvalidScheduleError("set_quota needs max_live= or max_inflight=")
        for name, value in caps.items():
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidScheduleError(f"{name} must be an int >= 0 or None, got {value!r}")
        with self._core.transaction(None) as c:
            store.set_quota(c, tenant, caps)
        self._core.quotas.clear()

    def quotas(self) -> list[store.Quota]:
        """Every stored quota: the default (tenant ``"*"``) first, then per-tenant ones."""
        if self._tenant is not None:
            raise TenantMismatchError("quotas are read through an unscoped App")
        with self.engine.connect() as c:
            return store.quotas(c)

    def _live_quota(self, conn: Connection, tenant: str) -> int | None:
        cached = self._core.quotas.get(tenant)
        if cached is not None and time.monotonic() - cached[0] < QUOTA_CACHE_SECONDS:
            return cached[1]
        cap = store.live_quota(conn, tenant)
        self._core.quotas[tenant] = (time.monotonic(), cap)
        return cap

    # -- recurring schedules -----------------------------------------------------------

    def recurring(
        self,
        name: str,
        *,
        cron: str,
        type: str,
        payload: Any = None,
        timezone: str = "UTC",
        tenant: str | None = None,
        dst_gap: DstGap | str = DstGap.SHIFT,
        dst_overlap: DstOverlap | str = DstOverlap.ONCE,
        misfire: Misfire | str = Misfire.LATEST,
        grace: timedelta | float = timedelta(0),
        queue: str | None = None,
    ) -> Recurring:
        """Create (or replace) the recurring schedule ``name`` of the tenant.

        Occurrences become ordinary schedules shortly before they are due (see
        :mod:`duejobs.recurring` for the DST and misfire policies). Calling it again with the
        same definition changes nothing; with another one it bumps the version and cancels
        the occurrences not yet run. ``queue``: as for :meth:`schedule` (default: the type's,
        else the App's).
        """
        spec = self._recurring_spec(
            name,
            tenant=self._write_tenant(tenant),
            cron=cron,
            type=type,
            payload=payload,
            timezone=timezone,
            dst_gap=dst_gap,
            dst_overlap=dst_overlap,
            misfire=misfire,
            grace=grace,
            queue=queue,
        )
        with self._core.transaction(None) as c:
            current = store.get_recurring(c, spec.tenant, name, lock=True)
            saved, jobs = self._save_recurring(c, spec, current is not None)
        for job in jobs:
            self._discard_queue_job(job)
        return saved

    def _recurring_spec(
        self,
        name: str,
        *,
        tenant: str,
        cron: str,
        type: str,
        payload: Any,
        timezone: str,
        dst_gap: DstGap | str,
        dst_overlap: DstOverlap | str,
        misfire: Misfire | str,
        grace: timedelta | float,
        queue: str | None,
    ) -> RecurringSpec:
        """A definition checked field by field (the error names the field)."""
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidScheduleError(f"recurring name must be 1-200 characters, got {name!r}")
        check_text(name, "recurring name")
        return RecurringSpec(
            tenant=tenant,
            name=name,
            type=check_type(type),
            payload_json=encode_payload(
                payload if payload is not None else {}, self._core.max_payload_bytes
            ),
            cron=check_cron(cron),
            timezone=str(zone(timezone)),
            dst_gap=_choice(DstGap, dst_gap, "dst_gap"),
            dst_overlap=_choice(DstOverlap, dst_overlap, "dst_overlap"),
            misfire=_choice(Misfire, misfire, "misfire"),
            grace=as_delay(grace, "grace"),
            queue=self._route(self.handler_for(type), queue),
        )

    @staticmethod
    def _save_recurring(
        c: Connection, spec: RecurringSpec, existed: bool
    ) -> tuple[Recurring, list[str]]:
        """Write ``spec`` (the caller holds the definition's lock); the stored definition and
        the queue jobs of the occurrences it superseded."""
        rule = Rule(spec.cron, spec.timezone, spec.dst_gap, spec.dst_overlap)
        saved = store.save_recurring(c, spec, plan(rule, store.database_now(c)))
        if saved is None:  # exactly the active definition already stored (perhaps by a
            # concurrent call that created it after this one looked)
            stored = store.get_recurring(c, spec.tenant, spec.name)
            assert stored is not None
            return stored, []
        replaced = existed or saved.version > 1
        return saved, store.cancel_occurrences(c, saved.id, "superseded") if replaced else []

    def get_recurring(self, name: str, *, tenant: str | None = None) -> Recurring | None:
        """The recurring schedule ``name`` (of this App's tenant, or ``tenant``)."""
        with self._core.transaction(None) as c:
            return store.get_recurring(c, self._write_tenant(tenant), name)

    def update_recurring(
        self, name: str, *, tenant: str | None = None, **changes: Any
    ) -> Recurring:
        """Change some of a recurring schedule's fields (version + 1 if anything changed).

        Read, merged and written in one transaction under the definition's row lock, so two
        updates at once each keep the other's change."""
        unknown = set(changes) - _UPDATABLE
        if unknown:
            raise InvalidScheduleError(f"cannot update {sorted(unknown)} of a recurring schedule")
        with self._core.transaction(None) as c:
            current = store.get_recurring(c, self._write_tenant(tenant), name, lock=True)
            if current is None:
                raise ScheduleNotFoundError(f"no recurring schedule {name!r}")
            fields = {f: getattr(current, f) for f in _UPDATABLE}
            spec = self._recurring_spec(name, tenant=current.tenant, **{**fields, **changes})
            saved, jobs = self._save_recurring(c, spec, True)
        for job in jobs:
            self._discard_queue_job(job)
        return saved

    def pause_recurring(self, name: str, *, tenant: str | None = None) -> Recurring:
        """Stop materializing occurrences; those not yet run are cancelled."""
        return self._set_recurring(name, tenant, "paused")

    def resume_recurring(self, name: str, *, tenant: str | None = None) -> Recurring:
        """Start again from the next occurrence after now."""
        return self._set_recurring(name, tenant, "active")

    def delete_recurring(self, name: str, *, tenant: str | None = None) -> bool:
        """Delete the definition and cancel its occurrences not yet run (history stays)."""
        with self._core.transaction(None) as c:
            current = store.get_recurring(c, self._write_tenant(tenant), name, lock=True)
            if current is None:
                return False
            jobs = store.cancel_occurrences(c, current.id, "recurring schedule deleted")
            store.delete_recurring(c, current.id)
        for job in jobs:
            self._discard_queue_job(job)
        return True

    def _set_recurring(self, name: str, tenant: str | None, status: str) -> Recurring:
        with self._core.transaction(None) as c:
            current = store.get_recurring(c, self._write_tenant(tenant), name, lock=True)
            if current is None:
                raise ScheduleNotFoundError(f"no recurring schedule {name!r}")
            jobs: list[str] = []
            restart = None
            if status == "paused":
                jobs = store.cancel_occurrences(c, current.id, "recurring schedule paused")
            elif current.status != "active":
                restart = plan(Rule.of(current), store.database_now(c))
            updated = store.set_recurring_status(c, current.id, status, restart)
        for job in jobs:
            self._discard_queue_job(job)
        return updated

    # -- reading -----------------------------------------------------------------------

    def get(self, schedule_id: ScheduleId, *, conn: Connection | None = None) -> Schedule | None:
        """The schedule as stored now, or None (also for another tenant's id)."""
        sid = _schedule_id(schedule_id)
        with self._core.transaction(conn) as c:
            return store.get_schedule(c, sid, self._tenant)

    def history(self, schedule_id: ScheduleId, *, conn: Connection | None = None) -> list[Event]:
        """The schedule's events, oldest first."""
        sid = _schedule_id(schedule_id)
        with self._core.transaction(conn) as c:
            return store.history(c, sid, self._tenant)

    def is_past_deadline(self, schedule_id: ScheduleId, *, conn: Connection | None = None) -> bool:
        """Whether the database clock has reached the schedule's ``run_at``.

        For endpoints that must enforce a deadline themselves (an auction close, a
        reservation expiry) instead of trusting that a job ran on time.
        """
        sid = _schedule_id(schedule_id)
        with self._core.transaction(conn) as c:
            past = store.is_past_run_at(c, sid, self._tenant)
        if past is None:
            raise ScheduleNotFoundError(f"no schedule {sid}")
        return past

    def now(self) -> datetime:
        """The database's current time (UTC)."""
        with self._core.transaction(None) as c:
            return store.database_now(c)

    # -- internals ---------------------------------------------------------------------

    def _discard_queue_job(self, queue_job_id: str | None) -> None:
        """Remove a superseded delivery that is still waiting in Redis.

        Best effort by design: the worker re-reads the row and skips a stale delivery, so a
        Redis error here is logged, not raised — the database change already committed. With
        ``conn=`` nothing is removed, since the caller may still roll back.
        """
        if queue_job_id is None or not self.settings.redis_url:
            return
        try:
            self.deliverer().remove(queue_job_id)
        except RedisError as exc:
            log.warning("could not remove stale queue job %s: %s", queue_job_id, exc)

    def _route(self, handler: Handler | None, queue: str | None) -> str:
        """The queue a schedule goes to: the one asked for, else its type's, else the App's."""
        if queue is not None:
            return check_queue(queue)
        return handler.queue if handler and handler.queue else self._core.queue

    def _write_tenant(self, tenant: str | None) -> str:
        if self._tenant is None:
            return check_tenant(tenant if tenant is not None else DEFAULT_TENANT)
        if tenant is not None and tenant != self._tenant:
            raise TenantMismatchError(
                f"this App is scoped to tenant {self._tenant!r} and cannot write for {tenant!r}"
            )
        return self._tenant

    def _explain_refusal(
        self, conn: Connection, sid: uuid.UUID, expected_version: int | None
    ) -> None:
        current = store.get_schedule(conn, sid, self._tenant)
        if current is None:
            raise ScheduleNotFoundError(f"no schedule {sid}")
        if not current.status.is_live:
            raise ScheduleNotLiveError(
                f"schedule {sid} is {current.status.value}; only scheduled or running ones move"
            )
        assert expected_version is not None
        raise VersionConflictError(sid, expected_version, current.version)


class _Checks:
    """Every check :meth:`App.schedule` makes, for the requests of one call.

    What repeats across a batch is checked once: each (type, tenant, queue)'s checks and
    registration are kept (a batch has few), and one JSON encoder serves every payload. One
    batch, one thread: a refused request ends the batch (the encoder is then left dirty)."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._seen: dict[tuple[object, object, object], _Placement] = {}
        self._encode = payload_encoder(app._core.max_payload_bytes)

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
            placement = self._app._placement(request)
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
        )
