"""A worker's attempt: claim, lease, effect ledger, finish, stale and deferred records."""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from duejobs.models import (
    Delivery,
    EventKind,
    Status,
)
from duejobs.store.execution import record, run, run_count, run_one, with_local_settings

if TYPE_CHECKING:
    from sqlalchemy import Connection

# -- the delivery path: worker ---------------------------------------------------------------


class SkipReason(enum.StrEnum):
    """Why a worker did not run a delivery."""

    MISSING = "missing"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    DUPLICATE = "duplicate"
    NOT_DUE = "not_due"
    EXPIRED = "expired"
    # A claim made ahead that the reconciler rescued before its handler could start (its
    # start was held up past its lease): the attempt the rescue pushed runs instead.
    LAPSED = "lapsed"
    # Its type has no handler in this worker: put back for one that has (see the worker).
    UNKNOWN_TYPE = "unknown_type"
    # A rate limit of its queue or tenant granted no start now: back to the table, for the
    # scheduler to push again at the limit's pace (:mod:`duejobs.store.rate_limits`), no
    # attempt used.
    RATE_LIMITED = "rate_limited"


@dataclass(frozen=True)
class RunClaim:
    """What the worker learned when it tried to claim a delivery: a running attempt (no
    ``skip``: its type, payload and times), or why it cannot run now (``rate_limited``: with
    ``due_at`` the start slot its limit gave it).

    A running attempt's ``started_at`` is when its handler may start, by the database clock:
    ``db_now``, or a moment after it for a start a rate limit granted for its slot just ahead;
    ``not_before`` is that moment on this process's ``time.monotonic()``, counted from when the
    answer came (after the database read its clock, so waiting for it never starts early)."""

    skip: SkipReason | None
    type: str = ""
    payload: Any = None
    run_at: datetime | None = None
    due_at: datetime | None = None
    db_now: datetime | None = None
    trace_context: str | None = None  # the scheduling caller's (duejobs.observability.tracing)
    interruptions: int = 0  # this version's attempts a broken connection ended
    unknown_since: datetime | None = None  # first put back for an unknown type (this version)
    started_at: datetime | None = None
    not_before: float = 0.0


def claim_runs(
    conn: Connection,
    deliveries: Sequence[Delivery],
    *,
    worker: str,
    lease: timedelta,
    types: Sequence[str],
    claim: str,
    hold: timedelta = timedelta(0),
) -> list[RunClaim | None]:
    """Turn the deliveries that can run now into running attempts, in one statement: each
    one's row (of its tenant) ``scheduled`` at the delivered version, this being its next
    attempt, due by the database clock, not expired, of one of ``types`` (those the worker
    has handlers for), and not locked by another transaction.
    The answers follow the deliveries' order, each matched by (schedule id, version,
    attempt) — copies of one schedule at other versions may come in the same batch; None for
    one left untouched (see :func:`claim_verdict`), and for a second copy of a delivery
    claimed once; ``rate_limited`` for one a rate limit turned back (the rate limits'
    grant is part of the statement: :mod:`duejobs.store.rate_limits`). A row under a limit
    whose start the limit grants for a moment within ``hold`` from now is claimed for that
    moment (``started_at``, ``not_before``). ``claim`` names the statement in each ``started``
    event (:func:`claim_landed`)."""
    params = {
        "synchronous_commit": None,  # a bookkeeping connection gives its own
        "lock_timeout": None,  # and its lock limit
        "claim": claim,
        "ids": [d.schedule_id for d in deliveries],
        "tenants": [d.tenant for d in deliveries],
        "versions": [d.version for d in deliveries],
        "attempts": [d.attempt for d in deliveries],
        "worker": worker,
        "lease": lease,
        "types": list(types),
        "hold": hold,
    }
    rows = run(conn, "claim_runs", params)
    answered = time.monotonic()
    claimed = {
        (row.id, row.version, row.attempt): record(
            RunClaim,
            row,
            skip=row.skip and SkipReason(row.skip),
            unknown_since=None,
            not_before=_not_before(row, answered),
        )
        for row in rows
    }
    return [claimed.pop((d.schedule_id, d.version, d.attempt), None) for d in deliveries]


def claim_landed(conn: Connection, delivery: Delivery, claim: str) -> RunClaim | None:
    """The delivery's claim made by the statement named ``claim`` (see :func:`claim_runs`)
    when that statement committed though its answer was lost; None when it did not."""
    params = {
        "id": delivery.schedule_id,
        "tenant": delivery.tenant,
        "version": delivery.version,
        "attempt": delivery.attempt,
        "claim": claim,
    }
    row = run_one(conn, "claim_landed", params)
    if row is None:
        return None
    not_before = _not_before(row, time.monotonic())
    return record(RunClaim, row, skip=None, unknown_since=None, not_before=not_before)


