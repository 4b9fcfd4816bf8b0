"""Schedules many at a time: a binary COPY, keyed rows through a staging table."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from duejobs.ids import id_stream
from duejobs.store.execution import copying, database_now, meanwhile, run
from duejobs.store.schedules import NewRow, insert_keyed
from duejobs.timespec import jitter_offset

if TYPE_CHECKING:
    from sqlalchemy import Connection

# Bulk scheduling: rows are streamed with COPY into a session-local staging table, then moved
# with one INSERT ... SELECT (database clock for delays, key conflicts skipped) that also
# writes their `created` events.
_STAGING = "duejobs_staging"  # created by the query create_staging
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
    "priority",
)


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
    db_now = database_now(conn)
    drawn: list[bytes] = []
    keyed: list[tuple[int, uuid.UUID, NewRow]] = []
    first = last = b""  # the batch's first and last copied ids
    with copying(conn, "scheduled_jobs", _DIRECT_COLUMNS, _DIRECT_TYPES) as copy:
        for r, raw in zip(rows, id_stream(), strict=False):  # ids never run out
            drawn.append(raw)
            if r.key is not None:
                keyed.append((len(drawn) - 1, uuid.UUID(bytes=raw), r))
                continue
            when = r.when
            run_at = when.run_at if when.delay is None else db_now + when.delay
            assert run_at is not None  # a When holds a delay or an instant
            offset = jitter_offset(uuid.UUID(bytes=raw), r.jitter) if r.jitter else r.jitter
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
                    r.priority,
                )
            )
            first, last = first or raw, raw
    recording = (
        meanwhile(
            conn, "record_copied", {"first": uuid.UUID(bytes=first), "last": uuid.UUID(bytes=last)}
        )
        if first
        else contextlib.nullcontext()
    )
    with recording:  # the copied rows' events are written while the ids' objects are made
        ids = [uuid.UUID(bytes=raw) for raw in drawn]
    if keyed:
        _insert_staged(conn, keyed, ids)
    return ids


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
    "priority",
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
    "int2",
)
_JSONB = b"\x01"


def _insert_staged(
    conn: Connection, keyed: Sequence[tuple[int, uuid.UUID, NewRow]], ids: list[uuid.UUID]
) -> None:
    """Insert rows with keys (``(position, id, row)``), setting ``ids[position]`` to the
    holder of each key that was already taken."""
    run(conn, "create_staging")
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
            jitter_offset(sid, r.jitter),
            r.expires_after,
            r.max_attempts,
            r.when.timezone,
            r.when.local_run_at,
            r.queue,
            r.priority,
        )
        for i, sid, r in keyed
    ]
    with copying(conn, _STAGING, _STAGING_COLUMNS) as copy:
        for row in staged:
            copy.write_row(row)
    created = insert_keyed(conn, "move_staged")[0].created
    if created < len(keyed):
        for staged_key in run(conn, "staged_keys"):
            ids[staged_key.ord] = staged_key.id
    run(conn, "clear_staging")
