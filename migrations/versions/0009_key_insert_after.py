"""Partitioned mode: the live-key insert trigger runs after the insert.

A BEFORE ROW INSERT trigger makes PostgreSQL fill a table one row at a time, so every
``schedule_many`` COPY paid for it, keys or not. The statements that insert keyed rows now
skip a held key themselves (see ``duejobs/store/partitions.py``). Nothing changes in the
plain schema.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from alembic import op

from duejobs import store

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    if store.partitioning(conn) is not None:
        store.time_key_insert(conn, "AFTER")


def downgrade() -> None:
    conn = op.get_bind()
    if store.partitioning(conn) is not None:
        store.time_key_insert(conn, "BEFORE")
