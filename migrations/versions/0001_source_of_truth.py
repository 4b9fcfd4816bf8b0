"""The source of truth: scheduled_jobs and its history, attempts and effects.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATUSES = "'scheduled', 'running', 'succeeded', 'failed', 'cancelled'"
EVENT_KINDS = (
    "'created', 'rescheduled', 'cancelled', 'enqueued', 'started', 'skipped', "
    "'retried', 'succeeded', 'failed', 'requeued', 'abandoned'"
)


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE recurring_schedules (
            id            uuid PRIMARY KEY,
            tenant        text NOT NULL DEFAULT 'default',
            name          text NOT NULL,
            type          text NOT NULL,
            payload       jsonb NOT NULL,
            cron          text NOT NULL,
            timezone      text NOT NULL,
            dst_gap       text NOT NULL CHECK (dst_gap IN ('shift', 'skip')),
            dst_overlap   text NOT NULL CHECK (dst_overlap IN ('once', 'twice')),
            misfire       text NOT NULL CHECK (misfire IN ('latest', 'all', 'skip')),
            grace         interval NOT NULL DEFAULT '0',
            status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused')),
            version       integer NOT NULL DEFAULT 1,
            next_run_at   timestamptz NOT NULL,
            created_at    timestamptz NOT NULL DEFAULT now(),
            updated_at    timestamptz NOT NULL DEFAULT now(),
            UNIQUE (tenant, name)
        )
        """
    )
    # The materializer's work: active definitions whose next occurrence enters the window.
    op.execute(
        "CREATE INDEX recurring_schedules_next_idx ON recurring_schedules (next_run_at) "
        "WHERE status = 'active'"
    )
    op.execute(
        f"""
        CREATE TABLE scheduled_jobs (
            id            uuid PRIMARY KEY,
            tenant        text NOT NULL DEFAULT 'default',
            type          text NOT NULL,
            key           text,
            payload       jsonb NOT NULL,
            run_at        timestamptz NOT NULL,
            due_at        timestamptz NOT NULL,
            jitter_offset interval NOT NULL DEFAULT '0' CHECK (jitter_offset >= interval '0'),
            expires_after interval CHECK (expires_after >= interval '0'),
            timezone      text,
            local_run_at  timestamp,
            status        text NOT NULL DEFAULT 'scheduled'
                          CONSTRAINT scheduled_jobs_status_check CHECK (status IN ({STATUSES})),
            queue_job_id  text,
            version       integer NOT NULL DEFAULT 1 CHECK (version >= 1),
            attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            max_attempts  integer,
            last_error    text,
            created_at    timestamptz NOT NULL DEFAULT now(),
            updated_at    timestamptz NOT NULL DEFAULT now(),
            enqueued_at   timestamptz,
            started_at    timestamptz,
            finished_at   timestamptz,
            lease_expires_at timestamptz,
            recurring_id      uuid REFERENCES recurring_schedules (id) ON DELETE SET NULL,
            recurring_version integer
        )
        """
    )
    # An occurrence's id is derived from (recurring schedule, its version, the instant), so the
    # primary key is what stops two schedulers from creating it twice. This index finds the
    # occurrences still to run when a recurring schedule is updated, paused or deleted.
    op.execute(
        "CREATE INDEX scheduled_jobs_recurring_idx ON scheduled_jobs (recurring_id) "
        "WHERE recurring_id IS NOT NULL AND status = 'scheduled'"
    )
    # `run_at` is the intent and never moves for a retry; `due_at` is when the next delivery
    # may start (run_at, or a retry's backoff). Work is found by `due_at`.
    # The scheduler's claim: due rows not yet pushed for their current version. Partial, so its
    # size follows the rows waiting to be pushed, never the history.
    op.execute(
        "CREATE INDEX scheduled_jobs_claim_idx ON scheduled_jobs (due_at) "
        "WHERE status = 'scheduled' AND queue_job_id IS NULL"
    )
    # Every live `scheduled` row by time: the reconciler's overdue scan and lag figures.
    op.execute(
        "CREATE INDEX scheduled_jobs_due_idx ON scheduled_jobs (due_at) WHERE status = 'scheduled'"
    )
    # Running rows by lease: the reconciler finds work whose worker died.
    op.execute(
        "CREATE INDEX scheduled_jobs_lease_idx ON scheduled_jobs (lease_expires_at) "
        "WHERE status = 'running'"
    )
    # Finished rows by age: `duejobs prune` deletes them oldest first, in batches.
    op.execute(
        "CREATE INDEX scheduled_jobs_finished_idx ON scheduled_jobs (finished_at) "
        "WHERE status IN ('succeeded', 'failed', 'cancelled')"
    )
    # Per-tenant quotas count a tenant's waiting rows (running ones come from the lease index).
    op.execute(
        "CREATE INDEX scheduled_jobs_tenant_idx ON scheduled_jobs (tenant) "
        "WHERE status = 'scheduled'"
    )
    # A business key names at most one live schedule per tenant; finished ones free the key.
    op.execute(
        "CREATE UNIQUE INDEX scheduled_jobs_live_key_idx ON scheduled_jobs (tenant, key) "
        "WHERE key IS NOT NULL AND status IN ('scheduled', 'running')"
    )
    op.execute(
        f"""
        CREATE TABLE scheduled_job_events (
            id           bigint GENERATED ALWAYS AS IDENTITY,
            schedule_id  uuid NOT NULL REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
            tenant       text NOT NULL,
            kind         text NOT NULL CHECK (kind IN ({EVENT_KINDS})),
            version      integer NOT NULL,
            at           timestamptz NOT NULL DEFAULT now(),
            detail       jsonb NOT NULL DEFAULT '{{}}',
            -- One index serves identity, a schedule's history in order, and cascades: every
            -- job writes several events, so each index saved is a write saved.
            PRIMARY KEY (schedule_id, id)
        )
        """
    )
    # Recent history for stats (lag, cancellations, retries in the last hour): the table is
    # append-only, so a BRIN index on time stays tiny and nearly free to maintain.
    op.execute("CREATE INDEX scheduled_job_events_at_brin ON scheduled_job_events USING brin (at)")
    op.execute(
        """
        CREATE TABLE scheduled_job_attempts (
            schedule_id       uuid NOT NULL REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
            tenant            text NOT NULL,
            version           integer NOT NULL,
            attempt           integer NOT NULL CHECK (attempt >= 1),
            status            text NOT NULL
                              CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned',
                                                'stale')),
            worker            text,
            started_at        timestamptz NOT NULL DEFAULT now(),
            finished_at       timestamptz,
            next_attempt_at   timestamptz,
            error             text,
            PRIMARY KEY (schedule_id, version, attempt)
        ) WITH (fillfactor = 80)  -- room for the outcome update to stay on the page (HOT)
        """
    )
    op.execute(
        """
        CREATE TABLE scheduled_job_effects (
            effect_key   text PRIMARY KEY,
            schedule_id  uuid NOT NULL REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
            tenant       text NOT NULL,
            version      integer NOT NULL,
            created_at   timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "CREATE INDEX scheduled_job_effects_schedule_idx ON scheduled_job_effects (schedule_id)"
    )
    # Quotas per tenant; the row of tenant '*' is the default for tenants without their own.
    op.execute(
        """
        CREATE TABLE tenant_quotas (
            tenant      text PRIMARY KEY,
            max_live    integer CHECK (max_live >= 0),
            updated_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE tenant_quotas")
    op.execute("DROP TABLE scheduled_job_effects")
    op.execute("DROP TABLE scheduled_job_attempts")
    op.execute("DROP TABLE scheduled_job_events")
    op.execute("DROP TABLE scheduled_jobs")
    op.execute("DROP TABLE recurring_schedules")
