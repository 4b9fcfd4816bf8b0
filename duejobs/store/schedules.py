"""Schedules one at a time: create, read, reschedule, cancel, history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import TYPE_CHECKING, Any

from duejobs.errors import KeyInUseError
from duejobs.ids import new_id
from duejobs.models import (
    Attempt,
    Event,
    EventKind,
    QueueJob,
    Schedule,
    Status,
)
from duejobs.store import dbapi
from duejobs.store.execution import record, run, run_one
from duejobs.store.partition_keys import LIVE_KEY_INDEX
from duejobs.store.partitions import is_partitioned
from duejobs.timespec import When, jitter_offset

if TYPE_CHECKING:
    from sqlalchemy import Connection


def as_schedule(m: Any, created: bool | None = None, was_running: bool | None = None) -> Schedule:
    return record(Schedule, m, status=Status(m.status), created=created, was_running=was_running)


def _when_params(when: When) -> dict[str, Any]:
    return {
        "run_at": when.run_at,
        "delay": when.delay,
        "timezone": when.timezone,
        "local_run_at": when.local_run_at,
    }


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
    priority: int = 0
    # "<link|child> <traceparent>" of the caller (duejobs.observability.tracing); None when tracing
    # is off.
    trace_context: str | None = None


def insert_schedule(conn: Connection, new: NewRow) -> tuple[Schedule, bool]:
    """Create a schedule, or return the live one holding ``key``; (schedule, created).

    With ``jitter``, the schedule is due at ``run_at`` plus
    :func:`~duejobs.timespec.jitter_offset`."""
    schedule_id = new_id()
    params = {
        "id": schedule_id,
        "jitter_offset": jitter_offset(schedule_id, new.jitter),
        "expires_after": new.expires_after,
        "max_attempts": new.max_attempts,
        "tenant": new.tenant,
        "type": new.job_type,
        "key": new.key,
        "payload": new.payload_json,
        "queue": new.queue,
        "priority": new.priority,
        "trace_context": new.trace_context,
        **_when_params(new.when),
    }
    while True:
        rows = (
            run(conn, "insert_schedule", params)
            if new.key is None
            else insert_keyed(conn, "insert_schedule", params)
        )
        if rows:
            row = rows[0]
            return as_schedule(row, True), True
        # The key is held by a live schedule. Read it with a fresh snapshot: the holder may
        # have committed after this statement began. If it finished meanwhile, insert again.
        existing = run_one(conn, "live_by_key", {"tenant": new.tenant, "key": new.key})
        if existing is not None:
            return as_schedule(existing, False), False


def inserts_in_one_statement(conn: Connection, new: NewRow) -> bool:
    """Whether :func:`insert_schedule` of ``new`` is a single statement, which PostgreSQL's
    implicit transaction may commit alone: not a keyed insert in partitioned mode (its
    savepoint needs a transaction)."""
    return new.key is None or not is_partitioned(conn)


# Runs of a keyed insert that lost a race for a key before its error is raised: each lost
# race is a rival's commit, so this only guards against a loop without progress.
_KEY_RACES = 50


def insert_keyed(conn: Connection, name: str, params: dict[str, Any] | None = None) -> list[Any]:
    """Run ``name``, an insert of rows with keys that skips a key held by a live schedule.

    In the plain schema the live-key index skips a row whose key a rival took meanwhile (in
    a transaction that committed after the statement began). In partitioned mode the key
    trigger fails it instead: there the insert runs under a savepoint, and again after such
    a failure, when it sees that rival and skips its key. Right after a conversion to
    partitioned mode (see :func:`~duejobs.store.partitions.is_partitioned`) such a race may
    still raise the unique index's error once."""
    if not is_partitioned(conn):
        return run(conn, name, params)
    races = 0
    while True:
        try:
            with conn.begin_nested():
                return run(conn, name, params)
        except dbapi.IntegrityError as exc:
            races += 1
            if races == _KEY_RACES or _constraint(exc) != LIVE_KEY_INDEX:
                raise


def live_by_key(conn: Connection, tenant: str, key: str) -> Schedule | None:
    """The live schedule holding ``key`` for ``tenant``, if any."""
    row = run_one(conn, "live_by_key", {"tenant": tenant, "key": key})
    return None if row is None else as_schedule(row)