def _not_before(row: Any, answered: float) -> float:
    """When (``time.monotonic()``) a claimed row's handler may start: its grant's moment, as
    far past ``answered`` as it was past the statement's clock."""
    if row.started_at is None or row.started_at <= row.db_now:
        return 0.0
    ahead: float = (row.started_at - row.db_now).total_seconds()
    return answered + ahead


def claim_verdict(
    conn: Connection, delivery: Delivery, *, worker: str, types: Sequence[str]
) -> RunClaim:
    """Why a delivery :func:`claim_runs` left out cannot run now, after waiting for a row
    lock another transaction holds (up to the connection's ``lock_timeout``); skips other
    than ``not_due`` are recorded as events. ``skip`` None: it can run now (its row was
    locked when the claim looked) — claim again."""
    row = run_one(
        conn,
        "claim_verdict",
        {
            "id": delivery.schedule_id,
            "tenant": delivery.tenant,
            "version": delivery.version,
            "attempt": delivery.attempt,
            "worker": worker,
            "types": list(types),
            "current_status": Status.SCHEDULED.value,
            "current_attempts": delivery.attempt - 1,
        },
    )
    if row is None:
        return RunClaim(skip=SkipReason.MISSING)
    return RunClaim(
        skip=SkipReason(row.reason) if row.reason else None,
        type=row.type,
        due_at=row.due_at.astimezone(UTC),
        db_now=row.db_now.astimezone(UTC),
        unknown_since=row.unknown_since and row.unknown_since.astimezone(UTC),
    )


def expire(conn: Connection, delivery: Delivery) -> None:
    """Cancel a schedule whose delivery came later than its ``expires_after`` allows."""
    run(conn, "expire", {"id": delivery.schedule_id, "version": delivery.version})


def record_deferred(conn: Connection, delivery: Delivery, reason: SkipReason, worker: str) -> None:
    """Record that a delivery was put back without using an attempt: early (``not_due``),
    or of a type this worker has no handler for (``unknown_type``)."""
    params = {
        "id": delivery.schedule_id,
        "version": delivery.version,
        "attempt": delivery.attempt,
        "reason": reason.value,
        "worker": worker,
    }
    run(conn, "record_deferred", params)


def defer_unknown_type(conn: Connection, delivery: Delivery, due_at: datetime, worker: str) -> None:
    """Put back a delivery of a type this worker has no handler for: its row due at
    ``due_at`` (when its job goes back on the queue), no attempt used, recorded."""
    params = {
        "id": delivery.schedule_id,
        "version": delivery.version,
        "attempt": delivery.attempt,
        "due_at": due_at,
        "worker": worker,
    }
    run(conn, "defer_unknown_type", params)


def fail_unknown_type(conn: Connection, delivery: Delivery, error: str, worker: str) -> bool:
    """Fail for good, without an attempt, a schedule of a type no worker that took it had a
    handler for; False when it is no longer that delivery's (it moved on meanwhile)."""
    params = {
        "id": delivery.schedule_id,
        "version": delivery.version,
        "attempt": delivery.attempt,
        "error": error,
        "worker": worker,
    }
    return run_one(conn, "fail_unknown_type", params) is not None


def change_since_claim(
    conn: Connection, delivery: Delivery, *, fence_idle: timedelta | None = None
) -> SkipReason | None:
    """None while the attempt is still the current one; otherwise what changed.
    With ``fence_idle`` (the effect fence) the row stays locked until the transaction ends,
    and the server ends the session should the transaction sit idle longer than that."""
    params: dict[str, Any] = {
        "id": delivery.schedule_id,
        "version": delivery.version,
        "current_status": Status.RUNNING.value,
        "current_attempts": delivery.attempt,
    }
    if fence_idle is not None:
        params["idle_timeout"] = f"{max(1, fence_idle // timedelta(milliseconds=1))}ms"
    locked = fence_idle is not None
    row = run_one(conn, "change_since_claim_locked" if locked else "change_since_claim", params)
    if row is None:
        return SkipReason.MISSING
    return None if row.reason is None else SkipReason(row.reason)


def extend_leases(conn: Connection, running: Sequence[Delivery], lease: timedelta) -> None:
    """Push forward the leases of running attempts in one statement; those no longer current,
    or whose row is locked now, are left as they are."""
    params = {
        "ids": [d.schedule_id for d in running],
        "versions": [d.version for d in running],
        "attempts": [d.attempt for d in running],
        "lease": lease,
    }
    run_count(conn, "extend_leases", params)


