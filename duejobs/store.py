"""The only module that speaks SQL to ``scheduled_jobs`` and its companion tables.

Every function takes an open SQLAlchemy ``Connection`` and runs inside the caller's
transaction: the caller decides when to commit, so an application can write a schedule
together with its own rows. Statements are parameterised; where a change and its history
entry belong together they are one statement (a data-modifying CTE), so a schedule is never
changed without its event and the common paths cost one round trip.

"Now" is always the database's clock (``statement_timestamp()``), never a process clock.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Row, TextClause, text
from sqlalchemy.exc import DBAPIError, StatementError

from duejobs.ids import id_stream, new_id, random_share
from duejobs.models import (
    DstGap,
    DstOverlap,
    Event,
    EventKind,
    Misfire,
    Recurring,
    RecurringSpec,
    Schedule,
    Status,
)
from duejobs.timespec import When

SCHEDULE_COLUMNS = (
    "id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status, "
    "queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, "
    "finished_at, queue"
)
_LIVE = "status IN ('scheduled', 'running')"
_TENANT = "(CAST(:tenant AS text) IS NULL OR tenant = :tenant)"
_RUN_AT = "COALESCE(CAST(:run_at AS timestamptz), statement_timestamp() + CAST(:delay AS interval))"


@functools.cache
def _driver_sql(clause: TextClause) -> str:
    """A ``text()`` statement in psycopg's own parameter style (``:name`` → ``%(name)s``)."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", clause.text.replace("%", "%%"))


def _fast(conn: Connection, clause: TextClause, params: dict[str, Any]) -> list[Any]:
    """Run a hot-path statement straight on psycopg, inside the connection's transaction.

    Same SQL, same transaction; it skips SQLAlchemy's per-execution work (about 0.15 ms a
    statement), which the scheduler and the worker pay once or twice per job.
    """
    driver = conn.connection.driver_connection
    assert driver is not None
    sql = _driver_sql(clause)
    try:
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, sql, params, exc) from exc


@contextlib.contextmanager
def _meanwhile(conn: Connection, clause: TextClause, params: dict[str, Any]) -> Iterator[None]:
    """Send a statement, and run the block while PostgreSQL works on it (psycopg's pipeline
    mode); the statement's errors surface when the block ends."""
    driver = conn.connection.driver_connection
    assert driver is not None
    sql = _driver_sql(clause)
    try:
        with driver.pipeline():
            driver.execute(sql, params)
            yield
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, sql, params, exc) from exc


def _surfaced(
    conn: Connection,
    driver: psycopg.Connection[Any],
    statement: str,
    params: dict[str, Any] | None,
    exc: psycopg.Error,
) -> StatementError:
    """A psycopg error as SQLAlchemy would raise it; a broken connection leaves the pool (a
    lock timeout does not break it)."""
    broken = driver.closed or (
        isinstance(exc, psycopg.OperationalError)
        and not isinstance(exc, psycopg.errors.LockNotAvailable)
    )
    if broken:
        conn.invalidate(exc)
    return DBAPIError.instance(statement, params, exc, psycopg.Error, connection_invalidated=broken)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


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


# Bulk scheduling: rows are streamed with COPY into a session-local staging table, then moved
# with one INSERT ... SELECT (database clock for delays, key conflicts skipped) that also
# writes their `created` events.
_STAGING = "duejobs_staging"
_STAGING_COLUMNS = (
    "ord",
    "id",
    "tenant",
    "type",
    "key",
    "payload",
    "run_at",
    "delay",
    "jitter_offset",
    "expires_after",
    "max_attempts",
    "timezone",
    "local_run_at",
    "queue",
)
_CREATE_STAGING = f"""
    CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} (
        ord integer, id uuid, tenant text, type text, key text, payload text,
        run_at timestamptz, delay interval, jitter_offset interval, expires_after interval,
        max_attempts integer, timezone text, local_run_at timestamp, queue text
    ) ON COMMIT DELETE ROWS
"""
_MOVE_STAGED = text(
    f"""
    WITH new AS (
        INSERT INTO scheduled_jobs
            (id, tenant, type, key, payload, run_at, due_at, jitter_offset, expires_after,
             max_attempts, timezone, local_run_at, queue)
        SELECT id, tenant, type, key, CAST(payload AS jsonb), at, at + jitter_offset,
               jitter_offset, expires_after, max_attempts, timezone, local_run_at, queue
        FROM (SELECT *, COALESCE(run_at, statement_timestamp() + delay) AS at
              FROM {_STAGING}) AS staged
        ORDER BY ord
        ON CONFLICT (tenant, key) WHERE key IS NOT NULL AND {_LIVE} DO NOTHING
        RETURNING id, tenant, version, run_at, due_at, timezone, local_run_at, key
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'created', version,
               {_CREATED_DETAIL}
        FROM new
    )
    SELECT count(*) FROM new
    """
)
# Which live schedule holds each staged key (the new one, or the one that already held it).
_STAGED_KEYS = text(
    f"SELECT st.ord, s.id FROM {_STAGING} st JOIN scheduled_jobs s "
    f"ON s.tenant = st.tenant AND s.key = st.key AND s.status IN ('scheduled', 'running') "
    "WHERE st.key IS NOT NULL"
)


_CLEAR_STAGING = text(f"TRUNCATE {_STAGING}")  # a second call in one transaction starts empty


