"""Partitioned mode: the schedules and their history split by time into partitions that are
created ahead and dropped whole once everything in them is old.

Four tables grow with every schedule: ``scheduled_jobs`` and, beside it, its events,
attempts and results. In partitioned mode each is range-partitioned by the schedule's id
(``id``, ``schedule_id``) with the same bounds. A schedule's id is stamped with the
millisecond it was made (a recurring occurrence's, with its instant: see
:func:`duejobs.ids.stamped`), so a range of ids is a range of creation times, one partition
of each table holds whole schedules with their whole history, and a reschedule never moves a
row. The primary keys stay what they are (PostgreSQL wants the partition key in every unique
index: ``id`` is), and so do the statements: each finds its rows by id or through partial
indexes that every partition carries.

What changes, and why:

- A business key is unique among live schedules through a partial unique index in the plain
  schema; such an index cannot span partitions. ``scheduled_job_keys`` holds the keys of
  live schedules, kept by triggers on ``scheduled_jobs``: a row that becomes live (new, or
  again) with a key a live schedule holds fails with the unique index's own error, and a row
  that stops being live frees its key. The statements that insert keyed rows skip a held key
  first, as ``ON CONFLICT DO NOTHING`` skips it in the plain schema.
- No foreign keys between the partitioned tables (a partition referenced by one could only be
  dropped after a scan): retention deletes a schedule's attempts, results and effects itself.
- A ``DEFAULT`` partition takes an id outside every range (a catch-up occurrence of a
  partition already dropped, ids made while maintenance was down): an insert never fails for
  want of a partition.

Partitions are named ``<table>_p<YYYYMMDDHHMM>`` after their first instant (UTC); the
period and how many are kept ahead live in ``duejobs_partitioning``.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg import sql as pgsql

from duejobs.errors import PartitioningError
from duejobs.ids import first_id_at, time_of
from duejobs.store.execution import database_now, run, run_composed, run_count, run_one, schema_of
from duejobs.store.partition_keys import LIVE_KEY_INDEX, key_triggers

if TYPE_CHECKING:
    from sqlalchemy import Connection

# Each partitioned table and the column it is partitioned by; scheduled_jobs first.
PARTITIONED = {
    "scheduled_jobs": "id",
    "scheduled_job_events": "schedule_id",
    "scheduled_job_attempts": "schedule_id",
    "scheduled_job_results": "schedule_id",
}
# Storage parameters the plain tables have (fillfactor since 0001, autovacuum since 0013),
# given to each partition instead (a partitioned table holds no rows, so it takes none).
_HOT = "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0"
_HISTORY = f"autovacuum_vacuum_scale_factor = 0.05, {_HOT}"
_STORAGE = {
    "scheduled_jobs": pgsql.SQL(
        " WITH (autovacuum_vacuum_scale_factor = 0.02, "
        + _HOT
        + ", autovacuum_analyze_scale_factor = 0.05)"
    ),
    "scheduled_job_events": pgsql.SQL(f" WITH ({_HISTORY})"),
    "scheduled_job_attempts": pgsql.SQL(f" WITH (fillfactor = 80, {_HISTORY})"),
}
_ANY_ROW = {
    "scheduled_jobs": "any_row_scheduled_jobs",
    "scheduled_job_events": "any_row_scheduled_job_events",
    "scheduled_job_attempts": "any_row_scheduled_job_attempts",
    "scheduled_job_results": "any_row_scheduled_job_results",
}
SETTINGS_TABLE = "duejobs_partitioning"
NAME_BYTES = 63  # PostgreSQL's identifiers
_EVENTS = "scheduled_job_events"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BOUNDS = re.compile(r"FROM \('([0-9a-f-]{36})'\) TO \('([0-9a-f-]{36})'\)")
# Creating or dropping a partition locks its parent for a moment; waiting longer than this
# behind another transaction would hold up every statement queued behind the lock.
LOCK_TIMEOUT = "2s"


@dataclass(frozen=True)
class Partitioning:
    """The partitioned mode's settings: each partition covers ``period``; ``ahead`` more are
    kept ready past the current one."""

    period: timedelta
    ahead: int

    def __post_init__(self) -> None:
        hour = timedelta(hours=1)
        if not hour <= self.period <= timedelta(days=366) or self.period % hour:
            raise PartitioningError(
                f"partition_period must be whole hours, from 1 hour to 366 days; not {self.period}"
            )
        if not 1 <= self.ahead <= 1000:
            raise PartitioningError(f"partitions_ahead must be from 1 to 1000; not {self.ahead}")

    def start_of(self, at: datetime) -> datetime:
        """The first instant of the period holding ``at`` (periods count from the Unix
        epoch, so a day starts at midnight UTC)."""
        return _EPOCH + (at - _EPOCH) // self.period * self.period

    def periods(self, first: datetime, last: datetime) -> Iterator[datetime]:
        """The first instants of the periods from the one holding ``first`` to the one
        holding ``last``."""
        start = self.start_of(first)
        while start <= last:
            yield start
            start += self.period

    def coming(self, now: datetime) -> list[datetime]:
        """The periods kept ready: the current one and ``ahead`` more."""
        return list(self.periods(now, now + self.ahead * self.period))


@dataclass(frozen=True)
class Partition:
    """One range of schedules: its first and end instants (None for the default partition),
    the rows PostgreSQL estimates it holds, whether a live row is in it and when its last
    finished schedule finished."""

    name: str
    start: datetime | None
    end: datetime | None
    rows: int
    live: bool
    last_finished: datetime | None

    def droppable_by(self, horizon: datetime) -> bool:
        """Whether the range may be dropped: a range (not the default partition) made
        before ``horizon``, with no live row and nothing finished since."""
        if self.end is None or self.live or self.end > horizon:
            return False
        return self.last_finished is None or self.last_finished < horizon


def partition_name(table: str, start: datetime) -> str:
    return f"{table}_p{start:%Y%m%d%H%M}"


def ident(conn: Connection, table: str) -> pgsql.Identifier:
    return pgsql.Identifier(schema_of(conn), table)


def partitioning(conn: Connection) -> Partitioning | None:
    """The partitioned mode's settings, or None for the plain schema."""
    present = run(conn, "partitioning_table", {"schema": schema_of(conn), "name": SETTINGS_TABLE})
    if not present[0].present:
        return None
    row = run_one(conn, "partitioning")
    return None if row is None else Partitioning(row.period, row.ahead)


