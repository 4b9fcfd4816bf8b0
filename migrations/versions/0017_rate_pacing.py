"""Rate limits paced by the scheduler: limited rows wait in the table, not in Redis.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

``paced_until`` is when the next start the scheduler hands out under a limit may come: the
scheduler pushes a limit's rows only for the starts its pace leaves within a short horizon,
each due at its slot, and moves this on; the worker's grant (``started_until``) stays what
decides a start.

And the claim's index of the rows waiting to be pushed by tenant, queue and due time: the
claim walks (tenant, queue) pairs, so the rows of a queue under a limit are left in the table
without reading through them to reach the rows of the queues beside it. Partial, like the
claim's per-tenant index (0002): its size follows the rows waiting to be pushed. The index of
the urgent ones (priority above 0, 0012's) takes the same columns, so a pair's urgent rows
are read from it alone. On a large table, build both beforehand without blocking writes
(``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` with the same definitions); this migration then
keeps them.
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_CLAIM_INDEX = "scheduled_jobs_claim_queue_idx"
_URGENT_INDEX = "scheduled_jobs_claim_urgent_idx"
_PRIORITY_INDEX = "scheduled_jobs_claim_priority_idx"  # 0012's, by tenant alone
_WAITING = "status = 'scheduled' AND queue_job_id IS NULL"


def upgrade() -> None:
    op.execute("ALTER TABLE rate_limits ADD COLUMN paced_until timestamptz")
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {_CLAIM_INDEX} ON scheduled_jobs (tenant, queue, due_at) "
        f"WHERE {_WAITING}"
    )
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {_URGENT_INDEX} ON scheduled_jobs (tenant, queue, due_at) "
        f"WHERE {_WAITING} AND priority > 0"
    )
    op.execute(f"DROP INDEX IF EXISTS {_PRIORITY_INDEX}")


def downgrade() -> None:
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {_PRIORITY_INDEX} ON scheduled_jobs (tenant, due_at) "
        f"WHERE {_WAITING} AND priority > 0"
    )
    op.execute(f"DROP INDEX IF EXISTS {_URGENT_INDEX}")
    op.execute(f"DROP INDEX IF EXISTS {_CLAIM_INDEX}")
    op.execute("ALTER TABLE rate_limits DROP COLUMN paced_until")