def insert_schedules(conn: Connection, rows: Iterable[NewRow]) -> list[uuid.UUID]:
    """Create many schedules with their ``created`` events; returns their ids in order.

    ``rows`` is consumed while the COPY runs, so PostgreSQL takes in the first rows while the
    caller still validates the last: an error raised by the iterable aborts the COPY and the
    caller's transaction writes nothing. Rows without a key are streamed with a binary COPY
    straight into the table (delays counted from one reading of the database clock); one
    statement then writes their events from the rows themselves. Rows with a key go through
    a staging table and one INSERT ... SELECT that skips keys held by a live schedule (or by
    an earlier row of the batch): such a row creates nothing and gets the holder's id, as
    :func:`insert_schedule` would."""
    db_now: datetime = _fast(conn, _CLOCK, {})[0][0]
    drawn: list[bytes] = []
    keyed: list[tuple[int, uuid.UUID, NewRow]] = []
    first = last = b""  # the batch's first and last copied ids
    with _copying(conn, "scheduled_jobs", _DIRECT_COLUMNS, _DIRECT_TYPES) as copy:
        for r, raw in zip(rows, id_stream(), strict=False):  # ids never run out
            drawn.append(raw)
            if r.key is not None:
                keyed.append((len(drawn) - 1, uuid.UUID(bytes=raw), r))
                continue
            when = r.when
            run_at = when.run_at if when.delay is None else db_now + when.delay
            assert run_at is not None  # a When holds a delay or an instant
            offset = _jitter_offset(uuid.UUID(bytes=raw), r.jitter) if r.jitter else r.jitter
            copy.write_row(
                (
                    raw,
                    r.tenant,
                    r.job_type,
                    _JSONB + r.payload_json.encode(),
                    run_at,
                    run_at + offset,
                    offset,
                    r.expires_after,
                    r.max_attempts,
                    when.timezone,
                    when.local_run_at,
                    r.queue,
                )
            )
            first, last = first or raw, raw
    recording = (
        _meanwhile(
            conn, _RECORD_COPIED, {"first": uuid.UUID(bytes=first), "last": uuid.UUID(bytes=last)}
        )
        if first
        else contextlib.nullcontext()
    )
    with recording:  # the copied rows' events are written while the ids' objects are made
        ids = [uuid.UUID(bytes=raw) for raw in drawn]
    if keyed:
        _insert_staged(conn, keyed, ids)
    return ids


# The `created` events of a batch just copied. Its ids were drawn in increasing order, so its
# rows are those between its first and last id that carry this (sub)transaction's xid: a
# row another transaction wrote in that range carries another xid, and has its own event.
_RECORD_COPIED = text(
    f"""
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'created', version, {_CREATED_DETAIL}
    FROM scheduled_jobs
    WHERE id BETWEEN :first AND :last
      AND xmin = (SELECT xmin FROM scheduled_jobs WHERE id = :first)
    """
)


_CLOCK = text("SELECT statement_timestamp()")
_DIRECT_COLUMNS = (
    "id",
    "tenant",
    "type",
    "payload",
    "run_at",
    "due_at",
    "jitter_offset",
    "expires_after",
    "max_attempts",
    "timezone",
    "local_run_at",
    "queue",
)
# Binary COPY: ``bytea`` marks fields given in their binary form already, which psycopg's
# C adapter for bytes sends as they are (its own uuid and jsonb adapters run in Python):
# an id's 16 bytes, and jsonb's version byte followed by JSON text encoded and checked.
_DIRECT_TYPES = (
    "bytea",
    "text",
    "text",
    "bytea",
    "timestamptz",
    "timestamptz",
    "interval",
    "interval",
    "int4",
    "text",
    "timestamp",
    "text",
)
_JSONB = b"\x01"


@contextlib.contextmanager
def _copying(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    types: Sequence[str] | None = None,
) -> Iterator[psycopg.Copy]:
    """A COPY into ``table`` inside the connection's transaction; errors surface as
    SQLAlchemy's, and a broken connection leaves the pool.

    With ``types`` (psycopg's names of the adapters to write each field with) the COPY is
    binary: the client formats little, and PostgreSQL parses no text."""
    driver = conn.connection.driver_connection
    assert driver is not None
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    if types is not None:
        statement += " (FORMAT BINARY)"
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            if types is not None:
                copy.set_types(types)
            yield copy
    except psycopg.Error as exc:
        raise _surfaced(conn, driver, statement, None, exc) from exc


def _insert_staged(
    conn: Connection, keyed: Sequence[tuple[int, uuid.UUID, NewRow]], ids: list[uuid.UUID]
) -> None:
    """Insert rows with keys (``(position, id, row)``), setting ``ids[position]`` to the
    holder of each key that was already taken."""
    conn.exec_driver_sql(_CREATE_STAGING)
    staged = [
        (
            i,
            sid,
            r.tenant,
            r.job_type,
            r.key,
            r.payload_json,
            r.when.run_at,
            r.when.delay,
            _jitter_offset(sid, r.jitter),
            r.expires_after,
            r.max_attempts,
            r.when.timezone,
            r.when.local_run_at,
            r.queue,
        )
        for i, sid, r in keyed
    ]
    with _copying(conn, _STAGING, _STAGING_COLUMNS) as copy:
        for row in staged:
            copy.write_row(row)
    created = _fast(conn, _MOVE_STAGED, {})[0][0]
    if created < len(keyed):
        for ordinal, holder in _fast(conn, _STAGED_KEYS, {}):
            ids[ordinal] = holder
    _fast(conn, _CLEAR_STAGING, {})


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


def database_now(conn: Connection) -> datetime:
    """The database's clock, the only one duejobs trusts for "is it due?"."""
    value: datetime = conn.execute(text("SELECT statement_timestamp()")).scalar_one()
    return value.astimezone(UTC)


# -- the delivery path: scheduler ------------------------------------------------------------


@dataclass(frozen=True)
class DueRow:
    """A claimed row the scheduler is about to push, with its queue job id."""

    id: uuid.UUID
    tenant: str
    version: int
    attempt: int
    due_at: datetime
    queue_job_id: str
    # Pushed to the front of the queue: the first row of a tenant with nothing in the queue
    # or running (see claim_due).
    front: bool = False
    queue: str = "duejobs"


# The queue job id of (tenant, id, version, attempt), as duejobs.delivery.job_id spells it;
# computed here so that claiming and marking a batch is a single UPDATE. A test holds the two
# spellings equal.
_JOB_ID_SQL = (
    "'dj-' || replace(s.tenant, '.', '_') || '-' || replace(CAST(s.id AS text), '-', '') "
    "|| '-v' || s.version || '-a' || (s.attempts + 1)"
)

DEFAULT_QUOTA_TENANT = "*"


# A tenant's quota: its own cap, else the default's (tenant '*'), else none.
def _cap_sql(column: str, tenant: str) -> str:
    return (
        f"COALESCE((SELECT {column} FROM tenant_quotas WHERE tenant = {tenant}), "
        f"(SELECT {column} FROM tenant_quotas WHERE tenant = '{DEFAULT_QUOTA_TENANT}'))"
    )


# A tenant's in-flight jobs, pushed (counted up to its cap) plus running.
def _inflight_sql(tenant: str, cap: str) -> str:
    return (
        f"((SELECT count(*) FROM (SELECT 1 FROM scheduled_jobs WHERE tenant = {tenant} "
        f"AND status = 'scheduled' AND queue_job_id IS NOT NULL LIMIT {cap}) AS pushed) "
        f"+ (SELECT count(*) FROM scheduled_jobs WHERE status = 'running' AND tenant = {tenant}))"
    )


