"""Priority: higher runs first among a tenant's due work on a queue.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

A column on schedules and on recurring definitions (whose occurrences take it), 0 for every
row there is: with a constant default, PostgreSQL adds it without rewriting the table or
reading its rows. Its range (-100 to 100, django.tasks') is checked where every write comes
from, the App: a CHECK constraint would read the whole table under the migration's lock.

And the claim's index of the rows above priority 0 waiting to be pushed, by tenant and due
time, like the claim's own (0002): a tenant's share takes them first, from here, however many
older rows of its wait — small (the urgent rows, until pushed), and written only for them. On
a large table, build it beforehand without blocking writes (``CREATE INDEX CONCURRENTLY IF NOT
EXISTS`` with the same definition); this migration then keeps it.
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TABLES = ("scheduled_jobs", "recurring_schedules")


_CLAIM_INDEX = "scheduled_jobs_claim_priority_idx"


def upgrade() -> None:
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} ADD COLUMN priority smallint NOT NULL DEFAULT 0")
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {_CLAIM_INDEX} ON scheduled_jobs (tenant, due_at) "
        "WHERE status = 'scheduled' AND queue_job_id IS NULL AND priority > 0"
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {_CLAIM_INDEX}")
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN priority")
