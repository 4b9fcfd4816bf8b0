"""Rate limits: each count's use over the last period.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

The GCRA state (``started_until``) says when the next start may come, not how many came:
two fixed windows of one period do (the starts of the current one, and of the one before),
kept by the claim that grants them, from which the query ``rate_limits`` estimates the starts over
the sliding period (the one before weighted by how much of it the period still covers). A
few integers on rows the claim updates anyway: no read of the history to say how busy a
limit is.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE rate_limits
            ADD COLUMN window_start timestamptz,
            ADD COLUMN window_starts integer NOT NULL DEFAULT 0,
            ADD COLUMN previous_starts integer NOT NULL DEFAULT 0
        """
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE rate_limits DROP COLUMN window_start, DROP COLUMN window_starts, "
        "DROP COLUMN previous_starts"
    )
