"""Unique business keys across partitions in partitioned mode, kept by triggers: a key held
by a live schedule in any partition is not taken again, races for one key make one live
schedule, a COPY stays batched, revision 0009's trigger timing. Each test on a schema of its
own, in partitioned mode (:mod:`tests.support.partitions`).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from duejobs import App, ScheduleRequest
from duejobs.store.partitions import partition_name
from tests.support.partitions import (
    DAILY,
    db_now,
    id_at,
    insert_at,
    live_keys,
    partition_of,
    past_partitions,
    schema_tx,
)
from tests.support.partitions import parted as parted


def test_a_key_held_by_a_live_schedule_in_an_older_partition_is_not_taken_again(
    parted: App,
) -> None:
    """Seen failing with the key triggers left out: a second live schedule held the key."""
    start = past_partitions(parted, 3)
    with schema_tx(parted) as conn:
        old = insert_at(conn, start + timedelta(hours=1), status="scheduled", key="order-1")
    again = parted.schedule("record", {}, delay=60, key="order-1")
    assert (again.id, again.created) == (old, False)
    assert partition_of(parted, old) != partition_of(
        parted, parted.schedule("record", {}, delay=60).id
    )


def test_two_transactions_scheduling_one_key_make_one_live_schedule(parted: App) -> None:
    """The second waits on the first's key, then sees the schedule it committed meanwhile.
    Seen failing with the holder's check left out: the second took the key over."""
    results: list[object] = []
    with schema_tx(parted) as first:
        mine = parted.schedule("record", {}, delay=60, key="k", conn=first)
        racer = threading.Thread(
            target=lambda: results.append(parted.schedule("record", {}, delay=60, key="k"))
        )
        racer.start()
        racer.join(1)
        assert racer.is_alive()  # waiting on the key's row
    racer.join(30)
    [theirs] = results
    assert theirs.id == mine.id and not theirs.created  # type: ignore[attr-defined]


def test_two_transactions_scheduling_one_key_in_batches_make_one_live_schedule(
    parted: App,
) -> None:
    """Seen failing with a lost race not run again: the second batch failed on the key."""
    results: list[list[uuid.UUID]] = []
    keyed = ScheduleRequest("record", {}, delay=60, key="k")
    with schema_tx(parted) as first:
        [mine] = parted.schedule_many([keyed], conn=first)
        racer = threading.Thread(
            target=lambda: results.append(
                parted.schedule_many([keyed, ScheduleRequest("record", {}, delay=60), keyed])
            )
        )
        racer.start()
        racer.join(1)
        assert racer.is_alive()  # waiting on the key's row
    racer.join(30)
    [[theirs, unkeyed, again]] = results
    assert theirs == again == mine and unkeyed != mine
    assert live_keys(parted) == {("default", "k", mine)}


def test_a_race_for_a_key_lost_inside_the_callers_transaction_leaves_it_usable(
    parted: App,
) -> None:
    """Seen failing with the keyed insert run without its savepoint: the caller's
    transaction was aborted by the key's error."""
    results: list[tuple[object, uuid.UUID]] = []

    def race() -> None:
        with schema_tx(parted) as second:
            theirs = parted.schedule("record", {}, delay=60, key="k", conn=second)
            results.append((theirs, parted.schedule("record", {}, delay=60, conn=second).id))

    with schema_tx(parted) as first:
        mine = parted.schedule("record", {}, delay=60, key="k", conn=first)
        racer = threading.Thread(target=race)
        racer.start()
        racer.join(1)
        assert racer.is_alive()
    racer.join(30)
    [(theirs, after)] = results
    assert theirs.id == mine.id and not theirs.created  # type: ignore[attr-defined]
    assert parted.get(after) is not None  # written after the lost race, and committed