# A tenant's rows waiting to be pushed that are due: within the window, or only those already
# due for a tenant with an in-flight cap (its backlog waits in the table, not in Redis).
# Spelled as a range of (tenant, due_at) pairs, without `tenant = ...`, so that only the
# per-tenant claim index can serve it: with the equality the planner may take the global
# due_at index instead and filter out every other tenant's rows on the way.
def _tenant_range_sql(row: str, tenant: str, upto: str) -> str:
    return (
        f"({row}.tenant, {row}.due_at) >= ({tenant}, CAST('-infinity' AS timestamptz)) "
        f"AND ({row}.tenant, {row}.due_at) <= ({tenant}, {upto})"
    )


def _tenant_due_sql(row: str, tenant: str, cap: str) -> str:
    horizon = (
        f"statement_timestamp() + CASE WHEN {cap} IS NULL "
        "THEN CAST(:window AS interval) ELSE interval '0' END"
    )
    return (
        f"{row}.status = 'scheduled' AND {row}.queue_job_id IS NULL "
        f"AND {_tenant_range_sql(row, tenant, horizon)}"
    )


_UNPUSHED = "status = 'scheduled' AND queue_job_id IS NULL"

# First half of a claim: walk the tenants that have rows waiting to be pushed, in name order
# after a cursor, one index probe each (the recursion is evaluated only as far as the LIMIT
# pulls it), and count each one's due rows up to the batch size. A tenant is "sparse" when it
# has fewer than FRONT_LANE jobs waiting in the queue. Capped tenants are locked
# (try-lock, held to the end of the claim's transaction) so that two claims never both fill
# the same tenant's last places; their in-flight count here is an estimate for sharing the
# batch, and the claim counts again under the lock.
CLAIM_WALK = text(
    f"""
    WITH RECURSIVE tenants (tenant) AS (
        SELECT min(tenant) FROM scheduled_jobs
        WHERE {_UNPUSHED} AND tenant > :after
          AND EXISTS (SELECT 1 FROM scheduled_jobs WHERE {_UNPUSHED}
                      AND due_at <= statement_timestamp() + CAST(:window AS interval))
      UNION ALL
        SELECT (SELECT min(s.tenant) FROM scheduled_jobs s
                WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
                  AND s.tenant > t.tenant)
        FROM tenants t WHERE t.tenant IS NOT NULL
    ), capped AS (
        SELECT t.tenant, {_cap_sql("max_inflight", "t.tenant")} AS cap
        FROM tenants t WHERE t.tenant IS NOT NULL
    ), walked AS (
        SELECT c.tenant, c.cap,
               (SELECT count(*) FROM (
                    SELECT 1 FROM scheduled_jobs s
                    WHERE {_tenant_due_sql("s", "c.tenant", "c.cap")}
                    LIMIT :limit) AS d) AS due
        FROM capped c
    ), picked AS (
        SELECT * FROM walked WHERE due > 0 LIMIT :limit
    )
    SELECT statement_timestamp() AS db_now, p.tenant, p.due, p.cap,
           CASE WHEN p.cap IS NOT NULL
                THEN pg_try_advisory_xact_lock(hashtext('duejobs-inflight:' || p.tenant))
           END AS locked,
           CASE WHEN p.cap IS NOT NULL THEN {_inflight_sql("p.tenant", "p.cap")} END AS inflight,
           (SELECT count(*) FROM (
                SELECT 1 FROM scheduled_jobs s
                WHERE s.status = 'scheduled' AND s.queue_job_id IS NOT NULL
                  AND {_tenant_range_sql("s", "p.tenant", "statement_timestamp()")}
                LIMIT :front_lane) AS queued) < :front_lane AS sparse
    -- The claim's commit does not wait for the WAL flush: a worker that already popped a job
    -- waits less on the row's lock (what a crash can cost: see duejobs.scheduler).
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS always
    LEFT JOIN picked p ON true
    """
)

# Second half: take each tenant's share of the batch, oldest first, FOR UPDATE SKIP LOCKED
# (a capped tenant's share cut to the room its cap leaves, counted afresh), record the queue
# job ids and an `enqueued` event, and return the rows in turns — every tenant's first row,
# then every tenant's second — so that the push interleaves tenants in the queue as well.
CLAIM_SHARES = text(
    f"""
    WITH plan AS (
        SELECT p.tenant, p.cap,
               CASE WHEN p.cap IS NULL THEN p.share
                    ELSE LEAST(p.share, p.cap - {_inflight_sql("p.tenant", "p.cap")}) END AS n
        FROM unnest(CAST(:tenants AS text[]), CAST(:shares AS integer[]),
                    CAST(:caps AS integer[])) AS p(tenant, share, cap)
    ), due AS (
        SELECT c.id FROM plan p CROSS JOIN LATERAL (
            SELECT s.id FROM scheduled_jobs s
            WHERE {_tenant_due_sql("s", "p.tenant", "p.cap")}
            ORDER BY s.tenant, s.due_at
            LIMIT GREATEST(p.n, 0)
            FOR UPDATE SKIP LOCKED
        ) AS c
    ), upd AS (
        UPDATE scheduled_jobs s
        SET queue_job_id = {_JOB_ID_SQL},
            enqueued_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE s.id = ANY(ARRAY(SELECT id FROM due))  -- primary-key lookups, never a join
        RETURNING s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at,
                  s.queue_job_id, s.queue
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'enqueued', version, jsonb_build_object('queue_job_id', queue_job_id)
        FROM upd
    )
    SELECT upd.*, row_number() OVER (PARTITION BY upd.tenant ORDER BY upd.due_at) AS turn
    FROM upd
    ORDER BY turn, upd.due_at
    """
)


def fair_shares(limit: int, wants: Sequence[int]) -> list[int]:
    """Split ``limit`` places among tenants wanting ``wants``: equal shares, a tenant wanting
    less than its share leaves the rest to the others (water-filling), and places that do not
    divide evenly go one each to the first tenants in order."""
    shares = [0] * len(wants)
    left = limit
    active = [i for i, want in enumerate(wants) if want > 0]
    while left > 0 and active:
        each = left // len(active)
        if each == 0:
            for i in active[:left]:
                shares[i] += 1
            break
        for i in active:
            given = min(each, wants[i] - shares[i])
            shares[i] += given
            left -= given
        active = [i for i in active if shares[i] < wants[i]]
    return shares


FRONT_LANE = 2


