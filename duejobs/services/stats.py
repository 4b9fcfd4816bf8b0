"""Observability figures: how late duejobs runs, and where the table and the queue disagree.

The seed's list, each a figure, overall and per tenant / per type:

* **lag** from the due time (``run_at`` for first attempts) to the handler's start, p50 /
  p95 / p99 / max over the last ``since`` (from ``started`` events, database clock);
* **late jobs**: ``scheduled`` rows due more than ``late_after`` ago and not started;
* **age of the oldest overdue item**;
* **schedules without a job**: overdue rows whose queue job is missing or not waiting;
* **jobs without a schedule**: waiting queue jobs whose schedule is gone, finished, or at
  another version (what the reconciler removes);
* **cancellations, reschedules, attempts, retries, failures, abandoned attempts** over the
  last ``since``; and the live counts (scheduled, running) and queue depth;
* per tenant, **in flight** (pushed to Redis or running) against its in-flight quota, and its
  live schedules against its live quota (quota refusals are counted in the metrics, since a
  refused ``schedule()`` writes nothing).

Cost: the live rows (two partial-index scans), the events of the last ``since`` (a BRIN
index on time), at most ``check_limit`` overdue rows checked against Redis, and the first
waiting queue jobs (``ORPHAN_SCAN_MOST`` of each queue and registry: jobs without a schedule
are counted among those). Never the finished history: the figures stay cheap on a table of
millions of rows and behind a queue of millions of jobs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from duejobs import store
from duejobs.core import HasCore
from duejobs.delivery import JobState
from duejobs.delivery.registries import RedisFigures, structures
from duejobs.models import CURRENT, Freshness, Schedule
from duejobs.observability import metrics
from duejobs.rq_wire.job_ids import job_tenant, job_tenant_part, parse_job_id
from duejobs.rq_wire.scripts import STUCK_AFTER
from duejobs.services import rate_figures
from duejobs.services.reconciler import orphan_jobs
from duejobs.terminal import printable

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class Stats:
    """One snapshot of the figures."""

    at: datetime
    since: timedelta
    late_after: timedelta
    live: list[store.LiveFigures]
    activity: list[store.Activity]
    queued: int | None  # None for a tenant-scoped App: Redis's depth is everyone's
    deferred: int | None
    schedules_without_job: int
    jobs_without_schedule: int
    quotas: list[store.Quota]
    # Active recurring definitions whose next occurrence is late and not yet a row.
    recurring_behind: int
    # The caps that apply to each tenant listed (its own, else the default's), as the
    # scheduler and the App read them.
    tenant_caps: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    # How current the figures are: from the read replica, they may be behind.
    freshness: Freshness = CURRENT
    # What grows (None for a tenant-scoped App: both are everyone's): duejobs' tables, with
    # their dead tuples, and what Redis holds, by structure.
    tables: list[store.TableFigures] | None = None
    redis: RedisFigures | None = None
    # Rows a rate limit turned back, waiting for their time: overall, per queue, per tenant.
    waiting_on_limits: list[store.Waiting] = field(default_factory=list)
    # The rate limits and their use (of the tenant alone for a tenant-scoped App: a queue's
    # limit is everyone's); None when not read.
    rate_limits: list[store.RateLimit] | None = None

    @property
    def oldest_wait_on_a_limit_seconds(self) -> float:
        since = next((w.since for w in self.waiting_on_limits if w.queue == w.tenant), None)
        return 0.0 if since is None else max(0.0, (self.at - since).total_seconds())

    @property
    def waiting_in_all(self) -> int:
        """Rows waiting on a rate limit, all told."""
        return sum(w.waiting for w in self.waiting_on_limits if w.queue == w.tenant)

    def caps(self, tenant: str) -> tuple[int | None, int | None]:
        """A tenant's effective (max_live, max_inflight): its own, else the default's."""
        return self.tenant_caps.get(tenant, (None, None))

    @property
    def overall(self) -> store.LiveFigures:
        return next(f for f in self.live if f.tenant is None and f.type is None)

    @property
    def recent(self) -> store.Activity:
        return next(a for a in self.activity if a.tenant is None and a.type is None)

    @property
    def oldest_overdue_seconds(self) -> float:
        oldest = self.overall.oldest_overdue
        return 0.0 if oldest is None else max(0.0, (self.at - oldest).total_seconds())

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (for ``duejobs stats --json``)."""

        def iso(value: Any) -> Any:
            return value.isoformat() if isinstance(value, datetime) else value

        return {
            "at": self.at.isoformat(),
            "since_seconds": self.since.total_seconds(),
            "late_after_seconds": self.late_after.total_seconds(),
            "queued": self.queued,
            "deferred": self.deferred,
            "schedules_without_job": self.schedules_without_job,
            "jobs_without_schedule": self.jobs_without_schedule,
            "recurring_behind": self.recurring_behind,
            "oldest_overdue_seconds": self.oldest_overdue_seconds,
            "live": [
                {**{k: iso(v) for k, v in asdict(f).items()}, "in_flight": f.in_flight}
                for f in self.live
            ],
            "quotas": [asdict(q) for q in self.quotas],
            "activity": [asdict(a) for a in self.activity],
            "freshness": self.freshness.as_dict(),
            "tables": None
            if self.tables is None
            else [{k: iso(v) for k, v in asdict(t).items()} for t in self.tables],
            "redis": None if self.redis is None else asdict(self.redis),
            "waiting_on_limits": [
                {k: iso(v) for k, v in asdict(w).items()} for w in self.waiting_on_limits
            ],
            "rate_limits": None
            if self.rate_limits is None
            else rate_figures.as_dicts(self.rate_limits),
        }