# Whether each schema is in partitioned mode, by (host, port, database, schema), with when it
# was read (time.monotonic): read again after _MODE_FOR seconds, so that a process sees a
# conversion (duejobs.services.partition_maintenance.convert) made while it runs.
_MODES: dict[tuple[str, ...], tuple[float, bool]] = {}
_MODE_FOR = 30.0


def is_partitioned(conn: Connection) -> bool:
    """Whether ``conn``'s schema is in partitioned mode, as read at most ``_MODE_FOR``
    seconds ago (for statements that are cheaper when they know it)."""
    info = conn.connection.driver_connection.info  # type: ignore[union-attr]
    where = (str(info.host), str(info.port), str(info.dbname), schema_of(conn))
    now = time.monotonic()
    known = _MODES.get(where)
    if known is None or now - known[0] > _MODE_FOR:
        known = _MODES[where] = (now, partitioning(conn) is not None)
    return known[1]


def holds_rows(conn: Connection) -> list[str]:
    """The tables to be partitioned that hold rows already."""
    return [t for t, query in _ANY_ROW.items() if run(conn, query)[0].present]


def make_partitioned(conn: Connection, settings: Partitioning, now: datetime) -> bool:
    """Turn the plain tables, if empty, into partitioned ones (``duejobs migrate
    --partitioned``, inside the migration's transaction): same columns, constraints, primary
    keys, indexes, owners and grants; the live-key index replaced by ``scheduled_job_keys`` and its
    triggers; the foreign keys between them dropped; then the default partitions and the
    first ones. False, changing nothing, when they hold rows (see ``convert``)."""
    # Locked first: a row being written now would otherwise be dropped with its table.
    on_each(conn, "lock_plain", "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE")
    if holds_rows(conn):
        return False
    rights = table_rights(conn)
    for table in PARTITIONED:
        drop_foreign_keys_to(conn, table)
    for table, column in PARTITIONED.items():
        _partition_table(conn, table, column)
    run(conn, "create_keys")
    run_composed(conn, "key_triggers", key_triggers(schema_of(conn)))
    run(conn, "create_partitioning")
    run(conn, "set_partitioning", {"period": settings.period, "ahead": settings.ahead})
    for table in PARTITIONED:
        _create(conn, table, f"{table}_default", pgsql.SQL("DEFAULT"))
    ensure_ahead(conn, settings, now)
    carry_rights(conn, rights)
    return True


