"""The scheduler's claim, in two statements: the walk over tenants with due rows, then the
claim of each one's share (how the batch is shared is the scheduler's decision).

Both run prepared, with their generic plan (the query ``claim_plan`` says why): planned once
per connection, not at every batch (again after an invalidation, such as an ANALYZE of the
table, or a rolled-back transaction, after which psycopg prepares them anew). The claim's
planner settings last to the end of the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from duejobs.models import Delivery
from duejobs.store.execution import run

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class TenantDue:
    """One tenant the walk found with due rows waiting to be pushed."""

    tenant: str
    due: int  # counted up to the walk's limit
    cap: int | None  # its in-flight quota
    locked: bool | None  # whether this claim holds the tenant's in-flight lock (capped only)
    inflight: int | None  # its jobs in flight (capped only; an estimate until the claim)
    sparse: bool  # fewer than front_lane of its jobs wait in the queue


def walk_tenants(
    conn: Connection, window: timedelta, limit: int, after: str, front_lane: int
) -> tuple[datetime, list[TenantDue]]:
    """The database clock, and up to ``limit`` tenants after ``after`` (in name order) with
    rows due within ``window`` waiting to be pushed (the query ``claim_walk``)."""
    params = {"window": window, "limit": limit, "after": after, "front_lane": front_lane}
    run(conn, "claim_plan")
    walk = run(conn, "claim_walk", params, prepare=True)
    tenants = [
        TenantDue(w.tenant, w.due, w.cap, w.locked, w.inflight, w.sparse)
        for w in walk
        if w.tenant is not None
    ]
    return walk[0].db_now.astimezone(UTC), tenants


@dataclass(frozen=True, kw_only=True)
class ClaimedRow(Delivery):
    """A row claimed for pushing, with its turn within its tenant."""

    turn: int  # 1 for the tenant's first row of the batch, 2 for its second, ...


def claim_shares(
    conn: Connection, window: timedelta, shares: Sequence[tuple[str, int, int | None]]
) -> list[ClaimedRow]:
    """Take each (tenant, share, in-flight cap)'s share of due rows, oldest first, SKIP
    LOCKED, a capped tenant's cut to the room its cap leaves (counted again under its lock);
    record their queue job ids with an ``enqueued`` event. Rows in turns: every tenant's
    first, then every tenant's second (the query ``claim_shares``)."""
    rows = run(
        conn,
        "claim_shares",
        {
            "window": window,
            "tenants": [tenant for tenant, _, _ in shares],
            "shares": [share for _, share, _ in shares],
            "caps": [cap for _, _, cap in shares],
        },
        prepare=True,
    )
    return [ClaimedRow.of(r, turn=r.turn) for r in rows]