def collect(
    app: HasCore,
    *,
    since: timedelta = timedelta(hours=1),
    late_after: timedelta = timedelta(minutes=1),
    check_limit: int = 10_000,
) -> Stats:
    """Read every figure once: of one tenant when ``app`` is a tenant-scoped App."""
    scope: str | None = getattr(app, "scope", None)
    core = app.core
    with core.reading() as (conn, fresh):
        now = store.database_now(conn)
        every_limit = store.rate_limits(conn, followers=True)
        limited = store.Limited.of(every_limit, now)  # whose unpushed rows wait on a limit
        live = store.live_figures(conn, late_after, scope, limited)
        recent = store.activity(conn, since, scope)
        overdue = store.overdue_rows(conn, check_limit, STUCK_AFTER, scope, limited)
        behind = store.recurring_behind(conn, late_after, scope)
        waiting = store.waiting_on_limits(conn, limited, scope)
        limits = [
            r for r in every_limit if scope is None or (r.scope == "tenant" and r.name == scope)
        ]
        quotas = [
            q
            for q in store.quotas(conn)
            if scope is None or q.tenant in (scope, store.DEFAULT_QUOTA_TENANT)
        ]
        listed = {f.tenant for f in live if f.tenant} | {a.tenant for a in recent if a.tenant}
        tenant_caps = store.effective_caps(conn, sorted(listed))
        deliverer = core.deliverer()
        pushed = [(r.queue_job_id, r.due_at, r.stuck, r.queue) for r in overdue if r.queue_job_id]
        alive = deliverer.live(pushed) if pushed else []
        held = structures(deliverer) if scope is None else None  # Redis' depth is everyone's
        queued = None if held is None else held.structures["queue"].entries
        deferred = None if held is None else held.structures["scheduled"].entries
        orphans = list(orphan_jobs(core, reading=conn))
        if scope is not None:
            orphans = _of_tenant(conn, orphans, scope)
    tables = None
    if scope is None:  # on the primary: a standby's statistics count no dead tuples
        with core.reading(current=True) as (primary, _):
            tables = store.table_figures(primary)
    return Stats(
        at=now,
        since=since,
        late_after=late_after,
        live=live,
        activity=recent,
        queued=queued,
        deferred=deferred,
        schedules_without_job=(len(overdue) - len(pushed)) + alive.count(False),
        jobs_without_schedule=len(orphans),
        quotas=quotas,
        recurring_behind=behind,
        tenant_caps=tenant_caps,
        freshness=fresh,
        tables=tables,
        redis=held,
        waiting_on_limits=waiting,
        rate_limits=limits,
    )


def _of_tenant(conn: Connection, jobs: list[str], tenant: str) -> list[str]:
    """The jobs of ``tenant``: by their schedule's row where it still exists, else by the
    tenant part of their id — which two tenants can share (``team.a``, ``team_a``), so a
    job whose row is gone is counted for both."""
    parsed = {job: ids[0] for job in jobs if (ids := parse_job_id(job)) is not None}
    owners = store.schedule_tenants(conn, list(parsed.values()))
    spelled = job_tenant_part(tenant)

    def owned(job: str) -> bool:
        owner = owners.get(parsed[job]) if job in parsed else None
        return owner == tenant if owner is not None else job_tenant(job) == spelled

    return [job for job in jobs if owned(job)]


def queue_job(app: HasCore, schedule: Schedule) -> JobState | None:
    """The queue job of a schedule's current delivery as Redis holds it (None: not pushed):
    a job the reconciler would push again shows ``live`` False."""
    if schedule.queue_job_id is None:
        return None
    with app.core.engine.connect() as conn:
        now = store.database_now(conn)
    stuck = now - schedule.due_at > STUCK_AFTER
    deliverer = app.core.deliverer()
    return deliverer.job_state(schedule.queue_job_id, schedule.due_at, stuck, schedule.queue)


