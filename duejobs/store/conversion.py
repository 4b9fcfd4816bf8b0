"""Moving a filled plain schema into partitioned mode, online: a staging schema with the
partitioned tables, triggers that mirror every write of the plain tables into it, a copy in
batches of what was there, then a swap in one short transaction (see
:mod:`duejobs.services.partition_maintenance` for the steps and what they promise)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg import sql as pgsql

from duejobs.errors import PartitioningError
from duejobs.ids import time_of
from duejobs.store.execution import run, run_composed, run_one, schema_of
from duejobs.store.partition_keys import key_function
from duejobs.store.partitions import (
    NAME_BYTES,
    PARTITIONED,
    SETTINGS_TABLE,
    carry_rights,
    drop_foreign_keys_to,
    ident,
    on_each,
    table_rights,
)
from duejobs.store.queries import ddl

if TYPE_CHECKING:
    from sqlalchemy import Connection

# How long the swap waits for each table's lock before it gives up and tries again.
BRIEF_LOCK_TIMEOUT = "100ms"  # x the six tables locked: under the 1 s deadlock_timeout
# The tables the swap locks, in the order statements take them (see :func:`swap`).
LOCKED_BY_SWAP = ["recurring_schedules", *PARTITIONED, "scheduled_job_effects"]


def staging_schema(schema: str) -> str:
    """Where the partitioned tables are built beside a filled plain schema: the schema's
    name and a suffix, which must fit PostgreSQL's 63 bytes (a longer name would be cut to
    another schema's — the source's own, for a 63-byte one)."""
    staging = f"{schema}_partitioning"
    if len(staging.encode()) > NAME_BYTES:
        raise PartitioningError(
            f"schema {schema!r} is too long to be moved to partitioned mode online: at most "
            f"{NAME_BYTES - len('_partitioning')} bytes"
        )
    return staging


def link_recurring(conn: Connection, source: str) -> None:
    """In the staging schema (``conn``'s, its tables still empty): the occurrences' foreign
    key pointed at the source schema's recurring definitions, which stay where they are."""
    run_composed(
        conn,
        "link_recurring",
        pgsql.SQL(
            "ALTER TABLE {jobs} DROP CONSTRAINT scheduled_jobs_recurring_id_fkey, "
            "ADD CONSTRAINT scheduled_jobs_recurring_id_fkey FOREIGN KEY (recurring_id) "
            "REFERENCES {recurring} (id) ON DELETE SET NULL"
        ).format(
            jobs=ident(conn, "scheduled_jobs"),
            recurring=pgsql.Identifier(source, "recurring_schedules"),
        ),
    )


def oldest_stamped(conn: Connection) -> datetime | None:
    """When the oldest schedule with a time-stamped id was made (ids of another kind, such as
    the occurrences of earlier releases, go to the default partition)."""
    row = run_one(conn, "oldest_stamped_id")
    return None if row is None else time_of(row.id)


def _columns(conn: Connection, table: str) -> list[str]:
    return [r.name for r in run(conn, "table_columns", {"schema": schema_of(conn), "name": table})]


def _key_columns(conn: Connection, table: str) -> list[str]:
    return [
        r.name for r in run(conn, "primary_key_columns", {"schema": schema_of(conn), "name": table})
    ]


def mirror(conn: Connection, staging: str) -> None:
    """Make every later write to the source tables (``conn``'s schema) write the same to
    their staging copies, in the same transaction: an insert or update as an upsert by
    primary key, a delete as a delete. The four tables are locked first, in one statement,
    waiting at most :data:`BRIEF_LOCK_TIMEOUT` for each (see :func:`swap`)."""
    _lock_briefly(conn, "lock_for_mirror", PARTITIONED, "SHARE ROW EXCLUSIVE")
    for table in PARTITIONED:
        columns = _columns(conn, table)
        keys = _key_columns(conn, table)
        rest = [c for c in columns if c not in keys]
        function = pgsql.Identifier(staging, f"duejobs_mirror_{table}")
        target = pgsql.Identifier(staging, table)
        body = ddl("mirror").format(
            function=function,
            target=target,
            source=ident(conn, table),
            keys=pgsql.SQL(", ").join(map(pgsql.Identifier, keys)),
            old_keys=pgsql.SQL(", ").join(pgsql.SQL("OLD.") + pgsql.Identifier(k) for k in keys),
            columns=pgsql.SQL(", ").join(map(pgsql.Identifier, columns)),
            new_columns=pgsql.SQL(", ").join(
                pgsql.SQL("NEW.") + pgsql.Identifier(c) for c in columns
            ),
            rest=pgsql.SQL(", ").join(map(pgsql.Identifier, rest)),
            excluded=pgsql.SQL(", ").join(
                pgsql.SQL("EXCLUDED.") + pgsql.Identifier(c) for c in rest
            ),
        )
        run_composed(conn, "mirror", body)


def drop_schema(conn: Connection, schema: str) -> None:
    """Drop ``schema`` and everything in it, if it exists (a staging schema)."""
    run_composed(
        conn,
        "drop_schema",
        pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)),
    )


