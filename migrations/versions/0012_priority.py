"""Priority: higher runs first among a tenant's due work on a queue.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

A column on schedules and on recurring definitions (whose occurrences take it), 0 for every
row there is: with a constant default, PostgreSQL adds it without rewriting the table or
reading its rows. Its range (-100 to 100, django.tasks') is checked where every write comes
from, the App: a CHECK constraint would read the whole table under the migration's lock.
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TABLES = ("scheduled_jobs", "recurring_schedules")


def upgrade() -> None:
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} ADD COLUMN priority smallint NOT NULL DEFAULT 0")


def downgrade() -> None:
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN priority")
