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

Knobs: :class:`App`'s own docstring. Cancel and reschedule also remove the superseded job
from Redis when it is still waiting there (best effort; the worker's check is the guarantee).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from redis import Redis
from redis.cluster import RedisCluster

from duejobs import store
from duejobs.app.quotas import UNSET, QuotaAPI, Unset
from duejobs.app.reads import ReadAPI
from duejobs.app.recurring import RecurringAPI
from duejobs.app.scope import RequestChecks, ScheduleId, change_of, schedule_id_of
from duejobs.app.tasks import TaskAPI
from duejobs.config import Settings
from duejobs.core import DEFAULT_READ_TIMEOUT, Conn, Core, check_strict_types, make_engine
from duejobs.delivery import DEFAULT_QUEUE
from duejobs.errors import (
    InvalidHandlerError,
    InvalidKeyError,
    InvalidScheduleError,
    KeyInUseError,
    QuotaExceededError,
    ScheduleNotFoundError,
    ScheduleNotLiveError,
    ScheduleNotRetryableError,
    VersionConflictError,
)
from duejobs.handlers import Handler, RetryPolicy, exception_classes
from duejobs.models import Schedule, ScheduleRequest
from duejobs.observability import metrics, replica, tracing
from duejobs.store.partitions import Partitioning
from duejobs.timespec import as_delay, parse_when
from duejobs.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_PRIORITY,
    check_key,
    check_priority,
    check_queue,
    check_tenant,
    check_type,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

__all__ = ["UNSET", "App", "ScheduleId", "Unset", "make_engine"]

log = logging.getLogger("duejobs")
F = TypeVar("F", bound=Callable[..., Any])


def _required_key(value: object) -> str:
    key = check_key(value)
    if key is None:
        raise InvalidKeyError("a key is required to find a schedule by key, got None")
    return key


class App(ReadAPI, RecurringAPI, QuotaAPI, TaskAPI):
    """The entry point: ``App()`` reads the URLs from the environment (``DUEJOBS_DATABASE_URL``,
    ``DUEJOBS_REDIS_URL``: a server, Sentinel or a cluster, :mod:`duejobs.redis_urls`).

    Beyond the two URLs: ``schema`` (of duejobs' tables), ``queue`` (the default RQ queue),
    ``max_payload_bytes``, ``trace_runs`` (:mod:`duejobs.observability.tracing`);
    ``read_database_url`` and ``read_max_lag``, a replica for the operators' reads
    (:mod:`duejobs.observability.replica`); ``read_timeout``, how long one statement of an
    operator's read (a list, the figures) may run before it is stopped with
    :class:`~duejobs.errors.ReadTimeoutError` (default 10 s, None: unbounded); ``redis_nodes``,
    queue → Redis URL for queues that live on a Redis of their own (``DUEJOBS_REDIS_NODES``; every
    other queue lives on ``redis_url``); ``strict_types``, whether scheduling a type with no handler
    registered in this App is refused (:class:`~duejobs.errors.UnknownTypeError`, a typo caught
    before it is written): by default when the App has handlers; False for a producer that schedules
    the types of another service's workers; ``prepared_statements``
    (``DUEJOBS_PREPARED_STATEMENTS``), ``"auto"`` (the default: kept on a connection to PostgreSQL
    itself, off through a connection pooler), ``"on"`` or ``"off"``
    (:class:`~duejobs.config.PreparedStatements`); ``redis``, a ready ``redis.Redis`` client instead
    of ``redis_url`` (``Sentinel(...).master_for("mymaster")``, a ``RedisCluster``, a client with
    TLS or options of one's own): the App's queues use it, and so do the workers made from the App.
    An ``AsyncApp`` built on the App uses it too. Give it a ``socket_timeout`` (a call to a Redis
    that hangs waits that long) and no ``decode_responses``. ``result_ttl`` (``DUEJOBS_RESULT_TTL``,
    500 s): how long a finished or failed job stays in Redis, in whole seconds (an int or a
    timedelta)."""

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        queue: str = DEFAULT_QUEUE,
        schema: str | None = None,
        trace_runs: str = tracing.LINK,
        read_database_url: str | None = None,
        read_max_lag: timedelta = replica.DEFAULT_MAX_LAG,
        read_timeout: timedelta | None = DEFAULT_READ_TIMEOUT,
        redis_nodes: Mapping[str, str] | None = None,
        strict_types: bool | None = None,
        prepared_statements: str | None = None,
        redis: Redis | RedisCluster | None = None,
        result_ttl: int | timedelta | None = None,
    ) -> None:
        settings = Settings.from_env(
            database_url,
            redis_url,
            schema,
            read_database_url,
            redis_nodes,
            prepared_statements,
            redis_client=redis,
            result_ttl=result_ttl,
        )
        self._core = Core.build(
            settings,
            max_payload_bytes=max_payload_bytes,
            queue=queue,
            trace_runs=trace_runs,
            read_max_lag=read_max_lag,
            read_timeout=read_timeout,
        )
        self._core.strict_types = check_strict_types("strict_types", strict_types)
        self._tenant: str | None = None

    @classmethod
    def _scoped(cls, core: Core, tenant: str) -> App:
        app = cls.__new__(cls)
        app._core = core
        app._tenant = tenant
        return app

    # -- configuration -----------------------------------------------------------------

    def tenant(self, name: str) -> App:
        """An App that sees and changes only ``name``'s schedules (shares engine, handlers)."""
        return App._scoped(self._core, check_tenant(name))

    def migrate(self, *, partitioned: Partitioning | None = None) -> tuple[str | None, str | None]:
        """Create or upgrade the schema; returns (revision before, revision after). With
        ``partitioned`` (a :class:`~duejobs.services.partition_maintenance.Partitioning`),
        partitioned mode (:mod:`duejobs.services.partition_maintenance`): made at once on empty
        tables, and on filled ones by :func:`~duejobs.services.partition_maintenance.convert`,
        online — which takes as long as copying the tables takes."""
        # Alembic and the conversion, loaded only by the schema's changes
        from duejobs.services import partition_maintenance
        from duejobs.store.migrate import upgrade

        with self._core.database():
            revisions = upgrade(self.engine, partitioned=partitioned)
            if partitioned is not None:
                partition_maintenance.convert(self.engine, partitioned)
            return revisions

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
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        never_retry: type[BaseException] | tuple[type[BaseException], ...] = (),
        priority: int = DEFAULT_PRIORITY,
    ) -> Callable[[F], F]:
        """Register the function that runs schedules of ``job_type`` in workers.

        ``retry_on``: only these exception classes are retried (default: every one);
        ``never_retry``: these fail the schedule at once, as :class:`~duejobs.errors.Permanent`
        raised by the handler does (see :mod:`duejobs.handlers`).

        ``jitter``: the default spread for this type's schedules written through this App
        (see :meth:`schedule`); leave it at zero for types whose time must be exact.
        ``queue``: the RQ queue this type's schedules are delivered on (default: the App's),
        so that a pool of workers (``duejobs worker --queue``) serves it apart from the
        others — a slow type then cannot hold up a fast one. ``priority``: this type's
        schedules' (see :meth:`schedule`), unless a call gives its own. Durations: a
        ``timedelta`` or seconds.
        """
        route = None if queue is None else check_queue(queue)
        rank = check_priority(priority)
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

        retried = None if retry_on is None else exception_classes("retry_on", retry_on)
        refused = exception_classes("never_retry", never_retry)

        def register(func: F) -> F:
            self._core.handlers[job_type] = Handler(
                job_type, func, policy, limit, spread, route, retried, refused, rank
            )
            return func

        return register

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
        priority: int | None = None,
        conn: Conn | None = None,
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

        ``priority`` (-100 to 100; default: its type's, else 0): higher runs first among its
        queue's due work, within its tenant's share, starving none (docs/usage.md).
        """
        new = RequestChecks(self).row(
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
                priority,
            )
        )
        with tracing.span("duejobs.schedule", type=new.job_type, tenant=new.tenant) as span:
            new.trace_context = tracing.recorded(self._core.trace_runs)
            schedule = self._insert(new, conn)
            if span is not None:
                span.set_attributes(tracing.attributes(schedule_id=str(schedule.id)))
        self._wake_if_due_soon(schedule, conn)
        return schedule

    def _insert(self, new: store.NewRow, conn: Conn | None) -> Schedule:
        """One checked schedule, within its tenant's live quota (none: one round trip)."""
        with self._core.statement(conn) as c:
            if store.inserts_in_one_statement(c, new) and self._live_quota(c, new.tenant) is None:
                return store.insert_schedule(c, new)[0]
        with self._core.transaction(conn) as c:
            cap = self._live_quota(c, new.tenant)
            if cap is not None and store.count_live_up_to(c, new.tenant, cap) >= cap:
                existing = store.live_by_key(c, new.tenant, new.key) if new.key else None
                if existing is not None:
                    return dataclasses.replace(existing, created=False)
                metrics.QUOTA_REFUSALS.labels(metrics.tenant_label(new.tenant)).inc()
                raise QuotaExceededError(new.tenant, cap)
            schedule, _created = store.insert_schedule(c, new)
        return schedule

    def schedule_many(
        self, requests: Iterable[ScheduleRequest], *, conn: Conn | None = None
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
        checks = RequestChecks(self)
        for position, request in enumerate(requests):
            try:
                row = checks.row(request)
            except InvalidScheduleError as exc:
                raise type(exc)(f"request {position}: {exc}") from exc
            tenants[row.tenant] += 1
            yield row

    def reschedule(
        self,
        schedule_id: ScheduleId,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        expected_version: int | None = None,
        priority: int | None = None,
        conn: Conn | None = None,
    ) -> Schedule:
        """Move a live schedule to a new time (and ``priority``); returns it at version + 1,
        ``was_running`` True if the old version was running: its handler goes on unless it
        calls ``ctx.ensure_current()``, and the schedule runs again at its new time."""
        sid = schedule_id_of(schedule_id)
        when, rank = change_of(delay, run_at, timezone, priority, expected_version)
        with self._core.statement(conn) as c:
            schedule, old_job = store.reschedule(c, sid, self._tenant, when, expected_version, rank)
            if schedule is None:
                self._explain_refusal(c, sid, expected_version)
        assert schedule is not None
        self._moved(old_job, schedule, conn)
        return schedule

    def cancel(self, schedule_id: ScheduleId, *, conn: Conn | None = None) -> bool:
        """Cancel a schedule: True when it was scheduled or running, False otherwise.

        A running handler finds out through ``ctx.ensure_current()`` before its effect.
        """
        sid = schedule_id_of(schedule_id)
        with self._core.statement(conn) as c:
            cancelled, job = store.cancel(c, sid, self._tenant)
        if conn is None:
            self._discard_queue_job(job)
        return cancelled

    def retry(
        self,
        schedule_id: ScheduleId,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        conn: Conn | None = None,
    ) -> Schedule:
        """Schedule a ``failed`` or ``cancelled`` schedule again: version + 1, its attempts
        from zero, due now (or at ``run_at`` / after ``delay``), recorded in its history as a
        ``rescheduled`` event marked ``retry``. Any other status is
        :class:`~duejobs.errors.ScheduleNotRetryableError`; a key another live schedule
        holds meanwhile, :class:`~duejobs.errors.KeyInUseError`."""
        sid = schedule_id_of(schedule_id)
        if run_at is None and delay is None:
            delay = 0
        when = parse_when(delay=delay, run_at=run_at, timezone=timezone)
        with self._core.transaction(conn) as c:
            current = store.get_schedule(c, sid, self._tenant)
            if current is None:
                raise ScheduleNotFoundError(f"no schedule {sid}")
            holder = store.live_by_key(c, current.tenant, current.key) if current.key else None
            if holder is not None and holder.id != sid:
                raise KeyInUseError(
                    f"schedule {sid}'s key {current.key!r} is held by live schedule "
                    f"{holder.id}: cancel that one first"
                )
            retried = store.retry(c, sid, self._tenant, when)
            if retried is None:
                raise ScheduleNotRetryableError(
                    f"schedule {sid} is {current.status.value}; only failed or cancelled "
                    "ones are retried"
                )
        self._wake_if_due_soon(retried, conn)
        return retried

    def run_now(
        self,
        schedule_id: ScheduleId,
        *,
        expected_version: int | None = None,
        conn: Conn | None = None,
    ) -> Schedule:
        """:meth:`reschedule` with no delay: due now, pushed by the next scheduler pass."""
        return self.reschedule(schedule_id, delay=0, expected_version=expected_version, conn=conn)

    # -- by key ------------------------------------------------------------------------

    def get_by_key(
        self, key: str, *, tenant: str | None = None, conn: Conn | None = None
    ) -> Schedule | None:
        """The live (scheduled or running) schedule holding ``key`` for the tenant (this
        App's, else ``tenant``, else the default), or None. Keys are unique among live
        schedules only: finished ones are found by id."""
        owner, key = self._write_tenant(tenant), _required_key(key)
        with self._core.transaction(conn) as c:
            return store.live_by_key(c, owner, key)

    def cancel_by_key(
        self, key: str, *, tenant: str | None = None, conn: Conn | None = None
    ) -> bool:
        """:meth:`cancel` the live schedule holding ``key``; False when none does."""
        owner, key = self._write_tenant(tenant), _required_key(key)
        with self._core.transaction(conn) as c:
            holder = store.live_by_key(c, owner, key)
            if holder is None:
                return False
            cancelled, job = store.cancel(c, holder.id, self._tenant)
        if conn is None:
            self._discard_queue_job(job)
        return cancelled

    def reschedule_by_key(
        self,
        key: str,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        timezone: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
        conn: Conn | None = None,
    ) -> Schedule:
        """:meth:`reschedule` the live schedule holding ``key``
        (:class:`~duejobs.errors.ScheduleNotFoundError` when none does)."""
        owner, key = self._write_tenant(tenant), _required_key(key)
        when, rank = change_of(delay, run_at, timezone, priority)
        with self._core.transaction(conn) as c:
            holder = store.live_by_key(c, owner, key)
            if holder is None:
                raise ScheduleNotFoundError(f"no live schedule holds key {key!r} of {owner!r}")
            schedule, old_job = store.reschedule(c, holder.id, self._tenant, when, None, rank)
            if schedule is None:
                self._explain_refusal(c, holder.id, None)
        assert schedule is not None
        self._moved(old_job, schedule, conn)
        return schedule

    # -- internals ---------------------------------------------------------------------

    def _explain_refusal(self, conn: Connection, sid: uuid.UUID, expected: int | None) -> None:
        current = store.get_schedule(conn, sid, self._tenant)
        if current is None:
            raise ScheduleNotFoundError(f"no schedule {sid}")
        if not current.status.is_live:
            raise ScheduleNotLiveError(
                f"schedule {sid} is {current.status.value}; only scheduled or running ones move"
            )
        assert expected is not None
        raise VersionConflictError(sid, expected, current.version)
