"""Records that duejobs hands to callers: schedules, their statuses and their history."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Self
from zoneinfo import ZoneInfo


class Status(enum.StrEnum):
    """Where a schedule is in its life. Stored as text with a CHECK constraint."""

    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_live(self) -> bool:
        """A live schedule may still run: it can be cancelled or rescheduled."""
        return self in (Status.SCHEDULED, Status.RUNNING)


class EventKind(enum.StrEnum):
    """Kinds of entries in the append-only history (``scheduled_job_events``)."""

    CREATED = "created"
    RESCHEDULED = "rescheduled"
    CANCELLED = "cancelled"
    ENQUEUED = "enqueued"
    STARTED = "started"
    SKIPPED = "skipped"
    RETRIED = "retried"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REQUEUED = "requeued"
    ABANDONED = "abandoned"
    # A recurring definition the scheduler could not evaluate (on the definition's id).
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class Schedule:
    """One row of ``scheduled_jobs`` as the database holds it now.

    ``run_at`` is the intended instant, always aware and in UTC; a retry never moves it.
    ``due_at`` is when the next delivery may start: ``run_at``, or a retry's backoff.
    When the schedule was given as a local wall time, ``timezone`` and ``local_run_at`` keep
    that original intent.
    """

    id: uuid.UUID
    tenant: str
    type: str
    key: str | None
    payload: Any
    run_at: datetime
    due_at: datetime
    timezone: str | None
    local_run_at: datetime | None
    status: Status
    queue_job_id: str | None
    version: int
    attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    queue: str = "duejobs"  # the RQ queue it is delivered on
    priority: int = 0  # higher runs first among due work of its tenant and queue
    # What schedule() did: True when it created this schedule, False when it returned the
    # live schedule already holding the key; None when the schedule was read (get, list).
    created: bool | None = field(default=None, compare=False)
    # What reschedule() (and run_now()) did: True when the version it replaced was running —
    # that handler goes on unless it calls ``ctx.ensure_current()``, and the schedule runs
    # again at its new time; False when that version had not started. None when the schedule
    # was read or made.
    was_running: bool | None = field(default=None, compare=False)

    @property
    def run_at_local(self) -> datetime:
        """``run_at`` in the schedule's own time zone (UTC when it has none)."""
        if self.timezone is None:
            return self.run_at
        return self.run_at.astimezone(ZoneInfo(self.timezone))


@dataclass(frozen=True)
class Freshness:
    """How current one read is: where it was served, and how far behind the primary it
    may be (:mod:`duejobs.observability.replica`)."""

    source: str  # "primary" or "replica"
    lag: timedelta | None  # zero when current; None when unknown
    max_lag: timedelta = timedelta(0)  # a lag over this is stale

    @property
    def stale(self) -> bool:
        return self.lag is None or self.lag > self.max_lag

    def warning(self) -> str | None:
        """What to tell a reader of a stale figure (None when it is not)."""
        if not self.stale:
            return None
        behind = "an unknown time" if self.lag is None else f"{self.lag.total_seconds():.1f} s"
        return (
            f"read from a replica that is behind the primary by {behind} "
            f"(bound {self.max_lag.total_seconds():g} s): these figures may be out of date"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "lag_seconds": None if self.lag is None else self.lag.total_seconds(),
            "stale": self.stale,
        }


# A read on the primary (or the caller's connection): current.
CURRENT = Freshness("primary", timedelta(0))


@dataclass(frozen=True)
class Page:
    """One page of :meth:`duejobs.App.list`: its schedules, and the cursor that reads the next
    page (None on the last). A cursor stays valid however the table changes: the next page
    starts after this one's last ``(due_at, id)``."""

    schedules: list[Schedule]
    next_cursor: str | None
    # How current the page is: read from the replica, it may be behind
    # (duejobs.observability.replica).
    freshness: Freshness = CURRENT


@dataclass(frozen=True)
class ScheduleRequest:
    """One schedule for :meth:`duejobs.App.schedule_many`: the arguments of
    :meth:`duejobs.App.schedule`, with the same meaning and the same checks."""

    type: str
    payload: Any
    delay: timedelta | float | None = None
    run_at: datetime | None = None
    timezone: str | None = None
    key: str | None = None
    tenant: str | None = None
    jitter: timedelta | float | None = None
    expires_after: timedelta | float | None = None
    queue: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class Event:
    """One entry of a schedule's history, stamped with the database clock."""

    id: int
    schedule_id: uuid.UUID
    kind: EventKind
    version: int
    at: datetime
    detail: dict[str, Any]


