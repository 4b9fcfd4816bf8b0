"""Partitioned mode (``duejobs migrate --partitioned``): the layout — every growing table
partitioned with all its indexes, settings refused out of range, ids outside every range in
the default partition — and the CLI that migrates and shows it.

Each test runs on a schema of its own, migrated in partitioned mode with daily partitions
(:mod:`tests.support.partitions`). The rest of the suite runs on partitioned mode too with
``DUEJOBS_TEST_PARTITIONED=1``; the conversion of a filled schema, live keys, maintenance and
plans have modules of their own (``test_partition_*.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from redis import Redis
from sqlalchemy import text

from duejobs import App, Status, store
from duejobs.errors import PartitioningError
from duejobs.ids import first_id_at, stamped, time_of
from duejobs.scheduler.loop import Scheduler
from duejobs.services.partition_maintenance import create_ahead, drop_behind
from duejobs.services.reconciler import Reconciler
from duejobs.store.partitions import PARTITIONED, Partitioning, partition_name
from duejobs.worker import build_worker
from tests.support.partitions import (
    DAILY,
    id_at,
    insert_at,
    partition_of,
    past_partitions,
    rows_of,
    schema_tx,
)
from tests.support.partitions import parted as parted
from tests.support.processes import ROOT


def test_migrate_partitioned_partitions_every_growing_table_with_all_its_indexes(
    parted: App,
) -> None:
    """Seen failing with the live-key index left out of the partitions."""
    schema = parted.engine.get_execution_options()["duejobs_schema"]
    with schema_tx(parted) as conn:

        def indexes(table: str) -> set[str]:
            return set(
                conn.execute(
                    text(
                        "SELECT indexname FROM pg_indexes WHERE schemaname = :s AND tablename = :t"
                    ),
                    {"s": schema, "t": table},
                ).scalars()
            )

        kinds = dict(
            conn.execute(
                text(
                    "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = :s AND c.relname = ANY(:t)"
                ),
                {"s": schema, "t": list(PARTITIONED)},
            ).all()
        )
        assert kinds == dict.fromkeys(PARTITIONED, "p")
        start = DAILY.start_of(store.database_now(conn))
        for table in PARTITIONED:
            parent = indexes(table)
            for part in (partition_name(table, start), f"{table}_default"):
                assert indexes(part) == {part + i.removeprefix(table) for i in parent}
        assert "scheduled_jobs_live_key_idx" in indexes("scheduled_jobs")
    assert parted.migrate(partitioned=DAILY)[0] == parted.migrate()[1]  # idempotent


@pytest.mark.parametrize(
    ("period", "ahead", "refusal"),
    [
        (timedelta(minutes=30), 2, "partition_period must be whole hours"),
        (timedelta(hours=1, minutes=30), 2, "partition_period must be whole hours"),
        (timedelta(days=400), 2, "partition_period must be whole hours"),
        (timedelta(days=1), 0, "partitions_ahead must be from 1 to 1000"),
    ],
)
def test_partition_settings_out_of_range_are_refused(
    period: timedelta, ahead: int, refusal: str
) -> None:
    with pytest.raises(PartitioningError, match=refusal):
        Partitioning(period, ahead)


def test_an_id_outside_every_range_lands_in_the_default_partition(parted: App) -> None:
    """No insert fails for want of a partition: an occurrence caught up from a range already
    dropped, or ids made while no reconciler made the coming partitions."""
    past = datetime(2001, 1, 1, tzinfo=UTC)
    with schema_tx(parted) as conn:
        sid = insert_at(conn, past)
    assert partition_of(parted, sid) == "scheduled_jobs_default"
    with schema_tx(parted) as conn:
        assert [rows_of(parted, t, [sid]) for t in PARTITIONED] == [1, 1, 1, 1]


def test_a_due_schedule_made_days_ago_is_claimed_reconciled_and_run_from_its_partition(
    parted: App,
) -> None:
    """A schedule made five days ago, its row in that day's partition, due now: the
    scheduler's claim pushes it, the reconciler's window pushes it again once Redis lost it,
    the worker's claim runs it. Seen failing with the scheduler's claim reading today's
    partition alone (the row never pushed)."""
    start = past_partitions(parted, 5)
    sid = id_at(start + timedelta(hours=1))
    with schema_tx(parted) as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at, status, "
                "created_at) VALUES (:id, 'record', '{}', now(), now(), 'scheduled', :made)"
            ),
            {"id": sid, "made": start + timedelta(hours=1)},
        )
        conn.execute(
            text(
                "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version) "
                "VALUES (:id, 'default', 'created', 1)"
            ),
            {"id": sid},
        )
    assert partition_of(parted, sid) == partition_name("scheduled_jobs", start)
    scheduler = Scheduler(parted)
    try:
        assert scheduler.run_once().claimed == 1
    finally:
        scheduler.close()
    Redis.from_url(parted.settings.redis_url).flushdb()  # its job lost
    assert Reconciler(parted).run_once().repushed == 1
    worker = build_worker(parted)
    try:
        worker.work(burst=True)
    finally:
        worker.runtime.close()
    done = parted.get(sid)
    assert done is not None and done.status is Status.SUCCEEDED


def test_partition_maintenance_does_nothing_on_the_plain_schema(app: App) -> None:
    assert create_ahead(app.engine) == []
    assert drop_behind(app.engine, timedelta(0)).dropped == []


def test_an_occurrence_id_is_the_same_for_every_scheduler_and_sorts_by_its_instant() -> None:
    definition = uuid.uuid4()
    at = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    one = stamped(uuid.uuid5(definition, f"v1:{at.isoformat()}"), at)
    assert one == stamped(uuid.uuid5(definition, f"v1:{at.isoformat()}"), at)
    assert time_of(one) == at and one.version == 8
    assert first_id_at(at) <= one < first_id_at(at + timedelta(milliseconds=1))


def test_the_cli_migrates_partitioned_and_shows_the_partitions(
    parted: App, database_url: str, redis_url: str
) -> None:
    schema = parted.engine.get_execution_options()["duejobs_schema"]
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "DUEJOBS_SCHEMA": schema,
        "PYTHONPATH": str(ROOT),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "duejobs", *args], env=env, capture_output=True, text=True
        )

    migrated = cli("migrate", "--partitioned", "--partition-period", "1d")
    assert migrated.returncode == 0, migrated.stderr
    assert "partitioned: periods of 1d, 2 ahead" in migrated.stdout
    shown = json.loads(cli("partitions", "--json").stdout)
    assert shown["partitioned"] and shown["period_seconds"] == 86400
    assert [p["name"] for p in shown["partitions"]][-1] == "scheduled_jobs_default"
    refused = cli("migrate", "--partitioned", "--partition-period", "90m")
    assert refused.returncode == 2 and "--partition-period" in refused.stderr