@dataclass(frozen=True)
class Claim:
    """What one claim took, and what it learned on the way."""

    rows: list[DueRow]
    db_now: datetime
    # Capped tenants whose due rows were held back by their in-flight quota.
    throttled: list[str]
    # Where the next claim's walk starts: the last tenant walked when the walk was cut at
    # ``limit`` tenants, else "" (the next claim starts again from the first tenant).
    cursor: str


def claim_due(conn: Connection, window: timedelta, limit: int, after: str = "") -> Claim:
    """Claim up to ``limit`` rows due within ``window`` that have no queue job for their
    current version, shared fairly among the tenants that have some (walked in name order
    after ``after``), oldest first within a tenant, rows locked by another scheduler skipped;
    record their queue job id with an ``enqueued`` event. A tenant with an in-flight quota
    gets only its due rows, and only as many as its quota leaves room for.

    The first row of a *sparse* tenant — fewer than ``FRONT_LANE`` of its jobs waiting in the
    queue — is marked ``front``: pushed to the front of the queue, it does not wait behind
    another tenant's backlog (the sparse-flow rule of fair queueing, as in FQ-CoDel). A
    tenant's later rows go to the back, so a busy tenant cannot jump the queue, and the front
    lane carries at most one job per tenant per batch. ``FRONT_LANE`` is 2, not 1: a light
    tenant whose previous job still waits (a slow moment) keeps its place at the front
    instead of falling behind the backlog, where each of its jobs would then find the
    previous one still waiting. The caller pushes
    the rows to Redis before committing and rolls back if the push fails, so a row is never
    marked pushed without a real queue job."""
    params: dict[str, Any] = {
        "window": window,
        "limit": limit,
        "after": after,
        "front_lane": FRONT_LANE,
    }
    walk = _fast(conn, CLAIM_WALK, params)
    if walk[0].tenant is None and after:
        walk = _fast(conn, CLAIM_WALK, params | {"after": ""})
    now = walk[0].db_now.astimezone(UTC)
    tenants = [w for w in walk if w.tenant is not None]
    wants = [
        w.due if w.cap is None else min(w.due, max(0, w.cap - w.inflight)) if w.locked else 0
        for w in tenants
    ]
    throttled = [w.tenant for w, want in zip(tenants, wants, strict=True) if want < w.due]
    cursor = tenants[-1].tenant if len(tenants) == limit else ""
    plan = [
        (w, share) for w, share in zip(tenants, fair_shares(limit, wants), strict=True) if share
    ]
    if not plan:
        return Claim([], now, throttled, cursor)
    rows = _fast(
        conn,
        CLAIM_SHARES,
        {
            "window": window,
            "tenants": [w.tenant for w, _ in plan],
            "shares": [share for _, share in plan],
            "caps": [w.cap for w, _ in plan],
        },
    )
    sparse = {w.tenant for w in tenants if w.sparse}
    due = [
        DueRow(
            r.id,
            r.tenant,
            r.version,
            r.attempt,
            r.due_at.astimezone(UTC),
            r.queue_job_id,
            front=r.turn == 1 and r.tenant in sparse,
            queue=r.queue,
        )
        for r in rows
    ]
    return Claim(due, now, throttled, cursor)


# -- the delivery path: worker ---------------------------------------------------------------


class SkipReason(enum.StrEnum):
    """Why a worker did not run a delivery."""

    MISSING = "missing"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    DUPLICATE = "duplicate"
    NOT_DUE = "not_due"
    EXPIRED = "expired"


@dataclass(frozen=True)
class RunClaim:
    """What the worker learned when it tried to claim a delivery."""

    skip: SkipReason | None
    type: str = ""
    payload: Any = None
    run_at: datetime | None = None
    due_at: datetime | None = None
    db_now: datetime | None = None


_CLAIM_RUN = text(
    """
    WITH cur AS (
        SELECT id, tenant, type, version, status, attempts, run_at, due_at, payload,
               expires_after
        FROM scheduled_jobs
        WHERE id = :id AND tenant = :tenant
        FOR UPDATE
    ), verdict AS (
        SELECT cur.*,
               CASE WHEN status = 'cancelled' THEN 'cancelled'
                    WHEN version <> :version THEN 'superseded'
                    WHEN status <> 'scheduled' OR attempts <> :attempt - 1 THEN 'duplicate'
                    WHEN due_at > statement_timestamp() THEN 'not_due'
                    WHEN due_at + expires_after < statement_timestamp() THEN 'expired'
               END AS reason
        FROM cur
    ), upd AS (
        UPDATE scheduled_jobs s
        SET status = 'running', attempts = :attempt, started_at = statement_timestamp(),
            lease_expires_at = statement_timestamp() + CAST(:lease AS interval),
            updated_at = statement_timestamp()
        FROM verdict v
        WHERE s.id = :id AND s.id = v.id AND v.reason IS NULL
        RETURNING s.id, s.tenant, s.version, s.due_at, s.run_at, s.type
    ), attempt AS (
        INSERT INTO scheduled_job_attempts (schedule_id, tenant, version, attempt, status, worker)
        SELECT id, tenant, version, :attempt, 'running', :worker FROM upd
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'started', version,
               jsonb_build_object(
                   'attempt', :attempt, 'worker', :worker, 'type', type,
                   'lag_ms', round(extract(epoch FROM statement_timestamp() - due_at) * 1000))
        FROM upd
        UNION ALL
        SELECT id, tenant, 'skipped', version,
               jsonb_build_object('reason', reason, 'delivered_version', :version,
                                  'attempt', :attempt, 'worker', :worker)
        FROM verdict
        WHERE reason IN ('cancelled', 'superseded', 'duplicate', 'expired')
    )
    SELECT type, payload, run_at, due_at, reason, statement_timestamp() AS db_now FROM verdict
    """
)


def claim_run(
    conn: Connection,
    *,
    schedule_id: uuid.UUID,
    tenant: str,
    version: int,
    attempt: int,
    worker: str,
    lease: timedelta,
) -> RunClaim:
    """Turn a delivery into a running attempt, in one statement, or say why not.

    Runs only if the row (of that tenant) is ``scheduled`` at the delivered version, this is
    the next attempt, and the database clock has reached ``due_at``. Skips other than
    ``not_due`` are recorded as events in the same statement.
    """
    rows = _fast(
        conn,
        _CLAIM_RUN,
        {
            "id": schedule_id,
            "tenant": tenant,
            "version": version,
            "attempt": attempt,
            "worker": worker,
            "lease": lease,
        },
    )
    if not rows:
        return RunClaim(skip=SkipReason.MISSING)
    row = rows[0]
    return RunClaim(
        skip=SkipReason(row.reason) if row.reason else None,
        type=row.type,
        payload=row.payload,
        run_at=row.run_at.astimezone(UTC),
        due_at=row.due_at.astimezone(UTC),
        db_now=row.db_now.astimezone(UTC),
    )


