"""Prometheus metrics exposed by the scheduler, the worker and the reconciler.

Each long-running command takes ``--metrics-port``; the process then serves ``/metrics``.

* worker: ``duejobs_lag_seconds{tenant,type}`` (histogram, due time → handler start, database clock)
  and ``duejobs_deliveries_total{tenant,type,outcome}`` (succeeded, retrying, failed, skipped,
  stale, deferred);
* scheduler: ``duejobs_scheduler_pushed_total{where}`` (queue, scheduled, already_present),
  ``duejobs_scheduler_promoted_total``, ``duejobs_scheduler_pass_seconds``,
  ``duejobs_scheduler_failed_passes_total``, ``duejobs_scheduler_throttled_total{tenant}``
  (passes in which a tenant's due rows waited for room under its in-flight quota);
* any App: ``duejobs_quota_refusals_total{tenant}`` (also occurrences of recurring schedules
  beyond the tenant's live quota);
* scheduler: ``duejobs_recurring_quarantined_total{tenant}`` (definitions it could not
  evaluate, set to status ``error``);
* reconciler: ``duejobs_reconciler_fixed_total{kind}``, ``duejobs_overdue_repushed_total``
  (rows overdue past the stuck threshold whose job hash looked alive but was not on its queue
  or in its registry), and, from ``duejobs stats`` after every
  pass, the gauges ``duejobs_scheduled{tenant}``, ``duejobs_running{tenant}``,
  ``duejobs_in_flight{tenant}`` (pushed to Redis or running, what an in-flight quota caps),
  ``duejobs_late{tenant}``, ``duejobs_overdue{tenant}``, ``duejobs_oldest_overdue_seconds``,
  ``duejobs_schedules_without_job``, ``duejobs_jobs_without_schedule``,
  ``duejobs_redis_jobs{where}``.

Tenant labels multiply series by the number of tenants: fine for tens or hundreds, not for
millions (use ``duejobs stats`` per tenant instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram, start_http_server

if TYPE_CHECKING:
    from duejobs.stats import Stats

LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

LAG = Histogram(
    "duejobs_lag_seconds",
    "Due time to handler start (database clock).",
    ["tenant", "type"],
    buckets=LAG_BUCKETS,
)
DELIVERIES = Counter(
    "duejobs_deliveries",
    "Deliveries handled by a worker, by outcome.",
    ["tenant", "type", "outcome"],
)
PUSHED = Counter("duejobs_scheduler_pushed", "Jobs pushed by the scheduler.", ["where"])
PROMOTED = Counter("duejobs_scheduler_promoted", "Deferred jobs moved onto the queue.")
PASS_SECONDS = Histogram("duejobs_scheduler_pass_seconds", "Duration of a scheduler pass.")
THROTTLED = Counter(
    "duejobs_scheduler_throttled",
    "Scheduler passes in which a tenant's due rows waited for its in-flight quota.",
    ["tenant"],
)
FAILED_PASSES = Counter("duejobs_scheduler_failed_passes", "Scheduler passes that failed (outage).")
RECURRING_QUARANTINED = Counter(
    "duejobs_recurring_quarantined",
    "Recurring definitions set aside because the scheduler could not evaluate them.",
    ["tenant"],
)
QUOTA_REFUSALS = Counter(
    "duejobs_quota_refusals", "schedule() calls refused by a tenant's quota.", ["tenant"]
)
FIXED = Counter("duejobs_reconciler_fixed", "Drift fixed by the reconciler.", ["kind"])
OVERDUE_REPUSHED = Counter(
    "duejobs_overdue_repushed",
    "Rows overdue past the stuck threshold re-pushed though their job hash looked alive.",
)

SCHEDULED = Gauge("duejobs_scheduled", "Scheduled rows.", ["tenant"])
RUNNING = Gauge("duejobs_running", "Running rows.", ["tenant"])
IN_FLIGHT = Gauge("duejobs_in_flight", "Jobs pushed to Redis or running.", ["tenant"])
OVERDUE = Gauge("duejobs_overdue", "Scheduled rows already due.", ["tenant"])
LATE = Gauge("duejobs_late", "Scheduled rows due longer ago than the late threshold.", ["tenant"])
OLDEST = Gauge("duejobs_oldest_overdue_seconds", "Age of the oldest overdue row.")
WITHOUT_JOB = Gauge("duejobs_schedules_without_job", "Overdue rows with no live queue job.")
ORPHANS = Gauge("duejobs_jobs_without_schedule", "Waiting queue jobs with no current schedule.")
REDIS_JOBS = Gauge("duejobs_redis_jobs", "Jobs in Redis.", ["where"])


def serve(port: int) -> None:
    """Serve /metrics on ``port`` from a background thread."""
    start_http_server(port)


def observe_stats(stats: Stats) -> None:
    """Set the gauges from one ``duejobs stats`` snapshot."""
    for figures in stats.live:
        if figures.type is not None:
            continue
        tenant = figures.tenant or "all"
        SCHEDULED.labels(tenant).set(figures.scheduled)
        RUNNING.labels(tenant).set(figures.running)
        IN_FLIGHT.labels(tenant).set(figures.in_flight)
        OVERDUE.labels(tenant).set(figures.overdue)
        LATE.labels(tenant).set(figures.late)
    OLDEST.set(stats.oldest_overdue_seconds)
    WITHOUT_JOB.set(stats.schedules_without_job)
    ORPHANS.set(stats.jobs_without_schedule)
    REDIS_JOBS.labels("queue").set(stats.queued)
    REDIS_JOBS.labels("scheduled").set(stats.deferred)
