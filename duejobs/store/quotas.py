"""Tenant quotas: caps on live schedules and on jobs in flight."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from duejobs.rates import Rate
from duejobs.store.execution import run, run_one
from duejobs.store.queries import DEFAULT_QUOTA_TENANT

if TYPE_CHECKING:
    from sqlalchemy import Connection

# -- tenant quotas ---------------------------------------------------------------------------

QUOTA_COLUMNS = ("max_live", "max_inflight")


@dataclass(frozen=True)
class Quota:
    """A tenant's own caps and rate limit as stored (``None``: the default's applies), or
    the default's."""

    tenant: str
    max_live: int | None
    max_inflight: int | None
    max_rate: Rate | None = None


def set_quota(conn: Connection, tenant: str, caps: dict[str, int | None]) -> None:
    """Set the given caps (``QUOTA_COLUMNS``) of a tenant, or of the default (tenant '*');
    ``None`` clears one (a tenant then follows the default, the default means no cap)."""
    if not caps or not set(caps) <= set(QUOTA_COLUMNS):
        raise ValueError(f"caps must name some of {QUOTA_COLUMNS}, got {sorted(caps)}")
    run(
        conn,
        "set_quota",
        {
            "tenant": tenant,
            "max_live": caps.get("max_live"),
            "max_inflight": caps.get("max_inflight"),
            "set_live": "max_live" in caps,
            "set_inflight": "max_inflight" in caps,
        },
    )


def quotas(conn: Connection, tenants: Sequence[str] | None = None) -> list[Quota]:
    """Every stored quota row — or, given ``tenants``, theirs and the default's —, the
    default first."""
    params = {
        "default": DEFAULT_QUOTA_TENANT,
        "tenants": None if tenants is None else list(tenants),
    }
    rows = run(conn, "quotas", params)
    return [
        Quota(
            r.tenant,
            r.max_live,
            r.max_inflight,
            None if r.max_starts is None else Rate(r.max_starts, r.period),
        )
        for r in rows
    ]


def live_quota(conn: Connection, tenant: str) -> int | None:
    """The tenant's cap on live schedules: its own, else the default, else none."""
    row = run_one(conn, "live_quota", {"tenant": tenant})
    return None if row is None or row.cap is None else int(row.cap)


def count_live_up_to(conn: Connection, tenant: str, cap: int) -> int:
    """The tenant's live schedules, counted up to ``cap`` under a per-tenant lock held until
    the transaction ends (so concurrent admissions cannot both take the last place)."""
    run(conn, "lock_tenant_quota", {"tenant": tenant})
    row = run_one(conn, "count_live_up_to", {"tenant": tenant, "cap": cap})
    assert row is not None
    return int(row.live)


def effective_caps(
    conn: Connection, tenants: Sequence[str]
) -> dict[str, tuple[int | None, int | None]]:
    """Each tenant's (max_live, max_inflight) as they apply: its own, else the default's."""
    rows = run(conn, "effective_caps", {"tenants": list(tenants)})
    return {r.tenant: (r.max_live, r.max_inflight) for r in rows}
