"""The App's tenant quotas: caps on live schedules and on jobs in flight."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from duejobs import store
from duejobs.app.scope import Scoped
from duejobs.errors import (
    InvalidScheduleError,
    TenantMismatchError,
)
from duejobs.validation import (
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
    ) -> None:
        """Set a tenant's caps; only the caps given change, ``None`` clears one.

        * ``max_live``: live (scheduled or running) schedules. A :meth:`schedule` beyond it
          raises :class:`~duejobs.errors.QuotaExceededError` and writes nothing.
        * ``max_inflight``: jobs pushed to Redis or running at once. The scheduler pushes
          such a tenant's rows only when due and only while it has room: the rest wait in
          the table, so a tenant's burst never sits in the queue ahead of other tenants.

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

    def quotas(self, tenants: Iterable[str] | None = None) -> list[store.Quota]:
        """Every stored quota — or, given ``tenants``, theirs alone —: the default (tenant
        ``"*"``) first, then per-tenant ones."""
        if self._tenant is not None:
            raise TenantMismatchError("quotas are read through an unscoped App")
        with self.engine.connect() as c:
            return store.quotas(c, None if tenants is None else sorted(set(tenants)))