@dataclass(frozen=True)
class Attempt:
    """One run of a schedule's handler: its version and number, the worker that ran it, how it
    ended (``running`` while it runs; ``stale`` when the schedule moved under it), when, and
    when the next one was due after a failure."""

    version: int
    attempt: int
    status: str
    worker: str | None
    started_at: datetime
    finished_at: datetime | None
    next_attempt_at: datetime | None
    error: str | None


class DstGap(enum.StrEnum):
    """A local time that does not exist (spring forward)."""

    SHIFT = "shift"  # run at the first valid instant after the gap (default)
    SKIP = "skip"  # do not run that day


class DstOverlap(enum.StrEnum):
    """A local time that happens twice (fall back)."""

    ONCE = "once"  # run at its first occurrence only (default)
    TWICE = "twice"  # run at both instants


class RecurringStatus(enum.StrEnum):
    """Where a recurring definition is: materializing occurrences, or not."""

    ACTIVE = "active"
    PAUSED = "paused"  # by its owner; resume() starts again after now
    ERROR = "error"  # set aside: the scheduler could not evaluate it (see last_error)


class Misfire(enum.StrEnum):
    """Occurrences missed while no scheduler ran (downtime longer than the window)."""

    LATEST = "latest"  # run the latest missed occurrence once (default)
    ALL = "all"  # run every missed occurrence
    SKIP = "skip"  # run none of them


@dataclass(frozen=True)
class QueueJob:
    """A schedule's job in RQ: its id, and the queue it was pushed to — so the Redis node a
    superseded one is removed from, without asking every node."""

    id: str
    queue: str


@dataclass(frozen=True)
class Delivery:
    """One delivery of a schedule, from its push to its outcome: which attempt of which
    version, for which tenant, on which RQ queue. What an RQ job carries (never the payload),
    what the worker claims and closes, and what every batched answer is matched on: two
    deliveries are the same one when these five agree.

    ``due_at`` and ``job_id`` (the RQ job id, built by the store with the row) are known on
    the pushing side only — a worker reads neither from the job — and take no part in
    comparing deliveries."""

    schedule_id: uuid.UUID
    tenant: str
    version: int
    attempt: int
    queue: str
    due_at: datetime | None = field(default=None, compare=False)
    job_id: str = field(default="", compare=False)
    # Its schedule's priority, which picks the RQ queue of its band (duejobs.rq_wire.bands);
    # known on the pushing side only, as due_at.
    priority: int = field(default=0, compare=False)

    @classmethod
    def of(cls, row: Any, **more: Any) -> Self:
        """One built from a row the store read (``id``, ``tenant``, ``version``,
        ``attempt``, ``queue``, ``due_at``, ``queue_job_id``, ``priority``) or from another
        delivery, with the fields its own kind adds."""
        if isinstance(row, Delivery):
            return cls(
                row.schedule_id,
                row.tenant,
                row.version,
                row.attempt,
                row.queue,
                row.due_at,
                row.job_id,
                row.priority,
                **more,
            )
        return cls(
            row.id,
            row.tenant,
            row.version,
            row.attempt,
            row.queue,
            row.due_at.astimezone(UTC),
            row.queue_job_id,
            row.priority,
            **more,
        )

    @property
    def when_due(self) -> datetime:
        """``due_at``, which a delivery to push always has."""
        if self.due_at is None:
            raise ValueError(f"delivery of {self.schedule_id} has no due time")
        return self.due_at


@dataclass(frozen=True)
class Occurrence:
    """One occurrence to materialize: its instant and, in its zone, its wall time."""

    run_at: datetime
    local_run_at: datetime


@dataclass(frozen=True)
class RecurringSpec:
    """A recurring definition as it is written: checked, its payload encoded as JSON."""

    tenant: str
    name: str
    type: str
    payload_json: str
    cron: str
    timezone: str
    dst_gap: DstGap
    dst_overlap: DstOverlap
    misfire: Misfire
    grace: timedelta
    queue: str
    priority: int = 0


@dataclass(frozen=True)
class Recurring:
    """A recurring schedule: a cron expression in a time zone, materialized as ordinary
    ``scheduled_jobs`` rows (occurrences) shortly before each is due."""

    id: uuid.UUID
    tenant: str
    name: str
    type: str
    payload: Any
    cron: str
    timezone: str
    dst_gap: DstGap
    dst_overlap: DstOverlap
    misfire: Misfire
    grace: timedelta
    status: RecurringStatus
    version: int
    next_run_at: datetime
    created_at: datetime
    updated_at: datetime
    queue: str = "duejobs"
    # Why the scheduler set it aside (status "error"), or None.
    last_error: str | None = None
    priority: int = 0  # that of its occurrences
