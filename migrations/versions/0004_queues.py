"""Routing: each schedule names the RQ queue it is delivered on.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Set at schedule() from the call, the type's handler or the App; the scheduler and the
    # reconciler push each row to its own queue, so workers can be pooled per queue.
    op.execute("ALTER TABLE scheduled_jobs ADD COLUMN queue text NOT NULL DEFAULT 'duejobs'")
    op.execute("ALTER TABLE recurring_schedules ADD COLUMN queue text NOT NULL DEFAULT 'duejobs'")


def downgrade() -> None:
    op.execute("ALTER TABLE recurring_schedules DROP COLUMN queue")
    op.execute("ALTER TABLE scheduled_jobs DROP COLUMN queue")
