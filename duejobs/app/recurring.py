"""The App's recurring definitions: create, update (under the definition's row lock), pause,
resume, delete; occurrences are materialized by the scheduler
(:mod:`duejobs.scheduler.occurrences`)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from duejobs import store
from duejobs.app.scope import Scoped, registration
from duejobs.errors import (
    InvalidScheduleError,
    ScheduleNotFoundError,
)
from duejobs.handlers import Handler
from duejobs.models import (
    DstGap,
    DstOverlap,
    Misfire,
    QueueJob,
    Recurring,
    RecurringSpec,
    RecurringStatus,
)
from duejobs.scheduler.occurrences import Rule, check_cron, occurrences, plan
from duejobs.timespec import as_delay, zone
from duejobs.validation import (
    DEFAULT_PRIORITY,
    check_list_limit,
    check_priority,
    check_text,
    check_type,
    encode_payload,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

E = TypeVar("E", DstGap, DstOverlap, Misfire)


def _choice(kind: type[E], value: object, name: str) -> E:
    try:
        return kind(str(value))
    except ValueError as exc:
        choices = ", ".join(repr(k.value) for k in kind)
        raise InvalidScheduleError(f"{name} must be one of {choices}, got {value!r}") from exc


def _known(app: Scoped, job_type: object) -> str:
    """A definition's type, checked, and refused when the App refuses unknown types."""
    checked = check_type(job_type)
    registration(app, checked)
    return checked


def _priority(handler: Handler | None, priority: object) -> int:
    """A definition's priority: given, checked; else its type's, else the default."""
    if priority is None:
        return handler.priority if handler else DEFAULT_PRIORITY
    return check_priority(priority)


# What update_recurring may change: every field of a definition but its identity.
_UPDATABLE = frozenset(
    (
        "cron",
        "type",
        "payload",
        "timezone",
        "dst_gap",
        "dst_overlap",
        "misfire",
        "grace",
        "queue",
        "priority",
    )
)


class RecurringAPI(Scoped):
    """Recurring definitions of the App's tenant (see :meth:`recurring`)."""

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
        priority: int | None = None,
    ) -> Recurring:
        """Create (or replace) the recurring schedule ``name`` of the tenant.

        Occurrences become ordinary schedules shortly before they are due (see
        :mod:`duejobs.scheduler.occurrences` for the DST and misfire policies). Calling it again
        with the same definition changes nothing; with another one it bumps the version and cancels
        the occurrences not yet run. ``queue`` and ``priority``: its occurrences', as for
        :meth:`schedule` (default: the type's, else the App's queue and priority 0).
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
            priority=priority,
        )
        return self._apply(spec)

    def declare_recurring(
        self, name: str, *, cron: str, type: str, timezone: str = "UTC", payload: Any = None
    ) -> None:
        """Declare, in code, a recurring definition of the App's tenant that
        :meth:`sync_recurring` writes (as ``@app.task(cron=...)`` does next to its task):
        checked now, as :meth:`recurring` checks it, so a bad cron fails at import; written
        by ``duejobs dev``, the scheduler and the worker with ``--app`` when they start."""
        spec = self._recurring_spec(
            name,
            tenant=self._write_tenant(None),
            cron=cron,
            type=type,
            payload=payload,
            timezone=timezone,
            dst_gap=DstGap.SHIFT,
            dst_overlap=DstOverlap.ONCE,
            misfire=Misfire.LATEST,
            grace=timedelta(0),
            queue=None,
            priority=None,
        )
        self._core.declared_recurring[(spec.tenant, name)] = spec

    def sync_recurring(self) -> list[Recurring]:
        """Write every definition declared in code (:meth:`declare_recurring`) as
        :meth:`recurring` would; the stored definitions, in order. One whose stored cron,
        time zone, type, payload, queue and priority are those declared is left as it is — paused or
        quarantined by an operator, it stays so; a changed one bumps its version. Definitions
        made otherwise are left alone."""
        written = []
        for spec in self._core.declared_recurring.values():
            with self._core.transaction(None) as c:
                stored = store.get_recurring(c, spec.tenant, spec.name)
            same = stored is not None and (
                (stored.cron, stored.timezone, stored.type, stored.queue, stored.priority)
                == (spec.cron, spec.timezone, spec.type, spec.queue, spec.priority)
                and json.loads(spec.payload_json) == stored.payload
            )
            written.append(stored if same and stored is not None else self._apply(spec))
        return written

    def _apply(self, spec: RecurringSpec) -> Recurring:
        """Write a checked definition under its row lock; drop what it supersedes in Redis."""
        with self._core.transaction(None) as c:
            current = store.get_recurring(c, spec.tenant, spec.name, lock=True)
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
        priority: int | None,
    ) -> RecurringSpec:
        """A definition checked field by field (the error names the field)."""
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidScheduleError(f"recurring name must be 1-200 characters, got {name!r}")
        check_text(name, "recurring name")
        return RecurringSpec(
            tenant=tenant,
            name=name,
            type=_known(self, type),
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
            priority=_priority(self.handler_for(type), priority),
        )

    @staticmethod
    def _save_recurring(
        c: Connection, spec: RecurringSpec, existed: bool
    ) -> tuple[Recurring, list[QueueJob]]:
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

    def list_recurring(self, *, tenant: str | None = None, limit: int = 500) -> list[Recurring]:
        """The recurring schedules of this App's tenant (the unscoped App: of ``tenant``, else
        of every tenant), by tenant and name, up to ``limit``."""
        owner = self._read_tenant(tenant)
        with self._core.reading() as (c, _):  # the read replica's, when there is one
            return store.list_recurring(c, owner, check_list_limit(limit))

    def next_occurrences(self, definition: Recurring, count: int = 3) -> list[datetime]:
        """When an active definition's next ``count`` occurrences are due (UTC), by its rule
        as the scheduler reads it; none for a paused or quarantined one."""
        if definition.status is not RecurringStatus.ACTIVE or definition.next_run_at is None:
            return []
        rule = Rule.of(definition)
        start = definition.next_run_at - timedelta(microseconds=1)
        found, _next = occurrences(rule, start, start + timedelta(days=366), count)
        return [o.run_at for o in found]

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
        return self._set_recurring(name, tenant, RecurringStatus.PAUSED)

    def resume_recurring(self, name: str, *, tenant: str | None = None) -> Recurring:
        """Start again from the next occurrence after now."""
        return self._set_recurring(name, tenant, RecurringStatus.ACTIVE)

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

    def _set_recurring(self, name: str, tenant: str | None, status: RecurringStatus) -> Recurring:
        with self._core.transaction(None) as c:
            current = store.get_recurring(c, self._write_tenant(tenant), name, lock=True)
            if current is None:
                raise ScheduleNotFoundError(f"no recurring schedule {name!r}")
            jobs: list[QueueJob] = []
            restart = None
            if status is RecurringStatus.PAUSED:
                jobs = store.cancel_occurrences(c, current.id, "recurring schedule paused")
            elif current.status is not RecurringStatus.ACTIVE:
                restart = plan(Rule.of(current), store.database_now(c))
            updated = store.set_recurring_status(c, current.id, status, restart)
        for job in jobs:
            self._discard_queue_job(job)
        return updated
