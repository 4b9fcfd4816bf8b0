"""The only module that speaks SQL to ``scheduled_jobs`` and its companion tables.

Every function takes an open SQLAlchemy ``Connection`` and runs inside the caller's
transaction: the caller decides when to commit, so an application can write a schedule
together with its own rows. Statements are parameterised; where a change and its history
entry belong together they are one statement (a data-modifying CTE), so a schedule is never
changed without its event and the common paths cost one round trip.

Every statement is named: it lives in ``sql/<concern>.sql`` (see :mod:`duejobs.store.queries`)
and runs through :mod:`duejobs.store.execution`, the one path to PostgreSQL. One module per
concern — schedules, bulk, claims, attempts, reconciliation, figures, retention, recurring,
quotas — names its statements, passes their parameters and builds one record type.

"Now" is always the database's clock (``statement_timestamp()``), never a process clock.
"""

from __future__ import annotations

from duejobs.store.attempts import (
    Closing,
    Delivery,
    RunClaim,
    SkipReason,
    bookkeeping_session,
    bounded_locks,
    change_since_claim,
    claim_runs,
    claim_verdict,
    expire,
    extend_leases,
    finish,
    record_deferred,
    record_effect,
    record_stale,
)
from duejobs.store.bulk import insert_schedules
from duejobs.store.claims import ClaimedRow, TenantDue, claim_shares, walk_tenants
from duejobs.store.execution import (
    AsyncDriver,
    Driver,
    advisory_lock,
    create_database,
    database_now,
    is_missing_table,
    lent,
    server_answers,
    use_schema,
)
from duejobs.store.figures import (
    Activity,
    LagPoint,
    LiveFigures,
    ScheduleOutcome,
    activity,
    lag_series,
    live_figures,
    outcomes,
    start_lag,
    status_counts,
)
from duejobs.store.listing import ListFilter, Position, list_schedules
from duejobs.store.queries import (
    DEFAULT_QUOTA_TENANT,
    FRAGMENTS,
    QUERIES,
    SCHEMA_OPTION,
    TABLES,
    Query,
    in_schema,
)
from duejobs.store.quotas import (
    QUOTA_COLUMNS,
    Quota,
    count_live_up_to,
    effective_caps,
    live_quota,
    quotas,
    set_quota,
)
from duejobs.store.reconciliation import (
    OverdueRow,
    WindowRow,
    overdue_rows,
    record_repushed,
    rescue_expired,
    schedule_states,
    window_page,
)
from duejobs.store.recurring import (
    advance_recurring,
    cancel_occurrences,
    delete_recurring,
    due_recurring,
    get_recurring,
    insert_occurrences,
    list_recurring,
    quarantine_recurring,
    save_recurring,
    set_recurring_status,
)
from duejobs.store.results import (
    AttemptRecord,
    StoredResult,
    add_error,
    outcome_of,
    save_return_value,
)
from duejobs.store.retention import prune_finished
from duejobs.store.schedules import (
    NewRow,
    attempts,
    cancel,
    get_schedule,
    history,
    insert_schedule,
    is_past_run_at,
    live_by_key,
    reschedule,
    retry,
)

__all__ = [
    "DEFAULT_QUOTA_TENANT",
    "FRAGMENTS",
    "QUERIES",
    "QUOTA_COLUMNS",
    "SCHEMA_OPTION",
    "TABLES",
    "Activity",
    "AsyncDriver",
    "AttemptRecord",
    "ClaimedRow",
    "Closing",
    "Delivery",
    "Driver",
    "LagPoint",
    "ListFilter",
    "LiveFigures",
    "NewRow",
    "OverdueRow",
    "Position",
    "Query",
    "Quota",
    "RunClaim",
    "ScheduleOutcome",
    "SkipReason",
    "StoredResult",
    "TenantDue",
    "WindowRow",
    "activity",
    "add_error",
    "advance_recurring",
    "advisory_lock",
    "attempts",
    "bookkeeping_session",
    "bounded_locks",
    "cancel",
    "cancel_occurrences",
    "change_since_claim",
    "claim_runs",
    "claim_shares",
    "claim_verdict",
    "count_live_up_to",
    "create_database",
    "database_now",
    "delete_recurring",
    "due_recurring",
    "effective_caps",
    "expire",
    "extend_leases",
    "finish",
    "get_recurring",
    "get_schedule",
    "history",
    "in_schema",
    "insert_occurrences",
    "insert_schedule",
    "insert_schedules",
    "is_missing_table",
    "is_past_run_at",
    "lag_series",
    "lent",
    "list_recurring",
    "list_schedules",
    "live_by_key",
    "live_figures",
    "live_quota",
    "outcome_of",
    "outcomes",
    "overdue_rows",
    "prune_finished",
    "quarantine_recurring",
    "quotas",
    "record_deferred",
    "record_effect",
    "record_repushed",
    "record_stale",
    "reschedule",
    "rescue_expired",
    "retry",
    "save_recurring",
    "save_return_value",
    "schedule_states",
    "server_answers",
    "set_quota",
    "set_recurring_status",
    "start_lag",
    "status_counts",
    "use_schema",
    "walk_tenants",
    "window_page",
]
