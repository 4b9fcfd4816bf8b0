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
  live schedules, kept by triggers on ``scheduled_jobs``: an insert whose key a live schedule
  holds is skipped (as ``ON CONFLICT DO NOTHING`` skips it in the plain schema), a row that
  becomes live again with a held key fails with the unique index's own error, and a row that
  stops being live frees its key.
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
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import sql as pgsql
from sqlalchemy import Connection

from duejobs.errors import PartitioningError
from duejobs.ids import first_id_at, time_of
from duejobs.store.execution import database_now, run, run_composed, run_count, run_one, schema_of

# Each partitioned table and the column it is partitioned by; scheduled_jobs first.
PARTITIONED = {
    "scheduled_jobs": "id",
    "scheduled_job_events": "schedule_id",
    "scheduled_job_attempts": "schedule_id",
    "scheduled_job_results": "schedule_id",
}
# Storage parameters the plain tables are created with, given to each partition instead
# (a partitioned table holds no rows, so it takes none).
_STORAGE = {"scheduled_job_attempts": pgsql.SQL(" WITH (fillfactor = 80)")}
_ANY_ROW = {
    "scheduled_jobs": "any_row_scheduled_jobs",
    "scheduled_job_events": "any_row_scheduled_job_events",
    "scheduled_job_attempts": "any_row_scheduled_job_attempts",
    "scheduled_job_results": "any_row_scheduled_job_results",
}
_LIVE_KEY_INDEX = "scheduled_jobs_live_key_idx"
_SETTINGS = "duejobs_partitioning"
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


def partition_name(table: str, start: datetime) -> str:
    return f"{table}_p{start:%Y%m%d%H%M}"


def _ident(conn: Connection, table: str) -> pgsql.Identifier:
    return pgsql.Identifier(schema_of(conn), table)


def partitioning(conn: Connection) -> Partitioning | None:
    """The partitioned mode's settings, or None for the plain schema."""
    present = run(conn, "partitioning_table", {"schema": schema_of(conn), "name": _SETTINGS})
    if not present[0].present:
        return None
    row = run_one(conn, "partitioning")
    return None if row is None else Partitioning(row.period, row.ahead)


def holds_rows(conn: Connection) -> list[str]:
    """The tables to be partitioned that hold rows already."""
    return [t for t, query in _ANY_ROW.items() if run(conn, query)[0].present]


def make_partitioned(conn: Connection, settings: Partitioning, now: datetime) -> None:
    """Turn the empty plain tables into partitioned ones (``duejobs migrate --partitioned``,
    inside the migration's transaction): same columns, constraints, primary keys and
    indexes; the live-key index replaced by ``scheduled_job_keys`` and its triggers; the
    foreign keys between them dropped; then the default partitions and the first ones."""
    filled = holds_rows(conn)
    if filled:
        raise PartitioningError(
            f"partitioned mode is chosen on empty tables; {', '.join(filled)} hold rows"
        )
    for table in PARTITIONED:
        for fk in run(conn, "foreign_keys_to", {"schema": schema_of(conn), "name": table}):
            run_composed(
                conn,
                "drop_foreign_key",
                pgsql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                    _ident(conn, fk.owner), pgsql.Identifier(fk.name)
                ),
            )
    for table, column in PARTITIONED.items():
        _partition_table(conn, table, column)
    run(conn, "create_keys")
    run_composed(conn, "key_triggers", _key_triggers(schema_of(conn)))
    run(conn, "create_partitioning")
    run(conn, "set_partitioning", {"period": settings.period, "ahead": settings.ahead})
    for table in PARTITIONED:
        _create(conn, table, f"{table}_default", pgsql.SQL("DEFAULT"))
    ensure_ahead(conn, settings, now)


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
        ).format(_ident(conn, new), _ident(conn, table), pgsql.Identifier(column)),
    )
    run_composed(conn, "drop_plain", pgsql.SQL("DROP TABLE {}").format(_ident(conn, table)))
    run_composed(
        conn,
        "rename_partitioned",
        pgsql.SQL("ALTER TABLE {} RENAME TO {}").format(_ident(conn, new), pgsql.Identifier(table)),
    )
    for item in shape:
        if item.kind == "sequence":  # the identity's sequence, named after the table again
            run_composed(
                conn,
                "rename_sequence",
                pgsql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(
                    _ident(conn, item.name.replace(table, new, 1)), pgsql.Identifier(item.name)
                ),
            )
        elif item.kind == "constraint":  # a primary key or a foreign key to another table
            run_composed(
                conn,
                "recreate_constraint",
                pgsql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(
                    _ident(conn, table), pgsql.Identifier(item.name)
                )
                + pgsql.SQL(item.definition),  # PostgreSQL's own text for it
            )
        else:  # an index, as PostgreSQL prints it (the live-key one no longer unique)
            definition = item.definition
            if item.name == _LIVE_KEY_INDEX:
                definition = definition.replace("CREATE UNIQUE INDEX", "CREATE INDEX", 1)
            run_composed(conn, "recreate_index", pgsql.SQL(definition))


