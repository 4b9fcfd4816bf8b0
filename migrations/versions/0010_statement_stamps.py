"""Events and attempts stamped with their statement's time, not their transaction's.

``now()`` is the time the transaction began: an attempt claimed late in its transaction (a
busy machine, a statement queued behind others) had its ``started`` event and its attempt's
``started_at`` stamped before the claim itself — a moment before its ``run_at`` although the
claim waited for it. ``statement_timestamp()`` is the claim's own moment, as the row's
``started_at`` already was. Partitioned tables take the default of their parent.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_STAMPS = (("scheduled_job_events", "at"), ("scheduled_job_attempts", "started_at"))


def upgrade() -> None:
    for table, column in _STAMPS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT statement_timestamp()")


def downgrade() -> None:
    for table, column in _STAMPS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT now()")
