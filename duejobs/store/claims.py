"""The scheduler's claim: due rows shared fairly among tenants, under their in-flight caps."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from duejobs.store.execution import run

# -- the delivery path: scheduler ------------------------------------------------------------


@dataclass(frozen=True)
class DueRow:
    """A claimed row the scheduler is about to push, with its queue job id."""

    id: uuid.UUID
    tenant: str
    version: int
    attempt: int
    due_at: datetime
    queue_job_id: str
    # Pushed to the front of the queue: the first row of a tenant with nothing in the queue
    # or running (see claim_due).
    front: bool = False
    queue: str = "duejobs"


def fair_shares(limit: int, wants: Sequence[int]) -> list[int]:
    """Split ``limit`` places among tenants wanting ``wants``: equal shares, a tenant wanting
    less than its share leaves the rest to the others (water-filling), and places that do not
    divide evenly go one each to the first tenants in order."""
    shares = [0] * len(wants)
    left = limit
    active = [i for i, want in enumerate(wants) if want > 0]
    while left > 0 and active:
        each = left // len(active)
        if each == 0:
            for i in active[:left]:
                shares[i] += 1
            break
        for i in active:
            given = min(each, wants[i] - shares[i])
            shares[i] += given
            left -= given
        active = [i for i in active if shares[i] < wants[i]]
    return shares


FRONT_LANE = 2


@dataclass(frozen=True)
class Claim:
    """What one claim took, and what it learned on the way."""

    rows: list[DueRow]
    db_now: datetime
    # Capped tenants whose due rows were held back by their in-flight quota.
    throttled: list[str]
    # Where the next claim's walk starts: the last tenant walked when the walk was cut at
    # ``limit`` tenants, else "" (the next claim starts again from the first tenant).
    cursor: str


def claim_due(conn: Connection, window: timedelta, limit: int, after: str = "") -> Claim:
    """Claim up to ``limit`` rows due within ``window`` that have no queue job for their
    current version, shared fairly among the tenants that have some (walked in name order
    after ``after``), oldest first within a tenant, rows locked by another scheduler skipped;
    record their queue job id with an ``enqueued`` event. A tenant with an in-flight quota
    gets only its due rows, and only as many as its quota leaves room for.

    The first row of a *sparse* tenant — fewer than ``FRONT_LANE`` of its jobs waiting in the
    queue — is marked ``front``: pushed to the front of the queue, it does not wait behind
    another tenant's backlog (the sparse-flow rule of fair queueing, as in FQ-CoDel). A
    tenant's later rows go to the back, so a busy tenant cannot jump the queue, and the front
    lane carries at most one job per tenant per batch. ``FRONT_LANE`` is 2, not 1: a light
    tenant whose previous job still waits (a slow moment) keeps its place at the front
    instead of falling behind the backlog, where each of its jobs would then find the
    previous one still waiting. The caller pushes
    the rows to Redis before committing and rolls back if the push fails, so a row is never
    marked pushed without a real queue job."""
    params: dict[str, Any] = {
        "window": window,
        "limit": limit,
        "after": after,
        "front_lane": FRONT_LANE,
    }
    walk = run(conn, "claim_walk", params)
    if walk[0].tenant is None and after:
        walk = run(conn, "claim_walk", params | {"after": ""})
    now = walk[0].db_now.astimezone(UTC)
    tenants = [w for w in walk if w.tenant is not None]
    wants = [
        w.due if w.cap is None else min(w.due, max(0, w.cap - w.inflight)) if w.locked else 0
        for w in tenants
    ]
    throttled = [w.tenant for w, want in zip(tenants, wants, strict=True) if want < w.due]
    cursor = tenants[-1].tenant if len(tenants) == limit else ""
    plan = [
        (w, share) for w, share in zip(tenants, fair_shares(limit, wants), strict=True) if share
    ]
    if not plan:
        return Claim([], now, throttled, cursor)
    rows = run(
        conn,
        "claim_shares",
        {
            "window": window,
            "tenants": [w.tenant for w, _ in plan],
            "shares": [share for _, share in plan],
            "caps": [w.cap for w, _ in plan],
        },
    )
    sparse = {w.tenant for w in tenants if w.sparse}
    due = [
        DueRow(
            r.id,
            r.tenant,
            r.version,
            r.attempt,
            r.due_at.astimezone(UTC),
            r.queue_job_id,
            front=r.turn == 1 and r.tenant in sparse,
            queue=r.queue,
        )
        for r in rows
    ]
    return Claim(due, now, throttled, cursor)