def _partition_table(conn: Connection, table: str, column: str) -> None:
    """Replace the empty ``table`` by a partitioned one of the same shape."""
    schema = schema_of(conn)
    shape = run(conn, "table_shape", {"schema": schema, "name": table})
    new = f"{table}_partitioned"
    run_composed(
        conn,
        "create_partitioned",
        pgsql.SQL(
            "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING IDENTITY INCLUDING GENERATED) PARTITION BY RANGE ({})"
        ).format(ident(conn, new), ident(conn, table), pgsql.Identifier(column)),
    )
    run_composed(conn, "drop_plain", pgsql.SQL("DROP TABLE {}").format(ident(conn, table)))
    run_composed(
        conn,
        "rename_partitioned",
        pgsql.SQL("ALTER TABLE {} RENAME TO {}").format(ident(conn, new), pgsql.Identifier(table)),
    )
    for item in shape:
        if item.kind == "sequence":  # the identity's sequence, named after the table again
            run_composed(
                conn,
                "rename_sequence",
                pgsql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(
                    ident(conn, item.name.replace(table, new, 1)), pgsql.Identifier(item.name)
                ),
            )
        elif item.kind == "constraint":  # a primary key or a foreign key to another table
            run_composed(
                conn,
                "recreate_constraint",
                pgsql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(
                    ident(conn, table), pgsql.Identifier(item.name)
                )
                + pgsql.SQL(item.definition),  # PostgreSQL's own text for it
            )
        else:  # an index, as PostgreSQL prints it (the live-key one no longer unique)
            definition = item.definition
            if item.name == LIVE_KEY_INDEX:
                definition = definition.replace("CREATE UNIQUE INDEX", "CREATE INDEX", 1)
            run_composed(conn, "recreate_index", pgsql.SQL(definition))


def _create(conn: Connection, table: str, name: str, bounds: pgsql.Composable) -> None:
    """Create one partition, its indexes named after its parent's (``scheduled_jobs_claim_idx``
    is ``scheduled_jobs_p202612010000_claim_idx`` on a partition), so a plan reads the same
    on every partition."""
    run_composed(
        conn,
        "create_partition",
        pgsql.SQL("CREATE TABLE {} PARTITION OF {} {}{}").format(
            ident(conn, name), ident(conn, table), bounds, _STORAGE.get(table, pgsql.SQL(""))
        ),
    )
    for index in run(conn, "partition_indexes", {"schema": schema_of(conn), "name": name}):
        wanted = name + index.parent.removeprefix(table)
        if index.name != wanted:
            run_composed(
                conn,
                "name_partition_index",
                pgsql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    ident(conn, index.name), pgsql.Identifier(wanted)
                ),
            )


def create_range(conn: Connection, settings: Partitioning, start: datetime) -> str:
    """Create the partitions of the period starting at ``start``, one per table; the name of
    ``scheduled_jobs``'. Rows the default partitions hold for that period (made while it had
    no partition) are moved in, the four tables locked meanwhile, in the order every statement
    takes them: PostgreSQL refuses a new range while the default partition holds a row of it.
    Waits at most :data:`LOCK_TIMEOUT` for each lock."""
    low, high = first_id_at(start), first_id_at(start + settings.period)
    bounds = pgsql.SQL("FOR VALUES FROM ({}) TO ({})").format(
        pgsql.Literal(str(low)), pgsql.Literal(str(high))
    )
    run(conn, "set_lock_timeout", {"timeout": LOCK_TIMEOUT})
    strays = run(conn, "default_holds", {"low": low, "high": high})[0].present
    if strays:
        on_each(conn, "lock_parent", "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE")
    for table, column in PARTITIONED.items():
        if strays:
            _move_out_of_default(conn, table, column, low, high)
        _create(conn, table, partition_name(table, start), bounds)
        if strays:
            run_composed(
                conn,
                "move_back",
                pgsql.SQL(
                    "INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM duejobs_moving; "
                    "DROP TABLE duejobs_moving"
                ).format(ident(conn, table)),
            )
    return partition_name("scheduled_jobs", start)


