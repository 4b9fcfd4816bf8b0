"""The scheduler's claim: due rows shared fairly among tenants, under their in-flight caps."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from duejobs.store.execution import _fast

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


# The queue job id of (tenant, id, version, attempt), as duejobs.delivery.job_id spells it;
# computed here so that claiming and marking a batch is a single UPDATE. A test holds the two
# spellings equal.
_JOB_ID_SQL = (
    "'dj-' || replace(s.tenant, '.', '_') || '-' || replace(CAST(s.id AS text), '-', '') "
    "|| '-v' || s.version || '-a' || (s.attempts + 1)"
)

DEFAULT_QUOTA_TENANT = "*"


# A tenant's quota: its own cap, else the default's (tenant '*'), else none.
def _cap_sql(column: str, tenant: str) -> str:
    return (
        f"COALESCE((SELECT {column} FROM tenant_quotas WHERE tenant = {tenant}), "
        f"(SELECT {column} FROM tenant_quotas WHERE tenant = '{DEFAULT_QUOTA_TENANT}'))"
    )


# A tenant's in-flight jobs, pushed (counted up to its cap) plus running.
def _inflight_sql(tenant: str, cap: str) -> str:
    return (
        f"((SELECT count(*) FROM (SELECT 1 FROM scheduled_jobs WHERE tenant = {tenant} "
        f"AND status = 'scheduled' AND queue_job_id IS NOT NULL LIMIT {cap}) AS pushed) "
        f"+ (SELECT count(*) FROM scheduled_jobs WHERE status = 'running' AND tenant = {tenant}))"
    )


# A tenant's rows waiting to be pushed that are due: within the window, or only those already
# due for a tenant with an in-flight cap (its backlog waits in the table, not in Redis).
# Spelled as a range of (tenant, due_at) pairs, without `tenant = ...`, so that only the
# per-tenant claim index can serve it: with the equality the planner may take the global
# due_at index instead and filter out every other tenant's rows on the way.
def _tenant_range_sql(row: str, tenant: str, upto: str) -> str:
    return (
        f"({row}.tenant, {row}.due_at) >= ({tenant}, CAST('-infinity' AS timestamptz)) "
        f"AND ({row}.tenant, {row}.due_at) <= ({tenant}, {upto})"
    )


def _tenant_due_sql(row: str, tenant: str, cap: str) -> str:
    horizon = (
        f"statement_timestamp() + CASE WHEN {cap} IS NULL "
        "THEN CAST(:window AS interval) ELSE interval '0' END"
    )
    return (
        f"{row}.status = 'scheduled' AND {row}.queue_job_id IS NULL "
        f"AND {_tenant_range_sql(row, tenant, horizon)}"
    )


_UNPUSHED = "status = 'scheduled' AND queue_job_id IS NULL"

# First half of a claim: walk the tenants that have rows waiting to be pushed, in name order
# after a cursor, one index probe each (the recursion is evaluated only as far as the LIMIT
# pulls it), and count each one's due rows up to the batch size. A tenant is "sparse" when it
# has fewer than FRONT_LANE jobs waiting in the queue. Capped tenants are locked
# (try-lock, held to the end of the claim's transaction) so that two claims never both fill
# the same tenant's last places; their in-flight count here is an estimate for sharing the
# batch, and the claim counts again under the lock.
CLAIM_WALK = text(
    f"""
    WITH RECURSIVE tenants (tenant) AS (
        SELECT min(tenant) FROM scheduled_jobs
        WHERE {_UNPUSHED} AND tenant > :after
          AND EXISTS (SELECT 1 FROM scheduled_jobs WHERE {_UNPUSHED}
                      AND due_at <= statement_timestamp() + CAST(:window AS interval))
      UNION ALL
        SELECT (SELECT min(s.tenant) FROM scheduled_jobs s
                WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
                  AND s.tenant > t.tenant)
        FROM tenants t WHERE t.tenant IS NOT NULL
    ), capped AS (
        SELECT t.tenant, {_cap_sql("max_inflight", "t.tenant")} AS cap
        FROM tenants t WHERE t.tenant IS NOT NULL
    ), walked AS (
        SELECT c.tenant, c.cap,
               (SELECT count(*) FROM (
                    SELECT 1 FROM scheduled_jobs s
                    WHERE {_tenant_due_sql("s", "c.tenant", "c.cap")}
                    LIMIT :limit) AS d) AS due
        FROM capped c
    ), picked AS (
        SELECT * FROM walked WHERE due > 0 LIMIT :limit
    )
    SELECT statement_timestamp() AS db_now, p.tenant, p.due, p.cap,
           CASE WHEN p.cap IS NOT NULL
                THEN pg_try_advisory_xact_lock(hashtext('duejobs-inflight:' || p.tenant))
           END AS locked,
           CASE WHEN p.cap IS NOT NULL THEN {_inflight_sql("p.tenant", "p.cap")} END AS inflight,
           (SELECT count(*) FROM (
                SELECT 1 FROM scheduled_jobs s
                WHERE s.status = 'scheduled' AND s.queue_job_id IS NOT NULL
                  AND {_tenant_range_sql("s", "p.tenant", "statement_timestamp()")}
                LIMIT :front_lane) AS queued) < :front_lane AS sparse
    -- The claim's commit does not wait for the WAL flush: a worker that already popped a job
    -- waits less on the row's lock (what a crash can cost: see duejobs.scheduler).
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS always
    LEFT JOIN picked p ON true
    """
)

# Second half: take each tenant's share of the batch, oldest first, FOR UPDATE SKIP LOCKED
# (a capped tenant's share cut to the room its cap leaves, counted afresh), record the queue
# job ids and an `enqueued` event, and return the rows in turns — every tenant's first row,
# then every tenant's second — so that the push interleaves tenants in the queue as well.
CLAIM_SHARES = text(
    f"""
    WITH plan AS (
        SELECT p.tenant, p.cap,
               CASE WHEN p.cap IS NULL THEN p.share
                    ELSE LEAST(p.share, p.cap - {_inflight_sql("p.tenant", "p.cap")}) END AS n
        FROM unnest(CAST(:tenants AS text[]), CAST(:shares AS integer[]),
                    CAST(:caps AS integer[])) AS p(tenant, share, cap)
    ), due AS (
        SELECT c.id FROM plan p CROSS JOIN LATERAL (
            SELECT s.id FROM scheduled_jobs s
            WHERE {_tenant_due_sql("s", "p.tenant", "p.cap")}
            ORDER BY s.tenant, s.due_at
            LIMIT GREATEST(p.n, 0)
            FOR UPDATE SKIP LOCKED
        ) AS c
    ), upd AS (
        UPDATE scheduled_jobs s
        SET queue_job_id = {_JOB_ID_SQL},
            enqueued_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE s.id = ANY(ARRAY(SELECT id FROM due))  -- primary-key lookups, never a join
        RETURNING s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at,
                  s.queue_job_id, s.queue
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'enqueued', version, jsonb_build_object('queue_job_id', queue_job_id)
        FROM upd
    )
    SELECT upd.*, row_number() OVER (PARTITION BY upd.tenant ORDER BY upd.due_at) AS turn
    FROM upd
    ORDER BY turn, upd.due_at
    """
)


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
    walk = _fast(conn, CLAIM_WALK, params)
    if walk[0].tenant is None and after:
        walk = _fast(conn, CLAIM_WALK, params | {"after": ""})
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
    rows = _fast(
        conn,
        CLAIM_SHARES,
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
