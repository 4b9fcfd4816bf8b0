"""Results: what a task returned and what its attempts raised, kept beside its schedule for
readers that ask after the fact (Django's ``TaskResult``)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from duejobs.store.execution import run, run_one

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a schedule, as its outcome reader needs it."""

    worker: str | None
    status: str
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class StoredResult:
    """A schedule's stored return value (JSON text, or None), its errors (oldest first) and
    its attempts."""

    return_value: Any
    errors: list[dict[str, Any]]
    attempts: list[AttemptRecord]


def save_return_value(conn: Connection, schedule_id: uuid.UUID, tenant: str, value: str) -> None:
    """Keep ``value`` (JSON text, already checked) as the schedule's return value."""
    run(conn, "save_return_value", {"id": schedule_id, "tenant": tenant, "value": value})


def add_error(conn: Connection, schedule_id: uuid.UUID, tenant: str, error: dict[str, str]) -> None:
    """Append one attempt's error (a JSON object) to the schedule's errors."""
    run(conn, "add_error", {"id": schedule_id, "tenant": tenant, "error": json.dumps(error)})


def outcome_of(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> StoredResult:
    """The schedule's return value, errors and attempts (empty when it has none)."""
    row = run_one(conn, "outcome_of", {"id": schedule_id, "tenant": tenant})
    assert row is not None  # one row, joined or not
    attempts = [
        AttemptRecord(
            a["worker"],
            a["status"],
            datetime.fromisoformat(a["started_at"]),
            datetime.fromisoformat(a["finished_at"]) if a["finished_at"] else None,
        )
        for a in row.attempts
    ]
    return StoredResult(row.return_value, list(row.errors or []), attempts)
