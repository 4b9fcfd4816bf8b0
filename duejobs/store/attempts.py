"""A worker's attempt: claim, lease, effect ledger, finish, stale and deferred records."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from duejobs.models import (
    EventKind,
    Status,
)
from duejobs.store.execution import _fast

# -- the delivery path: worker ---------------------------------------------------------------


class SkipReason(enum.StrEnum):
    """Why a worker did not run a delivery."""

    MISSING = "missing"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    DUPLICATE = "duplicate"
    NOT_DUE = "not_due"
    EXPIRED = "expired"


@dataclass(frozen=True)
class RunClaim:
    """What the worker learned when it tried to claim a delivery."""

    skip: SkipReason | None
    type: str = ""
    payload: Any = None
    run_at: datetime | None = None
    due_at: datetime | None = None
    db_now: datetime | None = None


_CLAIM_RUN = text(
    """
    WITH cur AS (
        SELECT id, tenant, type, version, status, attempts, run_at, due_at, payload,
               expires_after
        FROM scheduled_jobs
        WHERE id = :id AND tenant = :tenant
        FOR UPDATE
    ), verdict AS (
        SELECT cur.*,
               CASE WHEN status = 'cancelled' THEN 'cancelled'
                    WHEN version <> :version THEN 'superseded'
                    WHEN status <> 'scheduled' OR attempts <> :attempt - 1 THEN 'duplicate'
                    WHEN due_at > statement_timestamp() THEN 'not_due'
                    WHEN due_at + expires_after < statement_timestamp() THEN 'expired'
               END AS reason
        FROM cur
    ), upd AS (
        UPDATE scheduled_jobs s
        SET status = 'running', attempts = :attempt, started_at = statement_timestamp(),
            lease_expires_at = statement_timestamp() + CAST(:lease AS interval),
            updated_at = statement_timestamp()
        FROM verdict v
        WHERE s.id = :id AND s.id = v.id AND v.reason IS NULL
        RETURNING s.id, s.tenant, s.version, s.due_at, s.run_at, s.type
    ), attempt AS (
        INSERT INTO scheduled_job_attempts (schedule_id, tenant, version, attempt, status, worker)
        SELECT id, tenant, version, :attempt, 'running', :worker FROM upd
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'started', version,
               jsonb_build_object(
                   'attempt', :attempt, 'worker', :worker, 'type', type,
                   'lag_ms', round(extract(epoch FROM statement_timestamp() - due_at) * 1000))
        FROM upd
        UNION ALL
        SELECT id, tenant, 'skipped', version,
               jsonb_build_object('reason', reason, 'delivered_version', :version,
                                  'attempt', :attempt, 'worker', :worker)
        FROM verdict
        WHERE reason IN ('cancelled', 'superseded', 'duplicate', 'expired')
    )
    SELECT type, payload, run_at, due_at, reason, statement_timestamp() AS db_now FROM verdict
    """
)


def claim_run(
    conn: Connection,
    *,
    schedule_id: uuid.UUID,
    tenant: str,
    version: int,
    attempt: int,
    worker: str,
    lease: timedelta,
) -> RunClaim:
    """Turn a delivery into a running attempt, in one statement, or say why not.

    Runs only if the row (of that tenant) is ``scheduled`` at the delivered version, this is
    the next attempt, and the database clock has reached ``due_at``. Skips other than
    ``not_due`` are recorded as events in the same statement.
    """
    rows = _fast(
        conn,
        _CLAIM_RUN,
        {
            "id": schedule_id,
            "tenant": tenant,
            "version": version,
            "attempt": attempt,
            "worker": worker,
            "lease": lease,
        },
    )
    if not rows:
        return RunClaim(skip=SkipReason.MISSING)
    row = rows[0]
    return RunClaim(
        skip=SkipReason(row.reason) if row.reason else None,
        type=row.type,
        payload=row.payload,
        run_at=row.run_at.astimezone(UTC),
        due_at=row.due_at.astimezone(UTC),
        db_now=row.db_now.astimezone(UTC),
    )


_DEFERRED = text(
    """
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'requeued', version,
           jsonb_build_object('reason', 'not_due', 'due_at', due_at, 'attempt', :attempt)
    FROM scheduled_jobs
    WHERE id = :id AND version = :version AND status = 'scheduled'
    """
)


def expire(conn: Connection, schedule_id: uuid.UUID, version: int) -> None:
    """Cancel a schedule whose delivery came later than its ``expires_after`` allows."""
    conn.execute(
        text(
            "UPDATE scheduled_jobs SET status = 'cancelled', version = version + 1, "
            "finished_at = statement_timestamp(), updated_at = statement_timestamp(), "
            "last_error = 'expired: due ' || due_at || ', allowed ' || expires_after || ' late' "
            "WHERE id = :id AND version = :version AND status = 'scheduled'"
        ),
        {"id": schedule_id, "version": version},
    )


def record_deferred(conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int) -> None:
    """Record that an early delivery was put back for its ``due_at`` (no attempt used)."""
    conn.execute(_DEFERRED, {"id": schedule_id, "version": version, "attempt": attempt})


_CURRENT = """
    SELECT status, version, attempts FROM scheduled_jobs WHERE id = :id
