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

Knobs: the scheduler's ``window``; at most ``LIMIT`` occurrences per definition per pass (a
long ``misfire="all"`` backlog continues on the next pass).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from sqlalchemy import Engine

from duejobs import store
from duejobs.errors import InvalidScheduleError
from duejobs.models import DstGap, DstOverlap, Misfire, Recurring
from duejobs.store import Occurrence

log = logging.getLogger("duejobs.recurring")

LIMIT = 10_000
_TICK = timedelta(microseconds=1)


class InvalidCronError(InvalidScheduleError):
    """The cron expression cannot be parsed."""


def check_cron(expression: object) -> str:
    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise InvalidCronError(f"not a valid cron expression: {expression!r}")
    return expression


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
    missed occurrences (handled by their misfire policy)."""

    definitions: int = 0
    created: int = 0
    misfired: int = 0


def materialize_once(engine: Engine, window: timedelta, batch: int = 100) -> MaterializeResult:
    """Turn the occurrences entering ``window`` into rows; see the module docstring."""
    created = misfired = 0
    with engine.begin() as conn:
        definitions = store.due_recurring(conn, window, batch)
        now = store.database_now(conn) if definitions else None
        for r in definitions:
            assert now is not None
            start, backlog = r.next_run_at - _TICK, []
            cutoff = now - r.grace
            if r.next_run_at < cutoff and r.misfire is not Misfire.ALL:
                if r.misfire is Misfire.LATEST:
                    latest = latest_before(Rule.of(r), cutoff, r.next_run_at)
                    backlog = [latest] if latest else []
                misfired += 1
                log.info(
                    "recurring %s: occurrences missed since %s, policy %s",
                    r.name,
                    r.next_run_at,
                    r.misfire.value,
                )
                start = cutoff
            found, next_at = occurrences(Rule.of(r), start, now + window)
            created += store.insert_occurrences(conn, r, backlog + found)
            store.advance_recurring(conn, r.id, next_at)
    return MaterializeResult(len(definitions), created, misfired)