def _move_out_of_default(
    conn: Connection, table: str, column: str, low: uuid.UUID, high: uuid.UUID
) -> None:
    run_composed(
        conn,
        "move_out_of_default",
        pgsql.SQL(
            "CREATE TEMPORARY TABLE duejobs_moving (LIKE {table}) ON COMMIT DROP; "
            "WITH moved AS (DELETE FROM {default} WHERE {column} >= {low} AND {column} < {high} "
            "RETURNING *) INSERT INTO duejobs_moving SELECT * FROM moved"
        ).format(
            table=ident(conn, table),
            default=ident(conn, f"{table}_default"),
            column=pgsql.Identifier(column),
            low=pgsql.Literal(str(low)),
            high=pgsql.Literal(str(high)),
        ),
    )


def ensure_ahead(conn: Connection, settings: Partitioning, now: datetime) -> list[str]:
    """Create, in this transaction, the partitions from the current period to ``ahead``
    more that are missing; their names (those of ``scheduled_jobs``)."""
    have = {p.start for p in partitions(conn, details=False)}
    return [create_range(conn, settings, s) for s in settings.coming(now) if s not in have]


def partitions(conn: Connection, *, details: bool = True) -> list[Partition]:
    """The partitions of ``scheduled_jobs``, oldest first, the default one last; with
    ``details``, whether each holds a live row and its last finish (read through the partial
    indexes: a few index pages each)."""
    found = []
    for row in run(conn, "list_partitions", {"schema": schema_of(conn), "name": "scheduled_jobs"}):
        bounds = _BOUNDS.search(row.bound)
        start = end = None
        if bounds is not None:
            start, end = (time_of(uuid.UUID(b)) for b in bounds.groups())
        live, last = False, None
        if details:
            figures = _partition_figures(conn, row.name)
            live, last = figures.live, figures.last_finished
        found.append(Partition(row.name, start, end, max(int(row.rows), 0), live, last))
    return sorted(found, key=lambda p: (p.start is None, p.start or _EPOCH))


def _partition_figures(conn: Connection, name: str) -> Any:
    statement = pgsql.SQL(
        "SELECT EXISTS (SELECT 1 FROM {p} WHERE status = 'scheduled') "
        "OR EXISTS (SELECT 1 FROM {p} WHERE status = 'running') AS live, "
        "(SELECT max(finished_at) FROM {p} "
        "WHERE status IN ('succeeded', 'failed', 'cancelled')) AS last_finished"
    ).format(p=ident(conn, name))
    return run_composed(conn, "partition_figures", statement)[0]


def partition_rows(conn: Connection, partition: Partition) -> int:
    """How many schedules a range holds now: read before a drop, outside its locks (the rows
    of a range old enough to drop no longer change)."""
    statement = pgsql.SQL("SELECT count(*) AS n FROM {}").format(ident(conn, partition.name))
    return int(run_composed(conn, "partition_rows", statement)[0].n)


def drop_partition(conn: Connection, partition: Partition, older_than: timedelta) -> bool:
    """Drop one range of schedules with their history, if it still holds no live row and
    nothing that finished within ``older_than``. The four tables are locked first, in the
    order every statement takes them (so this waits instead of deadlocking), then the range
    is checked again (a retry racing with the drop either waited, or won and is seen here),
    then each table's partition dropped. False when the check no longer holds. The range's
    effect-ledger rows are left to :func:`delete_orphan_effects`, in batches: deleting them
    here would hold the locks as long as that takes."""
    assert partition.start is not None, "the default partition is never dropped"
    on_each(conn, "lock_parent", "LOCK TABLE ONLY {} IN ACCESS EXCLUSIVE MODE")
    figures = _partition_figures(conn, partition.name)
    now = replace(partition, live=figures.live, last_finished=figures.last_finished)
    if not now.droppable_by(database_now(conn) - older_than):
        return False
    for table in reversed(PARTITIONED):
        run_composed(
            conn,
            "drop_partition",
            pgsql.SQL("DROP TABLE {}").format(ident(conn, partition_name(table, partition.start))),
        )
    return True


