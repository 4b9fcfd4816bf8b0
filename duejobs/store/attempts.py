"""A worker's attempt: claim, lease, effect ledger, finish, stale and deferred records."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from duejobs.models import (
    EventKind,
    Status,
)
from duejobs.store.execution import run, run_count, run_one

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
    row = run_one(
        conn,
        "claim_run",
        {
            "id": schedule_id,
            "tenant": tenant,
            "version": version,
            "attempt": attempt,
            "worker": worker,
            "lease": lease,
            "current_status": Status.SCHEDULED.value,
            "current_attempts": attempt - 1,
        },
    )
    if row is None:
        return RunClaim(skip=SkipReason.MISSING)
    return RunClaim(
        skip=SkipReason(row.reason) if row.reason else None,
        type=row.type,
        payload=row.payload,
        run_at=row.run_at.astimezone(UTC),
        due_at=row.due_at.astimezone(UTC),
        db_now=row.db_now.astimezone(UTC),
    )


def expire(conn: Connection, schedule_id: uuid.UUID, version: int) -> None:
    """Cancel a schedule whose delivery came later than its ``expires_after`` allows."""
    run(conn, "expire", {"id": schedule_id, "version": version})


def record_deferred(conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int) -> None:
    """Record that an early delivery was put back for its ``due_at`` (no attempt used)."""
    run(conn, "record_deferred", {"id": schedule_id, "version": version, "attempt": attempt})


def change_since_claim(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, *, lock: bool = False
) -> SkipReason | None:
    """None while the attempt is still the current one; otherwise what changed.
    With ``lock`` the row stays locked until the transaction ends (the effect fence)."""
    row = run_one(
        conn,
        "change_since_claim_locked" if lock else "change_since_claim",
        {
            "id": schedule_id,
            "version": version,
            "current_status": Status.RUNNING.value,
            "current_attempts": attempt,
        },
    )
    if row is None:
        return SkipReason.MISSING
    return None if row.reason is None else SkipReason(row.reason)


def extend_leases(
    conn: Connection, attempts: Sequence[tuple[uuid.UUID, int, int]], lease: timedelta
) -> None:
    """Push forward the leases of running attempts — (schedule id, version, attempt) — in one
    statement; those no longer current, or whose row is locked now, are left as they are."""
    params = {
        "ids": [a[0] for a in attempts],
        "versions": [a[1] for a in attempts],
        "attempts": [a[2] for a in attempts],
        "lease": lease,
    }
    run_count(conn, "extend_leases", params)


def record_effect(
    conn: Connection, effect_key: str, schedule_id: uuid.UUID, tenant: str, version: int
) -> bool:
    """Insert the effect key; False if it was already recorded (the effect happened)."""
    params = {"key": effect_key, "id": schedule_id, "tenant": tenant, "version": version}
    return run_one(conn, "record_effect", params) is not None


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
    rows = run(
        conn,
        "finish",
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


def record_stale(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, reason: SkipReason
) -> None:
    """Record that a running attempt lost its schedule (cancelled, superseded, rescued):
    its result is not applied, and the history says so."""
    run(
        conn,
        "record_stale",
        {"id": schedule_id, "version": version, "attempt": attempt, "reason": reason.value},
    )


def bookkeeping_session(conn: Connection, lock_timeout: timedelta, durable: bool) -> None:
    """Set up a worker's bookkeeping connection (see the query ``bookkeeping_session``)."""
    run(
        conn,
        "bookkeeping_session",
        {
            "lock_timeout": f"{max(1, int(lock_timeout.total_seconds() * 1000))}ms",
            "synchronous_commit": "on" if durable else "off",
        },
    )


def bounded_locks(conn: Connection) -> None:
    """Give up on row locks after a second, until this transaction ends."""
    run(conn, "bounded_locks")
