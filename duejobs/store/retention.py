"""Retention: finished schedules deleted with their history, in batches."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, text

# -- retention -------------------------------------------------------------------------------

_PRUNE = text(
    """
    WITH old AS (
        SELECT id FROM scheduled_jobs
        WHERE status IN ('succeeded', 'failed', 'cancelled')
          AND finished_at < statement_timestamp() - CAST(:age AS interval)
        ORDER BY finished_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), events AS (  -- events carry no foreign key (see migration 0003): delete them here
        DELETE FROM scheduled_job_events WHERE schedule_id = ANY(ARRAY(SELECT id FROM old))
    )
    DELETE FROM scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))
    """
)


def prune_finished(conn: Connection, older_than: timedelta, limit: int) -> int:
    """Delete up to ``limit`` schedules that finished (succeeded, failed, cancelled) longer
    than ``older_than`` ago, with their events, attempts and effects. Never a live row."""
    return int(conn.execute(_PRUNE, {"age": older_than, "limit": limit}).rowcount)
