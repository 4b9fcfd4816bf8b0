"""Listing by type and by queue: an index each, for live and for finished schedules.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

A list filtered by a type or a queue read the parts' indexes in due order and kept the rows
of that type: a page cost about as many rows as it takes to meet ``limit`` of them, which for
a rare type is every row (seconds a page at ten million). Each index here starts with the
filtered column and ends with ``(due_at, id)``, the order of a list, so a page reads about as
many entries as it shows whatever the value's share. Live and finished schedules have one
each, so a filter on the live parts never walks the finished history of that type: a row
version enters one of the pair, which a live row's changes (push, start) already rewrite in
every index.

On a large table, build them beforehand without blocking writes (``CREATE INDEX CONCURRENTLY
IF NOT EXISTS`` with the same definitions); this migration then keeps them.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_LIVE = "status IN ('scheduled', 'running')"
_FINISHED = "status IN ('succeeded', 'failed', 'cancelled')"
_INDEXES = {
    f"scheduled_jobs_list_{state}_{column}_idx": f"({column}, due_at, id) WHERE {where}"
    for column in ("type", "queue")
    for state, where in (("live", _LIVE), ("finished", _FINISHED))
}


def upgrade() -> None:
    for name, definition in _INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON scheduled_jobs {definition}")


def downgrade() -> None:
    for name in _INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