def lag_over_time(
    app: HasCore, *, since: timedelta = timedelta(hours=1), step: timedelta = timedelta(minutes=1)
) -> list[store.LagPoint]:
    """The start lag (p50, p99) per ``step`` over the last ``since``: of one tenant when
    ``app`` is a tenant-scoped App."""
    with app.core.reading() as (conn, _):
        return store.lag_series(conn, since, step, getattr(app, "scope", None))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows as aligned columns (the first to the left, figures to the right), each as wide as
    its widest cell, so no figure runs into the next."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def render(stats: Stats) -> str:
    """A readable table of the figures."""
    overall, recent = stats.overall, stats.recent
    minutes = stats.since.total_seconds() / 60
    warning = stats.freshness.warning()
    lines = [
        f"duejobs at {stats.at:%Y-%m-%d %H:%M:%S} UTC (history: last {minutes:g} min)",
        *([] if warning is None else [f"  WARNING: {warning}"]),
        "",
        f"  scheduled {overall.scheduled:>9}   running {overall.running:>6}   "
        f"queued in Redis {_count(stats.queued):>7}   "
        f"deferred in Redis {_count(stats.deferred):>7}",
        f"  overdue   {overall.overdue:>9}   late (> {stats.late_after.total_seconds():g} s) "
        f"{overall.late:>6}   oldest overdue {stats.oldest_overdue_seconds:,.1f} s",
        f"  schedules without job {stats.schedules_without_job:>6}   "
        f"jobs without schedule {stats.jobs_without_schedule:>6}   "
        f"recurring behind {stats.recurring_behind:>6}",
        *rate_figures.waiting_lines(stats.waiting_on_limits, stats.oldest_wait_on_a_limit_seconds),
        *rate_figures.use_lines(stats.rate_limits or []),
        "",
        "  " + "   ".join(f"{k} {v}" for k, v in recent.counts.items()),
        "",
    ]
    lag_rows = [["lag (ms)", "p50", "p95", "p99", "max", "started"]]
    for a in stats.activity:
        if a.tenant is not None:
            continue
        label = "all types" if a.type is None else printable(f"type {a.type}")
        lag_rows.append(
            [
                label,
                *(_ms(a.lag_ms[p]) for p in ("p50", "p95", "p99", "max")),
                str(a.counts["started"]),
            ]
        )
    lines += _columns(lag_rows)
    live = {f.tenant: f for f in stats.live if f.tenant is not None and f.type is None}
    activity = {a.tenant: a for a in stats.activity if a.tenant is not None and a.type is None}
    tenants = sorted(live.keys() | activity.keys())  # a tenant whose work all ran is listed too
    if tenants:
        tenant_rows = [
            [
                *("tenant", "live", "in flight", "running", "overdue", "late", "lag p99"),
                *("cancelled", "retried", "failed"),
            ]
        ]
        for tenant in tenants:
            f = live.get(tenant) or store.LiveFigures(tenant, None, 0, 0, 0, 0, None, 0)
            act = activity.get(tenant)
            counts = act.counts if act else {}
            max_live, max_inflight = stats.caps(tenant)
            tenant_rows.append(
                [
                    tenant,
                    f"{f.scheduled + f.running}" + ("" if max_live is None else f"/{max_live}"),
                    f"{f.in_flight}" + ("" if max_inflight is None else f"/{max_inflight}"),
                    str(f.running),
                    str(f.overdue),
                    str(f.late),
                    _ms(act.lag_ms["p99"]) if act else "-",
                    *(str(counts.get(k, 0)) for k in ("cancelled", "retried", "failed")),
                ]
            )
        lines += ["", *_columns(tenant_rows)]
    return "\n".join(lines + _storage_lines(stats))


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def _storage_lines(stats: Stats) -> list[str]:
    """What grows: each table's size and dead tuples, Redis' memory and each structure."""
    lines: list[str] = []
    if stats.tables:
        rows = [["table", "MiB", "index MiB", "live", "dead", "last autovacuum"]]
        for t in stats.tables:
            vacuumed = "-" if t.last_autovacuum is None else f"{t.last_autovacuum:%Y-%m-%d %H:%M}"
            rows.append(
                [
                    t.table,
                    _mib(t.bytes),
                    _mib(t.index_bytes),
                    str(t.live_tuples),
                    str(t.dead_tuples),
                    vacuumed,
                ]
            )
        lines += ["", *_columns(rows)]
    if stats.redis is not None:
        held = stats.redis
        rows = [["redis", "entries", "KiB"]]
        for kind, one in held.structures.items():
            rows.append([kind, str(one.entries), f"{one.bytes / 1024:,.1f}"])
        lines += [
            "",
            f"  redis used_memory {_mib(held.used_memory)} MiB   keys {held.keys}",
            *_columns(rows),
        ]
    return lines


