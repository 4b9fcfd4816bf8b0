"""Fair claiming across tenants and per-tenant in-flight quotas.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The claim walks the tenants that have rows waiting to be pushed and takes each one's
    # oldest due rows: one probe per tenant, then an index range per tenant, so a tenant with
    # a large backlog never stands in front of another's due rows. Partial, like the claim
    # index: its size follows the rows waiting to be pushed, never the history.
    op.execute(
        "CREATE INDEX scheduled_jobs_claim_tenant_idx ON scheduled_jobs (tenant, due_at) "
        "WHERE status = 'scheduled' AND queue_job_id IS NULL"
    )
    # Pushed-but-not-started jobs by tenant and time: a capped tenant's are counted up to its
    # in-flight cap before each claim (its running ones come from the lease index), and a
    # tenant with none due is "sparse" — its next job may go to the front of the queue.
    op.execute(
        "CREATE INDEX scheduled_jobs_pushed_idx ON scheduled_jobs (tenant, due_at) "
        "WHERE status = 'scheduled' AND queue_job_id IS NOT NULL"
    )
    # Live quotas now count through the two indexes above (and the lease index for running
    # rows), so the index of every scheduled row by tenant is no longer needed: one write less
    # per schedule.
    op.execute("DROP INDEX scheduled_jobs_tenant_idx")
    # NULL means "the default's value" (the row of tenant '*'), for each cap separately.
    op.execute(
        "ALTER TABLE tenant_quotas ADD COLUMN max_inflight integer CHECK (max_inflight >= 0)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE tenant_quotas DROP COLUMN max_inflight")
    op.execute(
        "CREATE INDEX scheduled_jobs_tenant_idx ON scheduled_jobs (tenant) "
        "WHERE status = 'scheduled'"
    )
    op.execute("DROP INDEX scheduled_jobs_pushed_idx")
    op.execute("DROP INDEX scheduled_jobs_claim_tenant_idx")