def get_schedule(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> Schedule | None:
    """The schedule with that id, if it exists and belongs to ``tenant`` (None: any tenant)."""
    row = run_one(conn, "get_schedule", {"id": schedule_id, "tenant": tenant})
    return None if row is None else as_schedule(row)


def reschedule(
    conn: Connection,
    schedule_id: uuid.UUID,
    tenant: str | None,
    when: When,
    expected_version: int | None,
    priority: int | None = None,
) -> tuple[Schedule | None, QueueJob | None]:
    """Move a live schedule to a new time (and to ``priority``, if given) under version + 1.

    Returns (schedule — ``was_running`` said —, queue job of the superseded version if it was
    pushed) or (None, None)
    when no live row matched; :func:`get_schedule` then tells why.
    """
    row = run_one(
        conn,
        "reschedule",
        {
            "id": schedule_id,
            "tenant": tenant,
            "expected": expected_version,
            "priority": priority,
            **_when_params(when),
        },
    )
    if row is None:
        return None, None
    schedule = as_schedule(row, was_running=row.old_status == Status.RUNNING.value)
    old = row.old_queue_job_id
    return schedule, None if old is None else QueueJob(old, schedule.queue)


def retry(
    conn: Connection, schedule_id: uuid.UUID, tenant: str | None, when: When
) -> Schedule | None:
    """Schedule a failed or cancelled schedule again (version + 1, attempts from zero); None
    when no such row matched (:func:`get_schedule` then tells why).

    Under a savepoint: a live schedule that took the key after the caller looked (its
    transaction committed while this one waited on the key) raises :class:`KeyInUseError`
    and leaves the caller's transaction usable."""
    params = {"id": schedule_id, "tenant": tenant, **_when_params(when)}
    try:
        with conn.begin_nested():
            row = run_one(conn, "retry", params)
    except dbapi.IntegrityError as exc:
        if _constraint(exc) != LIVE_KEY_INDEX:
            raise
        raise KeyInUseError(
            f"schedule {schedule_id}'s key is held by another live schedule (taken while it "
            "was retried): cancel that one first"
        ) from None
    return None if row is None else as_schedule(row)


def _constraint(exc: dbapi.IntegrityError) -> str | None:
    """The name of the constraint (or index) an integrity error is about."""
    return getattr(getattr(exc.orig, "diag", None), "constraint_name", None)


def cancel(
    conn: Connection, schedule_id: uuid.UUID, tenant: str | None
) -> tuple[bool, QueueJob | None]:
    """Cancel a live schedule (version + 1); returns (cancelled, its queue job if pushed)."""
    row = run_one(conn, "cancel", {"id": schedule_id, "tenant": tenant})
    if row is None:
        return False, None
    return True, None if row.queue_job_id is None else QueueJob(row.queue_job_id, row.queue)


def history(
    conn: Connection,
    schedule_id: uuid.UUID,
    tenant: str | None,
    newest: int,
    before: int | None = None,
) -> list[Event]:
    """``newest`` of the schedule's latest events (before the event id ``before``), newest
    first. Empty when not visible to ``tenant``."""
    params = {"id": schedule_id, "tenant": tenant, "limit": newest, "before": before}
    rows = run(conn, "history_newest", params)
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


def attempts(
    conn: Connection, schedule_id: uuid.UUID, tenant: str | None, newest: int | None = None
) -> list[Attempt]:
    """The schedule's attempts, oldest first; with ``newest``, that many of the latest, newest
    first. Empty when not visible to ``tenant``."""
    params: dict[str, object] = {"id": schedule_id, "tenant": tenant}
    if newest is not None:
        params["limit"] = newest
    rows = run(conn, "attempts" if newest is None else "attempts_newest", params)
    return [record(Attempt, r) for r in rows]


def is_past_run_at(conn: Connection, schedule_id: uuid.UUID, tenant: str | None) -> bool | None:
    """Whether the database clock has reached the schedule's ``run_at`` (None: not found)."""
    row = run_one(conn, "is_past_run_at", {"id": schedule_id, "tenant": tenant})
    return None if row is None else bool(row.past)
