"""Quarantine: a recurring definition the scheduler cannot evaluate is set aside, not retried.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_KINDS = (
    "'created', 'rescheduled', 'cancelled', 'enqueued', 'started', 'skipped', "
    "'retried', 'succeeded', 'failed', 'requeued', 'abandoned'"
)


def upgrade() -> None:
    # status 'error': the scheduler failed to evaluate the definition (a zone this host's
    # tzdata lacks, an expression that ran out of occurrences); last_error says why. An update
    # or a resume makes it active again.
    op.execute("ALTER TABLE recurring_schedules ADD COLUMN last_error text")
    op.execute("ALTER TABLE recurring_schedules DROP CONSTRAINT recurring_schedules_status_check")
    op.execute(
        "ALTER TABLE recurring_schedules ADD CONSTRAINT recurring_schedules_status_check "
        "CHECK (status IN ('active', 'paused', 'error'))"
    )
    # The history of a quarantine is an event on the definition's id.
    op.execute("ALTER TABLE scheduled_job_events DROP CONSTRAINT scheduled_job_events_kind_check")
    op.execute(
        "ALTER TABLE scheduled_job_events ADD CONSTRAINT scheduled_job_events_kind_check "
        f"CHECK (kind IN ({_KINDS}, 'quarantined')) NOT VALID"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE scheduled_job_events DROP CONSTRAINT scheduled_job_events_kind_check")
    op.execute(
        "ALTER TABLE scheduled_job_events ADD CONSTRAINT scheduled_job_events_kind_check "
        f"CHECK (kind IN ({_KINDS})) NOT VALID"
    )
    op.execute("UPDATE recurring_schedules SET status = 'paused' WHERE status = 'error'")
    op.execute("ALTER TABLE recurring_schedules DROP CONSTRAINT recurring_schedules_status_check")
    op.execute(
        "ALTER TABLE recurring_schedules ADD CONSTRAINT recurring_schedules_status_check "
        "CHECK (status IN ('active', 'paused'))"
    )
    op.execute("ALTER TABLE recurring_schedules DROP COLUMN last_error")
