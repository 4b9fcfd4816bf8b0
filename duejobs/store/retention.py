"""Retention: finished schedules deleted with their history, in batches."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from duejobs.store.execution import run, run_count

if TYPE_CHECKING:
    from sqlalchemy import Connection

# -- retention -------------------------------------------------------------------------------


def prune_finished(
    conn: Connection,
    older_than: timedelta,
    limit: int,
    within: tuple[uuid.UUID, uuid.UUID] | None = None,
) -> int:
    """Delete up to ``limit`` schedules that finished (succeeded, failed, cancelled) longer
    than ``older_than`` ago, with their events, attempts and effects; with ``within`` (the
    lowest and highest id, both included), only those among its ids. Never a live row."""
    params = {"age": older_than, "limit": limit}
    if within is None:
        return run_count(conn, "prune_finished", params)
    run(conn, "custom_plans_only")
    return run_count(conn, "prune_finished_within", {**params, "low": within[0], "high": within[1]})
