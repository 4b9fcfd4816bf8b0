"""Rate limits: at most N starts a period for a queue, a tenant, or every tenant by default.

A limit is a row of ``rate_limits`` (scope ``queue`` or ``tenant``; tenant ``'*'`` holds the
default each tenant without a limit of its own follows). The worker's claim of a batch
(``claim_runs``) grants its starts: one statement locks the row of each limit the batch
touches and walks the batch's rows in due order, giving each its start by GCRA with one
start's tolerance over all its limits at once — in any window of one period, at most N starts
plus one. A start within the worker's wait (50 ms) and before the row's expiry is granted, the
attempt started then (``started_at``; the worker's slot waits for it), and moves its limits'
pace on; a start further off goes back to the table with that time, for the scheduler to push
again at the limit's pace, and moves nothing, so starts turned back again and again never push
a limit's pace ahead. A tenant that follows the default
gets a row of its own for its count (``max_starts`` NULL), made at its first start and pruned
once idle (:func:`prune_rate_counts`). The same statement counts the starts it grants into
two fixed windows of one period (the current one, and the one before), from which a limit's
use over the last period is read (:func:`rate_limits`) without the history.

What it promises: the count is the database's (every worker process, every slot, every
scheduler) and by its clock; a start is granted in the same statement that makes it, so no
two workers both take the last start of a window. What it does not promise: that a start
turned back runs at the time it was given — that time is not reserved for it; a fresh start
asked then may take the grant, and it is turned back again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from duejobs.rates import Rate
from duejobs.store.execution import run, run_count
from duejobs.store.queries import DEFAULT_QUOTA_TENANT

if TYPE_CHECKING:
    from sqlalchemy import Connection

Scope = Literal["queue", "tenant"]


@dataclass(frozen=True)
class RateLimit:
    """A limit as set — or the count of a tenant that follows the default
    (``follows_default``; ``rate`` the default's) —, its count's last grant (``granted`` of
    ``asked`` starts) and its use: the starts over the last period (estimated, see the query
    ``rate_limits``; None for the default itself, whose tenants each count their own)."""

    scope: Scope
    name: str
    rate: Rate
    asked: int
    granted: int
    # When the next start is due at the limit's pace (None: no start counted yet); later
    # than now by up to one interval while starts come at the limit.
    next_start: datetime | None
    recent_starts: int | None = None
    follows_default: bool = False
    # When the scheduler's pace gives its next start (None: it paced none yet).
    paced_until: datetime | None = None

    @property
    def use(self) -> float | None:
        """The share of the limit its starts over the last period took (1.0: all of it)."""
        return None if self.recent_starts is None else self.recent_starts / self.rate.count


def set_rate_limit(conn: Connection, scope: Scope, name: str, rate: Rate | None) -> None:
    """Set (or, ``None``, clear) the limit of a queue or a tenant (``'*'``: the default);
    when that changes it, the counts it governs start again (the same limit again leaves
    them: see the query ``set_rate_limit``). Waits for a scheduler's claim pacing that limit
    to commit (the query ``hold_limit``)."""
    run(conn, "hold_limit", {"scope": scope, "name": name})
    if rate is None:
        changed = run(conn, "clear_rate_limit", {"scope": scope, "name": name})
    else:
        params = {
            "scope": scope,
            "name": name,
            "max_starts": rate.count,
            "period": rate.period,
            "every": rate.every,
        }
        changed = run(conn, "set_rate_limit", params)
    if changed and scope == "tenant" and name == DEFAULT_QUOTA_TENANT:
        run(conn, "restart_default_counts")


def rate_limits(conn: Connection, followers: bool = False) -> list[RateLimit]:
    """Every limit set — the queues', then the default, then the tenants' own — with its
    use; and, with ``followers``, the counts of the tenants that follow the default with a
    start within the last period (after the tenants' own)."""
    return [
        RateLimit(
            r.scope,
            r.name,
            Rate(r.max_starts, r.period),
            r.asked,
            r.granted,
            r.started_until and r.started_until.astimezone(UTC),
            r.recent_starts,
            r.follows_default,
            r.paced_until and r.paced_until.astimezone(UTC),
        )
        for r in run(conn, "rate_limits")
        if followers or not r.follows_default
    ]


# How far behind now a limit's pace may be and its unpushed rows still count as waiting on
# it: while the limit keeps the scheduler back, its pace is ahead of now (a second at its
# fastest); once behind, the rows wait for no limit, and are overdue like any other.
PACE_BEHIND = timedelta(seconds=1)


@dataclass(frozen=True)
class Limited:
    """The queues and tenants whose limits hold the scheduler back now: their unpushed due
    rows wait on a limit, the scheduler pushing them at its pace, so they are neither overdue
    nor schedules without a job. A limit whose pace has fallen behind holds nothing back: a
    scheduler that stopped shows its rows overdue, limited or not."""

    queues: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()

    @classmethod
    def of(cls, limits: list[RateLimit], now: datetime) -> Limited:
        """From the limits and counts as :func:`rate_limits` lists them (with followers):
        those whose pace — the scheduler's, or the grant's if later — is ahead of ``now``
        less ``PACE_BEHIND``."""

        def ahead(limit: RateLimit) -> bool:
            paces = [t for t in (limit.next_start, limit.paced_until) if t is not None]
            return bool(paces) and max(paces) > now - PACE_BEHIND

        held = [r for r in limits if ahead(r)]
        return cls(
            tuple(r.name for r in held if r.scope == "queue"),
            tuple(r.name for r in held if r.scope == "tenant" and r.name != DEFAULT_QUOTA_TENANT),
        )

    def params(self) -> dict[str, object]:
        """The statements' parameters that say which unpushed rows wait on a limit."""
        return {"limited_queues": list(self.queues), "limited_tenants": list(self.tenants)}


NO_LIMITS = Limited()


def prune_rate_counts(conn: Connection, idle: timedelta) -> int:
    """Delete the counts of tenants following the default that started nothing in ``idle``."""
    return run_count(conn, "prune_rate_counts", {"idle": idle})


@dataclass(frozen=True)
class Waiting:
    """Rows waiting on a rate limit — of a queue, of a tenant, or all (both ``None``) — and
    the earliest due time they had before it moved them (None when none waits)."""

    queue: str | None
    tenant: str | None
    waiting: int
    since: datetime | None


def waiting_on_limits(
    conn: Connection, limited: Limited, tenant: str | None = None
) -> list[Waiting]:
    """The rows waiting on a rate limit — due and unpushed under one of ``limited``, or given
    a start's time ahead by one —: overall, per queue and per tenant (of ``tenant`` only, when
    given)."""
    return [
        Waiting(r.queue, r.tenant, r.waiting, r.since and r.since.astimezone(UTC))
        for r in run(conn, "waiting_on_limits", {"tenant": tenant, **limited.params()})
    ]
