"""Traces: the trace context of the request that scheduled a schedule.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # "<link|child> <W3C traceparent>" of the caller of schedule(), for the worker's span of
    # each attempt (duejobs.observability.tracing); NULL when tracing is off. Nullable without a
    # default:
    # adding it rewrites nothing.
    op.execute("ALTER TABLE scheduled_jobs ADD COLUMN trace_context text")


def downgrade() -> None:
    op.execute("ALTER TABLE scheduled_jobs DROP COLUMN trace_context")
