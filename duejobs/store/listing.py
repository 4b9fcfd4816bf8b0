"""Listing: pages of schedules by filter, read from a cursor in ``(due_at, id)`` order."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from duejobs.models import Schedule, Status
from duejobs.store.execution import run
from duejobs.store.schedules import as_schedule

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class ListFilter:
    """What a list keeps (None: no filter on that field). ``tenant`` None is every tenant."""

    tenant: str | None = None
    statuses: Sequence[Status] | None = None
    type: str | None = None
    key: str | None = None
    queue: str | None = None
    due_from: datetime | None = None
    due_before: datetime | None = None
    recurring: str | None = None


@dataclass(frozen=True)
class Position:
    """Where a page ends: the ``(due_at, id)`` of its last schedule."""

    due_at: datetime
    id: uuid.UUID

    _EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

    def encode(self) -> str:
        """An opaque cursor: microseconds since the epoch and the id, exact both ways."""
        micros = (self.due_at - self._EPOCH) // timedelta(microseconds=1)
        return f"{micros}.{self.id.hex}"

    @classmethod
    def decode(cls, cursor: str) -> Position:
        """The position a cursor names; ValueError for anything :meth:`encode` did not make."""
        micros, _, hexid = cursor.partition(".")
        return cls(cls._EPOCH + timedelta(microseconds=int(micros)), uuid.UUID(hex=hexid))


def list_schedules(
    conn: Connection,
    kept: ListFilter,
    after: Position | None,
    limit: int,
    latest_first: bool = False,
) -> list[Schedule]:
    """Up to ``limit`` schedules that ``kept`` keeps, past ``after`` in ``(due_at, id)``
    order (descending with ``latest_first``)."""
    params: dict[str, Any] = {
        "tenant": kept.tenant,
        "statuses": None if kept.statuses is None else [s.value for s in kept.statuses],
        "type": kept.type,
        "key": kept.key,
        "queue": kept.queue,
        "due_from": kept.due_from,
        "due_before": kept.due_before,
        "recurring_ids": None,
        "after_due": None if after is None else after.due_at,
        "after_id": None if after is None else after.id,
        "limit": limit,
    }
    if kept.recurring is not None:
        found = run(conn, "recurring_ids", {"name": kept.recurring, "tenant": kept.tenant})
        params["recurring_ids"] = [row.id for row in found]
    name = "list_schedules_latest_first" if latest_first else "list_schedules"
    return [as_schedule(row) for row in run(conn, name, params)]
