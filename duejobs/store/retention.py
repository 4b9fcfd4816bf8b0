"""Retention: finished schedules deleted with their history, in batches."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import Connection

from duejobs.store.execution import run_count

# -- retention -------------------------------------------------------------------------------


_NONE = (uuid.UUID(int=0), uuid.UUID(int=0))


def prune_finished(
    conn: Connection,
    older_than: timedelta,
    limit: int,
    waiting: tuple[uuid.UUID, uuid.UUID] = _NONE,
) -> int:
    """Delete up to ``limit`` schedules that finished (succeeded, failed, cancelled) longer
    than ``older_than`` ago, with their events, attempts and effects, except those whose id
    is within ``waiting`` (from, to): a range left for its drop. Never a live row."""
    params = {"age": older_than, "limit": limit, "wait_from": waiting[0], "wait_to": waiting[1]}
    return run_count(conn, "prune_finished", params)