def renew_claim(conn: Connection, delivery: Delivery, lease: timedelta) -> bool:
    """Renew the lease of a claim made ahead of its handler; False when it is no longer the
    current attempt (the reconciler rescued it, or the schedule moved on)."""
    params = {
        "id": delivery.schedule_id,
        "version": delivery.version,
        "attempt": delivery.attempt,
        "lease": lease,
    }
    return run_one(conn, "renew_claim", params) is not None


def record_effect(
    conn: Connection, effect_key: str, schedule_id: uuid.UUID, tenant: str, version: int
) -> bool:
    """Insert the effect key; False if it was already recorded (the effect happened)."""
    params = {"key": effect_key, "id": schedule_id, "tenant": tenant, "version": version}
    return run_one(conn, "record_effect", params) is not None


@dataclass(frozen=True)
class Closing:
    """A running attempt's outcome: ``succeeded``, ``failed``, or ``scheduled`` again for a
    retry after ``retry_in`` (``run_at`` never moves). ``interrupted``: a retry because the
    attempt's connection broke, counted in the row's ``interruptions``, not its attempts."""

    delivery: Delivery
    outcome: Status
    error: str | None = None
    retry_in: timedelta | None = None
    interrupted: bool = False


_EVENTS = {
    Status.SUCCEEDED: EventKind.SUCCEEDED,
    Status.FAILED: EventKind.FAILED,
    Status.SCHEDULED: EventKind.RETRIED,
}


def finish(conn: Connection, closings: Sequence[Closing]) -> list[bool]:
    """Close running attempts, in one statement; whether each was closed, in their order.
    One is left open when it is no longer current (the schedule was cancelled, rescheduled
    or rescued meanwhile) or when another transaction holds its row now (see
    :func:`change_since_claim` with ``fence_idle``)."""
    params = {
        "synchronous_commit": None,  # a bookkeeping connection gives its own
        "ids": [c.delivery.schedule_id for c in closings],
        "versions": [c.delivery.version for c in closings],
        "attempts": [c.delivery.attempt for c in closings],
        "statuses": [c.outcome.value for c in closings],
        "events": [_EVENTS[c.outcome].value for c in closings],
        "errors": [c.error for c in closings],
        "retry_ins": [c.retry_in for c in closings],
        "interrupted": [c.interrupted for c in closings],
    }
    closed = {(r.id, r.version, r.attempt) for r in run(conn, "finish", params)}
    return [
        (c.delivery.schedule_id, c.delivery.version, c.delivery.attempt) in closed for c in closings
    ]


def attempt_closed(conn: Connection, delivery: Delivery) -> Status | None:
    """What the delivery's attempt was closed as by :func:`finish` (``scheduled``: failed,
    with a retry to come), or None while it is not closed that way."""
    params = {"id": delivery.schedule_id, "version": delivery.version, "attempt": delivery.attempt}
    row = run_one(conn, "attempt_closed", params)
    return None if row is None else Status(row.closed_as)


def record_stale(conn: Connection, delivery: Delivery, reason: SkipReason) -> None:
    """Record that a running attempt lost its schedule (cancelled, superseded, rescued):
    its result is not applied, and the history says so."""
    run(
        conn,
        "record_stale",
        {
            "id": delivery.schedule_id,
            "version": delivery.version,
            "attempt": delivery.attempt,
            "reason": reason.value,
        },
    )


def for_bookkeeping(conn: Connection, lock_timeout: timedelta, durable: bool) -> Connection:
    """``conn`` as a worker's bookkeeping connection: in autocommit, each statement with the
    query ``bookkeeping_settings`` ahead of it, in its own transaction."""
    params = {
        "lock_timeout": f"{max(1, int(lock_timeout.total_seconds() * 1000))}ms",
        "synchronous_commit": "on" if durable else "off",
    }
    return with_local_settings(conn, "bookkeeping_settings", params)


@dataclass(frozen=True)
class Durability:
    """How a worker's bookkeeping commits: ``synchronous_commit`` as its statements run, and
    the server's ``synchronous_standby_names`` (empty: no synchronous replication)."""

    synchronous_commit: str
    standbys: str


def bookkeeping_durability(conn: Connection) -> Durability:
    """Read on a bookkeeping connection (see :func:`for_bookkeeping`)."""
    row = run_one(conn, "bookkeeping_durability")
    assert row is not None
    return Durability(row.synchronous_commit, row.standbys)


def bounded_locks(conn: Connection) -> None:
    """Give up on row locks after a second, until this transaction ends."""
    run(conn, "bounded_locks")
