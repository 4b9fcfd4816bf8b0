"""Observability figures: live counts, recent activity, outcomes and lag."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from duejobs.models import (
    EventKind,
    Status,
)
from duejobs.store.execution import _utc, run, run_one, schema_of
from duejobs.store.queries import TABLES
from duejobs.store.rate_limits import NO_LIMITS, Limited

if TYPE_CHECKING:
    from sqlalchemy import Connection

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


def live_figures(
    conn: Connection,
    late_after: timedelta,
    tenant: str | None = None,
    limited: Limited = NO_LIMITS,
) -> list[LiveFigures]:
    """Counts over live rows only (two partial-index scans), overall, per tenant, per type;
    one tenant's alone when ``tenant`` is given; rows waiting unpushed under one of
    ``limited`` not overdue. Cost follows the live rows, never the finished history."""
    params = {"late": late_after, "tenant": tenant, **limited.params()}
    rows = run(conn, "live_figures", params)
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


# The count, among ``Activity.counts``, of deliveries put back because the worker that took
# them had no handler for their type (a rolling deploy, or a type no worker runs).
UNKNOWN_TYPE = "unknown_type"


def activity(conn: Connection, since: timedelta, tenant: str | None = None) -> list[Activity]:
    """Events of the last ``since`` by kind, and the lag from due time to start
    (p50/p95/p99/max, ms). Reads only that window of the history (BRIN index on time)."""
    result: list[Activity] = []
    for r in run(conn, "activity", {"since": since, "tenant": tenant}):
        if r.level == 2 and r.type is None:
            continue  # events that carry no type (all but `started`), in the per-type set
        lag = r.lag or [None, None, None]
        result.append(
            Activity(
                tenant=r.tenant,
                type=r.type,
                counts={
                    **{k.value: int(getattr(r, k.value)) for k in EventKind},
                    UNKNOWN_TYPE: int(r.unknown_type),
                },
                lag_ms={"p50": lag[0], "p95": lag[1], "p99": lag[2], "max": r.lag_max},
            )
        )
    return result


@dataclass(frozen=True)
class LagPoint:
    """The start lag of one time bucket: its start, how many starts, p50 and p99 (ms)."""

    at: datetime
    starts: int
    p50_ms: float
    p99_ms: float


def lag_series(
    conn: Connection, since: timedelta, step: timedelta, tenant: str | None = None
) -> list[LagPoint]:
    """The start lag over the last ``since``, one point per ``step`` that had starts."""
    params = {"since": since, "step": step.total_seconds(), "tenant": tenant}
    return [
        LagPoint(r.bucket.astimezone(UTC), int(r.starts), float(r.lag[0]), float(r.lag[1]))
        for r in run(conn, "lag_series", params)
    ]


def recurring_behind(conn: Connection, late_after: timedelta, tenant: str | None = None) -> int:
    """Active recurring definitions whose next occurrence is past by more than ``late_after``
    and not yet made a row."""
    row = run_one(conn, "recurring_behind", {"late_after": late_after, "tenant": tenant})
    assert row is not None
    return int(row.behind)


def status_counts(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """How many of these schedules are in each status."""
    rows = run(conn, "status_counts", {"ids": list(ids)})
    return {r.status: int(r.n) for r in rows}


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


def outcomes(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, ScheduleOutcome]:
    """What became of each of these schedules (the demo's checks)."""
    return {
        r.id: ScheduleOutcome(r.id, Status(r.status), *r[2:])
        for r in run(conn, "outcomes", {"ids": list(ids)})
    }


def start_lag(conn: Connection, ids: Sequence[uuid.UUID]) -> tuple[float | None, float | None]:
    """p50 and p99 of these schedules' lag from due time to start (ms)."""
    row = run_one(conn, "start_lag", {"ids": list(ids)})
    lag = row.lag if row else None
    return (lag[0], lag[1]) if lag else (None, None)


@dataclass(frozen=True)
class ReplayPosition:
    """How far a read replica has replayed the primary's log (see :func:`replay_position`)."""

    in_recovery: bool  # False: the server is a primary, not a replica
    caught_up: bool  # it has replayed the primary's log up to the position asked about
    behind: timedelta | None  # since the commit of the last transaction it replayed


def wal_position(conn: Connection) -> str:
    """The primary's write-ahead log position now (an LSN, as text)."""
    row = run_one(conn, "wal_position")
    assert row is not None
    return str(row.lsn)


def bound_statements(conn: Connection, limit: timedelta) -> tuple[str, str]:
    """Stop any statement of the rest of this transaction that runs past ``limit``, and any
    wait for a lock past four fifths of it (so a read held up by a lock is stopped as such,
    :func:`~duejobs.store.execution.is_lock_timeout`); the limits it had (for
    :func:`restore_statement_timeout`)."""
    ms = max(1, limit // timedelta(milliseconds=1))
    row = run(conn, "bound_statements", {"ms": str(ms), "lock_ms": str(max(1, ms * 4 // 5))})[0]
    return str(row.before), str(row.lock_before)


def restore_statement_timeout(conn: Connection, before: tuple[str, str]) -> None:
    """Give this transaction back the statement and lock limits it had."""
    run(conn, "restore_statement_timeout", {"before": before[0], "lock_before": before[1]})


def replay_position(conn: Connection, lsn: str) -> ReplayPosition:
    """On a replica: whether it has replayed up to ``lsn``, and how old its last replayed
    commit is."""
    row = run_one(conn, "replay_position", {"lsn": lsn})
    assert row is not None
    return ReplayPosition(bool(row.in_recovery), bool(row.caught_up), row.behind)


@dataclass(frozen=True)
class TableFigures:
    """One of duejobs' tables as the server holds it (a partitioned table's partitions summed
    under its name): its size with its indexes and TOAST, its indexes' share, its live and dead
    tuples as the statistics collector counts them, and when autovacuum last finished on it."""

    table: str
    bytes: int
    index_bytes: int
    live_tuples: int
    dead_tuples: int
    last_autovacuum: datetime | None


def table_figures(conn: Connection) -> list[TableFigures]:
    """The figures of each of duejobs' tables there is (what grows, and what vacuum has left
    to do): from the catalog and the statistics views, no table read."""
    rows = run(conn, "table_figures", {"schema": schema_of(conn), "tables": list(TABLES)})
    return [
        TableFigures(
            r.name,
            int(r.bytes),
            int(r.index_bytes),
            int(r.live),
            int(r.dead),
            None if r.last_autovacuum is None else _utc(r.last_autovacuum),
        )
        for r in rows
    ]
