"""Recurring schedules: cron in a time zone, with explicit DST and misfire policies.

A definition (``recurring_schedules``) is *materialized* by the scheduler: shortly before each
occurrence enters the window, it becomes an ordinary ``scheduled_jobs`` row — so every
occurrence gets what a one-off schedule has (revalidation, cancel, effects, retries, history).

What it promises:

* **No occurrence twice.** An occurrence's id is derived from (definition, its version, the
  instant); the primary key, not a hope, stops a second scheduler from creating it again.
* **DST as a policy, per schedule.** croniter (>= 6.1) moves a local time that does not exist
  to the end of the gap and yields a repeated local time twice. ``dst_gap``: ``shift`` (run
  at the first valid instant after the gap, the default) or ``skip``. ``dst_overlap``:
  ``once`` (the first of the two instants, the default) or ``twice``. For sub-hourly
  expressions ``once`` also drops the repeated wall times of the fall-back hour.
* **Misfires, per schedule.** Occurrences that no scheduler materialized in time (downtime
  longer than the window) and are older than ``grace``: ``latest`` runs the latest one once
  (the default), ``all`` runs each, ``skip`` runs none.
* **Updates supersede.** Changing the cron, zone, type, payload or a policy bumps the version
  and cancels the occurrences not yet run; pausing cancels them too; resuming starts from the
  next occurrence after now (what fell in the pause is not a misfire).

The pass runs on a loop of its own (:class:`Materializer`), which the scheduler starts beside
its claims in :meth:`~duejobs.scheduler.loop.Scheduler.run`: a one-off schedule's claim never
waits for cron evaluation, and a definition that is slow to evaluate delays only recurring
work, and a tenant whose quota lock another transaction holds past a second waits for the
next pass while the others' occurrences are made. Its failures are counted in
``duejobs_recurring_failed_passes_total`` and, like every loop's, never end it
(:mod:`duejobs.services.loop`); ``duejobs_recurring_last_pass_timestamp_seconds`` says when it
last finished a pass, and definitions it has fallen behind on show in ``duejobs stats``
(``recurring_behind``).

Knobs: the scheduler's ``window``, ``poll_interval`` (a pass's cadence, so an occurrence that
enters the window is claimable on the scheduler's next pass) and ``max_backoff``; at most
``LIMIT`` occurrences per definition and ``BATCH`` definitions per pass (a long
``misfire="all"`` backlog continues on the next pass; after a full batch of definitions, the
next pass starts at once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from croniter import croniter

from duejobs import store
from duejobs.errors import InvalidCronError, describe
from duejobs.models import DstGap, DstOverlap, Misfire, Occurrence, Recurring
from duejobs.observability import metrics
from duejobs.redis_urls import redis_failures
from duejobs.services.loop import Loop
from duejobs.store import dbapi

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

    from duejobs.core import HasCore

log = logging.getLogger("duejobs.recurring")

LIMIT = 10_000
BATCH = 100  # definitions per pass; a full one is followed by the next at once
_TICK = timedelta(microseconds=1)


# Nicknames that mean something to a scheduler that runs for days (not ``@reboot``).
NICKNAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_NAMES = {  # croniter's English names (not the locale's)
    "month": set(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    ),
    "day-of-week": set(["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
}
_STANDARD = "write the five standard fields: minute hour day-of-month month day-of-week"


def _check_part(part: str, field: str, expression: str) -> None:
    """One value of a field: ``*``, a number or (month, day of week) an English name."""
    if part == "*" or part.isdigit() or part.lower() in _NAMES.get(field, ()):
        return
    if part.upper() == "R" or part.upper().startswith(("R(", "H")):
        raise InvalidCronError(
            f"cron {expression!r}: {part!r} in the {field} field asks for a random or hashed "
            "value, which each dialect draws differently (croniter draws a new one at every "
            "evaluation, so it would never fire); write the value you want"
        )
    if part == "?":
        raise InvalidCronError(
            f"cron {expression!r}: '?' (Quartz's 'no specific value') is not standard cron; "
            "write * instead"
        )
    if any(c in part.upper() for c in "LW#"):
        raise InvalidCronError(
            f"cron {expression!r}: {part!r} in the {field} field is an extension whose meaning "
            "differs between dialects (Quartz counts weekdays from Sunday = 1); "
            f"{_STANDARD}, with L alone in the day-of-month field for the month's last day"
        )
    raise InvalidCronError(f"cron {expression!r}: {part!r} is not a valid {field}")


def check_cron(expression: object) -> str:
    """The standard five-field dialect and the nicknames, refusing what dialects read
    differently (six or seven fields, random or hashed fields, Quartz's ``?``, ``W``, ``#``)
    with a message that says what to write instead."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidCronError(f"cron must be a non-empty string, got {expression!r}")
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in NICKNAMES:
            raise InvalidCronError(
                f"cron {expression!r}: unknown nickname; use one of {', '.join(NICKNAMES)}"
            )
        return text.lower()
    fields = text.split(" ")
    if len(fields) in (6, 7):
        raise InvalidCronError(
            f"cron {expression!r} has {len(fields)} fields: a seconds field comes first in "
            "Quartz and Spring and last in croniter, so its meaning depends on who reads it; "
            f"{_STANDARD}"
        )
    if len(fields) != 5:
        raise InvalidCronError(
            f"not a valid cron expression: {expression!r} has {len(fields)} fields; {_STANDARD}"
        )
    for field, value in zip(_FIELDS, fields, strict=True):
        if field == "day-of-month" and value.upper() == "L":
            continue
        for item in value.split(","):
            ranged, _, step = item.partition("/")
            if step and not step.isdigit():
                raise InvalidCronError(f"cron {expression!r}: step {step!r} is not a number")
            for part in ranged.split("-", 1):
                _check_part(part, field, expression)
    if not croniter.is_valid(text):
        raise InvalidCronError(f"not a valid cron expression: {expression!r}")
    return text


def _kept(cron: str, local: datetime, gap: DstGap, overlap: DstOverlap) -> bool:
    """Apply the DST policies to one instant croniter yielded."""
    if not croniter.match(cron, local.replace(tzinfo=None)):
        return gap is DstGap.SHIFT  # croniter moved a non-existent time to the end of the gap
    repeated = local.replace(fold=0).utcoffset() != local.replace(fold=1).utcoffset()
    return not (repeated and local.fold == 1 and overlap is DstOverlap.ONCE)


@dataclass(frozen=True)
class Rule:
    """When a recurring schedule fires: its cron expression, zone and DST policies."""

    cron: str
    timezone: str
    dst_gap: DstGap
    dst_overlap: DstOverlap

    @classmethod
    def of(cls, r: Recurring) -> Rule:
        return cls(r.cron, r.timezone, r.dst_gap, r.dst_overlap)


def _occurrence(local: datetime) -> Occurrence:
    return Occurrence(run_at=local.astimezone(UTC), local_run_at=local.replace(tzinfo=None))


def occurrences(
    r: Rule, after: datetime, until: datetime, limit: int = LIMIT
) -> tuple[list[Occurrence], datetime]:
    """Kept occurrences in ``(after, until]`` (at most ``limit``), and the next instant to
    start from."""
    it = croniter(r.cron, after.astimezone(ZoneInfo(r.timezone)))
    found: list[Occurrence] = []
    while True:
        local: datetime = it.get_next(datetime)
        if local.astimezone(UTC) > until or len(found) >= limit:
            return found, local.astimezone(UTC)
        if _kept(r.cron, local, r.dst_gap, r.dst_overlap):
            found.append(_occurrence(local))


def first_after(r: Rule, moment: datetime) -> datetime:
    """The instant of the first occurrence strictly after ``moment``."""
    _none, first = occurrences(r, moment, moment, limit=0)
    return first


def plan(r: Rule, now: datetime) -> datetime:
    """The first occurrence after ``now``, after evaluating the rule as the scheduler will
    (that one and the following day's occurrences): a rule that cannot be evaluated — one
    that never fires (``0 0 30 2 *``), or runs past the calendar — is refused here rather
    than found by every scheduler later."""
    try:
        first = first_after(r, now)
        occurrences(r, first - _TICK, first + timedelta(days=1), limit=100)
    except InvalidCronError:
        raise
    except Exception as exc:
        raise InvalidCronError(
            f"cron {r.cron!r} in {r.timezone} cannot be evaluated: {describe(exc)}"
        ) from exc
    return first


def latest_before(r: Rule, moment: datetime, not_before: datetime) -> Occurrence | None:
    """The latest kept occurrence in ``[not_before, moment]``."""
    it = croniter(r.cron, (moment + _TICK).astimezone(ZoneInfo(r.timezone)))
    while True:
        local: datetime = it.get_prev(datetime)
        if local.astimezone(UTC) < not_before:
            return None
        if _kept(r.cron, local, r.dst_gap, r.dst_overlap):
            return _occurrence(local)


@dataclass(frozen=True)
class MaterializeResult:
    """What one pass did: definitions handled, occurrences created, definitions that had
    missed occurrences (handled by their misfire policy), occurrences refused by their
    tenant's ``max_live`` quota, definitions quarantined, definitions left for the next pass
    (their tenant's quota lock held by another transaction past a second)."""

    definitions: int = 0
    created: int = 0
    misfired: int = 0
    refused: int = 0
    quarantined: int = 0
    waiting: int = 0


def materialize_once(engine: Engine, window: timedelta, batch: int = BATCH) -> MaterializeResult:
    """Turn the occurrences entering ``window`` into rows; see the module docstring.

    Each definition is handled in a savepoint of its own: one that fails for any reason but
    an outage (a zone this host's tzdata lacks, an expression that ran out of occurrences,
    an instant past the calendar) is quarantined — status ``error``, ``last_error``, a
    ``quarantined`` event on its id, ``duejobs_recurring_quarantined_total{tenant}`` and an
    error log line — and the pass goes on for the others. One whose tenant's quota lock
    another transaction holds past a second (an application's ``schedule_many`` on its own
    connection, left open) waits for the next pass; the others go on."""
    created = misfired = refused = quarantined = waiting = 0
    with engine.begin() as conn:
        definitions = store.due_recurring(conn, window, batch)
        now = store.database_now(conn) if definitions else None
        if definitions:
            store.bounded_locks(conn)
        # Tenants' quota locks are taken in one order by every materializer (and by
        # schedule_many), so concurrent passes cannot deadlock on them.
        for r in sorted(definitions, key=lambda d: d.tenant):
            assert now is not None
            try:
                with conn.begin_nested():
                    made, missed, dropped = _materialize(conn, r, now, window)
            except dbapi.OperationalError as exc:
                if not store.is_lock_conflict(exc):
                    raise  # an outage: the pass fails and is retried
                log.info("recurring %s of tenant %s: quota lock held, next pass", r.name, r.tenant)
                waiting += 1
                continue
            except Exception as exc:
                if isinstance(exc, (dbapi.InterfaceError, *redis_failures())):
                    raise  # says nothing about the definition: the pass fails, is retried
                error = describe(exc)
                store.quarantine_recurring(conn, r.id, error)
                metrics.RECURRING_QUARANTINED.labels(metrics.tenant_label(r.tenant)).inc()
                log.error("recurring %s of tenant %s quarantined: %s", r.name, r.tenant, error)
                quarantined += 1
                continue
            created, misfired, refused = created + made, misfired + missed, refused + dropped
    return MaterializeResult(len(definitions), created, misfired, refused, quarantined, waiting)


def _materialize(
    conn: Connection, r: Recurring, now: datetime, window: timedelta
) -> tuple[int, int, int]:
    """One definition's occurrences entering the window: (created, misfired, refused)."""
    start, backlog, misfired = r.next_run_at - _TICK, [], 0
    cutoff = now - r.grace
    if r.next_run_at < cutoff and r.misfire is not Misfire.ALL:
        if r.misfire is Misfire.LATEST:
            latest = latest_before(Rule.of(r), cutoff, r.next_run_at)
            backlog = [latest] if latest else []
        misfired = 1
        log.info(
            "recurring %s: occurrences missed since %s, policy %s",
            r.name,
            r.next_run_at,
            r.misfire.value,
        )
        start = cutoff
    found, next_at = occurrences(Rule.of(r), start, now + window)
    wanted = backlog + found
    admitted = _admitted(conn, r, wanted)
    created = store.insert_occurrences(conn, r, admitted)
    store.advance_recurring(conn, r.id, next_at)
    return created, misfired, len(wanted) - len(admitted)


def _admitted(conn: Connection, r: Recurring, wanted: list[Occurrence]) -> list[Occurrence]:
    """Occurrences count against the tenant's ``max_live`` quota like any schedule: those
    beyond it are not created (logged, and counted as quota refusals)."""
    cap = store.live_quota(conn, r.tenant) if wanted else None
    if cap is None:
        return wanted
    room = max(0, cap - store.count_live_up_to(conn, r.tenant, cap))
    if room < len(wanted):
        metrics.QUOTA_REFUSALS.labels(metrics.tenant_label(r.tenant)).inc(len(wanted) - room)
        log.warning(
            "recurring %s of tenant %s: %d occurrence(s) not created, live quota %d reached",
            r.name,
            r.tenant,
            len(wanted) - room,
            cap,
        )
    return wanted[:room]


class Materializer:
    """The recurring definitions' loop: a :func:`materialize_once` pass every
    ``poll_interval`` (see the module docstring for what it promises)."""

    def __init__(
        self, app: HasCore, window: timedelta, poll_interval: timedelta, max_backoff: timedelta
    ) -> None:
        self.core = app.core
        self.window, self.poll_interval, self.max_backoff = window, poll_interval, max_backoff
        self._loop = Loop("recurring", log, metrics.RECURRING_FAILED_PASSES)

    def run_once(self) -> MaterializeResult:
        """One pass: the occurrences entering the window made rows."""
        result = materialize_once(self.core.engine, self.window)
        metrics.RECURRING_LAST_PASS.set_to_current_time()
        return result

    def stop(self) -> None:
        """End the loop at its next wait (a pass under way finishes)."""
        self._loop.stop()

    def run(self) -> None:
        """Pass after pass until :meth:`stop`."""
        self._loop.run_forever(self.run_once, self._pause, self.poll_interval, self.max_backoff)

    def _pause(self, result: MaterializeResult) -> timedelta:
        """None after a full pass (a backlog after downtime is caught up at once, before its
        occurrences pass their ``grace``), else the poll interval."""
        return timedelta(0) if result.definitions >= BATCH else self.poll_interval
