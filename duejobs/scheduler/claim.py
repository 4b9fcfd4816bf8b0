"""The scheduler's claim: which due rows a batch takes, and how it is shared.

A batch is shared fairly among the tenants that have due rows (equal shares, a tenant needing
less leaves the rest to the others, oldest ``due_at`` first within a tenant), then each
tenant's share among its queues the same way; the walk over (tenant, queue) pairs resumes
where the last batch stopped. A tenant with an in-flight quota gets only its due rows, as many
as its quota leaves room for; a pair under a rate limit only the starts the limit's pace has
room for (:mod:`duejobs.scheduler.pacing`), its room shared among the pairs under it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.models import Delivery
from duejobs.scheduler.pacing import PACE_AHEAD, Pacing, group_of

if TYPE_CHECKING:
    from sqlalchemy import Connection

# A tenant with fewer jobs than this waiting in the queue is "sparse": its first row of a
# batch goes to the front of the queue.
FRONT_LANE = 2
# Where a walk starts from the first pair.
FIRST: tuple[str, str] = ("", "")


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


@dataclass(frozen=True, kw_only=True)
class DueRow(Delivery):
    """A claimed row the scheduler is about to push."""

    # Pushed to the front of the queue: the first row of a sparse tenant (see claim_due).
    front: bool = False
    # Onto its queue at this time, ahead of its due time (its slot under a rate limit:
    # duejobs.scheduler.pacing.group_of); None: when due.
    group_at: datetime | None = None


@dataclass(frozen=True)
class Claim:
    """What one claim took, and what it learned on the way."""

    rows: list[DueRow]
    db_now: datetime
    # Capped tenants whose due rows were held back by their in-flight quota.
    throttled: list[str]
    # Where the next claim's walk starts: the last (tenant, queue) walked when the walk was
    # cut at ``limit`` pairs, else FIRST (the next claim starts again from the first pair).
    cursor: tuple[str, str]
    # The rate limits it paced, each with its next start's time: for the caller to record
    # (store.advance_paces) once the rows are pushed, before its commit.
    paces: list[store.Pace] = dataclasses.field(default_factory=list)


def claim_due(
    conn: Connection,
    window: timedelta,
    limit: int,
    after: tuple[str, str] = FIRST,
    horizon: timedelta = PACE_AHEAD,
) -> Claim:
    """Claim up to ``limit`` rows due within ``window`` that have no queue job for their
    current version, shared fairly among the tenants that have some and each tenant's share
    among its queues (pairs walked in name order after ``after``), oldest first within a
    pair, rows locked by another scheduler skipped; record their queue job id with an
    ``enqueued`` event. A tenant with an in-flight quota gets only its due rows, and only as
    many as its quota leaves room for; a pair under a rate limit only its rows due within
    ``horizon``, as many as the limit's pace has starts for, each due at its slot.

    The first row of a *sparse* tenant — fewer than ``FRONT_LANE`` of its jobs waiting in the
    queue — is marked ``front``: pushed to the front of the queue, it does not wait behind
    another tenant's backlog (the sparse-flow rule of fair queueing, as in FQ-CoDel). A
    tenant's later rows go to the back, so a busy tenant cannot jump the queue, and the front
    lane carries at most one job per tenant per batch. ``FRONT_LANE`` is 2, not 1: a light
    tenant whose previous job still waits (a slow moment) keeps its place at the front
    instead of falling behind the backlog, where each of its jobs would then find the
    previous one still waiting. The caller pushes the rows to Redis before committing and
    rolls back if the push fails, so a row is never marked pushed without a real queue job,
    then records the limits' paces (``Claim.paces``).
    The claim's planner settings (the query ``claim_plan``: index scans only, generic plans)
    hold to the end of the caller's transaction."""
    now, pairs = store.walk_pairs(conn, window, horizon, limit, after, FRONT_LANE)
    if not pairs and after != FIRST:  # the end of the names: start again from the first
        now, pairs = store.walk_pairs(conn, window, horizon, limit, FIRST, FRONT_LANE)
    cursor = (pairs[-1].tenant, pairs[-1].queue) if len(pairs) == limit else FIRST
    pacing = Pacing.hold(conn, pairs, now)
    wants = [p.due for p in pairs]
    for key, under in pacing.under(pairs).items():  # each limit's room shared among its pairs
        for i, share in zip(
            under, fair_shares(pacing.room(key), [wants[i] for i in under]), strict=True
        ):
            wants[i] = min(wants[i], share)
    tenants: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        tenants.setdefault(pair.tenant, []).append(i)
    tenant_wants, throttled = [], []
    for tenant, positions in tenants.items():
        first, want = pairs[positions[0]], sum(wants[i] for i in positions)
        if first.cap is not None:
            room = max(0, first.cap - (first.inflight or 0)) if first.locked else 0
            if room < want:
                throttled.append(tenant)
            want = min(want, room)
        tenant_wants.append(want)
    plan = [
        store.Share(pairs[i].tenant, pairs[i].queue, share, pairs[i].cap, pairs[i].ahead)
        for positions, tenant_share in zip(
            tenants.values(), fair_shares(limit, tenant_wants), strict=True
        )
        for i, share in zip(
            positions, fair_shares(tenant_share, [wants[i] for i in positions]), strict=True
        )
        if share
    ]
    if not plan:
        return Claim([], now, throttled, cursor)
    sparse = {p.tenant for p in pairs if p.sparse}
    claimed = store.claim_shares(conn, plan)
    slots, paces = pacing.place(conn, claimed, pairs)
    rows = [DueRow.of(r, front=r.turn == 1 and r.tenant in sparse) for r in claimed]
    if slots:  # the paced rows, due at their slots, sent in groups a little ahead
        rows = [
            dataclasses.replace(
                r, due_at=slots[r.schedule_id], group_at=group_of(slots[r.schedule_id])
            )
            if r.schedule_id in slots
            else r
            for r in rows
        ]
    return Claim(rows, now, throttled, cursor, paces)
