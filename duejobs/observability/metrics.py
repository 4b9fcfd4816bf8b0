"""Prometheus metrics exposed by the scheduler, the worker, the reconciler and the pruner.

Each long-running command takes ``--metrics-port``; the process then serves ``/metrics``.

* worker: ``duejobs_lag_seconds{tenant,type}`` (histogram, due time → handler start, database clock)
  and ``duejobs_deliveries_total{tenant,type,outcome}`` (succeeded, retrying, interrupted,
  failed, skipped, stale, deferred), ``duejobs_rate_limited_deliveries_total{tenant}`` (starts
  a rate limit turned back that were put back in Redis);
* scheduler: ``duejobs_scheduler_pushed_total{where}`` (queue, scheduled, already_present),
  ``duejobs_scheduler_promoted_total``, ``duejobs_scheduler_pass_seconds``,
  ``duejobs_scheduler_failed_passes_total``, ``duejobs_scheduler_throttled_total{tenant}``
  (passes in which a tenant's due rows waited for room under its in-flight quota);
* any App: ``duejobs_quota_refusals_total{tenant}`` (also occurrences of recurring schedules
  beyond the tenant's live quota);
* scheduler's recurring loop: ``duejobs_recurring_quarantined_total{tenant}`` (definitions
  it could not evaluate, set to status ``error``), ``duejobs_recurring_failed_passes_total``,
  ``duejobs_recurring_last_pass_timestamp_seconds`` (a loop that stopped finishing passes);
* pruner: ``duejobs_pruned_total`` (finished schedules deleted with their history),
  ``duejobs_pruner_failed_passes_total``;
* reconciler: ``duejobs_reconciler_fixed_total{kind}``, ``duejobs_reconciler_failed_passes_total``,
  ``duejobs_overdue_repushed_total``
  (rows overdue past the stuck threshold whose job hash looked alive but was not on its queue
  or in its registry), and, from ``duejobs stats`` after every
  pass, the gauges ``duejobs_scheduled{tenant}``, ``duejobs_running{tenant}``,
  ``duejobs_in_flight{tenant}`` (pushed to Redis or running, what an in-flight quota caps),
  ``duejobs_late{tenant}``, ``duejobs_overdue{tenant}``, ``duejobs_oldest_overdue_seconds``,
  ``duejobs_schedules_without_job``, ``duejobs_jobs_without_schedule``,
  ``duejobs_recurring_behind`` (definitions the scheduler's recurring loop is late on),
  ``duejobs_redis_jobs{where}``, and the rate limits' ``duejobs_rate_limit_waiting{scope,name}``,
  ``duejobs_rate_limit_oldest_wait_seconds``, ``duejobs_rate_limit_use_ratio{scope,name}``
  (:mod:`duejobs.services.rate_figures`);
* any reader of the figures from a read replica: ``duejobs_read_replica_lag_seconds``
  (:mod:`duejobs.observability.replica`);
* any process pushing to several Redis nodes: ``duejobs_redis_node_errors_total{node}``
  (calls to one node that failed while the others went on).

Label values are bounded: a tenant label keeps its name for the first ``MAX_TENANT_LABELS``
(500) tenants a process sees and reads ``other`` after that; a type label is a type this
worker has a handler for, else ``unregistered``. Per-tenant gauges of a tenant that no longer
has live rows are removed. For more tenants than that, use ``duejobs stats`` per tenant.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class OwnedGauge(Gauge):
    """A gauge without labels that only the processes setting it export: it joins the
    default registry at its first value. (Every process importing this module would export it
    at 0 otherwise — a worker's ``duejobs_recurring_last_pass_timestamp_seconds`` 0 reads as a
    recurring loop that never ran, and fires its alert.)"""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, registry=None)
        self._joined = False
        self._join_lock = threading.Lock()

    def set(self, value: float) -> None:
        self._join()
        super().set(value)

    def set_to_current_time(self) -> None:
        self._join()
        super().set_to_current_time()

    def _join(self) -> None:
        if self._joined:
            return
        with self._join_lock:
            if not self._joined:
                REGISTRY.register(self)
                self._joined = True


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
UNKNOWN_TYPES = Counter(
    "duejobs_unknown_type_deliveries",
    "Deliveries of a type the worker had no handler for: put back, or failed past the grace.",
    ["tenant"],
)
RATE_LIMITED = Counter(
    "duejobs_rate_limited_deliveries",
    "Starts a rate limit's grant turned back to the table (no attempt used; the scheduler "
    "pushes them again at the limit's pace); one waited out in its slot, its time "
    "milliseconds away, is not counted.",
    ["tenant"],
)
BATCH_SIZE = Histogram(
    "duejobs_worker_batch_size",
    "Claims or outcomes a worker's bookkeeping statement carried (group commit).",
    ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
PUSHED = Counter("duejobs_scheduler_pushed", "Jobs pushed by the scheduler.", ["where"])
PROMOTED = Counter("duejobs_scheduler_promoted", "Deferred jobs moved onto the queue.")
PASS_SECONDS = Histogram("duejobs_scheduler_pass_seconds", "Duration of a scheduler pass.")
BATCH_SECONDS = Histogram(
    "duejobs_worker_batch_seconds",
    "Duration of one of a worker's bookkeeping steps (group commit): the statement of its "
    "claims, of its outcomes, or the script of its finishes in Redis.",
    ["kind"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
THROTTLED = Counter(
    "duejobs_scheduler_throttled",
    "Scheduler passes in which a tenant's due rows waited for its in-flight quota.",
    ["tenant"],
)
FAILED_PASSES = Counter("duejobs_scheduler_failed_passes", "Scheduler passes that failed (outage).")
RECURRING_FAILED_PASSES = Counter(
    "duejobs_recurring_failed_passes",
    "Recurring definitions' passes that failed (an outage or a bug).",
)
RECURRING_LAST_PASS = OwnedGauge(
    "duejobs_recurring_last_pass_timestamp_seconds",
    "When the recurring definitions' loop last finished a pass (Unix time).",
)
RECONCILE_FAILED_PASSES = Counter(
    "duejobs_reconciler_failed_passes", "Reconciler passes that failed (an outage or a bug)."
)
PRUNE_FAILED_PASSES = Counter(
    "duejobs_pruner_failed_passes", "Pruner passes that failed (an outage or a bug)."
)
PRUNED = Counter("duejobs_pruned", "Finished schedules deleted with their history.")
PARTITION_MAINTENANCE_FAILED = Counter(
    "duejobs_partition_maintenance_failed_passes",
    "Partition maintenance passes that failed (an outage, or a partition's locks not granted).",
)
PARTITIONS_CREATED = Counter(
    "duejobs_partitions_created", "Partitions created ahead (partitioned mode)."
)
PARTITIONS_READY_AHEAD = OwnedGauge(
    "duejobs_partitions_ready_ahead_seconds",
    "How far past now the last partition reaches (partitioned mode): below one period, the "
    "coming partitions are not being made.",
)
PARTITIONS_DROPPED = Counter(
    "duejobs_partitions_dropped", "Ranges of old schedules dropped whole (partitioned mode)."
)
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
# What grows, from the figures of `duejobs stats` (the reconciler's gauges).
TABLE_BYTES = Gauge(
    "duejobs_table_bytes",
    "A table's size with its indexes and TOAST (partitions summed).",
    ["table"],
)
TABLE_INDEX_BYTES = Gauge("duejobs_table_index_bytes", "A table's indexes' size.", ["table"])
TABLE_LIVE_TUPLES = Gauge(
    "duejobs_table_live_tuples",
    "A table's live tuples (the statistics collector's count).",
    ["table"],
)
TABLE_DEAD_TUPLES = Gauge(
    "duejobs_table_dead_tuples",
    "A table's dead tuples, not yet vacuumed (the statistics collector's count).",
    ["table"],
)
REDIS_USED_MEMORY = OwnedGauge(
    "duejobs_redis_used_memory_bytes", "Redis' used_memory (every node)."
)
REDIS_KEYS = OwnedGauge("duejobs_redis_keys", "Keys in duejobs' Redis databases (every node).")
REDIS_ENTRIES = Gauge(
    "duejobs_redis_entries",
    "Entries of each structure duejobs writes to Redis, summed over queues and nodes.",
    ["structure"],
)
REDIS_STRUCTURE_BYTES = Gauge(
    "duejobs_redis_structure_bytes",
    "Bytes of each structure duejobs writes to Redis (MEMORY USAGE, sampled).",
    ["structure"],
)
LOCKED_PAST_LEASE = OwnedGauge(
    "duejobs_locked_past_lease",
    "Running rows past their lease that another transaction holds locked, so that the "
    "reconciler cannot rescue them (set by the reconciler each pass).",
)
REDIS_CLEANED = Counter(
    "duejobs_redis_cleaned",
    "Entries the reconciler removed from RQ's structures: expired finished and failed registry "
    "entries (expired), dead workers' started entries (abandoned), dead workers' places in the "
    "worker sets (dead_workers).",
    ["kind"],
)

SCHEDULED = Gauge("duejobs_scheduled", "Scheduled rows.", ["tenant"])
RUNNING = Gauge("duejobs_running", "Running rows.", ["tenant"])
IN_FLIGHT = Gauge("duejobs_in_flight", "Jobs pushed to Redis or running.", ["tenant"])
OVERDUE = Gauge("duejobs_overdue", "Scheduled rows already due.", ["tenant"])
LATE = Gauge("duejobs_late", "Scheduled rows due longer ago than the late threshold.", ["tenant"])
OLDEST = OwnedGauge("duejobs_oldest_overdue_seconds", "Age of the oldest overdue row.")
RATE_WAITING = Gauge(
    "duejobs_rate_limit_waiting",
    "Rows a rate limit turned back, waiting for the time it gave them: per queue "
    "(scope=queue), per tenant (scope=tenant, the most waiting named, the rest as other), "
    "and all (scope=all).",
    ["scope", "name"],
)
RATE_OLDEST_WAIT = OwnedGauge(
    "duejobs_rate_limit_oldest_wait_seconds",
    "How long the row waiting longest on a rate limit has been due (since its due time "
    "before the limit moved it).",
)
RATE_USE = Gauge(
    "duejobs_rate_limit_use_ratio",
    "A rate limit's starts over the last period against its N, estimated (1: N of them; up "
    "to (N + 1) / N, the one start of tolerance): per queue (scope=queue), per tenant "
    "(scope=tenant: its own limit, or its count under the default; the busiest named, the "
    "busiest of the rest as other).",
    ["scope", "name"],
)
WITHOUT_JOB = OwnedGauge("duejobs_schedules_without_job", "Overdue rows with no live queue job.")
RECURRING_BEHIND = OwnedGauge(
    "duejobs_recurring_behind",
    "Active recurring definitions whose next occurrence is late and not yet a row.",
)
ORPHANS = OwnedGauge(
    "duejobs_jobs_without_schedule", "Waiting queue jobs with no current schedule."
)
REDIS_JOBS = Gauge("duejobs_redis_jobs", "Jobs in Redis.", ["where"])


def serve(port: int) -> None:
    """Serve /metrics on ``port`` from a background thread."""
    start_http_server(port)


def spelled(tenant: str) -> str:
    """A tenant's label: its name, but ``tenant:all`` and ``tenant:other`` for tenants called
    as the aggregate series are (``all``, ``other``) — a ':' no tenant name has — so that no
    tenant's figures are ever added into them."""
    return f"tenant:{tenant}" if tenant in (ALL, OTHER) else tenant


class _BoundedLabel:
    """Keeps one label's series bounded: the first ``limit`` distinct values keep their name
    (:func:`spelled`), later ones are counted under ``"other"`` (tenants are unbounded, series
    must not be)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        value = spelled(value)
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


OTHER = "other"  # the tenants past the named ones
ALL = "all"  # every tenant
MAX_TENANT_LABELS = 500
tenant_label = _BoundedLabel(MAX_TENANT_LABELS)
PER_TENANT = (SCHEDULED, RUNNING, IN_FLIGHT, OVERDUE, LATE)