_DEFERRED = text(
    """
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'requeued', version,
           jsonb_build_object('reason', 'not_due', 'due_at', due_at, 'attempt', :attempt)
    FROM scheduled_jobs
    WHERE id = :id AND version = :version AND status = 'scheduled'
    """
)


def expire(conn: Connection, schedule_id: uuid.UUID, version: int) -> None:
    """Cancel a schedule whose delivery came later than its ``expires_after`` allows."""
    conn.execute(
        text(
            "UPDATE scheduled_jobs SET status = 'cancelled', version = version + 1, "
            "finished_at = statement_timestamp(), updated_at = statement_timestamp(), "
            "last_error = 'expired: due ' || due_at || ', allowed ' || expires_after || ' late' "
            "WHERE id = :id AND version = :version AND status = 'scheduled'"
        ),
        {"id": schedule_id, "version": version},
    )


def record_deferred(conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int) -> None:
    """Record that an early delivery was put back for its ``due_at`` (no attempt used)."""
    conn.execute(_DEFERRED, {"id": schedule_id, "version": version, "attempt": attempt})


_CURRENT = """
    SELECT status, version, attempts FROM scheduled_jobs WHERE id = :id
"""


def change_since_claim(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, *, lock: bool = False
) -> SkipReason | None:
    """None while the attempt is still the current one; otherwise what changed.
    With ``lock`` the row stays locked until the transaction ends (the effect fence)."""
    row = conn.execute(
        text(_CURRENT + (" FOR UPDATE" if lock else "")), {"id": schedule_id}
    ).first()
    if row is None:
        return SkipReason.MISSING
    if row.status == "cancelled":
        return SkipReason.CANCELLED
    if row.version != version:
        return SkipReason.SUPERSEDED
    if row.status != "running" or row.attempts != attempt:
        return SkipReason.DUPLICATE
    return None


def extend_lease(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, lease: timedelta
) -> bool:
    """Push the running attempt's lease forward; False when it is no longer current."""
    result = conn.execute(
        text(
            "UPDATE scheduled_jobs "
            "SET lease_expires_at = statement_timestamp() + CAST(:lease AS interval) "
            "WHERE id = :id AND version = :version AND attempts = :attempt "
            "AND status = 'running'"
        ),
        {"id": schedule_id, "version": version, "attempt": attempt, "lease": lease},
    )
    return result.rowcount == 1


def record_effect(
    conn: Connection, effect_key: str, schedule_id: uuid.UUID, tenant: str, version: int
) -> bool:
    """Insert the effect key; False if it was already recorded (the effect happened)."""
    row = conn.execute(
        text(
            "INSERT INTO scheduled_job_effects (effect_key, schedule_id, tenant, version) "
            "VALUES (:key, :id, :tenant, :version) ON CONFLICT (effect_key) DO NOTHING "
            "RETURNING 1"
        ),
        {"key": effect_key, "id": schedule_id, "tenant": tenant, "version": version},
    ).first()
    return row is not None


_FINISH = text(
    """
    WITH upd AS (
        UPDATE scheduled_jobs
        SET status = CAST(:status AS text),
            due_at = CASE WHEN CAST(:retry_in AS interval) IS NULL THEN due_at
                          ELSE statement_timestamp() + CAST(:retry_in AS interval) END,
            queue_job_id = CASE WHEN :status = 'scheduled' THEN NULL ELSE queue_job_id END,
            finished_at = CASE WHEN :status = 'scheduled' THEN NULL
                               ELSE statement_timestamp() END,
            last_error = CAST(:error AS text),
            lease_expires_at = NULL,
            updated_at = statement_timestamp()
        WHERE id = :id AND version = :version AND attempts = :attempt AND status = 'running'
        RETURNING id, tenant, version, due_at
    ), attempt AS (
        UPDATE scheduled_job_attempts a
        SET status = CASE WHEN :status = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
            finished_at = statement_timestamp(), error = CAST(:error AS text),
            next_attempt_at = CASE WHEN :status = 'scheduled' THEN upd.due_at END
        FROM upd
        WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = :attempt
    )
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, CAST(:event AS text), version,
           jsonb_strip_nulls(jsonb_build_object(
               'attempt', :attempt, 'error', CAST(:error AS text),
               'next_attempt_at', CASE WHEN :status = 'scheduled' THEN due_at END))
    FROM upd
    RETURNING 1
    """
)


def finish(
    conn: Connection,
    schedule_id: uuid.UUID,
    version: int,
    attempt: int,
    *,
    outcome: Status,
    error: str | None = None,
    retry_in: timedelta | None = None,
) -> bool:
    """Close the running attempt: ``succeeded``, ``failed``, or back to ``scheduled`` for a
    retry after ``retry_in`` (``run_at`` never moves). False when the attempt was no longer
    current — the schedule was cancelled, rescheduled or rescued meanwhile."""
    event = {
        Status.SUCCEEDED: EventKind.SUCCEEDED,
        Status.FAILED: EventKind.FAILED,
        Status.SCHEDULED: EventKind.RETRIED,
    }[outcome]
    rows = _fast(
        conn,
        _FINISH,
        {
            "id": schedule_id,
            "version": version,
            "attempt": attempt,
            "status": outcome.value,
            "event": event.value,
            "error": error,
            "retry_in": retry_in,
        },
    )
    return bool(rows)


_STALE = text(
    """
    WITH att AS (
        UPDATE scheduled_job_attempts
        SET status = 'stale', finished_at = statement_timestamp(), error = :reason
        WHERE schedule_id = :id AND version = :version AND attempt = :attempt
          AND status = 'running'
        RETURNING schedule_id, tenant
    )
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT schedule_id, tenant, 'skipped', :version,
           jsonb_build_object('reason', :reason, 'attempt', :attempt, 'while', 'running')
    FROM att
    """
)


def record_stale(
    conn: Connection, schedule_id: uuid.UUID, version: int, attempt: int, reason: SkipReason
) -> None:
    """Record that a running attempt lost its schedule (cancelled, superseded, rescued):
    its result is not applied, and the history says so."""
    conn.execute(
        _STALE,
        {"id": schedule_id, "version": version, "attempt": attempt, "reason": reason.value},
    )


