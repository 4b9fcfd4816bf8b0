"""Partitioned mode's maintenance: ranges dropped whole behind (only once nothing in them
is live or recent, checked again under the lock), pruned in batches while busy, and made
ahead by a service of their own, which ``duejobs reconcile`` runs. Each test on a schema of
its own, in partitioned mode (:mod:`tests.support.partitions`).
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from duejobs import App, store
from duejobs.errors import PartitioningError
from duejobs.services.partition_maintenance import PartitionMaintenance, create_ahead
from duejobs.services.pruner import PruneConfig, Pruner
from duejobs.store.partitions import PARTITIONED, partition_name
from tests.support import sample, wait_for
from tests.support.cli import run
from tests.support.partitions import (
    DAILY,
    db_now,
    insert_at,
    partition_of,
    past_partitions,
    rows_of,
    schema_tx,
)
from tests.support.partitions import parted as parted
from tests.support.processes import ROOT, Proc


def test_a_range_is_dropped_whole_only_once_nothing_in_it_is_live_or_recent(
    parted: App,
) -> None:
    """Seen failing with the live check left out (the live range went too) and with the
    finish horizon left out (the recent range went too)."""
    start = past_partitions(parted, 12)
    now = db_now(parted)
    long_ago = now - timedelta(days=8)
    with schema_tx(parted) as conn:
        gone = [insert_at(conn, start + timedelta(hours=h), finished=long_ago) for h in (1, 2)]
        live = [insert_at(conn, start + timedelta(days=1, hours=1), status="scheduled")]
        recent = [insert_at(conn, start + timedelta(days=2, hours=1), finished=now)]
    result = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert (result.partitions_dropped, result.schedules_dropped) == (1, 2)
    assert [rows_of(parted, t, gone) for t in PARTITIONED] == [0, 0, 0, 0]
    assert rows_of(parted, "scheduled_job_effects", gone) == 0
    for kept in (live, recent):
        assert [rows_of(parted, t, kept) for t in PARTITIONED] == [1, 1, 1, 1]
    with schema_tx(parted) as conn:
        names = {p.name for p in store.partitions(conn)}
    assert partition_name("scheduled_jobs", start) not in names
    assert partition_name("scheduled_jobs", start + timedelta(days=1)) in names


def test_prune_says_how_many_ranges_and_schedules_it_dropped(
    parted: App, database_url: str, redis_url: str
) -> None:
    """Seen failing before the ranges were reported (only the batches' rows were)."""
    start = past_partitions(parted, 12)
    with schema_tx(parted) as conn:
        for h in (1, 2, 3):
            insert_at(conn, start + timedelta(hours=h), finished=db_now(parted) - timedelta(days=8))
    done = run("prune", "--older-than", "7d", env=_cli_env(parted, database_url, redis_url))
    assert done.returncode == 0, done.stderr
    said = re.search(r"dropped (\d+) ranges whole, with (\d+) finished schedules", done.stdout)
    assert said is not None, done.stdout
    assert int(said[1]) >= 1 and int(said[2]) == 3, done.stdout  # the empty ranges go too


def test_a_range_with_nothing_live_is_left_whole_for_its_drop(parted: App) -> None:
    """A pruner run every hour deletes nothing batch by batch that a drop will take whole: a
    range begun before the horizon with no live row waits, even once the horizon has passed
    its end while a schedule of it finished late; the finished rows of a range a live row
    keeps go in batches. Seen failing with only the range the horizon falls in spared (the
    range a late finish kept went row by row) and with no range spared."""
    start = past_partitions(parted, 8)  # ranges of 8, 7 and 6 days ago
    now = db_now(parted)
    with schema_tx(parted) as conn:
        held = [insert_at(conn, start + timedelta(hours=1), finished=start + timedelta(hours=2))]
        live = insert_at(conn, start + timedelta(hours=3), status="scheduled")
        waits = start + timedelta(days=1)
        early = insert_at(conn, waits + timedelta(hours=1), finished=waits + timedelta(hours=2))
        late = insert_at(conn, waits + timedelta(hours=3), finished=now - timedelta(days=3))
    result = Pruner(parted, PruneConfig(older_than=timedelta(days=6))).run_once()
    assert (result.partitions_dropped, result.deleted) == (0, 1)
    assert [rows_of(parted, t, held) for t in PARTITIONED] == [0, 0, 0, 0]
    assert [rows_of(parted, t, [early, late]) for t in PARTITIONED] == [2, 2, 2, 2]
    later = Pruner(parted, PruneConfig(older_than=timedelta(days=2))).run_once()
    assert (later.partitions_dropped, later.deleted) == (2, 0)  # the empty one of 6 days ago
    assert [rows_of(parted, t, [early, late]) for t in PARTITIONED] == [0, 0, 0, 0]
    assert rows_of(parted, "scheduled_jobs", [live]) == 1


def test_a_drop_checks_again_under_the_lock(parted: App) -> None:
    """A retry between the look and the drop keeps the range. Seen failing with the check
    under the lock left out."""
    start = past_partitions(parted, 12)
    with schema_tx(parted) as conn:
        long_ago = store.database_now(conn) - timedelta(days=9)
        sid = insert_at(conn, start + timedelta(hours=1), status="failed", finished=long_ago)
        [looked] = [p for p in store.partitions(conn) if p.start == start]
    assert not looked.live
    parted.retry(sid)  # live again
    with schema_tx(parted) as conn:
        assert not store.drop_partition(conn, looked, timedelta(days=7))
    assert rows_of(parted, "scheduled_jobs", [sid]) == 1


def _drop_last_partition(app: App) -> datetime:
    """The last partition ahead dropped, as if no maintenance pass had run for a period;
    its start."""
    last = DAILY.start_of(db_now(app)) + 2 * DAILY.period
    with schema_tx(app) as conn:
        for table in reversed(PARTITIONED):
            conn.execute(text(f"DROP TABLE {partition_name(table, last)}"))
    return last


def _cli_env(app: App, database_url: str, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "DUEJOBS_SCHEMA": app.engine.get_execution_options()["duejobs_schema"],
    }


def test_partition_maintenance_makes_the_coming_partitions(parted: App) -> None:
    """Seen failing with the pass's call to create them left out."""
    last = _drop_last_partition(parted)
    result = PartitionMaintenance(parted).run_once()
    assert result.created == [partition_name("scheduled_jobs", last)]
    ahead = sample("duejobs_partitions_ready_ahead_seconds")
    assert 2 * 86400 < ahead <= 3 * 86400
    assert create_ahead(parted.engine) == []
    with schema_tx(parted) as conn:
        assert last in {p.start for p in store.partitions(conn)}


def test_duejobs_reconcile_makes_the_coming_partitions_in_one_pass(
    parted: App, database_url: str, redis_url: str
) -> None:
    """``duejobs reconcile`` once (a cron job's way) runs a maintenance pass beside its own.
    Seen failing with the command running the reconciler alone."""
    last = _drop_last_partition(parted)
    done = run("reconcile", env=_cli_env(parted, database_url, redis_url))
    assert done.returncode == 0, done.stderr
    with schema_tx(parted) as conn:
        assert last in {p.start for p in store.partitions(conn)}


def test_duejobs_reconcile_every_makes_the_coming_partitions_beside_its_passes(
    parted: App, database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """``duejobs reconcile --every`` runs the maintenance loop beside the reconciler's (its
    first pass at once), and both stop at SIGTERM. Seen failing with the loop not started."""
    last = _drop_last_partition(parted)
    env = {**_cli_env(parted, database_url, redis_url), "PYTHONPATH": str(ROOT)}
    proc = Proc(["reconcile", "--every", "1s"], env, tmp_path / "reconcile.log")
    try:

        def made() -> bool:
            with schema_tx(parted) as conn:
                return last in {p.start for p in store.partitions(conn)}

        wait_for(made, 30, "the coming partition made")
    finally:
        assert proc.stop() == 0, proc.output()


def test_a_coming_range_is_made_even_when_the_default_partition_holds_rows_of_it(
    parted: App,
) -> None:
    """Schedules made while their period had no partition (no reconciler ran for longer than
    the partitions ahead) wait in the default partition; making the period's partition moves
    them in, key and history with them. Seen failing without the move: PostgreSQL refused the
    new range, and every pass after it."""
    last = DAILY.start_of(db_now(parted)) + 2 * DAILY.period
    with schema_tx(parted) as conn:
        for table in reversed(PARTITIONED):
            conn.execute(text(f"DROP TABLE {partition_name(table, last)}"))
        stray = insert_at(conn, last + timedelta(hours=1), status="scheduled", key="stray")
    assert partition_of(parted, stray) == "scheduled_jobs_default"
    assert create_ahead(parted.engine) == [partition_name("scheduled_jobs", last)]
    assert partition_of(parted, stray) == partition_name("scheduled_jobs", last)
    assert [rows_of(parted, t, [stray]) for t in PARTITIONED] == [1, 1, 1, 1]
    assert (stray, False) == (
        (again := parted.schedule("record", {}, delay=60, key="stray")).id,
        again.created,
    )


def test_a_range_whose_tables_are_busy_is_pruned_in_batches_and_dropped_at_a_later_pass(
    parted: App,
) -> None:
    """Seen failing with the lock timeout raised out of the pass (nothing was pruned) and with
    the busy range spared from the batches as if it would drop (its rows stayed, and would
    stay for as long as its tables stayed busy)."""
    start = past_partitions(parted, 8)  # the first ended less than a period before the horizon
    long_ago = db_now(parted) - timedelta(days=9)
    with schema_tx(parted) as conn:
        old = [insert_at(conn, start + timedelta(hours=h), finished=long_ago) for h in (1, 2)]
        kept_by_live = start + timedelta(days=1)
        insert_at(conn, kept_by_live, status="scheduled")
        rest = [insert_at(conn, kept_by_live + timedelta(hours=1), finished=long_ago)]
    with schema_tx(parted) as reader:
        reader.execute(text("SELECT count(*) FROM scheduled_job_results"))  # holds its lock
        result = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert (result.partitions_dropped, result.deleted) == (0, 3)
    assert rows_of(parted, "scheduled_jobs", [*old, *rest]) == 0
    again = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert again.partitions_dropped == 1


def test_a_range_kept_from_its_drop_a_period_past_its_end_goes_to_the_batches(
    parted: App,
) -> None:
    """A schedule retried again and again (or run long after it was made) keeps its range from
    being dropped; its other finished rows then go in batches once the horizon is a period
    past the range's end, not never. Seen failing with no such bound (they stayed)."""
    start = past_partitions(parted, 12)
    now = db_now(parted)
    with schema_tx(parted) as conn:
        early = insert_at(conn, start + timedelta(hours=1), finished=start + timedelta(hours=2))
        retried = insert_at(conn, start + timedelta(hours=3), finished=now - timedelta(hours=1))
    result = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert result.deleted == 1 and rows_of(parted, "scheduled_jobs", [early]) == 0
    assert rows_of(parted, "scheduled_jobs", [retried]) == 1


def test_a_schema_too_long_for_its_staging_schema_is_refused_before_anything_is_touched() -> None:
    """A 63-byte schema's staging name would be cut back to the schema's own."""
    assert store.staging_schema("s" * 50) == "s" * 50 + "_partitioning"
    with pytest.raises(PartitioningError, match="too long to be moved to partitioned mode"):
        store.staging_schema("s" * 51)
