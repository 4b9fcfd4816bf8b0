"""History rows without a foreign-key check per insert.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every job writes several events (created, enqueued, started, succeeded...), each in the
    # same statement or transaction as the change of its schedule, and only duejobs writes
    # them. The foreign key's check per row was about a quarter of a scheduler claim and half
    # of writing a bulk batch's history. `duejobs prune` deletes a schedule's events with it.
    op.execute(
        "ALTER TABLE scheduled_job_events DROP CONSTRAINT scheduled_job_events_schedule_id_fkey"
    )


def downgrade() -> None:
    op.execute(
        "DELETE FROM scheduled_job_events e "
        "WHERE NOT EXISTS (SELECT 1 FROM scheduled_jobs s WHERE s.id = e.schedule_id)"
    )
    op.execute(
        "ALTER TABLE scheduled_job_events ADD CONSTRAINT scheduled_job_events_schedule_id_fkey "
        "FOREIGN KEY (schedule_id) REFERENCES scheduled_jobs (id) ON DELETE CASCADE"
    )
