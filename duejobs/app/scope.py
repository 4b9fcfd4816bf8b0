"""What every part of the App stands on: its Core, the tenant it is scoped to, and the rules
that place a write (whose tenant, which queue) and tidy up after one (a superseded job left in
Redis)."""

from __future__ import annotations

import logging
import uuid

from redis.exceptions import RedisError
from sqlalchemy import Engine

from duejobs.config import Settings
from duejobs.core import Core
from duejobs.delivery import Deliverer
from duejobs.errors import (
    InvalidScheduleIdError,
    TenantMismatchError,
)
from duejobs.handlers import Handler
from duejobs.models import QueueJob
from duejobs.validation import (
    DEFAULT_TENANT,
    check_queue,
    check_tenant,
)

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
        """Remove a superseded delivery that is still waiting in Redis, on its queue's node.

        Best effort by design: the worker re-reads the row and skips a stale delivery, so a
        Redis error here is logged, not raised — the database change already committed. With
        ``conn=`` nothing is removed, since the caller may still roll back; in a host
        framework's transaction (Django's ``atomic()``) only once it commits. A job left on a
        node its queue has moved away from is the reconciler's orphan removal's to find.
        """
        if job is None or not self.settings.has_redis:
            return

        def remove() -> None:
            try:
                self.deliverer().remove(job.id, job.queue)
            except RedisError as exc:
                log.warning("could not remove stale queue job %s: %s", job.id, exc)

        self._core.after_commit(remove)

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
