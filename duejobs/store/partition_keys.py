"""Unique business keys in partitioned mode, kept by triggers.

A key is unique among live schedules through a partial unique index in the plain schema,
which cannot span partitions. In partitioned mode ``scheduled_job_keys`` holds the keys of
live schedules, kept by the triggers made here on ``scheduled_jobs``: a row that becomes live
(new, or again) with a key a live schedule holds fails with the unique index's own error
(:data:`LIVE_KEY_INDEX`), and a row that stops being live frees its key.
"""

from __future__ import annotations

from psycopg import sql as pgsql
from sqlalchemy import Connection

from duejobs.store.execution import run_composed, schema_of

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
    LOOP
        INSERT INTO {keys} (tenant, key, schedule_id) VALUES (NEW.tenant, NEW.key, NEW.id)
        ON CONFLICT (tenant, key) DO NOTHING;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        -- Held: lock the key's row, so that whoever holds it is settled until this commits.
        SELECT schedule_id INTO holder FROM {keys}
        WHERE tenant = NEW.tenant AND key = NEW.key FOR UPDATE;
        IF FOUND THEN
            EXIT WHEN holder <> NEW.id AND EXISTS (
                SELECT 1 FROM {jobs} WHERE id = holder AND status IN ('scheduled', 'running')
            );
            -- Its own key (its row written again), or one left by a row no longer live (a
            -- copy that lost to a newer write): it is this row's.
            UPDATE {keys} SET schedule_id = NEW.id WHERE tenant = NEW.tenant AND key = NEW.key;
            RETURN NEW;
        END IF;
        -- Freed since the insert looked: try again.
    END LOOP;
    IF TG_OP = 'INSERT' AND TG_WHEN = 'BEFORE' THEN
        RETURN NULL;  -- skipped, as revision 0008's statements expect
    END IF;
    RAISE unique_violation USING
        MESSAGE = 'duplicate key value violates unique constraint "{index}"',
        DETAIL = format('Key (tenant, key)=(%s, %s) already exists.', NEW.tenant, NEW.key),
        CONSTRAINT = '{index}';
END
$fn$;
{insert_trigger}
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
        index=pgsql.SQL(LIVE_KEY_INDEX),
        insert_trigger=key_insert_trigger(schema, "AFTER"),
    )


def key_insert_trigger(schema: str, timing: str) -> pgsql.Composed:
    """The trigger that gives a new live row its key, run ``timing`` (AFTER, or BEFORE as
    revision 0008 had it) the insert."""
    return pgsql.SQL(
        "CREATE TRIGGER scheduled_jobs_key_insert {timing} INSERT ON {jobs} "
        "FOR EACH ROW WHEN (NEW.key IS NOT NULL AND NEW.status IN ('scheduled', 'running')) "
        "EXECUTE FUNCTION {keep}();"
    ).format(
        timing=pgsql.SQL({"AFTER": "AFTER", "BEFORE": "BEFORE"}[timing]),
        jobs=pgsql.Identifier(schema, "scheduled_jobs"),
        keep=pgsql.Identifier(schema, "duejobs_keep_live_key"),
    )


def time_key_insert(conn: Connection, timing: str) -> None:
    """Run the live-key insert trigger ``timing`` (AFTER or BEFORE) the insert, with the
    function of this version (revision 0009 and its downgrade, in partitioned mode)."""
    schema = schema_of(conn)
    run_composed(conn, "key_function", key_function(schema))
    run_composed(
        conn,
        "drop_key_insert",
        pgsql.SQL("DROP TRIGGER scheduled_jobs_key_insert ON {}").format(
            pgsql.Identifier(schema, "scheduled_jobs")
        ),
    )
    run_composed(conn, "key_insert", key_insert_trigger(schema, timing))


def key_function(schema: str) -> pgsql.SQL:
    """The key triggers' function alone, replacing the one there."""
    return pgsql.SQL(
        key_triggers(schema)
        .as_string(None)
        .split("CREATE TRIGGER", 1)[0]
        .replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    )
