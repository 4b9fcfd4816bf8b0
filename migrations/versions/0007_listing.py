"""Listing: the indexes behind ``App.list`` / ``duejobs list``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

A list reads its rows in four parts (see ``store/sql/listing.sql``): waiting to be pushed,
pushed, running — each served by an index a schedule's life already writes — and finished.
Every index here is partial on finished rows, so a schedule gets its entries once, when it
finishes: scheduling, claiming and running pay nothing for listing (every update of a live row
is a new row version in each index that holds it). Each ends with ``(due_at, id)``, the
order of a list, so a page reads about as many entries as it shows.

On a large table, build them beforehand without blocking writes (``CREATE INDEX CONCURRENTLY
IF NOT EXISTS`` with the same definitions); this migration then keeps them.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_FINISHED = "status IN ('succeeded', 'failed', 'cancelled')"
_INDEXES = {
    # Finished schedules by time: the unfiltered list, a due-time range, and filters on
    # columns with few distinct values (type, queue), read in order until a page is full.
    "scheduled_jobs_list_finished_idx": f"(due_at, id) WHERE {_FINISHED}",
    # One tenant's finished schedules by time (live ones: the claim and pushed indexes).
    "scheduled_jobs_list_finished_tenant_idx": f"(tenant, due_at, id) WHERE {_FINISHED}",
    # The finished schedules of a key (live ones: the unique index of live keys).
    "scheduled_jobs_list_finished_key_idx": f"(tenant, key, due_at, id) WHERE key IS NOT NULL "
    f"AND {_FINISHED}",
    # The finished schedules that need an operator: few, however long the history.
    "scheduled_jobs_list_problem_idx": (
        "(status, due_at, id) WHERE status IN ('failed', 'cancelled')"
    ),
    # A recurring definition's finished occurrences (waiting ones: the recurring index).
    "scheduled_jobs_list_finished_recurring_idx": (
        f"(recurring_id, due_at, id) WHERE recurring_id IS NOT NULL AND {_FINISHED}"
    ),
}


def upgrade() -> None:
    for name, definition in _INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON scheduled_jobs {definition}")


def downgrade() -> None:
    for name in _INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