def conversion_left(conn: Connection, staging: str) -> bool:
    """Whether a conversion left mirroring triggers on the source tables (``conn``'s schema)
    or its staging schema behind."""
    row = run_one(conn, "conversion_left", {"schema": schema_of(conn), "staging": staging})
    return bool(row is not None and row.left_behind)


def unmirror(conn: Connection) -> None:
    """Remove the mirroring triggers from the source tables (``conn``'s schema), if any.
    With none there, nothing is locked (a conversion starting, or one that failed before its
    mirror, holds no writer up); else the four tables are locked first, in one statement,
    waiting at most :data:`BRIEF_LOCK_TIMEOUT` for each (see :func:`swap`)."""
    row = run_one(conn, "mirrored", {"schema": schema_of(conn)})
    if row is None or not row.mirrored:
        return
    _lock_briefly(conn, "unmirror", PARTITIONED, "ACCESS EXCLUSIVE")
    on_each(conn, "unmirror", "DROP TRIGGER IF EXISTS duejobs_mirror ON {}")  # held: no wait


def _lock_briefly(conn: Connection, what: str, tables: Iterable[str], mode: str) -> None:
    """Lock ``tables`` in ``mode``, in one statement (so that no helper's own, longer, lock
    timeout applies to any of them), waiting at most :data:`BRIEF_LOCK_TIMEOUT` for each."""
    run(conn, "set_lock_timeout", {"timeout": BRIEF_LOCK_TIMEOUT})
    _lock(conn, what, tables, mode)


def _lock(conn: Connection, what: str, tables: Iterable[str], mode: str) -> None:
    run_composed(
        conn,
        what,
        pgsql.SQL("LOCK TABLE {} IN " + mode + " MODE").format(
            pgsql.SQL(", ").join(ident(conn, table) for table in tables)
        ),
    )


def _descending(keys: list[str]) -> pgsql.Composed:
    """``ORDER BY`` the whole key, greatest first (every column descending)."""
    return pgsql.SQL(", ").join(pgsql.SQL("{} DESC").format(pgsql.Identifier(k)) for k in keys)


def last_key(conn: Connection, table: str) -> tuple[Any, ...] | None:
    """The greatest primary key of ``table`` now (None: empty). Read once the mirror is in
    place, it bounds the copy: a row with a greater key was written since, and the mirror
    wrote it already."""
    names = _key_columns(conn, table)
    statement = pgsql.SQL("SELECT {keys} FROM {source} ORDER BY {descending} LIMIT 1").format(
        keys=pgsql.SQL(", ").join(map(pgsql.Identifier, names)),
        source=ident(conn, table),
        descending=_descending(names),
    )
    rows = run_composed(conn, "last_key", statement)
    return tuple(rows[0]) if rows else None


def copy_batch(
    conn: Connection,
    staging: str,
    table: str,
    after: tuple[Any, ...] | None,
    upto: tuple[Any, ...],
    limit: int,
) -> tuple[tuple[Any, ...], int] | None:
    """Copy the next ``limit`` rows of ``table`` (by primary key, after ``after``, up to
    ``upto`` included) into its staging copy, leaving alone a row the mirror wrote already (it
    is newer); the last key read and how many rows were read, or None once there are no more.
    Each row is locked ``FOR KEY SHARE`` while it is copied, so a delete of it (which the
    mirror carries over) waits for the copy."""
    keys = _key_columns(conn, table)
    columns = pgsql.SQL(", ").join(map(pgsql.Identifier, _columns(conn, table)))
    key_list = pgsql.SQL(", ").join(map(pgsql.Identifier, keys))

    def row(values: tuple[Any, ...]) -> pgsql.Composed:
        return pgsql.SQL(", ").join(map(pgsql.Literal, values))

    bounds = pgsql.SQL("({}) <= ({})").format(key_list, row(upto))
    if after is not None:
        bounds = pgsql.SQL("({}) > ({}) AND {}").format(key_list, row(after), bounds)
    statement = pgsql.SQL(
        """
WITH batch AS (
    SELECT {columns} FROM {source} WHERE {bounds} ORDER BY {keys} LIMIT {limit} FOR KEY SHARE
), copied AS (
    INSERT INTO {target} ({columns}) OVERRIDING SYSTEM VALUE
    SELECT {columns} FROM batch ON CONFLICT DO NOTHING
)
SELECT {keys}, count(*) OVER () AS n FROM batch ORDER BY {keys_descending} LIMIT 1
"""
    ).format(
        columns=columns,
        source=ident(conn, table),
        target=pgsql.Identifier(staging, table),
        bounds=bounds,
        keys=key_list,
        # every column of the key descending: the batch's last key, where the next resumes
        keys_descending=_descending(keys),
        limit=pgsql.Literal(limit),
    )
    rows = run_composed(conn, "copy_batch", statement)
    if not rows:
        return None
    *last, n = rows[0]
    return tuple(last), int(n)


