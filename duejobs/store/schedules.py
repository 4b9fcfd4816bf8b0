"""Schedules one at a time: create, read, reschedule, cancel, history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any

from sqlalchemy import Connection, Row, text

from duejobs.ids import new_id, random_share
from duejobs.models import (
    Event,
    EventKind,
    Schedule,
    Status,
)
from duejobs.store.execution import _LIVE, _RUN_AT, _TENANT, _utc
from duejobs.timespec import When

SCHEDULE_COLUMNS = (
    "id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status, "
    "queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, "
    "finished_at, queue"
)


def _schedule(row: Row[Any]) -> Schedule:
    m = row._mapping
    return Schedule(
        id=m["id"],
        tenant=m["tenant"],
        type=m["type"],
        key=m["key"],
        payload=m["payload"],
        run_at=m["run_at"].astimezone(UTC),
        due_at=m["due_at"].astimezone(UTC),
        timezone=m["timezone"],
        local_run_at=m["local_run_at"],
        status=Status(m["status"]),
        queue_job_id=m["queue_job_id"],
        version=m["version"],
        attempts=m["attempts"],
        last_error=m["last_error"],
        created_at=m["created_at"].astimezone(UTC),
        updated_at=m["updated_at"].astimezone(UTC),
        started_at=_utc(m["started_at"]),
        finished_at=_utc(m["finished_at"]),
        queue=m["queue"],
    )


def _when_params(when: When) -> dict[str, Any]:
    return {
        "run_at": when.run_at,
        "delay": when.delay,
        "timezone": when.timezone,
        "local_run_at": when.local_run_at,
    }


# A `created` event's detail, from the schedule's new row (every way of creating one). Most
# schedules have no zone, key or jitter: building just {"run_at": ...} for them costs a third
# of building every field and stripping the nulls.
_CREATED_DETAIL = """CASE
    WHEN timezone IS NULL AND local_run_at IS NULL AND key IS NULL AND due_at = run_at
    THEN jsonb_build_object('run_at', run_at)
    ELSE jsonb_strip_nulls(jsonb_build_object(
        'run_at', run_at, 'timezone', timezone, 'local_run_at', local_run_at,
        'key', key, 'due_at', CASE WHEN due_at <> run_at THEN due_at END))
    END"""

_INSERT = text(
    f"""
    WITH new AS (
        INSERT INTO scheduled_jobs
            (id, tenant, type, key, payload, run_at, due_at, jitter_offset, expires_after,
             max_attempts, timezone, local_run_at, queue)
        VALUES (:id, :tenant, :type, :key, CAST(:payload AS jsonb), {_RUN_AT},
                {_RUN_AT} + CAST(:jitter_offset AS interval), :jitter_offset,
                CAST(:expires_after AS interval), CAST(:max_attempts AS integer), :timezone,
                :local_run_at, :queue)
        ON CONFLICT (tenant, key) WHERE key IS NOT NULL AND {_LIVE} DO NOTHING
        RETURNING {SCHEDULE_COLUMNS}
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'created', version,
               {_CREATED_DETAIL}
        FROM new
    )
    SELECT {SCHEDULE_COLUMNS} FROM new
    """
)

_LIVE_BY_KEY = text(
    f"SELECT {SCHEDULE_COLUMNS} FROM scheduled_jobs "
    f"WHERE tenant = :tenant AND key = :key AND {_LIVE}"
)


@dataclass(slots=True)
class NewRow:
    """A validated schedule to insert (not frozen: building one per row of a bulk insert
    costs a fifth of a frozen dataclass's)."""

    tenant: str
    job_type: str
    key: str | None
    payload_json: str
    when: When
    jitter: timedelta = timedelta(0)
    expires_after: timedelta | None = None
    max_attempts: int | None = None
    queue: str = "duejobs"


def _jitter_offset(schedule_id: uuid.UUID, jitter: timedelta) -> timedelta:
    """A fixed share of ``jitter`` drawn from the schedule's own id: the same on every re-push,
    reconcile or reschedule, spread over ``[0, jitter)``."""
    return jitter * random_share(schedule_id)


def insert_schedule(conn: Connection, new: NewRow) -> tuple[Schedule, bool]:
    """Create a schedule, or return the live one holding ``key``; (schedule, created).

    With ``jitter``, the schedule is due at ``run_at`` plus a fixed share of it drawn from its
    own id: after the intended instant, never before."""
    schedule_id = new_id()
    params = {
        "id": schedule_id,
        "jitter_offset": _jitter_offset(schedule_id, new.jitter),
        "expires_after": new.expires_after,
        "max_attempts": new.max_attempts,
        "tenant": new.tenant,
        "type": new.job_type,
        "key": new.key,
        "payload": new.payload_json,
        "queue": new.queue,
        **_when_params(new.when),
    }
    while True:
        row = conn.execute(_INSERT, params).first()
        if row is not None:
            return _schedule(row), True
        # The key is held by a live schedule. Read it with a fresh snapshot: the holder may
        # have committed after this statement began. If it finished meanwhile, insert again.
        existing = conn.execute(_LIVE_BY_KEY, {"tenant": new.tenant, "key": new.key}).first()
        if existing is not None:
            return _schedule(existing), False


def live_by_key(conn: Connection, tenant: str, key: str) -> Schedule | None:
    """The live schedule holding ``key`` for ``tenant``, if any."""
    row = conn.execute(_LIVE_BY_KEY, {"tenant": tenant, "key": key}).first()
    return None if row is None else _schedule(row)


def get_schedule(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> Schedule | None:
    """The schedule with that id, if it exists and belongs to ``tenant`` (None: any tenant)."""
    row = conn.execute(
        text(f"SELECT {SCHEDULE_COLUMNS} FROM scheduled_jobs WHERE id = :id AND {_TENANT}"),
        {"id": schedule_id, "tenant": tenant},
    ).first()
    return None if row is None else _schedule(row)


_RESCHEDULE = text(
    f"""
    WITH cur AS (
        SELECT id, run_at AS old_run_at, version AS old_version, queue_job_id AS old_queue_job_id
        FROM scheduled_jobs
        WHERE id = :id AND {_TENANT} AND {_LIVE}
          AND (CAST(:expected AS integer) IS NULL OR version = :expected)
        FOR UPDATE
    ), upd AS (
        UPDATE scheduled_jobs s
        SET run_at = {_RUN_AT},
            due_at = {_RUN_AT} + s.jitter_offset,
            timezone = COALESCE(CAST(:timezone AS text), s.timezone),
            local_run_at = :local_run_at,
            version = s.version + 1,
            status = 'scheduled',
            queue_job_id = NULL,
            attempts = 0,
            updated_at = statement_timestamp(),
            enqueued_at = NULL,
            started_at = NULL,
            lease_expires_at = NULL
        FROM cur
        WHERE s.id = :id AND s.id = cur.id
        RETURNING s.*, cur.old_run_at, cur.old_version, cur.old_queue_job_id
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'rescheduled', version,
               jsonb_build_object('old_run_at', old_run_at, 'new_run_at', run_at,
                                  'old_version', old_version, 'timezone', timezone,
                                  'local_run_at', local_run_at)
        FROM upd
    )
    SELECT {SCHEDULE_COLUMNS}, old_queue_job_id FROM upd
    """
)


def reschedule(
    conn: Connection,
    schedule_id: uuid.UUID,
    tenant: str | None,
    when: When,
    expected_version: int | None,
) -> tuple[Schedule | None, str | None]:
    """Move a live schedule to a new time under version + 1.

    Returns (schedule, queue job id of the superseded version) or (None, None) when no live
    row matched; :func:`get_schedule` then tells why.
    """
    row = conn.execute(
        _RESCHEDULE,
        {"id": schedule_id, "tenant": tenant, "expected": expected_version, **_when_params(when)},
    ).first()
    if row is None:
        return None, None
    return _schedule(row), row._mapping["old_queue_job_id"]


_CANCEL = text(
    f"""
    WITH cur AS (
        SELECT id, queue_job_id FROM scheduled_jobs
        WHERE id = :id AND {_TENANT} AND {_LIVE}
        FOR UPDATE
    ), upd AS (
        UPDATE scheduled_jobs s
        SET status = 'cancelled', version = s.version + 1,
            updated_at = statement_timestamp(), finished_at = statement_timestamp()
        FROM cur
        WHERE s.id = :id AND s.id = cur.id
        RETURNING s.id, s.tenant, s.version, cur.queue_job_id
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version)
        SELECT id, tenant, 'cancelled', version FROM upd
    )
    SELECT queue_job_id FROM upd
    """
)


def cancel(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> tuple[bool, str | None]:
    """Cancel a live schedule (version + 1); returns (cancelled, its queue job id if pushed)."""
    row = conn.execute(_CANCEL, {"id": schedule_id, "tenant": tenant}).first()
    if row is None:
        return False, None
    return True, row._mapping["queue_job_id"]


def history(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> list[Event]:
    """The schedule's events, oldest first (empty when not visible to ``tenant``)."""
    rows = conn.execute(
        text(
            "SELECT id, schedule_id, kind, version, at, detail FROM scheduled_job_events "
            f"WHERE schedule_id = :id AND {_TENANT} ORDER BY id"
        ),
        {"id": schedule_id, "tenant": tenant},
    )
    return [
        Event(
            id=r.id,
            schedule_id=r.schedule_id,
            kind=EventKind(r.kind),
            version=r.version,
            at=r.at.astimezone(UTC),
            detail=r.detail,
        )
        for r in rows
    ]


def is_past_run_at(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> bool | None:
    """Whether the database clock has reached the schedule's ``run_at`` (None: not found)."""
    row = conn.execute(
        text(
            "SELECT run_at <= statement_timestamp() FROM scheduled_jobs "
            f"WHERE id = :id AND {_TENANT}"
        ),
        {"id": schedule_id, "tenant": tenant},
    ).first()
    return None if row is None else bool(row[0])
