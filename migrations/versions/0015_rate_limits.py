"""Rate limits: at most N starts per period for a queue or a tenant, and what counts them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

One row per limit set (a queue's, a tenant's own, the tenants' default under tenant ``'*'``)
and per tenant that follows the default (``max_starts`` NULL: its count alone). The count is
a GCRA: ``started_until`` is when the next start is due at the limit's pace, so one row
holds the state however high the rate (duejobs.store.rate_limits). The rows a worker's claim
locks are few (one per limit its batch touches) and each held for that statement only.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE rate_limits (
            scope text NOT NULL CHECK (scope IN ('queue', 'tenant')),
            name text NOT NULL,
            max_starts integer CHECK (max_starts >= 1),
            period interval CHECK (period > interval '0'),
            every interval CHECK (every > interval '0'),
            started_until timestamptz,
            asked integer NOT NULL DEFAULT 0,
            granted integer NOT NULL DEFAULT 0,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (scope, name),
            CHECK ((max_starts IS NULL) = (period IS NULL)),
            CHECK (max_starts IS NULL OR every IS NOT NULL)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE rate_limits")