def autovacuumed(conn: Connection) -> list[str]:
    """The tables of ``conn``'s schema a conversion step locks that an autovacuum worker holds
    now (one running to prevent wraparound left out: it yields to no one)."""
    rows = run(conn, "autovacuumed_tables", {"schema": schema_of(conn), "names": LOCKED_BY_SWAP})
    return [r.name for r in rows]


def wait_out_autovacuum(conn: Connection, tables: Sequence[str]) -> None:
    """Take ``tables`` in SHARE UPDATE EXCLUSIVE mode, waiting PostgreSQL's
    ``deadlock_timeout`` and half a second: an autovacuum worker holding one yields to a
    request that has waited ``deadlock_timeout`` (PostgreSQL ends it), and, held to the end
    of the transaction, the lock keeps a new one off until the step that follows has locked
    the tables.

    Why: the steps' own waits (:data:`BRIEF_LOCK_TIMEOUT`) stay under ``deadlock_timeout``,
    so that a writer they hold up is never the one the deadlock check ends; autovacuum never
    yields to them, and on a filled table a vacuum or an analyze can run for minutes. This
    mode conflicts with no write and no read, so the longer wait holds up no application's
    statement, and the transaction holds nothing else while it waits."""
    run(conn, "wait_past_deadlock_check")
    _lock(conn, "wait_out_autovacuum", tables, "SHARE UPDATE EXCLUSIVE")


def swap(conn: Connection, staging: str) -> None:
    """Put the staging tables in the source tables' place (``conn``'s schema), in one short
    transaction: lock the source tables (waiting at most :data:`LOCK_TIMEOUT`), carry the
    events' identity on, drop the source tables, move the staging ones — partitions, keys,
    settings and the key triggers' function included — and drop the staging schema."""
    schema = schema_of(conn)
    # In the order statements take them: the recurring definitions (the materializer locks one,
    # then writes its occurrences), the four tables, then the effect ledger (written after its
    # schedule's row is locked). The first and the last lose a foreign key here. Each wait is
    # short (BRIEF_LOCK_TIMEOUT, under PostgreSQL's 1 s deadlock_timeout): a writer that takes
    # them in another order finds the swap given up, to try again, rather than its own
    # transaction ended by the deadlock check (an autovacuum in the way: see
    # :func:`wait_out_autovacuum`).
    _lock_briefly(conn, "lock_for_swap", LOCKED_BY_SWAP, "ACCESS EXCLUSIVE")
    run(
        conn,
        "carry_identity",
        {"source": schema, "staging": staging, "name": "scheduled_job_events"},
    )
    rights = table_rights(conn)
    drop_foreign_keys_to(conn, "scheduled_jobs")  # the effect ledger's, gone with its table
    for table in reversed(PARTITIONED):
        run_composed(conn, "drop_source", pgsql.SQL("DROP TABLE {}").format(ident(conn, table)))
    moved = [*PARTITIONED, "scheduled_job_keys", SETTINGS_TABLE]
    for row in run(conn, "partition_tables", {"schema": staging, "names": list(PARTITIONED)}):
        moved.append(row.name)
    for name in moved:
        run_composed(
            conn,
            "move_table",
            pgsql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                pgsql.Identifier(staging, name), pgsql.Identifier(schema)
            ),
        )
    run_composed(
        conn,
        "move_function",
        pgsql.SQL("ALTER FUNCTION {}() SET SCHEMA {}").format(
            pgsql.Identifier(staging, "duejobs_keep_live_key"), pgsql.Identifier(schema)
        ),
    )
    # its body names the tables: now those of this schema
    run_composed(conn, "key_function", key_function(schema))
    run_composed(
        conn,
        "drop_staging",
        pgsql.SQL("DROP SCHEMA {} CASCADE").format(pgsql.Identifier(staging)),
    )
    carry_rights(conn, rights)