def _before_insert_row_triggers(app: App) -> list[str]:
    """The tables of the App's schema (partitions too) with a BEFORE ROW INSERT trigger."""
    schema = app.engine.get_execution_options()["duejobs_schema"]
    with schema_tx(app) as conn:
        return sorted(
            conn.execute(
                text(
                    "SELECT DISTINCT c.relname FROM pg_trigger t "
                    "JOIN pg_class c ON c.oid = t.tgrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    # pg_trigger.tgtype: 1 a row trigger, 2 before, 4 on insert
                    "WHERE n.nspname = :s AND t.tgtype & 7 = 7"
                ),
                {"s": schema},
            ).scalars()
        )


def test_no_trigger_makes_a_copy_into_the_partitioned_tables_go_row_by_row(parted: App) -> None:
    """PostgreSQL's COPY batches rows only into a table without BEFORE ROW INSERT triggers,
    whether they would fire or not. Seen failing with the live-key trigger run before the
    insert, as revision 0008 made it."""
    parted.schedule_many([ScheduleRequest("record", {}, delay=60) for _ in range(10)])
    assert _before_insert_row_triggers(parted) == []


def _alembic(app: App, action: str, revision: str) -> None:
    """Alembic's ``action`` (upgrade or downgrade) to ``revision`` on the App's schema."""
    from alembic import command

    from duejobs.store.migrate import alembic_config

    schema = app.engine.get_execution_options()["duejobs_schema"]
    config = alembic_config()
    with schema_tx(app) as conn:
        config.attributes["connection"] = conn
        config.attributes["version_table_schema"] = schema
        getattr(command, action)(config, revision)


def test_revision_0009_moves_the_key_trigger_after_the_insert_and_back(parted: App) -> None:
    """A partitioned schema made before 0009 skipped a held key in its BEFORE trigger; after
    the upgrade the trigger runs after the insert and keys still hold; a downgrade puts the
    BEFORE trigger back, which 0008's statements (plain ``ON CONFLICT DO NOTHING``) need.
    Seen failing with the revision's upgrade left empty."""
    jobs = partition_name("scheduled_jobs", DAILY.start_of(db_now(parted)))
    _alembic(parted, "downgrade", "0008")
    assert jobs in _before_insert_row_triggers(parted)
    held = id_at(db_now(parted))
    with schema_tx(parted) as conn:  # written as at revision 0008 (no column of later ones)
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, type, key, payload, run_at, due_at) "
                "VALUES (:id, 'record', 'k', '{}', now() + interval '1 minute', "
                "now() + interval '1 minute')"
            ),
            {"id": held},
        )
    with schema_tx(parted) as conn:  # as revision 0008 inserted it: the trigger skips the row
        skipped = conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, type, key, payload, run_at, due_at) "
                "VALUES (:id, 'record', 'k', '{}', now(), now()) ON CONFLICT DO NOTHING"
            ),
            {"id": id_at(db_now(parted))},
        )
        assert skipped.rowcount == 0
    _alembic(parted, "upgrade", "head")
    assert _before_insert_row_triggers(parted) == []
    again = parted.schedule("record", {}, delay=60, key="k")
    assert (again.id, again.created) == (held, False)
    assert live_keys(parted) == {("default", "k", held)}


def test_a_finished_schedule_frees_its_key_and_a_retry_under_a_held_key_fails(
    parted: App,
) -> None:
    """Seen failing with the update trigger removed: the cancelled schedule kept its key."""
    first = parted.schedule("record", {}, delay=60, key="k")
    parted.cancel(first.id)
    second = parted.schedule("record", {}, delay=60, key="k")
    assert second.created and second.id != first.id
    # what App.retry checks first, done behind its back
    with (
        pytest.raises(IntegrityError, match="scheduled_jobs_live_key_idx"),
        schema_tx(parted) as conn,
    ):
        conn.execute(
            text("UPDATE scheduled_jobs SET status = 'scheduled' WHERE id = :id"),
            {"id": first.id},
        )
    parted.cancel(second.id)
    assert parted.retry(first.id).status.value == "scheduled"
    with schema_tx(parted) as conn:
        held = conn.execute(text("SELECT key, schedule_id FROM scheduled_job_keys")).all()
    assert held == [("k", first.id)]
