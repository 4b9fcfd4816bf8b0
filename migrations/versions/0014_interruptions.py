"""Interruptions: attempts that failed only because their database connection broke.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

A count on each schedule of its current version's attempts that a broken connection ended (a
pooler restarted, a failover, a terminate): the worker retries those without using up the
handler's ``max_attempts``, and the reconciler's rescue subtracts them too. 0 for every row
there is: with a constant default, PostgreSQL adds the column without rewriting the table.
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE scheduled_jobs ADD COLUMN interruptions integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE scheduled_jobs DROP COLUMN interruptions")
