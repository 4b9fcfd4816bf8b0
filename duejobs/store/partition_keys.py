"""Unique business keys in partitioned mode, kept by triggers.

A key is unique among live schedules through a partial unique index in the plain schema,
which cannot span partitions. In partitioned mode ``scheduled_job_keys`` holds the keys of
live schedules, kept by the triggers made here on ``scheduled_jobs``: a row that becomes live
(new, or again) with a key a live schedule holds fails with the unique index's own error
(:data:`LIVE_KEY_INDEX`), and a row that stops being live frees its key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg import sql as pgsql

from duejobs.store.execution import run_composed, schema_of
from duejobs.store.queries import ddl

if TYPE_CHECKING:
    from sqlalchemy import Connection

LIVE_KEY_INDEX = "scheduled_jobs_live_key_idx"


def key_triggers(schema: str) -> pgsql.Composed:
    """The triggers that keep ``scheduled_job_keys`` equal to the keys of live schedules.

    A held key's row is locked before its holder is looked at, and the look is a statement of
    its own (a snapshot taken after the lock): a holder that finished, or one that took the
    key, while this one waited is seen as it committed. A key freed meanwhile is tried again.

    Every trigger runs after its row is written: PostgreSQL fills a table with a BEFORE ROW
    INSERT trigger one row at a time, even in a COPY of rows the trigger would never fire on
    (``schedule_many``'s unkeyed rows), where it batches them otherwise. So a new row whose
    key a live schedule holds fails like a unique index; the statements that insert keyed rows
    skip a held key themselves (as ``ON CONFLICT DO NOTHING`` does over the plain schema's
    index), and a caller that lost a race for one tries again
    (:func:`duejobs.store.schedules.insert_keyed`).
    The function still skips such a row when it runs BEFORE the insert, as revision 0008's
    statements want (a downgrade puts that trigger back)."""
    return pgsql.Composed(
        [
            key_function(schema),
            key_insert_trigger(schema, "AFTER"),
            ddl("live_key_triggers").format(jobs=_jobs(schema), keep=_keep(schema)),
        ]
    )


def key_insert_trigger(schema: str, timing: str) -> pgsql.Composed:
    """The trigger that gives a new live row its key, run ``timing`` (AFTER, or BEFORE as
    revision 0008 had it) the insert."""
    return ddl("live_key_insert_trigger").format(
        timing=pgsql.SQL({"AFTER": "AFTER", "BEFORE": "BEFORE"}[timing]),
        jobs=_jobs(schema),
        keep=_keep(schema),
    )


def time_key_insert(conn: Connection, timing: str) -> None:
    """Run the live-key insert trigger ``timing`` (AFTER or BEFORE) the insert, with the
    function of this version (revision 0009 and its downgrade, in partitioned mode)."""
    schema = schema_of(conn)
    run_composed(conn, "key_function", key_function(schema))
    run_composed(
        conn,
        "drop_key_insert",
        pgsql.SQL("DROP TRIGGER scheduled_jobs_key_insert ON {}").format(_jobs(schema)),
    )
    run_composed(conn, "key_insert", key_insert_trigger(schema, timing))


def key_function(schema: str) -> pgsql.Composed:
    """The key triggers' function alone, made or replacing the one there."""
    return ddl("live_key_function").format(
        keep=_keep(schema),
        keys=pgsql.Identifier(schema, "scheduled_job_keys"),
        jobs=_jobs(schema),
        index=pgsql.SQL(LIVE_KEY_INDEX),
    )


def _jobs(schema: str) -> pgsql.Identifier:
    return pgsql.Identifier(schema, "scheduled_jobs")


def _keep(schema: str) -> pgsql.Identifier:
    return pgsql.Identifier(schema, "duejobs_keep_live_key")
