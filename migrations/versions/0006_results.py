"""Results: what a task returned, and the errors its attempts raised, beside its schedule.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One row per schedule that has a result or an error to keep (Django's Tasks read them);
    # it goes with its schedule (pruned, deleted).
    op.execute(
        """
        CREATE TABLE scheduled_job_results (
            schedule_id   uuid PRIMARY KEY REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
            tenant        text NOT NULL,
            return_value  jsonb,
            errors        jsonb NOT NULL DEFAULT '[]',
            updated_at    timestamptz NOT NULL DEFAULT statement_timestamp()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE scheduled_job_results")
