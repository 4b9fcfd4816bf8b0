"""Observability figures: live counts, recent activity, outcomes and lag."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from duejobs.models import (
    EventKind,
    Status,
)
from duejobs.store.execution import _TENANT, _utc

# -- observability ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveFigures:
    """Live rows of one tenant, one type, or all (``None`` means "all")."""

    tenant: str | None
    type: str | None
    scheduled: int
    running: int
    overdue: int
    late: int
    oldest_overdue: datetime | None
    pushed: int  # scheduled rows whose job is in Redis

    @property
    def in_flight(self) -> int:
        """Pushed to Redis or running: what an in-flight quota caps."""
        return self.pushed + self.running


LIVE_FIGURES = text(
    f"""
    WITH live AS (
        SELECT tenant, type, status, due_at, queue_job_id IS NOT NULL AS pushed
        FROM scheduled_jobs WHERE status = 'scheduled' AND {_TENANT}
        UNION ALL
        SELECT tenant, type, status, due_at, false FROM scheduled_jobs
        WHERE status = 'running' AND {_TENANT}
    )
    SELECT CASE WHEN GROUPING(tenant) = 0 THEN tenant END AS tenant,
           CASE WHEN GROUPING(type) = 0 THEN type END AS type,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'scheduled' AND due_at <= statement_timestamp())
               AS overdue,
           count(*) FILTER (WHERE status = 'scheduled'
                            AND due_at < statement_timestamp() - CAST(:late AS interval))
               AS late,
           min(due_at) FILTER (WHERE status = 'scheduled' AND due_at <= statement_timestamp())
               AS oldest_overdue,
           count(*) FILTER (WHERE pushed) AS pushed
    FROM live
    GROUP BY GROUPING SETS ((), (tenant), (type))
    """
)


def live_figures(
    conn: Connection, late_after: timedelta, tenant: str | None = None
) -> list[LiveFigures]:
    """Counts over live rows only (two partial-index scans), overall, per tenant, per type;
    one tenant's alone when ``tenant`` is given. Cost follows the live rows, never the
    finished history."""
    rows = conn.execute(LIVE_FIGURES, {"late": late_after, "tenant": tenant})
    return [
        LiveFigures(
            r.tenant,
            r.type,
            r.scheduled,
            r.running,
            r.overdue,
            r.late,
            _utc(r.oldest_overdue),
            r.pushed,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class Activity:
    """History of the last ``since``, overall, per tenant or per type (``None``: all)."""

    tenant: str | None
    type: str | None
    counts: dict[str, int]
    lag_ms: dict[str, float | None]


_COUNT_BY_KIND = ", ".join(
    f"count(*) FILTER (WHERE kind = '{k.value}') AS {k.value}" for k in EventKind
)
_ACTIVITY = text(
    f"""
    SELECT GROUPING(tenant, detail->>'type') AS level,
           CASE WHEN GROUPING(tenant) = 0 THEN tenant END AS tenant,
           CASE WHEN GROUPING(detail->>'type') = 0 THEN detail->>'type' END AS type,
           {_COUNT_BY_KIND},
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
               (ORDER BY CAST(detail->>'lag_ms' AS double precision))
               FILTER (WHERE kind = 'started') AS lag,
           max(CAST(detail->>'lag_ms' AS double precision)) FILTER (WHERE kind = 'started')
               AS lag_max
    FROM scheduled_job_events
    WHERE at >= statement_timestamp() - CAST(:since AS interval) AND {_TENANT}
    GROUP BY GROUPING SETS ((), (tenant), (detail->>'type'))
    """
)


def activity(conn: Connection, since: timedelta, tenant: str | None = None) -> list[Activity]:
    """Events of the last ``since`` by kind, and the lag from due time to start
    (p50/p95/p99/max, ms). Reads only that window of the history (BRIN index on time)."""
    result: list[Activity] = []
    for r in conn.execute(_ACTIVITY, {"since": since, "tenant": tenant}):
        m = r._mapping
        if m["level"] == 2 and m["type"] is None:
            continue  # events that carry no type (all but `started`), in the per-type set
        lag = m["lag"] or [None, None, None]
        result.append(
            Activity(
                tenant=m["tenant"],
                type=m["type"],
                counts={k.value: int(m[k.value]) for k in EventKind},
                lag_ms={"p50": lag[0], "p95": lag[1], "p99": lag[2], "max": m["lag_max"]},
            )
        )
    return result


def status_counts(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """How many of these schedules are in each status."""
    rows = conn.execute(
        text(
            "SELECT status, count(*) FROM scheduled_jobs "
            "WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status"
        ),
        {"ids": list(ids)},
    )
    return {status: int(n) for status, n in rows}


@dataclass(frozen=True)
class ScheduleOutcome:
    """What became of one schedule, from its row, its history and the effect ledger."""

    id: uuid.UUID
    status: Status
    version: int
    attempts: int
    effects: int  # rows in the effect ledger
    starts: int  # `started` events
    early: int  # `started` events before its run_at (database clock)
    started_version: int | None  # the lowest version that ever started


_OUTCOMES = text(
    """
    SELECT s.id, s.status, s.version, s.attempts,
           (SELECT count(*) FROM scheduled_job_effects f WHERE f.schedule_id = s.id) AS effects,
           (SELECT count(*) FROM scheduled_job_events e
            WHERE e.schedule_id = s.id AND e.kind = 'started') AS starts,
           (SELECT count(*) FROM scheduled_job_events e
            WHERE e.schedule_id = s.id AND e.kind = 'started' AND e.at < s.run_at) AS early,
           (SELECT min(e.version) FROM scheduled_job_events e
            WHERE e.schedule_id = s.id AND e.kind = 'started') AS started_version
    FROM scheduled_jobs s WHERE s.id = ANY(CAST(:ids AS uuid[]))
    """
)


def outcomes(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, ScheduleOutcome]:
    """What became of each of these schedules (the demo's checks)."""
    return {
        r.id: ScheduleOutcome(r.id, Status(r.status), *r[2:])
        for r in conn.execute(_OUTCOMES, {"ids": list(ids)})
    }


_START_LAG = text(
    """
    SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
               (ORDER BY CAST(detail->>'lag_ms' AS double precision))
    FROM scheduled_job_events WHERE kind = 'started' AND schedule_id = ANY(CAST(:ids AS uuid[]))
    """
)


def start_lag(conn: Connection, ids: Sequence[uuid.UUID]) -> tuple[float | None, float | None]:
    """p50 and p99 of these schedules' lag from due time to start (ms)."""
    lag = conn.execute(_START_LAG, {"ids": list(ids)}).scalar_one()
    return (lag[0], lag[1]) if lag else (None, None)
