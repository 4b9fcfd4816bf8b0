"""The scheduler's claim, in two statements: the walk over (tenant, queue) pairs with due rows,
then the claim of each one's share (how the batch is shared is the scheduler's decision); and,
for pairs under a rate limit, the two statements that pace them (duejobs.scheduler.pacing).

Both run prepared, with their generic plan (the query ``claim_plan`` says why): planned once
per connection, not at every batch (again after an invalidation, such as an ANALYZE of the
table, or a rolled-back transaction, after which psycopg prepares them anew). The claim's
planner settings last to the end of the caller's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from duejobs.models import Delivery
from duejobs.store import dbapi
from duejobs.store.execution import is_lock_timeout, run

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class PairDue:
    """One (tenant, queue) pair the walk found with due rows waiting to be pushed."""

    tenant: str
    queue: str
    due: int  # counted up to the walk's limit
    ahead: timedelta  # how far ahead its rows were counted: the window, the horizon or none
    cap: int | None  # its tenant's in-flight quota
    locked: bool | None  # whether this claim holds the tenant's in-flight lock (capped only)
    inflight: int | None  # its tenant's jobs in flight (capped only; an estimate until the claim)
    sparse: bool  # fewer than front_lane of its tenant's jobs wait in the queue
    queue_every: timedelta | None  # the interval between starts of its queue's rate limit
    tenant_every: timedelta | None  # of its tenant's (its own, else the default's)


def walk_pairs(
    conn: Connection,
    window: timedelta,
    horizon: timedelta,
    limit: int,
    after: tuple[str, str],
    front_lane: int,
) -> tuple[datetime, list[PairDue]]:
    """The database clock, and up to ``limit`` (tenant, queue) pairs after ``after`` (in name
    order) with rows due within ``window`` waiting to be pushed — within ``horizon`` for a
    pair under a rate limit (the query ``claim_walk``)."""
    params = {
        "window": window,
        "horizon": horizon,
        "limit": limit,
        "after_tenant": after[0],
        "after_queue": after[1],
        "front_lane": front_lane,
    }
    run(conn, "claim_plan")
    walk = run(conn, "claim_walk", params, prepare=True)
    pairs = [
        PairDue(
            w.tenant,
            w.queue,
            w.due,
            w.ahead,
            w.cap,
            w.locked,
            w.inflight,
            w.sparse,
            w.queue_every,
            w.tenant_every,
        )
        for w in walk
        if w.tenant is not None
    ]
    return walk[0].db_now.astimezone(UTC), pairs


@dataclass(frozen=True, kw_only=True)
class ClaimedRow(Delivery):
    """A row claimed for pushing, with its turn within its tenant."""

    turn: int  # 1 for the tenant's first row of the batch, 2 for its second, ...


@dataclass(frozen=True)
class Share:
    """A pair's share of a claim: how many of its rows to take, how far ahead."""

    tenant: str
    queue: str
    share: int
    cap: int | None  # its tenant's in-flight quota, counted again under the claim's lock
    ahead: timedelta


def claim_shares(conn: Connection, shares: Sequence[Share]) -> list[ClaimedRow]:
    """Take each pair's share of due rows, oldest first, SKIP LOCKED, a capped tenant's cut to
    the room its cap leaves (counted again under its lock); record their queue job ids with an
    ``enqueued`` event. Rows in turns: every tenant's first, then every tenant's second (the
    query ``claim_shares``)."""
    rows = run(
        conn,
        "claim_shares",
        {
            "tenants": [s.tenant for s in shares],
            "queues": [s.queue for s in shares],
            "shares": [s.share for s in shares],
            "caps": [s.cap for s in shares],
            "aheads": [s.ahead for s in shares],
        },
        prepare=True,
    )
    return [ClaimedRow.of(r, turn=r.turn) for r in rows]


@dataclass(frozen=True)
class LimitState:
    """A rate limit a claim holds: when its next start may come by the scheduler's pointer
    and by the worker's grant."""

    scope: str
    name: str
    paced_until: datetime | None
    started_until: datetime | None
    # A tenant's count under the default (or none yet), not a limit of its own.
    follows_default: bool = False


@dataclass(frozen=True)
class Pace:
    """A limit's pointer as a claim leaves it: when its next start may come, and the
    limit's interval (for a count the pointer's write must make)."""

    scope: str
    name: str
    until: datetime
    every: timedelta
    # A tenant's count under the default: made with the pointer when it is not there.
    count: bool = False


def pace_limits(conn: Connection, limits: Sequence[tuple[str, str]]) -> list[LimitState]:
    """Hold, to this transaction's end, the (scope, name) limits no other claim is pacing,
    with their paces (the query ``pace_limits``; it writes nothing)."""
    rows = run(
        conn,
        "pace_limits",
        {"scopes": [scope for scope, _ in limits], "names": [name for _, name in limits]},
    )
    return [
        LimitState(r.scope, r.name, r.paced_until, r.started_until, bool(r.follows_default))
        for r in rows
    ]


def pace_rows(conn: Connection, moved: Sequence[tuple[uuid.UUID, datetime, datetime]]) -> None:
    """Move each (id, slot, due time before) row to its slot, with its event (the query
    ``pace_rows``)."""
    run(
        conn,
        "pace_rows",
        {
            "ids": [i for i, _, _ in moved],
            "slots": [slot for _, slot, _ in moved],
            "moved_from": [before for _, _, before in moved],
        },
    )


# How long the scheduler's claim waits for a rate limit's row to move its pointer on.
PACE_LOCK_WAIT = "200ms"


def advance_paces(conn: Connection, paces: Sequence[Pace]) -> bool:
    """Move each limit's pointer on (the query ``advance_paces``, which makes a tenant's
    count that is not there): last in the claim's transaction, after its push. A row held
    past ``PACE_LOCK_WAIT`` leaves the pointers where they were (False), the claim's rows
    still committed: the next claim gives those starts out again, and the workers' grant,
    which keeps the limit, turns back the starts it has no room for."""
    params = {
        "scopes": [p.scope for p in paces],
        "names": [p.name for p in paces],
        "everies": [p.every for p in paces],
        "untils": [p.until for p in paces],
        "counts": [p.count for p in paces],
        "lock_timeout": PACE_LOCK_WAIT,
    }
    try:
        with conn.begin_nested():
            run(conn, "advance_paces", params)
    except dbapi.OperationalError as exc:
        if not is_lock_timeout(exc.orig):
            raise
        return False
    return True