def delete_orphan_effects(
    conn: Connection, low: datetime | None, high: datetime, limit: int
) -> int:
    """Delete up to ``limit`` effect-ledger rows of schedules made from ``low`` (None: any
    time) to ``high`` that no longer exist: those of ranges dropped. How many."""
    params = {
        "low": first_id_at(low) if low is not None else uuid.UUID(int=0),
        "high": first_id_at(high),
        "limit": limit,
    }
    return run_count(conn, "delete_orphan_effects", params)


# -- what the conversion shares with make_partitioned ------------------------------------


def on_each(conn: Connection, what: str, template: str) -> None:
    """Run ``template`` on each table to partition of ``conn``'s schema (``{}``), waiting at
    most :data:`LOCK_TIMEOUT` for each table's lock."""
    run(conn, "set_lock_timeout", {"timeout": LOCK_TIMEOUT})
    for table in PARTITIONED:
        run_composed(conn, what, pgsql.SQL(template).format(ident(conn, table)))


def drop_foreign_keys_to(conn: Connection, table: str) -> None:
    for fk in run(conn, "foreign_keys_to", {"schema": schema_of(conn), "name": table}):
        run_composed(
            conn,
            "drop_foreign_key",
            pgsql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                ident(conn, fk.owner), pgsql.Identifier(fk.name)
            ),
        )


def table_rights(conn: Connection) -> list[Any]:
    """The owners of the four tables and the grants on them (and their columns) to others,
    read before the tables are replaced (see :func:`carry_rights`)."""
    return run(conn, "table_rights", {"schema": schema_of(conn), "names": list(PARTITIONED)})


def carry_rights(conn: Connection, rights: Sequence[Any]) -> None:
    """Give the partitioned tables their plain forerunners' owners and grants (``rights``,
    from :func:`table_rights`): an application running as a role granted the tables, not
    owning them, goes on working. Each partition takes its parent's owner (a partition is
    dropped by its owner); the keys table the owner and table grants of ``scheduled_jobs``
    (its triggers write it with the writer's rights); the settings, which maintenance reads,
    that owner and SELECT for whoever may select ``scheduled_jobs``. An owner that is the
    role running this is left as is; one it cannot give tables to fails the statement, and
    with it the migration or the swap, which then change nothing."""
    owners = {r.name: r for r in rights}
    grants: dict[str, list[Any]] = {name: [] for name in owners}
    for r in rights:
        if r.privilege is not None:
            grants[r.name].append(r)
    jobs = grants["scheduled_jobs"]
    grants["scheduled_job_keys"] = [g for g in jobs if g.column_name is None]
    grants[SETTINGS_TABLE] = [g for g in jobs if g.column_name is None and g.privilege == "SELECT"]
    partitions = run(
        conn, "partition_tables", {"schema": schema_of(conn), "names": list(PARTITIONED)}
    )
    tables = [*PARTITIONED, "scheduled_job_keys", SETTINGS_TABLE, *(row.name for row in partitions)]
    parents = sorted(PARTITIONED, key=len, reverse=True)
    for name in tables:
        parent = next((t for t in parents if name == t or name.startswith(f"{t}_")), None)
        owner = owners[parent or "scheduled_jobs"]
        if not owner.mine:
            run_composed(
                conn,
                "carry_owner",
                pgsql.SQL("ALTER TABLE {} OWNER TO {}").format(
                    ident(conn, name), pgsql.Identifier(owner.owner)
                ),
            )
        for grant in grants.get(name, []):
            run_composed(conn, "carry_grant", grant_of(conn, name, grant))


def grant_of(conn: Connection, table: str, grant: Any) -> pgsql.Composed:
    """The GRANT that gives ``table`` (or its column) what ``grant`` gave its forerunner."""
    column: pgsql.Composable = pgsql.SQL("")
    if grant.column_name is not None:
        column = pgsql.SQL(" ({})").format(pgsql.Identifier(grant.column_name))
    return pgsql.SQL("GRANT {}{} ON {} TO {}{}").format(
        pgsql.SQL(grant.privilege),  # one of PostgreSQL's own privilege names, from its catalog
        column,
        ident(conn, table),
        pgsql.SQL("PUBLIC") if grant.grantee is None else pgsql.Identifier(grant.grantee),
        pgsql.SQL(" WITH GRANT OPTION" if grant.grantable else ""),
    )
