"""Recurring definitions and their occurrences."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, text

from duejobs.models import (
    DstGap,
    DstOverlap,
    Misfire,
    Recurring,
    RecurringSpec,
)

# -- recurring schedules ---------------------------------------------------------------------

RECURRING_COLUMNS = (
    "id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace, "
    "status, version, next_run_at, created_at, updated_at, queue, last_error"
)


def _recurring(row: Row[Any]) -> Recurring:
    m = row._mapping
    return Recurring(
        id=m["id"],
        tenant=m["tenant"],
        name=m["name"],
        type=m["type"],
        payload=m["payload"],
        cron=m["cron"],
        timezone=m["timezone"],
        dst_gap=DstGap(m["dst_gap"]),
        dst_overlap=DstOverlap(m["dst_overlap"]),
        misfire=Misfire(m["misfire"]),
        grace=m["grace"],
        status=m["status"],
        version=m["version"],
        next_run_at=m["next_run_at"].astimezone(UTC),
        created_at=m["created_at"].astimezone(UTC),
        updated_at=m["updated_at"].astimezone(UTC),
        queue=m["queue"],
        last_error=m["last_error"],
    )


def get_recurring(
    conn: Connection, tenant: str | None, name: str, *, lock: bool = False
) -> Recurring | None:
    """The recurring schedule ``name`` of ``tenant`` (None: the default tenant's)."""
    row = conn.execute(
        text(
            f"SELECT {RECURRING_COLUMNS} FROM recurring_schedules "
            "WHERE tenant = :tenant AND name = :name" + (" FOR UPDATE" if lock else "")
        ),
        {"tenant": tenant, "name": name},
    ).first()
    return None if row is None else _recurring(row)


def save_recurring(
    conn: Connection, spec: RecurringSpec, next_run_at: datetime
) -> Recurring | None:
    """Create the definition, or replace it at version + 1 (the caller holds its lock); None
    when an active definition is already exactly this one — compared as PostgreSQL stores
    it (``jsonb`` payload, interval), so an identical call never bumps the version. A
    quarantined definition becomes active again."""
    row = conn.execute(
        text(
            f"""
            INSERT INTO recurring_schedules
                (id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap,
                 misfire, grace, next_run_at, queue)
            VALUES (:id, :tenant, :name, :type, CAST(:payload_json AS jsonb), :cron, :timezone,
                    :dst_gap, :dst_overlap, :misfire, :grace, :next_run_at, :queue)
            ON CONFLICT (tenant, name) DO UPDATE
            SET type = EXCLUDED.type, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
                queue = EXCLUDED.queue,
                timezone = EXCLUDED.timezone, dst_gap = EXCLUDED.dst_gap,
                dst_overlap = EXCLUDED.dst_overlap, misfire = EXCLUDED.misfire,
                grace = EXCLUDED.grace, next_run_at = EXCLUDED.next_run_at,
                version = recurring_schedules.version + 1, updated_at = statement_timestamp(),
                status = CASE WHEN recurring_schedules.status = 'error' THEN 'active'
                              ELSE recurring_schedules.status END,
                last_error = NULL
            WHERE (recurring_schedules.type, recurring_schedules.payload,
                   recurring_schedules.cron, recurring_schedules.timezone,
                   recurring_schedules.dst_gap, recurring_schedules.dst_overlap,
                   recurring_schedules.misfire, recurring_schedules.grace,
                   recurring_schedules.queue, recurring_schedules.status)
                  IS DISTINCT FROM
                  (EXCLUDED.type, EXCLUDED.payload, EXCLUDED.cron, EXCLUDED.timezone,
                   EXCLUDED.dst_gap, EXCLUDED.dst_overlap, EXCLUDED.misfire, EXCLUDED.grace,
                   EXCLUDED.queue, 'active')
            RETURNING {RECURRING_COLUMNS}
            """
        ),
        {"id": uuid.uuid4(), "next_run_at": next_run_at, **asdict(spec)},
    ).first()
    return None if row is None else _recurring(row)


def quarantine_recurring(conn: Connection, recurring_id: uuid.UUID, error: str) -> None:
    """Set aside a definition the scheduler could not evaluate: status ``error`` with the
    reason, and a ``quarantined`` event on the definition's id. An update or a resume makes
    it active again."""
    conn.execute(
        text(
            """
            WITH upd AS (
                UPDATE recurring_schedules
                SET status = 'error', last_error = :error, updated_at = statement_timestamp()
                WHERE id = :id
                RETURNING id, tenant, version
            )
            INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
            SELECT id, tenant, 'quarantined', version, jsonb_build_object('error', :error)
            FROM upd
            """
        ),
        {"id": recurring_id, "error": error},
    )


def set_recurring_status(
    conn: Connection, recurring_id: uuid.UUID, status: str, next_run_at: datetime | None
) -> Recurring:
    """Pause or resume, under a new version (occurrences made after a resume are new ones, not
    the cancelled ones of before); resuming restarts from ``next_run_at``."""
    row = conn.execute(
        text(
            "UPDATE recurring_schedules SET status = :status, version = version + 1, "
            "next_run_at = COALESCE(CAST(:next_run_at AS timestamptz), next_run_at), "
            f"updated_at = statement_timestamp() WHERE id = :id RETURNING {RECURRING_COLUMNS}"
        ),
        {"id": recurring_id, "status": status, "next_run_at": next_run_at},
    ).one()
    return _recurring(row)


def delete_recurring(conn: Connection, recurring_id: uuid.UUID) -> None:
    """Delete the definition; its occurrences keep their history (``recurring_id`` → NULL)."""
    conn.execute(text("DELETE FROM recurring_schedules WHERE id = :id"), {"id": recurring_id})


def cancel_occurrences(conn: Connection, recurring_id: uuid.UUID, reason: str) -> list[str]:
    """Cancel the occurrences still waiting to run; returns the queue jobs to discard."""
    rows = conn.execute(
        text(
            """
            WITH upd AS (
                UPDATE scheduled_jobs
                SET status = 'cancelled', version = version + 1,
                    finished_at = statement_timestamp(), updated_at = statement_timestamp()
                WHERE recurring_id = :rid AND status = 'scheduled'
                RETURNING id, tenant, version, queue_job_id
            ), event AS (
                INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
                SELECT id, tenant, 'cancelled', version,
                       jsonb_build_object('reason', CAST(:reason AS text))
                FROM upd
            )
            SELECT queue_job_id FROM upd WHERE queue_job_id IS NOT NULL
            """
        ),
        {"rid": recurring_id, "reason": reason},
    )
    return [r.queue_job_id for r in rows]


def due_recurring(conn: Connection, window: timedelta, limit: int) -> list[Recurring]:
    """Lock (SKIP LOCKED) active definitions whose next occurrence enters the window."""
    rows = conn.execute(
        text(
            f"SELECT {RECURRING_COLUMNS} FROM recurring_schedules "
            "WHERE status = 'active' "
            "AND next_run_at <= statement_timestamp() + CAST(:window AS interval) "
            "ORDER BY next_run_at FOR UPDATE SKIP LOCKED LIMIT :limit"
        ),
        {"window": window, "limit": limit},
    ).all()
    return [_recurring(r) for r in rows]


@dataclass(frozen=True)
class Occurrence:
    """One occurrence to materialize: its instant and, in its zone, its wall time."""

    run_at: datetime
    local_run_at: datetime


def insert_occurrences(
    conn: Connection, recurring: Recurring, occurrences: Sequence[Occurrence]
) -> int:
    """Insert occurrences as ordinary schedules under ids derived from (definition, version,
    instant); one already there (another scheduler made it) is left alone. Returns how many
    were new."""
    if not occurrences:
        return 0
    ids = [
        uuid.uuid5(recurring.id, f"v{recurring.version}:{o.run_at.isoformat()}")
        for o in occurrences
    ]
    row = conn.execute(
        text(
            """
            WITH new AS (
                INSERT INTO scheduled_jobs
                    (id, tenant, type, payload, run_at, due_at, timezone, local_run_at,
                     recurring_id, recurring_version, queue)
                SELECT o.id, :tenant, :type, CAST(:payload AS jsonb), o.run_at, o.run_at,
                       :timezone, o.local_run_at, :rid, :version, :queue
                FROM unnest(CAST(:ids AS uuid[]), CAST(:run_ats AS timestamptz[]),
                            CAST(:locals AS timestamp[])) AS o(id, run_at, local_run_at)
                ON CONFLICT DO NOTHING
                RETURNING id, tenant, version, run_at
            ), event AS (
                INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
                SELECT id, tenant, 'created', version,
                       jsonb_build_object('run_at', run_at, 'recurring', CAST(:name AS text),
                                          'recurring_version', CAST(:version AS integer))
                FROM new
            )
            SELECT count(*) FROM new
            """
        ),
        {
            "ids": ids,
            "run_ats": [o.run_at for o in occurrences],
            "locals": [o.local_run_at for o in occurrences],
            "tenant": recurring.tenant,
            "type": recurring.type,
            "payload": json.dumps(recurring.payload),
            "timezone": recurring.timezone,
            "rid": recurring.id,
            "version": recurring.version,
            "name": recurring.name,
            "queue": recurring.queue,
        },
    ).scalar_one()
    return int(row)


def advance_recurring(conn: Connection, recurring_id: uuid.UUID, next_run_at: datetime) -> None:
    """Record where the next materialization starts."""
    conn.execute(
        text("UPDATE recurring_schedules SET next_run_at = :next WHERE id = :id"),
        {"id": recurring_id, "next": next_run_at},
    )
