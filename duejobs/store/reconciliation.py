"""What the reconciler reads and writes: the window's rows, expired leases, states."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from duejobs.models import (
    Delivery,
    Status,
)
from duejobs.store.execution import run
from duejobs.store.rate_limits import NO_LIMITS, Limited

if TYPE_CHECKING:
    from sqlalchemy import Connection

# -- reconciliation --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WindowRow(Delivery):
    """A ``scheduled`` row inside the window, as the reconciler checks it against Redis."""

    was_pushed: bool  # a scheduler had pushed it (else the reconciler is the first to)


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
    rows = run(
        conn,
        "window_page",
        {"window": window, "after_due": after_due, "after_id": after_id, "limit": limit},
    )
    return [WindowRow.of(r, was_pushed=r.was_pushed) for r in rows]


def pending_deliveries(conn: Connection, jobs: Sequence[tuple[str, uuid.UUID]]) -> list[Delivery]:
    """Of the queue jobs ``jobs`` — (job id, its schedule id) — those whose schedule is
    ``scheduled`` and still names that job: the deliveries they stand for."""
    if not jobs:
        return []
    params = {"ids": [s for _, s in jobs], "jobs": [j for j, _ in jobs]}
    return [Delivery.of(r) for r in run(conn, "pending_deliveries", params)]


def record_repushed(conn: Connection, rows: Sequence[WindowRow]) -> None:
    """History for rows whose queue job had vanished and was pushed again."""
    if rows:
        run(
            conn,
            "record_repushed",
            {"ids": [r.schedule_id for r in rows], "jobs": [r.job_id for r in rows]},
        )


@dataclass(frozen=True)
class Rescued:
    """What one rescue did: rows rescued, by their new status; and the running rows past their
    lease that it could not take because a transaction held them locked (None when the batch
    was full: the rest may merely have waited for the next one)."""

    by_status: dict[str, int]
    locked: int | None


def rescue_expired(conn: Connection, limit: int) -> Rescued:
    """Running rows whose lease expired (their worker is gone): the attempt is recorded as
    abandoned; the row goes back to ``scheduled`` (due now) or, with its attempts exhausted,
    to ``failed``. (A row scheduled by an App that did not know the type's handler has no
    ``max_attempts``: it goes back, and the worker fails it if no attempt is left.)
    Rows locked by another transaction are skipped, never waited for, and counted."""
    counts = {r.status: int(r.n) for r in run(conn, "rescue_expired", {"limit": limit})}
    past_lease = counts.pop("past_lease", 0)
    rescued = sum(counts.values())
    return Rescued(counts, past_lease - rescued if rescued < limit else None)


def schedule_states(
    conn: Connection, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[Status, int]]:
    """(status, version) of each id that exists (for telling orphan queue jobs)."""
    rows = run(conn, "schedule_states", {"ids": list(ids)})
    return {r.id: (Status(r.status), r.version) for r in rows}


def schedule_tenants(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The tenant of each id that exists (whose an orphan queue job is)."""
    return {r.id: r.tenant for r in run(conn, "schedule_tenants", {"ids": list(ids)})}


@dataclass(frozen=True)
class OverdueRow:
    """A ``scheduled`` row already due, as stats check it against Redis."""

    queue_job_id: str | None  # None: not pushed yet
    due_at: datetime
    stuck: bool  # overdue by more than the ``stuck_after`` asked for
    queue: str | None  # its RQ queue (None: the App's default)


def overdue_rows(
    conn: Connection,
    limit: int,
    stuck_after: timedelta,
    tenant: str | None = None,
    limited: Limited = NO_LIMITS,
) -> list[OverdueRow]:
    """``scheduled`` rows already due, oldest first (at most ``limit``; one tenant's), but
    those waiting unpushed under one of ``limited``."""
    params = {"limit": limit, "stuck": stuck_after, "tenant": tenant, **limited.params()}
    rows = run(conn, "overdue_rows", params)
    return [OverdueRow(r.queue_job_id, r.due_at.astimezone(UTC), r.stuck, r.queue) for r in rows]
