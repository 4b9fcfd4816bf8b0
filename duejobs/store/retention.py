"""Retention: finished schedules deleted with their history, in batches."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection

from duejobs.store.execution import run_count

# -- retention -------------------------------------------------------------------------------


def prune_finished(conn: Connection, older_than: timedelta, limit: int) -> int:
    """Delete up to ``limit`` schedules that finished (succeeded, failed, cancelled) longer
    than ``older_than`` ago, with their events, attempts and effects. Never a live row."""
    return run_count(conn, "prune_finished", {"age": older_than, "limit": limit})
