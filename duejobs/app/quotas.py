"""The App's tenant quotas (caps on live schedules and on jobs in flight) and rate limits
(starts a period, of a queue or a tenant)."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from duejobs import store
from duejobs.app.scope import Scoped
from duejobs.errors import (
    InvalidScheduleError,
    TenantMismatchError,
)
from duejobs.rates import Rate, parse_rate
from duejobs.validation import (
    check_queue,
    check_tenant,
)


class Unset(enum.Enum):
    """Marks an argument that was not given (``None`` has a meaning of its own)."""

    UNSET = "unset"


UNSET = Unset.UNSET


class QuotaAPI(Scoped):
    """Setting and reading quotas (see :meth:`set_quota`)."""

    def set_quota(
        self,
        tenant: str,
        *,
        max_live: int | Unset | None = UNSET,
        max_inflight: int | Unset | None = UNSET,
        max_rate: str | Rate | Unset | None = UNSET,
    ) -> None:
        """Set a tenant's caps; only the caps given change, ``None`` clears one.

        * ``max_live``: live (scheduled or running) schedules. A :meth:`schedule` beyond it
          raises :class:`~duejobs.errors.QuotaExceededError` and writes nothing.
        * ``max_inflight``: jobs pushed to Redis or running at once. The scheduler pushes
          such a tenant's rows only when due and only while it has room: the rest wait in
          the table, so a tenant's burst never sits in the queue ahead of other tenants.
        * ``max_rate``: starts a period, ``"N/s"``, ``"N/m"`` or ``"N/h"``: in any window of
          one period at most N of the tenant's attempts start (plus one), over every queue,
          worker and scheduler (see :meth:`set_rate_limit`). Under the default each tenant
          has a count of its own.

        Tenant ``"*"`` holds the defaults; a tenant's cleared cap follows the default.
        Other processes apply a ``max_live`` change within
        :data:`~duejobs.app.scope.QUOTA_CACHE_SECONDS`; the
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
        if not caps and isinstance(max_rate, Unset):
            raise InvalidScheduleError("set_quota needs max_live=, max_inflight= or max_rate=")
        for name, value in caps.items():
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidScheduleError(f"{name} must be an int >= 0 or None, got {value!r}")
        rate = (
            max_rate
            if max_rate is None or isinstance(max_rate, Unset)
            else parse_rate(max_rate, "max_rate")
        )
        with self._core.transaction(None) as c:
            if caps:
                store.set_quota(c, tenant, caps)
            if not isinstance(rate, Unset):
                store.set_rate_limit(c, "tenant", tenant, rate)
        self._core.quotas.clear()

    def set_rate_limit(self, queue: str, rate: str | Rate | None) -> None:
        """Limit the attempts that start from ``queue``: ``"N/s"``, ``"N/m"`` or ``"N/h"``
        (``None`` clears the limit). In any window of one period at most N start (one more
        at its edge), counted by the database over every worker and scheduler, whatever
        tenant they are of; retries count. A start the limit has no room for is not run:
        its job goes back on its queue at a slot of its own, its row still ``scheduled``
        and no attempt used. Takes effect at the next start.

        A bad rate (``"fast"``, ``"0/s"``, ``"1.5/s"``, ``"10/week"``) raises
        :class:`~duejobs.errors.InvalidRateError` naming it, and nothing is written."""
        if self._tenant is not None:
            raise TenantMismatchError("rate limits are set through an unscoped App")
        check_queue(queue)
        parsed = None if rate is None else parse_rate(rate)
        with self._core.transaction(None) as c:
            store.set_rate_limit(c, "queue", queue, parsed)

    def rate_limits(self) -> list[store.RateLimit]:
        """Every rate limit set — queues', the tenants' default (``"*"``), tenants' own —
        with its count's last grant and its use over the last period (``recent_starts``,
        ``use``)."""
        if self._tenant is not None:
            raise TenantMismatchError("rate limits are read through an unscoped App")
        with self.engine.connect() as c:
            return store.rate_limits(c)

    def quotas(self, tenants: Iterable[str] | None = None) -> list[store.Quota]:
        """Every stored quota — or, given ``tenants``, theirs alone —: the default (tenant
        ``"*"``) first, then per-tenant ones."""
        if self._tenant is not None:
            raise TenantMismatchError("quotas are read through an unscoped App")
        with self.engine.connect() as c:
            return store.quotas(c, None if tenants is None else sorted(set(tenants)))
