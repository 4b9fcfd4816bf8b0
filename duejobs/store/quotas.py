"""Tenant quotas: caps on live schedules and on jobs in flight."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

from duejobs.store.claims import DEFAULT_QUOTA_TENANT, _cap_sql, _inflight_sql

# -- tenant quotas ---------------------------------------------------------------------------

QUOTA_COLUMNS = ("max_live", "max_inflight")


@dataclass(frozen=True)
class Quota:
    """A tenant's own caps as stored (``None``: the default's applies), or the default's."""

    tenant: str
    max_live: int | None
    max_inflight: int | None


def set_quota(conn: Connection, tenant: str, caps: dict[str, int | None]) -> None:
    """Set the given caps (``QUOTA_COLUMNS``) of a tenant, or of the default (tenant '*');
    ``None`` clears one (a tenant then follows the default, the default means no cap)."""
    if not caps or not set(caps) <= set(QUOTA_COLUMNS):
        raise ValueError(f"caps must name some of {QUOTA_COLUMNS}, got {sorted(caps)}")
    columns = ", ".join(caps)
    values = ", ".join(f":{c}" for c in caps)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in caps)
    conn.execute(
        text(
            f"INSERT INTO tenant_quotas (tenant, {columns}) VALUES (:tenant, {values}) "
            f"ON CONFLICT (tenant) DO UPDATE SET {updates}, updated_at = statement_timestamp()"
        ),
        {"tenant": tenant, **caps},
    )


def quotas(conn: Connection) -> list[Quota]:
    """Every stored quota row, the default first."""
    rows = conn.execute(
        text(
            "SELECT tenant, max_live, max_inflight FROM tenant_quotas "
            "ORDER BY tenant <> :default, tenant"
        ),
        {"default": DEFAULT_QUOTA_TENANT},
    )
    return [Quota(r.tenant, r.max_live, r.max_inflight) for r in rows]


def live_quota(conn: Connection, tenant: str) -> int | None:
    """The tenant's cap on live schedules: its own, else the default, else none."""
    value = conn.execute(
        text(f"SELECT {_cap_sql('max_live', ':tenant')}"), {"tenant": tenant}
    ).scalar_one()
    return None if value is None else int(value)


def count_live_up_to(conn: Connection, tenant: str, cap: int) -> int:
    """The tenant's live schedules, counted up to ``cap`` under a per-tenant lock held until
    the transaction ends (so concurrent admissions cannot both take the last place)."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('duejobs-quota:' || :tenant))"),
        {"tenant": tenant},
    )
    count = conn.execute(
        text(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM scheduled_jobs WHERE tenant = :tenant "
            "        AND status = 'scheduled' AND queue_job_id IS NULL LIMIT :cap) AS waiting) "
            f"+ {_inflight_sql(':tenant', ':cap')}"
        ),
        {"tenant": tenant, "cap": cap},
    ).scalar_one()
    return int(count)
