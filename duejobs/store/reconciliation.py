"""What the reconciler reads and writes: the window's rows, expired leases, states."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text

from duejobs.models import (
    Status,
)
from duejobs.store.claims import _JOB_ID_SQL, _cap_sql
from duejobs.store.execution import _TENANT, _fast

# -- reconciliation --------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowRow:
    """A ``scheduled`` row inside the window, as the reconciler checks it against Redis."""

    id: uuid.UUID
    tenant: str
    version: int
    attempt: int
    due_at: datetime
    queue_job_id: str
    was_pushed: bool
    queue: str = "duejobs"


WINDOW_PAGE = text(
    f"""
    WITH page AS (
        SELECT s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at, s.queue,
               s.queue_job_id AS current, {_JOB_ID_SQL} AS job
        FROM scheduled_jobs s
        WHERE s.status = 'scheduled'
          AND s.due_at <= statement_timestamp() + CAST(:window AS interval)
          AND (s.due_at, s.id) > (CAST(:after_due AS timestamptz), CAST(:after_id AS uuid))
          -- a never-pushed row of a tenant with an in-flight quota is the scheduler's to
          -- push, when the quota leaves room
          AND (s.queue_job_id IS NOT NULL OR {_cap_sql("max_inflight", "s.tenant")} IS NULL)
        ORDER BY s.due_at, s.id
        FOR UPDATE SKIP LOCKED
        LIMIT :limit
    ), upd AS (
        UPDATE scheduled_jobs s
        SET queue_job_id = {_JOB_ID_SQL}, enqueued_at = statement_timestamp(),
            updated_at = statement_timestamp()
        WHERE s.id = ANY(ARRAY(SELECT id FROM page WHERE current IS DISTINCT FROM job))
        RETURNING s.id, s.tenant, s.version, s.queue_job_id
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'enqueued', version,
               jsonb_build_object('queue_job_id', queue_job_id, 'by', 'reconciler')
        FROM upd
    )
    SELECT id, tenant, version, attempt, due_at, job AS queue_job_id,
           current IS NOT NULL AS was_pushed, queue
    FROM page
    ORDER BY due_at, id
    """
)


def window_page(
    conn: Connection,
    window: timedelta,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[WindowRow]:
    """One page (keyset on ``due_at``, ``id``) of ``scheduled`` rows due within ``window``,
    locked (SKIP LOCKED), with their deterministic queue job id — recorded on the rows no
    scheduler has pushed yet (only those are written). The caller pushes them all; a live job
    is left alone."""
    # The origin precedes every instant a schedule can hold (the API refuses years before 1).
    after_due, after_id = after or (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))
    rows = _fast(
        conn,
        WINDOW_PAGE,
        {"window": window, "after_due": after_due, "after_id": after_id, "limit": limit},
    )
    return [
        WindowRow(
            r.id,
            r.tenant,
            r.version,
            r.attempt,
            r.due_at.astimezone(UTC),
            r.queue_job_id,
            r.was_pushed,
            r.queue,
        )
        for r in rows
    ]


def record_repushed(conn: Connection, rows: Sequence[WindowRow]) -> None:
    """History for rows whose queue job had vanished and was pushed again."""
    if rows:
        conn.execute(
            text(
                "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail) "
                "SELECT id, tenant, 'requeued', version, "
                "jsonb_build_object('reason', 'queue_job_missing', 'queue_job_id', job) "
                "FROM scheduled_jobs JOIN unnest(CAST(:ids AS uuid[]), CAST(:jobs AS text[])) "
                "AS r(rid, job) ON id = rid"
            ),
            {"ids": [r.id for r in rows], "jobs": [r.queue_job_id for r in rows]},
        )


RESCUE_EXPIRED = text(
    """
    WITH expired AS (
        SELECT id FROM scheduled_jobs
        WHERE status = 'running' AND lease_expires_at < statement_timestamp()
        ORDER BY lease_expires_at
        FOR UPDATE SKIP LOCKED
        LIMIT :limit
    ), upd AS (
        UPDATE scheduled_jobs s
        SET status = CASE WHEN s.attempts >= s.max_attempts THEN 'failed'
                          ELSE 'scheduled' END,
            queue_job_id = NULL,
            due_at = statement_timestamp(),
            lease_expires_at = NULL,
            last_error = 'attempt ' || s.attempts || ' abandoned: its worker stopped renewing '
                         || 'the lease',
            finished_at = CASE WHEN s.attempts >= s.max_attempts
                               THEN statement_timestamp() END,
            updated_at = statement_timestamp()
        WHERE s.id = ANY(ARRAY(SELECT id FROM expired))
        RETURNING s.id, s.tenant, s.version, s.attempts, s.status
    ), attempt AS (
        UPDATE scheduled_job_attempts a
        SET status = 'abandoned', finished_at = statement_timestamp(),
            error = 'the worker stopped renewing the lease'
        FROM upd
        WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = upd.attempts
          AND a.status = 'running'
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'abandoned', version,
               jsonb_build_object('attempt', attempts, 'then', status)
        FROM upd
        UNION ALL
        SELECT id, tenant, 'failed', version,
               jsonb_build_object('attempt', attempts, 'error', 'attempts exhausted')
        FROM upd WHERE status = 'failed'
    )
    SELECT status, count(*) AS n FROM upd GROUP BY status
    """
)


def rescue_expired(conn: Connection, limit: int) -> dict[str, int]:
    """Running rows whose lease expired (their worker is gone): the attempt is recorded as
    abandoned; the row goes back to ``scheduled`` (due now) or, with its attempts exhausted,
    to ``failed``. (A row scheduled by an App that did not know the type's handler has no
    ``max_attempts``: it goes back, and the worker fails it if no attempt is left.)
    Returns counts by new status."""
    return {r.status: int(r.n) for r in _fast(conn, RESCUE_EXPIRED, {"limit": limit})}


def schedule_states(
    conn: Connection, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[Status, int]]:
    """(status, version) of each id that exists (for telling orphan queue jobs)."""
    rows = conn.execute(
        text("SELECT id, status, version FROM scheduled_jobs WHERE id = ANY(CAST(:ids AS uuid[]))"),
        {"ids": list(ids)},
    )
    return {r.id: (Status(r.status), r.version) for r in rows}


@dataclass(frozen=True)
class OverdueRow:
    """A ``scheduled`` row already due, as stats check it against Redis."""

    queue_job_id: str | None  # None: not pushed yet
    due_at: datetime
    stuck: bool  # overdue by more than the ``stuck_after`` asked for


def overdue_rows(
    conn: Connection, limit: int, stuck_after: timedelta, tenant: str | None = None
) -> list[OverdueRow]:
    """``scheduled`` rows already due, oldest first (at most ``limit``; one tenant's)."""
    rows = conn.execute(
        text(
            "SELECT queue_job_id, due_at, "
            "due_at < statement_timestamp() - CAST(:stuck AS interval) AS stuck "
            f"FROM scheduled_jobs WHERE status = 'scheduled' AND {_TENANT} "
            "AND due_at <= statement_timestamp() ORDER BY due_at LIMIT :limit"
        ),
        {"limit": limit, "stuck": stuck_after, "tenant": tenant},
    )
    return [OverdueRow(r.queue_job_id, r.due_at.astimezone(UTC), r.stuck) for r in rows]