def _key_triggers(schema: str) -> pgsql.Composed:
    """The triggers that keep ``scheduled_job_keys`` equal to the keys of live schedules.

    Each check of who holds a key is a statement of its own, so it sees a holder that
    committed while this one waited on the key's row."""
    text = """
CREATE FUNCTION {keep}() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    holder uuid;
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.key IS NOT NULL AND OLD.status IN ('scheduled', 'running') THEN
        DELETE FROM {keys}
        WHERE tenant = OLD.tenant AND key = OLD.key AND schedule_id = OLD.id;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF NEW.key IS NULL OR NEW.status NOT IN ('scheduled', 'running') THEN
        RETURN NEW;
    END IF;
    INSERT INTO {keys} (tenant, key, schedule_id) VALUES (NEW.tenant, NEW.key, NEW.id)
    ON CONFLICT (tenant, key) DO NOTHING;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    SELECT schedule_id INTO holder FROM {keys} WHERE tenant = NEW.tenant AND key = NEW.key;
    IF NOT EXISTS (
        SELECT 1 FROM {jobs} WHERE id = holder AND status IN ('scheduled', 'running')
    ) THEN  -- a key left by a row that was never written: it is free
        UPDATE {keys} SET schedule_id = NEW.id WHERE tenant = NEW.tenant AND key = NEW.key;
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        RETURN NULL;  -- as ON CONFLICT DO NOTHING over the plain schema's unique index
    END IF;
    RAISE unique_violation USING
        MESSAGE = 'duplicate key value violates unique constraint "{index}"',
        DETAIL = format('Key (tenant, key)=(%s, %s) already exists.', NEW.tenant, NEW.key),
        CONSTRAINT = '{index}';
END
$fn$;
CREATE TRIGGER scheduled_jobs_key_insert BEFORE INSERT ON {jobs}
    FOR EACH ROW WHEN (NEW.key IS NOT NULL AND NEW.status IN ('scheduled', 'running'))
    EXECUTE FUNCTION {keep}();
CREATE TRIGGER scheduled_jobs_key_update AFTER UPDATE ON {jobs}
    FOR EACH ROW WHEN (
        OLD.key IS DISTINCT FROM NEW.key
        OR (OLD.status IN ('scheduled', 'running')) <> (NEW.status IN ('scheduled', 'running'))
    )
    EXECUTE FUNCTION {keep}();
CREATE TRIGGER scheduled_jobs_key_delete AFTER DELETE ON {jobs}
    FOR EACH ROW WHEN (OLD.key IS NOT NULL AND OLD.status IN ('scheduled', 'running'))
    EXECUTE FUNCTION {keep}();
"""
    return pgsql.SQL(text).format(
        keep=pgsql.Identifier(schema, "duejobs_keep_live_key"),
        keys=pgsql.Identifier(schema, "scheduled_job_keys"),
        jobs=pgsql.Identifier(schema, "scheduled_jobs"),
        index=pgsql.SQL(_LIVE_KEY_INDEX),
    )


def _create(conn: Connection, table: str, name: str, bounds: pgsql.Composable) -> None:
    """Create one partition, its indexes named after its parent's (``scheduled_jobs_claim_idx``
    is ``scheduled_jobs_p202612010000_claim_idx`` on a partition), so a plan reads the same
    on every partition."""
    run_composed(
        conn,
        "create_partition",
        pgsql.SQL("CREATE TABLE {} PARTITION OF {} {}{}").format(
            _ident(conn, name), _ident(conn, table), bounds, _STORAGE.get(table, pgsql.SQL(""))
        ),
    )
    for index in run(conn, "partition_indexes", {"schema": schema_of(conn), "name": name}):
        wanted = name + index.parent.removeprefix(table)
        if index.name != wanted:
            run_composed(
                conn,
                "name_partition_index",
                pgsql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    _ident(conn, index.name), pgsql.Identifier(wanted)
                ),
            )


def _periods(settings: Partitioning, first: datetime, last: datetime) -> Iterator[datetime]:
    start = settings.start_of(first)
    while start <= last:
        yield start
        start += settings.period


def ensure_ahead(conn: Connection, settings: Partitioning, now: datetime) -> list[str]:
    """Create the partitions of the current period and of ``ahead`` more that are missing;
    their names (those of ``scheduled_jobs``). Waits at most :data:`LOCK_TIMEOUT` for each
    parent's lock (a pass that cannot get it fails, to be tried again)."""
    have = {p.start for p in partitions(conn, details=False)}
    wanted = _periods(settings, now, now + settings.ahead * settings.period)
    missing = [start for start in wanted if start not in have]
    if missing:
        run(conn, "set_lock_timeout", {"timeout": LOCK_TIMEOUT})
    for start in missing:
        end = start + settings.period
        for table in PARTITIONED:
            bounds = pgsql.SQL("FOR VALUES FROM ({}) TO ({})").format(
                pgsql.Literal(str(first_id_at(start))), pgsql.Literal(str(first_id_at(end)))
            )
            _create(conn, table, partition_name(table, start), bounds)
    return [partition_name("scheduled_jobs", start) for start in missing]


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
    ).format(p=_ident(conn, name))
    return run_composed(conn, "partition_figures", statement)[0]


def drop_partition(conn: Connection, partition: Partition, older_than: timedelta) -> bool:
    """Drop one range of schedules with their history, if it still holds no live row and
    nothing that finished within ``older_than``: the range's ``scheduled_jobs`` partition is
    locked first (a retry or a late insert waits for it, or wins and is seen here), then
    checked again, then its effects deleted and every table's partition dropped. False when
    the check no longer holds."""
    assert partition.start is not None, "the default partition is never dropped"
    run(conn, "set_lock_timeout", {"timeout": LOCK_TIMEOUT})
    run_composed(
        conn,
        "lock_partition",
        pgsql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(_ident(conn, partition.name)),
    )
    figures = _partition_figures(conn, partition.name)
    horizon = database_now(conn) - older_than
    if figures.live or (figures.last_finished is not None and figures.last_finished >= horizon):
        return False
    assert partition.end is not None
    run_count(
        conn,
        "delete_effects_between",
        {"low": first_id_at(partition.start), "high": first_id_at(partition.end)},
    )
    for table in reversed(PARTITIONED):
        run_composed(
            conn,
            "drop_partition",
            pgsql.SQL("DROP TABLE {}").format(_ident(conn, partition_name(table, partition.start))),
        )
    return True