# -- reconciliation --------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowRow:
    """A ``scheduled`` row inside the window, as the reconciler checks it against Redis."""

    id: uuid.UUID
    tenant: str
    version: int
    attempt: int
    due_at: datetime
    queue_job_id: str
    was_pushed: bool
    queue: str = "duejobs"


WINDOW_PAGE = text(
    f"""
    WITH page AS (
        SELECT s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at, s.queue,
               s.queue_job_id AS current, {_JOB_ID_SQL} AS job
        FROM scheduled_jobs s
        WHERE s.status = 'scheduled'
          AND s.due_at <= statement_timestamp() + CAST(:window AS interval)
          AND (s.due_at, s.id) > (CAST(:after_due AS timestamptz), CAST(:after_id AS uuid))
          -- a never-pushed row of a tenant with an in-flight quota is the scheduler's to
          -- push, when the quota leaves room
          AND (s.queue_job_id IS NOT NULL OR {_cap_sql("max_inflight", "s.tenant")} IS NULL)
        ORDER BY s.due_at, s.id
        FOR UPDATE SKIP LOCKED
        LIMIT :limit
    ), upd AS (
        UPDATE scheduled_jobs s
        SET queue_job_id = {_JOB_ID_SQL}, enqueued_at = statement_timestamp(),
            updated_at = statement_timestamp()
        WHERE s.id = ANY(ARRAY(SELECT id FROM page WHERE current IS DISTINCT FROM job))
        RETURNING s.id, s.tenant, s.version, s.queue_job_id
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'enqueued', version,
               jsonb_build_object('queue_job_id', queue_job_id, 'by', 'reconciler')
        FROM upd
    )
    SELECT id, tenant, version, attempt, due_at, job AS queue_job_id,
           current IS NOT NULL AS was_pushed, queue
    FROM page
    ORDER BY due_at, id
    """
)


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
    rows = _fast(
        conn,
        WINDOW_PAGE,
        {"window": window, "after_due": after_due, "after_id": after_id, "limit": limit},
    )
    return [
        WindowRow(
            r.id,
            r.tenant,
            r.version,
            r.attempt,
            r.due_at.astimezone(UTC),
            r.queue_job_id,
            r.was_pushed,
            r.queue,
        )
        for r in rows
    ]


def record_repushed(conn: Connection, rows: Sequence[WindowRow]) -> None:
    """History for rows whose queue job had vanished and was pushed again."""
    if rows:
        conn.execute(
            text(
                "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail) "
                "SELECT id, tenant, 'requeued', version, "
                "jsonb_build_object('reason', 'queue_job_missing', 'queue_job_id', job) "
                "FROM scheduled_jobs JOIN unnest(CAST(:ids AS uuid[]), CAST(:jobs AS text[])) "
                "AS r(rid, job) ON id = rid"
            ),
            {"ids": [r.id for r in rows], "jobs": [r.queue_job_id for r in rows]},
        )


RESCUE_EXPIRED = text(
    """
    WITH expired AS (
        SELECT id FROM scheduled_jobs
        WHERE status = 'running' AND lease_expires_at < statement_timestamp()
        ORDER BY lease_expires_at
        FOR UPDATE SKIP LOCKED
        LIMIT :limit
    ), upd AS (
        UPDATE scheduled_jobs s
        SET status = CASE WHEN s.attempts >= s.max_attempts THEN 'failed'
                          ELSE 'scheduled' END,
            queue_job_id = NULL,
            due_at = statement_timestamp(),
            lease_expires_at = NULL,
            last_error = 'attempt ' || s.attempts || ' abandoned: its worker stopped renewing '
                         || 'the lease',
            finished_at = CASE WHEN s.attempts >= s.max_attempts
                               THEN statement_timestamp() END,
            updated_at = statement_timestamp()
        WHERE s.id = ANY(ARRAY(SELECT id FROM expired))
        RETURNING s.id, s.tenant, s.version, s.attempts, s.status
    ), attempt AS (
        UPDATE scheduled_job_attempts a
        SET status = 'abandoned', finished_at = statement_timestamp(),
            error = 'the worker stopped renewing the lease'
        FROM upd
        WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = upd.attempts
          AND a.status = 'running'
    ), event AS (
        INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
        SELECT id, tenant, 'abandoned', version,
               jsonb_build_object('attempt', attempts, 'then', status)
        FROM upd
        UNION ALL
        SELECT id, tenant, 'failed', version,
               jsonb_build_object('attempt', attempts, 'error', 'attempts exhausted')
        FROM upd WHERE status = 'failed'
    )
    SELECT status, count(*) AS n FROM upd GROUP BY status
    """
)


def rescue_expired(conn: Connection, limit: int) -> dict[str, int]:
    """Running rows whose lease expired (their worker is gone): the attempt is recorded as
    abandoned; the row goes back to ``scheduled`` (due now) or, with its attempts exhausted,
    to ``failed``. (A row scheduled by an App that did not know the type's handler has no
    ``max_attempts``: it goes back, and the worker fails it if no attempt is left.)
    Returns counts by new status."""
    return {r.status: int(r.n) for r in _fast(conn, RESCUE_EXPIRED, {"limit": limit})}


def schedule_states(
    conn: Connection, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[Status, int]]:
    """(status, version) of each id that exists (for telling orphan queue jobs)."""
    rows = conn.execute(
        text("SELECT id, status, version FROM scheduled_jobs WHERE id = ANY(CAST(:ids AS uuid[]))"),
        {"ids": list(ids)},
    )
    return {r.id: (Status(r.status), r.version) for r in rows}


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


@dataclass(frozen=True)
class OverdueRow:
    """A ``scheduled`` row already due, as stats check it against Redis."""

    queue_job_id: str | None  # None: not pushed yet
    due_at: datetime
    stuck: bool  # overdue by more than the ``stuck_after`` asked for


def overdue_rows(
    conn: Connection, limit: int, stuck_after: timedelta, tenant: str | None = None
) -> list[OverdueRow]:
    """``scheduled`` rows already due, oldest first (at most ``limit``; one tenant's)."""
    rows = conn.execute(
        text(
            "SELECT queue_job_id, due_at, "
            "due_at < statement_timestamp() - CAST(:stuck AS interval) AS stuck "
            f"FROM scheduled_jobs WHERE status = 'scheduled' AND {_TENANT} "
            "AND due_at <= statement_timestamp() ORDER BY due_at LIMIT :limit"
        ),
        {"limit": limit, "stuck": stuck_after, "tenant": tenant},
    )
    return [OverdueRow(r.queue_job_id, r.due_at.astimezone(UTC), r.stuck) for r in rows]


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


