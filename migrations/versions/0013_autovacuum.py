"""Autovacuum kept up with the churn of the hot tables.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

Every schedule updates its row three to five times (pushed, started, finished, pruned) and
writes its events and attempts, which the pruner deletes later: at 300 schedules a second that
is a million dead tuples an hour. PostgreSQL's defaults vacuum a table once a fifth of its rows
are dead, with a cost delay that paces it for the whole database's I/O: on the hot table the
dead rows of an hour wait for the next vacuum, and the claim's index scans walk past them.

Here each hot table is vacuumed once 2% (the schedules) or 5% (their history) of its rows plus
a thousand are dead, analysed at 5%, and its vacuum is not paced (a cost delay of 0: each one is
small and frequent). ``fillfactor`` is left as it is: the schedules' updates change indexed
columns (the status, the lease, the queue job), so they are never HOT and room left on a page
would stay empty; the attempts, whose outcome update can stay on its page, keep their 80 since
0001. Measured by the soak run (docs/benchmarks.md).

In partitioned mode a partitioned table takes no storage parameters: each partition there is
given them (and every partition made later, by duejobs.store.partitions).
"""

from alembic import op
from sqlalchemy import text

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_HOT = "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0"
SETTINGS = {
    "scheduled_jobs": f"autovacuum_vacuum_scale_factor = 0.02, {_HOT}, "
    "autovacuum_analyze_scale_factor = 0.05",
    "scheduled_job_events": f"autovacuum_vacuum_scale_factor = 0.05, {_HOT}",
    "scheduled_job_attempts": f"autovacuum_vacuum_scale_factor = 0.05, {_HOT}",
    "scheduled_job_effects": f"autovacuum_vacuum_scale_factor = 0.05, {_HOT}",
}
_NAMES = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_analyze_scale_factor",
)

# The table itself, or (partitioned mode) each of its partitions, in the current schema.
_TARGETS = text(
    """
    SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relname = :table
      AND c.relkind = 'r'
    UNION ALL
    SELECT p.relname FROM pg_inherits i
    JOIN pg_class parent ON parent.oid = i.inhparent
    JOIN pg_class p ON p.oid = i.inhrelid
    WHERE parent.relnamespace = to_regnamespace(current_schema()) AND parent.relname = :table
      AND parent.relkind = 'p'
    """
)


def _each(table: str) -> list[str]:
    return [str(r[0]) for r in op.get_bind().execute(_TARGETS, {"table": table})]


def upgrade() -> None:
    for table, settings in SETTINGS.items():
        for target in _each(table):
            op.execute(f'ALTER TABLE "{target}" SET ({settings})')


def downgrade() -> None:
    for table in SETTINGS:
        for target in _each(table):
            op.execute(f'ALTER TABLE "{target}" RESET ({", ".join(_NAMES)})')