"""


def change_since_claim(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, *, lock: bool = False
) -> SkipReason | None:
    """None while the attempt is still the current one; otherwise what changed.
    With ``lock`` the row stays locked until the transaction ends (the effect fence)."""
    row = conn.execute(
        text(_CURRENT + (" FOR UPDATE" if lock else "")), {"id": schedule_id}
    ).first()
    if row is None:
        return SkipReason.MISSING
    if row.status == "cancelled":
        return SkipReason.CANCELLED
    if row.version != version:
        return SkipReason.SUPERSEDED
    if row.status != "running" or row.attempts != attempt:
        return SkipReason.DUPLICATE
    return None


def extend_lease(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, lease: timedelta
) -> bool:
    """Push the running attempt's lease forward; False when it is no longer current."""
    result = conn.execute(
        text(
            "UPDATE scheduled_jobs "
            "SET lease_expires_at = statement_timestamp() + CAST(:lease AS interval) "
            "WHERE id = :id AND version = :version AND attempts = :attempt "
            "AND status = 'running'"
        ),
        {"id": schedule_id, "version": version, "attempt": attempt, "lease": lease},
    )
    return result.rowcount == 1


def record_effect(
    conn: Connection, effect_key: str, schedule_id: uuid.UUID, tenant: str, version: int
) -> bool:
    """Insert the effect key; False if it was already recorded (the effect happened)."""
    row = conn.execute(
        text(
            "INSERT INTO scheduled_job_effects (effect_key, schedule_id, tenant, version) "
            "VALUES (:key, :id, :tenant, :version) ON CONFLICT (effect_key) DO NOTHING "
            "RETURNING 1"
        ),
        {"key": effect_key, "id": schedule_id, "tenant": tenant, "version": version},
    ).first()
    return row is not None


_FINISH = text(
    """
    WITH upd AS (
        UPDATE scheduled_jobs
        SET status = CAST(:status AS text),
            due_at = CASE WHEN CAST(:retry_in AS interval) IS NULL THEN due_at
                          ELSE statement_timestamp() + CAST(:retry_in AS interval) END,
            queue_job_id = CASE WHEN :status = 'scheduled' THEN NULL ELSE queue_job_id END,
            finished_at = CASE WHEN :status = 'scheduled' THEN NULL
                               ELSE statement_timestamp() END,
            last_error = CAST(:error AS text),
            lease_expires_at = NULL,
            updated_at = statement_timestamp()
        WHERE id = :id AND version = :version AND attempts = :attempt AND status = 'running'
        RETURNING id, tenant, version, due_at
    ), attempt AS (
        UPDATE scheduled_job_attempts a
        SET status = CASE WHEN :status = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
            finished_at = statement_timestamp(), error = CAST(:error AS text),
            next_attempt_at = CASE WHEN :status = 'scheduled' THEN upd.due_at END
        FROM upd
        WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = :attempt
    )
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, CAST(:event AS text), version,
           jsonb_strip_nulls(jsonb_build_object(
               'attempt', :attempt, 'error', CAST(:error AS text),
               'next_attempt_at', CASE WHEN :status = 'scheduled' THEN due_at END))
    FROM upd
    RETURNING 1
    """
)


def finish(
    conn: Connection,
    schedule_id: uuid.UUID,
    version: int,
    attempt: int,
    *,
    outcome: Status,
    error: str | None = None,
    retry_in: timedelta | None = None,
) -> bool:
    """Close the running attempt: ``succeeded``, ``failed``, or back to ``scheduled`` for a
    retry after ``retry_in`` (``run_at`` never moves). False when the attempt was no longer
    current — the schedule was cancelled, rescheduled or rescued meanwhile."""
    event = {
        Status.SUCCEEDED: EventKind.SUCCEEDED,
        Status.FAILED: EventKind.FAILED,
        Status.SCHEDULED: EventKind.RETRIED,
    }[outcome]
    rows = _fast(
        conn,
        _FINISH,
        {
            "id": schedule_id,
            "version": version,
            "attempt": attempt,
            "status": outcome.value,
            "event": event.value,
            "error": error,
            "retry_in": retry_in,
        },
    )
    return bool(rows)


_STALE = text(
    """
    WITH att AS (
        UPDATE scheduled_job_attempts
        SET status = 'stale', finished_at = statement_timestamp(), error = :reason
        WHERE schedule_id = :id AND version = :version AND attempt = :attempt
          AND status = 'running'
        RETURNING schedule_id, tenant
    )
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT schedule_id, tenant, 'skipped', :version,
           jsonb_build_object('reason', :reason, 'attempt', :attempt, 'while', 'running')
    FROM att
    """
)


def record_stale(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, reason: SkipReason
) -> None:
    """Record that a running attempt lost its schedule (cancelled, superseded, rescued):
    its result is not applied, and the history says so."""
    conn.execute(
        _STALE,
        {"id": schedule_id, "version": version, "attempt": attempt, "reason": reason.value},
    )