# -- recurring schedules ---------------------------------------------------------------------

RECURRING_COLUMNS = (
    "id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace, "
    "status, version, next_run_at, created_at, updated_at, queue, last_error"
)


def _recurring(row: Row[Any]) -> Recurring:
    m = row._mapping
    return Recurring(
        id=m["id"],
        tenant=m["tenant"],
        name=m["name"],
        type=m["type"],
        payload=m["payload"],
        cron=m["cron"],
        timezone=m["timezone"],
        dst_gap=DstGap(m["dst_gap"]),
        dst_overlap=DstOverlap(m["dst_overlap"]),
        misfire=Misfire(m["misfire"]),
        grace=m["grace"],
        status=m["status"],
        version=m["version"],
        next_run_at=m["next_run_at"].astimezone(UTC),
        created_at=m["created_at"].astimezone(UTC),
        updated_at=m["updated_at"].astimezone(UTC),
        queue=m["queue"],
        last_error=m["last_error"],
    )


def get_recurring(
    conn: Connection, tenant: str | None, name: str, *, lock: bool = False
) -> Recurring | None:
    """The recurring schedule ``name`` of ``tenant`` (None: the default tenant's)."""
    row = conn.execute(
        text(
            f"SELECT {RECURRING_COLUMNS} FROM recurring_schedules "
            "WHERE tenant = :tenant AND name = :name" + (" FOR UPDATE" if lock else "")
        ),
        {"tenant": tenant, "name": name},
    ).first()
    return None if row is None else _recurring(row)


def save_recurring(
    conn: Connection, spec: RecurringSpec, next_run_at: datetime
) -> Recurring | None:
    """Create the definition, or replace it at version + 1 (the caller holds its lock); None
    when an active definition is already exactly this one — compared as PostgreSQL stores
    it (``jsonb`` payload, interval), so an identical call never bumps the version. A
    quarantined definition becomes active again."""
    row = conn.execute(
        text(
            f"""
            INSERT INTO recurring_schedules
                (id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap,
                 misfire, grace, next_run_at, queue)
            VALUES (:id, :tenant, :name, :type, CAST(:payload_json AS jsonb), :cron, :timezone,
                    :dst_gap, :dst_overlap, :misfire, :grace, :next_run_at, :queue)
            ON CONFLICT (tenant, name) DO UPDATE
            SET type = EXCLUDED.type, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
                queue = EXCLUDED.queue,
                timezone = EXCLUDED.timezone, dst_gap = EXCLUDED.dst_gap,
                dst_overlap = EXCLUDED.dst_overlap, misfire = EXCLUDED.misfire,
                grace = EXCLUDED.grace, next_run_at = EXCLUDED.next_run_at,
                version = recurring_schedules.version + 1, updated_at = statement_timestamp(),
                status = CASE WHEN recurring_schedules.status = 'error' THEN 'active'
                              ELSE recurring_schedules.status END,
                last_error = NULL
            WHERE (recurring_schedules.type, recurring_schedules.payload,
                   recurring_schedules.cron, recurring_schedules.timezone,
                   recurring_schedules.dst_gap, recurring_schedules.dst_overlap,
                   recurring_schedules.misfire, recurring_schedules.grace,
                   recurring_schedules.queue, recurring_schedules.status)
                  IS DISTINCT FROM
                  (EXCLUDED.type, EXCLUDED.payload, EXCLUDED.cron, EXCLUDED.timezone,
                   EXCLUDED.dst_gap, EXCLUDED.dst_overlap, EXCLUDED.misfire, EXCLUDED.grace,
                   EXCLUDED.queue, 'active')
            RETURNING {RECURRING_COLUMNS}
            """
        ),
        {"id": uuid.uuid4(), "next_run_at": next_run_at, **asdict(spec)},
    ).first()
    return None if row is None else _recurring(row)


def quarantine_recurring(conn: Connection, recurring_id: uuid.UUID, error: str) -> None:
    """Set aside a definition the scheduler could not evaluate: status ``error`` with the
    reason, and a ``quarantined`` event on the definition's id. An update or a resume makes
    it active again."""
    conn.execute(
        text(
            """
            WITH upd AS (
                UPDATE recurring_schedules
                SET status = 'error', last_error = :error, updated_at = statement_timestamp()
                WHERE id = :id
                RETURNING id, tenant, version
            )
            INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
            SELECT id, tenant, 'quarantined', version, jsonb_build_object('error', :error)
            FROM upd
            """
        ),
        {"id": recurring_id, "error": error},
    )


def set_recurring_status(
    conn: Connection, recurring_id: uuid.UUID, status: str, next_run_at: datetime | None
) -> Recurring:
    """Pause or resume, under a new version (occurrences made after a resume are new ones, not
    the cancelled ones of before); resuming restarts from ``next_run_at``."""
    row = conn.execute(
        text(
            "UPDATE recurring_schedules SET status = :status, version = version + 1, "
            "next_run_at = COALESCE(CAST(:next_run_at AS timestamptz), next_run_at), "
            f"updated_at = statement_timestamp() WHERE id = :id RETURNING {RECURRING_COLUMNS}"
        ),
        {"id": recurring_id, "status": status, "next_run_at": next_run_at},
    ).one()
    return _recurring(row)


def delete_recurring(conn: Connection, recurring_id: uuid.UUID) -> None:
    """Delete the definition; its occurrences keep their history (``recurring_id`` → NULL)."""
    conn.execute(text("DELETE FROM recurring_schedules WHERE id = :id"), {"id": recurring_id})


def cancel_occurrences(conn: Connection, recurring_id: uuid.UUID, reason: str) -> list[str]:
    """Cancel the occurrences still waiting to run; returns the queue jobs to discard."""
    rows = conn.execute(
        text(
            """
            WITH upd AS (
                UPDATE scheduled_jobs
                SET status = 'cancelled', version = version + 1,
                    finished_at = statement_timestamp(), updated_at = statement_timestamp()
                WHERE recurring_id = :rid AND status = 'scheduled'
                RETURNING id, tenant, version, queue_job_id
            ), event AS (
                INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
                SELECT id, tenant, 'cancelled', version,
                       jsonb_build_object('reason', CAST(:reason AS text))
                FROM upd
            )
            SELECT queue_job_id FROM upd WHERE queue_job_id IS NOT NULL
            """
        ),
        {"rid": recurring_id, "reason": reason},
    )
    return [r.queue_job_id for r in rows]


