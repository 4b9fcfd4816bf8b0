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
index on time), at most ``check_limit`` overdue rows checked against Redis, and the waiting
queue jobs. Never the finished history: the figures stay cheap on a table of millions of rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from duejobs import store
from duejobs.app import App
from duejobs.delivery import STUCK_AFTER, job_tenant, job_tenant_part
from duejobs.reconcile import orphan_jobs


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

    def caps(self, tenant: str) -> tuple[int | None, int | None]:
        """A tenant's effective (max_live, max_inflight): its own, else the default's."""
        own = {q.tenant: q for q in self.quotas}
        mine, default = own.get(tenant), own.get(store.DEFAULT_QUOTA_TENANT)

        def pick(name: str) -> int | None:
            value = getattr(mine, name, None)
            return getattr(default, name, None) if value is None else value

        return pick("max_live"), pick("max_inflight")

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
            "oldest_overdue_seconds": self.oldest_overdue_seconds,
            "live": [
                {**{k: iso(v) for k, v in asdict(f).items()}, "in_flight": f.in_flight}
                for f in self.live
            ],
            "quotas": [asdict(q) for q in self.quotas],
            "activity": [asdict(a) for a in self.activity],
        }


def collect(
    app: App,
    *,
    since: timedelta = timedelta(hours=1),
    late_after: timedelta = timedelta(minutes=1),
    check_limit: int = 10_000,
) -> Stats:
    """Read every figure once."""
    scope = app.scope
    with app.engine.connect() as conn:
        now = store.database_now(conn)
        live = store.live_figures(conn, late_after, scope)
        recent = store.activity(conn, since, scope)
        overdue = store.overdue_rows(conn, check_limit, STUCK_AFTER, scope)
        quotas = [
            q
            for q in store.quotas(conn)
            if scope is None or q.tenant in (scope, store.DEFAULT_QUOTA_TENANT)
        ]
    deliverer = app.deliverer()
    pushed = [(r.queue_job_id, r.due_at, r.stuck) for r in overdue if r.queue_job_id]
    alive = deliverer.live(pushed) if pushed else []
    queued, deferred = deliverer.depth() if scope is None else (None, None)
    orphans = orphan_jobs(app)
    if scope is not None:
        orphans = (job for job in orphans if job_tenant(job) == job_tenant_part(scope))
    return Stats(
        at=now,
        since=since,
        late_after=late_after,
        live=live,
        activity=recent,
        queued=queued,
        deferred=deferred,
        schedules_without_job=(len(overdue) - len(pushed)) + alive.count(False),
        jobs_without_schedule=sum(1 for _ in orphans),
        quotas=quotas,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def render(stats: Stats) -> str:
    """A readable table of the figures."""
    overall, recent = stats.overall, stats.recent
    minutes = stats.since.total_seconds() / 60
    lines = [
        f"duejobs at {stats.at:%Y-%m-%d %H:%M:%S} UTC (history: last {minutes:g} min)",
        "",
        f"  scheduled {overall.scheduled:>9}   running {overall.running:>6}   "
        f"queued in Redis {_count(stats.queued):>7}   "
        f"deferred in Redis {_count(stats.deferred):>7}",
        f"  overdue   {overall.overdue:>9}   late (> {stats.late_after.total_seconds():g} s) "
        f"{overall.late:>6}   oldest overdue {stats.oldest_overdue_seconds:,.1f} s",
        f"  schedules without job {stats.schedules_without_job:>6}   "
        f"jobs without schedule {stats.jobs_without_schedule:>6}",
        "",
        "  " + "   ".join(f"{k} {v}" for k, v in recent.counts.items()),
        "",
        f"  {'lag (ms)':<24}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}{'started':>9}",
    ]
    for a in stats.activity:
        if a.tenant is not None:
            continue
        label = "all types" if a.type is None else f"type {a.type}"
        lines.append(
            f"  {label:<24}{_ms(a.lag_ms['p50']):>9}{_ms(a.lag_ms['p95']):>9}"
            f"{_ms(a.lag_ms['p99']):>9}{_ms(a.lag_ms['max']):>9}{a.counts['started']:>9}"
        )
    tenants = [f for f in stats.live if f.tenant is not None]
    if tenants:
        lines += [
            "",
            f"  {'tenant':<20}{'live':>10}{'in flight':>12}{'running':>9}{'overdue':>9}"
            f"{'late':>7}{'lag p99':>9}{'cancelled':>11}{'retried':>9}{'failed':>8}",
        ]
        activity = {a.tenant: a for a in stats.activity if a.tenant is not None}
        for f in sorted(tenants, key=lambda f: f.tenant or ""):
            assert f.tenant is not None
            act = activity.get(f.tenant)
            counts = act.counts if act else {}
            max_live, max_inflight = stats.caps(f.tenant)
            live = f"{f.scheduled + f.running}" + ("" if max_live is None else f"/{max_live}")
            in_flight = f"{f.in_flight}" + ("" if max_inflight is None else f"/{max_inflight}")
            lag = _ms(act.lag_ms["p99"]) if act else "-"
            lines.append(
                f"  {f.tenant:<20}{live:>10}{in_flight:>12}{f.running:>9}{f.overdue:>9}"
                f"{f.late:>7}{lag:>9}{counts.get('cancelled', 0):>11}"
                f"{counts.get('retried', 0):>9}{counts.get('failed', 0):>8}"
            )
    return "\n".join(lines)
