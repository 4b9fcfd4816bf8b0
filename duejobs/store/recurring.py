"""Recurring definitions and their occurrences."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from duejobs.ids import stamped
from duejobs.models import (
    DstGap,
    DstOverlap,
    Misfire,
    Occurrence,
    QueueJob,
    Recurring,
    RecurringSpec,
    RecurringStatus,
)
from duejobs.store.execution import record, run, run_one

if TYPE_CHECKING:
    from sqlalchemy import Connection

# -- recurring schedules ---------------------------------------------------------------------


def _recurring(m: Any) -> Recurring:
    return record(
        Recurring,
        m,
        dst_gap=DstGap(m.dst_gap),
        dst_overlap=DstOverlap(m.dst_overlap),
        misfire=Misfire(m.misfire),
        status=RecurringStatus(m.status),
    )


def list_recurring(conn: Connection, tenant: str | None, limit: int) -> list[Recurring]:
    """The recurring schedules of ``tenant`` (None: every tenant's), by tenant and name."""
    return [_recurring(r) for r in run(conn, "list_recurring", {"tenant": tenant, "limit": limit})]


def get_recurring(
    conn: Connection, tenant: str | None, name: str, *, lock: bool = False
) -> Recurring | None:
    """The recurring schedule ``name`` of ``tenant`` (None: the default tenant's)."""
    query = "get_recurring_locked" if lock else "get_recurring"
    row = run_one(conn, query, {"tenant": tenant, "name": name})
    return None if row is None else _recurring(row)


def save_recurring(
    conn: Connection, spec: RecurringSpec, next_run_at: datetime
) -> Recurring | None:
    """Create the definition, or replace it at version + 1 (the caller holds its lock); None
    when an active definition is already exactly this one — compared as PostgreSQL stores
    it (``jsonb`` payload, interval), so an identical call never bumps the version. A
    quarantined definition becomes active again."""
    row = run_one(
        conn,
        "save_recurring",
        {"id": uuid.uuid4(), "next_run_at": next_run_at, **asdict(spec)},
    )
    return None if row is None else _recurring(row)


def quarantine_recurring(conn: Connection, recurring_id: uuid.UUID, error: str) -> None:
    """Set aside a definition the scheduler could not evaluate: status ``error`` with the
    reason, and a ``quarantined`` event on the definition's id. An update or a resume makes
    it active again."""
    run(conn, "quarantine_recurring", {"id": recurring_id, "error": error})


def set_recurring_status(
    conn: Connection,
    recurring_id: uuid.UUID,
    status: RecurringStatus,
    next_run_at: datetime | None,
) -> Recurring:
    """Pause or resume, under a new version (occurrences made after a resume are new ones, not
    the cancelled ones of before); resuming restarts from ``next_run_at``."""
    row = run_one(
        conn,
        "set_recurring_status",
        {"id": recurring_id, "status": status, "next_run_at": next_run_at},
    )
    assert row is not None  # the caller holds the definition's lock
    return _recurring(row)


def delete_recurring(conn: Connection, recurring_id: uuid.UUID) -> None:
    """Delete the definition; its occurrences keep their history (``recurring_id`` → NULL)."""
    run(conn, "delete_recurring", {"id": recurring_id})


def cancel_occurrences(conn: Connection, recurring_id: uuid.UUID, reason: str) -> list[QueueJob]:
    """Cancel the occurrences still waiting to run; returns the queue jobs to discard."""
    rows = run(conn, "cancel_occurrences", {"rid": recurring_id, "reason": reason})
    return [QueueJob(r.queue_job_id, r.queue) for r in rows]


def due_recurring(conn: Connection, window: timedelta, limit: int) -> list[Recurring]:
    """Lock (SKIP LOCKED) active definitions whose next occurrence enters the window."""
    rows = run(conn, "due_recurring", {"window": window, "limit": limit})
    return [_recurring(r) for r in rows]


def insert_occurrences(
    conn: Connection, recurring: Recurring, occurrences: Sequence[Occurrence]
) -> int:
    """Insert occurrences as ordinary schedules under ids derived from (definition, version,
    instant); one already there (another scheduler made it) is left alone. Returns how many
    were new."""
    if not occurrences:
        return 0
    ids = [
        stamped(uuid.uuid5(recurring.id, f"v{recurring.version}:{o.run_at.isoformat()}"), o.run_at)
        for o in occurrences
    ]
    row = run_one(
        conn,
        "insert_occurrences",
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
            "priority": recurring.priority,
        },
    )
    assert row is not None
    return int(row.created)


def advance_recurring(conn: Connection, recurring_id: uuid.UUID, next_run_at: datetime) -> None:
    """Record where the next materialization starts."""
    run(conn, "advance_recurring", {"id": recurring_id, "next": next_run_at})