def due_recurring(conn: Connection, window: timedelta, limit: int) -> list[Recurring]:
    """Lock (SKIP LOCKED) active definitions whose next occurrence enters the window."""
    rows = conn.execute(
        text(
            f"SELECT {RECURRING_COLUMNS} FROM recurring_schedules "
            "WHERE status = 'active' "
            "AND next_run_at <= statement_timestamp() + CAST(:window AS interval) "
            "ORDER BY next_run_at FOR UPDATE SKIP LOCKED LIMIT :limit"
        ),
        {"window": window, "limit": limit},
    ).all()
    return [_recurring(r) for r in rows]


@dataclass(frozen=True)
class Occurrence:
    """One occurrence to materialize: its instant and, in its zone, its wall time."""

    run_at: datetime
    local_run_at: datetime


def insert_occurrences(
    conn: Connection, recurring: Recurring, occurrences: Sequence[Occurrence]
) -> int:
    """Insert occurrences as ordinary schedules under ids derived from (definition, version,
    instant); one already there (another scheduler made it) is left alone. Returns how many
    were new."""
    if not occurrences:
        return 0
    ids = [
        uuid.uuid5(recurring.id, f"v{recurring.version}:{o.run_at.isoformat()}")
        for o in occurrences
    ]
    row = conn.execute(
        text(
            """
            WITH new AS (
                INSERT INTO scheduled_jobs
                    (id, tenant, type, payload, run_at, due_at, timezone, local_run_at,
                     recurring_id, recurring_version, queue)
                SELECT o.id, :tenant, :type, CAST(:payload AS jsonb), o.run_at, o.run_at,
                       :timezone, o.local_run_at, :rid, :version, :queue
                FROM unnest(CAST(:ids AS uuid[]), CAST(:run_ats AS timestamptz[]),
                            CAST(:locals AS timestamp[])) AS o(id, run_at, local_run_at)
                ON CONFLICT DO NOTHING
                RETURNING id, tenant, version, run_at
            ), event AS (
                INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
                SELECT id, tenant, 'created', version,
                       jsonb_build_object('run_at', run_at, 'recurring', CAST(:name AS text),
                                          'recurring_version', CAST(:version AS integer))
                FROM new
            )
            SELECT count(*) FROM new
            """
        ),
        {
            "ids": ids,
            "run_ats": [o.run_at for o in occurrences],
            "locals": [o.local_run_at for o in occurrences],
            "tenant": recurring.tenant,
            "type": recurring.type,
            "payload": json.dumps(recurring.payload),
            "timezone": recurring.timezone,
            "rid": recurring.id,
            "version": recurring.version,
            "name": recurring.name,
            "queue": recurring.queue,
        },
    ).scalar_one()
    return int(row)


def advance_recurring(conn: Connection, recurring_id: uuid.UUID, next_run_at: datetime) -> None:
    """Record where the next materialization starts."""
    conn.execute(
        text("UPDATE recurring_schedules SET next_run_at = :next WHERE id = :id"),
        {"id": recurring_id, "next": next_run_at},
    )


# -- tenant quotas ---------------------------------------------------------------------------

QUOTA_COLUMNS = ("max_live", "max_inflight")


@dataclass(frozen=True)
class Quota:
    """A tenant's own caps as stored (``None``: the default's applies), or the default's."""

    tenant: str
    max_live: int | None
    max_inflight: int | None


def set_quota(conn: Connection, tenant: str, caps: dict[str, int | None]) -> None:
    """Set the given caps (``QUOTA_COLUMNS``) of a tenant, or of the default (tenant '*');
    ``None`` clears one (a tenant then follows the default, the default means no cap)."""
    if not caps or not set(caps) <= set(QUOTA_COLUMNS):
        raise ValueError(f"caps must name some of {QUOTA_COLUMNS}, got {sorted(caps)}")
    columns = ", ".join(caps)
    values = ", ".join(f":{c}" for c in caps)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in caps)
    conn.execute(
        text(
            f"INSERT INTO tenant_quotas (tenant, {columns}) VALUES (:tenant, {values}) "
            f"ON CONFLICT (tenant) DO UPDATE SET {updates}, updated_at = statement_timestamp()"
        ),
        {"tenant": tenant, **caps},
    )


def quotas(conn: Connection) -> list[Quota]:
    """Every stored quota row, the default first."""
    rows = conn.execute(
        text(
            "SELECT tenant, max_live, max_inflight FROM tenant_quotas "
            "ORDER BY tenant <> :default, tenant"
        ),
        {"default": DEFAULT_QUOTA_TENANT},
    )
    return [Quota(r.tenant, r.max_live, r.max_inflight) for r in rows]


def live_quota(conn: Connection, tenant: str) -> int | None:
    """The tenant's cap on live schedules: its own, else the default, else none."""
    value = conn.execute(
        text(f"SELECT {_cap_sql('max_live', ':tenant')}"), {"tenant": tenant}
    ).scalar_one()
    return None if value is None else int(value)


def count_live_up_to(conn: Connection, tenant: str, cap: int) -> int:
    """The tenant's live schedules, counted up to ``cap`` under a per-tenant lock held until
    the transaction ends (so concurrent admissions cannot both take the last place)."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('duejobs-quota:' || :tenant))"),
        {"tenant": tenant},
    )
    count = conn.execute(
        text(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM scheduled_jobs WHERE tenant = :tenant "
            "        AND status = 'scheduled' AND queue_job_id IS NULL LIMIT :cap) AS waiting) "
            f"+ {_inflight_sql(':tenant', ':cap')}"
        ),
        {"tenant": tenant, "cap": cap},
    ).scalar_one()
    return int(count)


# -- what other modules used to say in SQL -----------------------------------------------------


def server_answers(url: str) -> bool:
    """Whether the PostgreSQL server at ``url`` (a libpq URL) answers a trivial query."""
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def create_database(url: str, database: str) -> None:
    """Create ``database`` on the server at ``url`` unless it exists (safe when several
    processes race to create it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        if exists.fetchone() is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(database)))


def is_missing_table(exc: BaseException | None) -> bool:
    """Whether a driver error says a table does not exist (the schema was never migrated)."""
    return isinstance(exc, psycopg.errors.UndefinedTable)


def advisory_lock(conn: Connection, key: int) -> None:
    """Hold PostgreSQL's advisory lock ``key`` until the transaction ends (migrators queue
    behind one another)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


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