# The tenants whose gauges observe_stats set last (one with no live rows loses its series).
_shown: set[str] = set()


class GaugeRefresh:
    """The gauges of ``duejobs stats``, refreshed at most every ``every``: they count every
    live row (about 4 s at 5 million live schedules), while a reconcile pass costs only
    what its window holds."""

    DEFAULT_EVERY = timedelta(minutes=1)

    def __init__(self, collect: Callable[[], Stats], every: timedelta = DEFAULT_EVERY) -> None:
        self._collect, self._every = collect, every.total_seconds()
        self._next = time.monotonic()

    def maybe_refresh(self) -> bool:
        """Refresh if ``every`` has passed since the last refresh (the first call does)."""
        if time.monotonic() < self._next:
            return False
        observe_stats(self._collect())
        self._next = time.monotonic() + self._every
        return True


def named_tenants(live: Sequence[store.LiveFigures], limit: int) -> set[str]:
    """The tenants whose gauges carry their own name in one snapshot: those with the most
    late rows (then overdue), half the names at most, then those with the most live rows;
    ``other`` sums the rest. Ranked anew at each snapshot, so that the tenants in trouble now
    are named, not the first ones a process happened to see."""
    tenants = [f for f in live if f.type is None and f.tenant is not None]
    troubled = sorted(
        (f for f in tenants if f.late or f.overdue),
        key=lambda f: (-f.late, -f.overdue, f.tenant),
    )
    named = {str(f.tenant) for f in troubled[: limit // 2]}
    for f in sorted(tenants, key=lambda f: (-(f.scheduled + f.running), f.tenant)):
        if len(named) >= limit:
            break
        named.add(str(f.tenant))
    return named


def observe_stats(stats: Stats, limit: int = metrics.MAX_TENANT_LABELS) -> None:
    """Set the gauges from one ``duejobs stats`` snapshot, ``limit`` tenants named
    (:func:`named_tenants`); a tenant that no longer has live rows, or is no longer named,
    loses its series instead of keeping its last value."""
    named = named_tenants(stats.live, limit)
    values: dict[str, list[float]] = {}
    for figures in stats.live:
        if figures.type is not None:
            continue
        if figures.tenant is None:
            tenant = metrics.ALL
        else:
            tenant = metrics.spelled(figures.tenant) if figures.tenant in named else metrics.OTHER
        counts = (figures.scheduled, figures.running, figures.in_flight, figures.overdue)
        summed = values.setdefault(tenant, [0.0] * len(metrics.PER_TENANT))
        for i, value in enumerate((*counts, figures.late)):
            summed[i] += value
    for tenant, row in values.items():
        for gauge, total in zip(metrics.PER_TENANT, row, strict=True):
            gauge.labels(tenant).set(total)
    for gone in _shown - values.keys():
        for gauge in metrics.PER_TENANT:
            with contextlib.suppress(KeyError):
                gauge.remove(gone)
    _shown.clear()
    _shown.update(values)
    metrics.OLDEST.set(stats.oldest_overdue_seconds)
    rate_figures.observe(
        stats.waiting_on_limits, stats.oldest_wait_on_a_limit_seconds, stats.rate_limits, limit
    )
    metrics.WITHOUT_JOB.set(stats.schedules_without_job)
    metrics.ORPHANS.set(stats.jobs_without_schedule)
    metrics.RECURRING_BEHIND.set(stats.recurring_behind)
    if stats.queued is not None and stats.deferred is not None:
        metrics.REDIS_JOBS.labels("queue").set(stats.queued)
        metrics.REDIS_JOBS.labels("scheduled").set(stats.deferred)
    for t in stats.tables or ():
        metrics.TABLE_BYTES.labels(t.table).set(t.bytes)
        metrics.TABLE_INDEX_BYTES.labels(t.table).set(t.index_bytes)
        metrics.TABLE_LIVE_TUPLES.labels(t.table).set(t.live_tuples)
        metrics.TABLE_DEAD_TUPLES.labels(t.table).set(t.dead_tuples)
    if stats.redis is not None:
        metrics.REDIS_USED_MEMORY.set(stats.redis.used_memory)
        metrics.REDIS_KEYS.set(stats.redis.keys)
        for kind, one in stats.redis.structures.items():
            metrics.REDIS_ENTRIES.labels(kind).set(one.entries)
            metrics.REDIS_STRUCTURE_BYTES.labels(kind).set(one.bytes)
