"""Partitioned mode (``duejobs migrate --partitioned``): the layout, live keys across
partitions, partitions made ahead and dropped behind, and the plans on every partition.

Each test runs on a schema of its own, migrated in partitioned mode with daily partitions.
The rest of the suite runs on partitioned mode too with ``DUEJOBS_TEST_PARTITIONED=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql
from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from duejobs import App, ScheduleRequest, store
from duejobs.errors import PartitioningError
from duejobs.ids import first_id_at, stamped, time_of
from duejobs.scheduler.loop import claim_due
from duejobs.services import partition_maintenance
from duejobs.services.partition_maintenance import convert, create_ahead, drop_behind
from duejobs.services.pruner import PruneConfig, Pruner
from duejobs.services.reconciler import Reconciler
from duejobs.store.partitions import PARTITIONED, Partitioning, partition_name
from duejobs.store.queries import in_schema
from tests.support import sample, wait_for
from tests.support.apps import register
from tests.support.plans import full_scans, reads_index
from tests.support.processes import ROOT

DAILY = Partitioning(timedelta(days=1), 2)


@pytest.fixture
def parted(database_url: str, redis_url: str) -> Iterator[App]:
    """An App whose tables, in a schema of their own, are in partitioned mode."""
    schema = f"parted_{secrets.token_hex(4)}"
    app = register(App(database_url=database_url, redis_url=redis_url, schema=schema))
    app.migrate(partitioned=DAILY)
    yield app
    with _tx(app) as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    app.close()


@contextlib.contextmanager
def _tx(app: App) -> Iterator[Connection]:
    """A transaction on the App's tables: its schema first on the search path."""
    with app.engine.begin() as conn:
        schema = app.engine.get_execution_options().get("duejobs_schema", "public")
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": schema})
        yield conn


def _now(app: App) -> datetime:
    with _tx(app) as conn:
        return store.database_now(conn)


def id_at(at: datetime) -> uuid.UUID:
    """A version 7 id stamped ``at``, as one made then."""
    return uuid.UUID(int=first_id_at(at).int | 0x7 << 76 | secrets.randbits(76) & ~(0xF << 76))


def _insert(
    conn: Connection,
    at: datetime,
    *,
    status: str = "succeeded",
    finished: datetime | None = None,
    key: str | None = None,
) -> uuid.UUID:
    """A schedule made ``at``, with an event, an attempt, a result and an effect."""
    sid = id_at(at)
    conn.execute(
        text(
            "INSERT INTO scheduled_jobs (id, type, key, payload, run_at, due_at, status, "
            "finished_at, created_at, lease_expires_at) VALUES (:id, 'record', :key, '{}', :at, "
            ":at, :status, :finished, :at, CASE WHEN :status = 'running' THEN :at END)"
        ),
        {"id": sid, "key": key, "at": at, "status": status, "finished": finished},
    )
    conn.execute(
        text(
            "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, at) "
            "VALUES (:id, 'default', 'created', 1, :at)"
        ),
        {"id": sid, "at": at},
    )
    conn.execute(
        text(
            "INSERT INTO scheduled_job_attempts (schedule_id, tenant, version, attempt, status) "
            "VALUES (:id, 'default', 1, 1, 'succeeded')"
        ),
        {"id": sid},
    )
    conn.execute(
        text("INSERT INTO scheduled_job_results (schedule_id, tenant) VALUES (:id, 'default')"),
        {"id": sid},
    )
    conn.execute(
        text(
            "INSERT INTO scheduled_job_effects (effect_key, schedule_id, tenant, version) "
            "VALUES (:key, :id, 'default', 1)"
        ),
        {"key": f"effect-{sid}", "id": sid},
    )
    return sid


def _rows(app: App, table: str, ids: list[uuid.UUID]) -> int:
    column = "id" if table == "scheduled_jobs" else "schedule_id"
    with _tx(app) as conn:
        return int(
            conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE {column} = ANY(:ids)"), {"ids": ids}
            ).scalar_one()
        )


def _partition_of(app: App, sid: uuid.UUID) -> str:
    with _tx(app) as conn:
        return str(
            conn.execute(
                text("SELECT tableoid::regclass::text FROM scheduled_jobs WHERE id = :id"),
                {"id": sid},
            ).scalar_one()
        ).split(".")[-1]


def _past_partitions(app: App, days_ago: int) -> datetime:
    """The partitions of ``days_ago`` days ago and of the two days after; its first instant."""
    with _tx(app) as conn:
        start = DAILY.start_of(store.database_now(conn) - timedelta(days=days_ago))
        store.ensure_ahead(conn, DAILY, start)
    return start


def test_migrate_partitioned_partitions_every_growing_table_with_all_its_indexes(
    parted: App,
) -> None:
    """Seen failing with the live-key index left out of the partitions."""
    schema = parted.engine.get_execution_options()["duejobs_schema"]
    with _tx(parted) as conn:

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


@pytest.fixture
def plain(database_url: str, redis_url: str) -> Iterator[App]:
    """An App whose tables, in a schema of their own, are plain."""
    schema = f"plain_{secrets.token_hex(4)}"
    app = register(App(database_url=database_url, redis_url=redis_url, schema=schema))
    app.migrate()
    yield app
    with app.engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema}_partitioning CASCADE"))
    app.close()


def _live_keys(app: App) -> set[tuple[str, str, uuid.UUID]]:
    with _tx(app) as conn:
        return set(
            conn.execute(
                text(
                    "SELECT tenant, key, id FROM scheduled_jobs "
                    "WHERE key IS NOT NULL AND status IN ('scheduled', 'running')"
                )
            ).all()
        )


def test_the_swap_gives_up_a_busy_lock_before_postgresqls_deadlock_check(plain: App) -> None:
    """A writer's transaction open on a source table when the swap comes: the swap's attempt
    gives up well within PostgreSQL's 1 s deadlock_timeout (it waits 200 ms per lock), so a
    writer it blocks is never the one the deadlock check ends; the next attempt, once the
    writer is done, succeeds. The bound asserted is 1.5 s, not 1 s, so that a loaded
    machine's scheduling does not fail it: the defect took 2 s. Seen failing when the source
    tables were locked under the conversion's 2 s timeout (the lock helper reset the swap's):
    the first attempt gave up after 2.0 s, and a loaded test run saw a writer ended by the
    deadlock check."""
    schema = plain.engine.get_execution_options()["duejobs_schema"]
    plain.schedule("record", {}, delay=60)
    holder = plain.engine.connect()
    stamps: dict[str, float] = {}

    def report(line: str) -> None:
        if line.startswith("scheduled_job_results: copied"):  # the last copy: the swap is next
            holder.execute(text(f"LOCK TABLE {schema}.scheduled_job_events IN ROW EXCLUSIVE MODE"))
            stamps["locked"] = time.monotonic()
        elif "busy (attempt 1)" in line:
            stamps["gave up"] = time.monotonic()
            holder.rollback()  # the writer's transaction ends: the next attempt goes through

    try:
        convert(plain.engine, DAILY, batch_size=100, report=report)
    finally:
        holder.rollback()
        holder.close()
    assert stamps["gave up"] - stamps["locked"] < 1.5, stamps
    with _tx(plain) as conn:
        assert store.partitioning(conn) == DAILY


def test_a_filled_schema_moves_to_partitioned_mode_while_it_is_written(plain: App) -> None:
    """The rows copied in batches while another thread schedules, reschedules and cancels:
    afterwards every schedule is there at the version and status its last change left, with
    every event of its history, and the live keys are those of the live schedules, and no
    write failed. Seen failing with the mirroring triggers left out (changes made during the
    copy were lost), and, on a loaded machine, with a write ended by PostgreSQL's deadlock
    check while the swap waited 2 s for each lock."""
    made = plain.schedule_many(
        [ScheduleRequest("record", {"n": n}, delay=3600, key=f"k{n}") for n in range(1500)]
    )
    expected = {sid: ("scheduled", 1, 1) for sid in made}  # status, version, events
    done = threading.Event()
    during: list[int] = []
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            write()
        except BaseException as exc:  # a user's write refused while the schema moved
            failed.append(exc)

    def write() -> None:
        n = 0
        while not done.is_set():
            n += 1
            s = plain.schedule("record", {}, delay=3600, key=f"w{n}")
            expected[s.id] = ("scheduled", 1, 1)
            old = made[n % len(made)]
            status, version, events = expected[old]
            if status == "scheduled" and n % 2:
                plain.reschedule(old, delay=7200)
                expected[old] = (status, version + 1, events + 1)
            elif status == "scheduled":
                plain.cancel(old)
                expected[old] = ("cancelled", version + 1, events + 1)
            done.wait(0.005)

    racer = threading.Thread(target=writer)
    racer.start()
    try:
        copied = convert(
            plain.engine, DAILY, batch_size=100, report=lambda line: during.append(len(expected))
        )
    finally:
        done.set()
        racer.join(30)
    assert failed == [], failed
    assert copied >= 1500
    assert during[-1] > during[0], "the writer made no change while the rows were copied"
    with _tx(plain) as conn:
        assert store.partitioning(conn) == DAILY
        rows = {
            r.id: (r.status, r.version, r.events)
            for r in conn.execute(
                text(
                    "SELECT s.id, s.status, s.version, "
                    "(SELECT count(*) FROM scheduled_job_events e WHERE e.schedule_id = s.id) "
                    "AS events FROM scheduled_jobs s"
                )
            )
        }
        held = set(conn.execute(text("SELECT tenant, key, schedule_id FROM scheduled_job_keys")))
    assert rows == expected
    assert held == _live_keys(plain)
    again = plain.schedule("record", {}, delay=60, key="k1")
    assert not again.created or expected[made[1]][0] == "cancelled"


def _converted_in_batches_of_50(app: App) -> dict[str, int]:
    """Convert ``app``'s schema 50 rows a batch; each table's batches, as reported."""
    said: list[str] = []
    convert(app.engine, DAILY, batch_size=50, report=said.append)
    found = re.findall(r"^(\w+): copied .* in (\d+) batches", "\n".join(said), re.M)
    return {table: int(n) for table, n in found}


def _rescheduled_once(app: App, n: int) -> list[uuid.UUID]:
    """``n`` schedules, each rescheduled once: two events each."""
    ids = app.schedule_many([ScheduleRequest("record", {}, delay=3600) for _ in range(n)])
    for made in ids:
        app.reschedule(made, delay=7200)
    return ids


def test_the_conversion_copies_each_table_in_whole_batches(plain: App) -> None:
    """200 schedules, each rescheduled once (400 events, keyed by schedule and id), copied
    50 rows a batch: every table in about rows / 50 batches. Seen failing when the copy
    resumed from its batch's last key sorted descending on the key's last column only: the
    events advanced by one schedule a batch (201 batches)."""
    _rescheduled_once(plain, 200)
    batches = _converted_in_batches_of_50(plain)
    assert batches["scheduled_jobs"] <= 200 // 50 + 1, batches
    assert batches["scheduled_job_events"] <= 400 // 50 + 1, batches


def test_the_copy_stops_at_the_rows_there_when_the_mirror_began(
    plain: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer adds a schedule (and its events) before each batch of the copy: the copy
    stops at the last key there was when the mirror began — what came later the mirror wrote
    already — so each table takes rows / 50 batches and every schedule ends up converted.
    Seen failing when the copy read on until a batch came back empty: it chased the writer
    down the table, one small batch per write (20 batches of schedules for 4 of rows), and a
    writer that never paused would have kept it copying for good."""
    ids = _rescheduled_once(plain, 200)
    copy_batch = store.copy_batch
    written: list[uuid.UUID] = []

    def writing_between_batches(*args: Any) -> Any:
        if len(written) < 20:
            written.append(plain.schedule("record", {}, delay=3600).id)
        return copy_batch(*args)

    monkeypatch.setattr(store, "copy_batch", writing_between_batches)
    batches = _converted_in_batches_of_50(plain)
    assert batches["scheduled_jobs"] <= 200 // 50 + 1, batches
    assert batches["scheduled_job_events"] <= 400 // 50 + 1, batches
    assert len(written) > 10, written  # writes came during the copy of every table
    assert _rows(plain, "scheduled_jobs", [*ids, *written]) == 200 + len(written)


@contextlib.contextmanager
def _autovacuum_every_second(app: App) -> Iterator[None]:
    """The server's autovacuum launcher waking every second (it wakes every minute by
    default), for the time of a test; needs a superuser."""
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.execute(
            text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        ).scalar():
            pytest.skip("setting autovacuum_naptime needs a superuser")
        conn.execute(text("ALTER SYSTEM SET autovacuum_naptime = '1s'"))
        conn.execute(text("SELECT pg_reload_conf()"))
        try:
            yield
        finally:
            conn.execute(text("ALTER SYSTEM RESET autovacuum_naptime"))
            conn.execute(text("SELECT pg_reload_conf()"))


@pytest.mark.serial
def test_a_conversion_gets_past_an_autovacuum_holding_its_tables(
    plain: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An autovacuum worker crawls through ``scheduled_jobs`` (its cost limit set to the
    least, so it runs for a minute) as the conversion comes: the brief lock wait gives up, the
    next attempt first waits past PostgreSQL's deadlock check in a mode no write conflicts
    with, which ends the autovacuum, and the conversion goes through within three attempts.
    Seen failing when every attempt waited 100 ms: autovacuum yields only to a lock request
    that waited ``deadlock_timeout``, so each attempt gave up while it ran. Serial: it changes
    the server's autovacuum interval; about 12 s (waiting for the launcher to start the
    worker, and the worker's first pages)."""
    schema = plain.engine.get_execution_options()["duejobs_schema"]
    plain.schedule_many([ScheduleRequest("record", {}, delay=3600) for _ in range(5000)])
    with _tx(plain) as conn:
        conn.execute(text(f"UPDATE {schema}.scheduled_jobs SET updated_at = now()"))
        conn.execute(
            text(
                f"ALTER TABLE {schema}.scheduled_jobs SET (autovacuum_vacuum_threshold = 0, "
                "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_cost_delay = 100, "
                "autovacuum_vacuum_cost_limit = 1, autovacuum_enabled = true)"
            )
        )
    monkeypatch.setattr(partition_maintenance, "SWAP_ATTEMPTS", 3)
    said: list[str] = []
    with _autovacuum_every_second(plain):

        def vacuuming() -> bool:
            with _tx(plain) as conn:
                return "scheduled_jobs" in store.autovacuumed(conn)

        wait_for(vacuuming, 60, "an autovacuum worker on the schedules")
        convert(plain.engine, DAILY, batch_size=1000, report=said.append)
    assert any("autovacuum holds scheduled_jobs" in line for line in said), said
    with _tx(plain) as conn:
        assert store.partitioning(conn) == DAILY


def test_one_conversion_at_a_time_and_no_abort_while_one_runs(plain: App) -> None:
    """While a conversion copies, a second conversion and ``partitions --abort`` are refused
    with an error naming the running one, and the first goes through. Seen failing with the
    advisory lock not taken: the abort removed the running conversion's triggers and
    staging schema under it."""
    plain.schedule("record", {}, delay=60)
    refused: list[str] = []

    def report(line: str) -> None:
        if "mirrored" in line:  # under way: its triggers in place, the copy next
            for attempt in (
                lambda: convert(plain.engine, DAILY),
                lambda: partition_maintenance.abort_conversion(plain.engine),
            ):
                with pytest.raises(PartitioningError, match="is running") as error:
                    attempt()
                refused.append(str(error.value))

    convert(plain.engine, DAILY, batch_size=100, report=report)
    assert len(refused) == 2, refused
    with _tx(plain) as conn:
        assert store.partitioning(conn) == DAILY


_KILLED_CONVERSION = """
import os, signal, sys
from datetime import timedelta
from duejobs import App
from duejobs.services.partition_maintenance import convert
from duejobs.store.partitions import Partitioning

app = App(sys.argv[1], sys.argv[2], schema=sys.argv[3])

def report(line):
    if "mirrored" in line:  # the triggers are in place: killed, as by the OOM killer
        os.kill(os.getpid(), signal.SIGKILL)

convert(app.engine, Partitioning(timedelta(days=1), 2), report=report)
"""


def _left_behind(app: App) -> bool:
    schema = app.engine.get_execution_options()["duejobs_schema"]
    with _tx(app) as conn:
        return store.conversion_left(conn, store.staging_schema(schema))


def test_a_conversion_killed_midway_is_removed_by_partitions_abort(
    plain: App, database_url: str, redis_url: str
) -> None:
    """Seen failing before ``--abort`` existed (no such option: the triggers stayed)."""
    schema = plain.engine.get_execution_options()["duejobs_schema"]
    made = plain.schedule("record", {}, delay=3600)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_CONVERSION, database_url, redis_url, schema],
        timeout=120,
    )
    assert killed.returncode == -9 and _left_behind(plain)
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_SCHEMA": schema}
    aborted = subprocess.run(
        [sys.executable, "-m", "duejobs", "partitions", "--abort"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert aborted.returncode == 0, aborted.stderr
    assert "removed a stopped conversion" in aborted.stdout
    assert not _left_behind(plain)
    assert plain.get(made.id) is not None  # the source tables as they were
    plain.migrate(partitioned=DAILY)  # and a conversion starts over
    with _tx(plain) as conn:
        assert store.partitioning(conn) == DAILY


def test_a_failed_conversion_removes_its_triggers_while_a_writer_holds_a_table(
    plain: App,
) -> None:
    """A conversion fails after its mirror is in place while a writer's transaction is open
    on a source table: its cleanup waits briefly for the tables, tries again once the writer
    is done, removes the triggers and the staging schema, and the conversion's own error is
    what the caller gets. Seen failing when the cleanup dropped the triggers table by table
    under a 2 s lock wait: a lock timeout replaced the error and the triggers stayed (every
    write still paying for a mirror)."""
    schema = plain.engine.get_execution_options()["duejobs_schema"]
    plain.schedule("record", {}, delay=60)
    holder = plain.engine.connect()

    def report(line: str) -> None:
        if line.startswith("scheduled_jobs: copied"):
            holder.execute(text(f"LOCK TABLE {schema}.scheduled_job_events IN ROW EXCLUSIVE MODE"))
            raise RuntimeError("stopped midway")
        if line.startswith("unmirror: the tables are busy"):
            holder.rollback()  # the writer's transaction ends: the next attempt goes through

    try:
        with pytest.raises(RuntimeError, match="stopped midway"):
            convert(plain.engine, DAILY, batch_size=100, report=report)
    finally:
        holder.rollback()
        holder.close()
    assert not _left_behind(plain)


def test_migrate_partitioned_on_a_filled_schema_converts_it(plain: App) -> None:
    first = plain.schedule("record", {}, delay=60, key="k")
    plain.migrate(partitioned=DAILY)
    with _tx(plain) as conn:
        assert store.partitioning(conn) == DAILY
    assert plain.get(first.id).key == "k"
    assert not plain.schedule("record", {}, delay=60, key="k").created


@pytest.mark.parametrize("filled", [True, False], ids=["converted online", "empty tables"])
def test_owners_and_grants_are_carried_over_to_the_partitioned_tables(
    plain: App, filled: bool
) -> None:
    """Tables owned by one role and granted to another (with grant option, to PUBLIC, on a
    column): once partitioned — online, or at once when empty — each has the same owner and
    grants, its partitions its owner, and the granted role goes on scheduling with keys,
    cancelling and reading the partition settings. Seen failing without the rights carried
    over (the rights differ), without them on empty tables, and with the settings table left
    without grants (permission denied)."""
    schema = plain.engine.get_execution_options()["duejobs_schema"]
    role, owner = (f"duejobs_{kind}_{secrets.token_hex(4)}" for kind in ("app", "owner"))
    tables = ", ".join(f"{schema}.{t}" for t in PARTITIONED)

    def rights() -> set[tuple[object, ...]]:
        with plain.engine.connect() as conn:
            return set(
                conn.execute(
                    text(
                        "SELECT c.relname, pg_get_userbyid(c.relowner), "
                        "CAST(c.relacl AS text), CAST(a.attacl AS text) "
                        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "LEFT JOIN pg_attribute a ON a.attrelid = c.oid "
                        "AND a.attacl IS NOT NULL WHERE n.nspname = :s AND c.relname = ANY(:t)"
                    ),
                    {"s": schema, "t": list(PARTITIONED)},
                ).all()
            )

    with plain.engine.begin() as conn:
        for name in (role, owner):
            conn.execute(text(f"CREATE ROLE {name} NOLOGIN"))
        conn.execute(text(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}, {owner}"))
        conn.execute(
            text(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        )
        conn.execute(text(f"GRANT DELETE ON {tables} TO {role} WITH GRANT OPTION"))
        conn.execute(text(f"GRANT SELECT ON {schema}.scheduled_job_events TO PUBLIC"))
        conn.execute(text(f"GRANT UPDATE (payload) ON {schema}.scheduled_jobs TO PUBLIC"))
        for table in PARTITIONED:
            conn.execute(text(f"ALTER TABLE {schema}.{table} OWNER TO {owner}"))
    try:
        if filled:
            plain.schedule("record", {}, delay=60, key="before")
        before = rights()
        if filled:
            convert(plain.engine, DAILY)
        else:
            plain.migrate(partitioned=DAILY)
        assert rights() == before
        with plain.engine.connect() as conn:
            partition_owners = set(
                conn.execute(
                    text(
                        "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_inherits i "
                        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = "
                        "CAST(:t AS regclass)"
                    ),
                    {"t": f"{schema}.scheduled_job_events"},
                ).scalars()
            )
        assert partition_owners == {owner}
        with plain.engine.begin() as conn:
            conn.execute(text(f"SET LOCAL ROLE {role}"))
            made = plain.schedule("record", {}, delay=60, key="granted", conn=conn)
            assert not plain.schedule("record", {}, delay=60, key="granted", conn=conn).created
            assert plain.cancel(made.id, conn=conn)
            assert store.partitioning(store.lent(conn, schema=schema)) == DAILY
    finally:
        with plain.engine.begin() as conn:
            for table in PARTITIONED:  # the schema is dropped by the fixture's own role
                conn.execute(text(f"ALTER TABLE {schema}.{table} OWNER TO CURRENT_USER"))
            for name in (role, owner):
                conn.execute(text(f"DROP OWNED BY {name}"))
                conn.execute(text(f"DROP ROLE {name}"))


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


def test_a_key_held_by_a_live_schedule_in_an_older_partition_is_not_taken_again(
    parted: App,
) -> None:
    """Seen failing with the key triggers left out: a second live schedule held the key."""
    start = _past_partitions(parted, 3)
    with _tx(parted) as conn:
        old = _insert(conn, start + timedelta(hours=1), status="scheduled", key="order-1")
    again = parted.schedule("record", {}, delay=60, key="order-1")
    assert (again.id, again.created) == (old, False)
    assert _partition_of(parted, old) != _partition_of(
        parted, parted.schedule("record", {}, delay=60).id
    )


def test_two_transactions_scheduling_one_key_make_one_live_schedule(parted: App) -> None:
    """The second waits on the first's key, then sees the schedule it committed meanwhile.
    Seen failing with the holder's check left out: the second took the key over."""
    results: list[object] = []
    with _tx(parted) as first:
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
    with _tx(parted) as first:
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
    assert _live_keys(parted) == {("default", "k", mine)}


def test_a_race_for_a_key_lost_inside_the_callers_transaction_leaves_it_usable(
    parted: App,
) -> None:
    """Seen failing with the keyed insert run without its savepoint: the caller's
    transaction was aborted by the key's error."""
    results: list[tuple[object, uuid.UUID]] = []

    def race() -> None:
        with _tx(parted) as second:
            theirs = parted.schedule("record", {}, delay=60, key="k", conn=second)
            results.append((theirs, parted.schedule("record", {}, delay=60, conn=second).id))

    with _tx(parted) as first:
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
    with _tx(app) as conn:
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
    with _tx(app) as conn:
        config.attributes["connection"] = conn
        config.attributes["version_table_schema"] = schema
        getattr(command, action)(config, revision)


def test_revision_0009_moves_the_key_trigger_after_the_insert_and_back(parted: App) -> None:
    """A partitioned schema made before 0009 skipped a held key in its BEFORE trigger; after
    the upgrade the trigger runs after the insert and keys still hold; a downgrade puts the
    BEFORE trigger back, which 0008's statements (plain ``ON CONFLICT DO NOTHING``) need.
    Seen failing with the revision's upgrade left empty."""
    jobs = partition_name("scheduled_jobs", DAILY.start_of(_now(parted)))
    _alembic(parted, "downgrade", "0008")
    assert jobs in _before_insert_row_triggers(parted)
    held = parted.schedule("record", {}, delay=60, key="k").id
    with _tx(parted) as conn:  # as revision 0008 inserted it: the trigger skips the row
        skipped = conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, type, key, payload, run_at, due_at) "
                "VALUES (:id, 'record', 'k', '{}', now(), now()) ON CONFLICT DO NOTHING"
            ),
            {"id": id_at(_now(parted))},
        )
        assert skipped.rowcount == 0
    _alembic(parted, "upgrade", "head")
    assert _before_insert_row_triggers(parted) == []
    again = parted.schedule("record", {}, delay=60, key="k")
    assert (again.id, again.created) == (held, False)
    assert _live_keys(parted) == {("default", "k", held)}


def test_a_finished_schedule_frees_its_key_and_a_retry_under_a_held_key_fails(
    parted: App,
) -> None:
    """Seen failing with the update trigger removed: the cancelled schedule kept its key."""
    first = parted.schedule("record", {}, delay=60, key="k")
    parted.cancel(first.id)
    second = parted.schedule("record", {}, delay=60, key="k")
    assert second.created and second.id != first.id
    # what App.retry checks first, done behind its back
    with pytest.raises(IntegrityError, match="scheduled_jobs_live_key_idx"), _tx(parted) as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET status = 'scheduled' WHERE id = :id"),
            {"id": first.id},
        )
    parted.cancel(second.id)
    assert parted.retry(first.id).status.value == "scheduled"
    with _tx(parted) as conn:
        held = conn.execute(text("SELECT key, schedule_id FROM scheduled_job_keys")).all()
    assert held == [("k", first.id)]


def test_a_range_is_dropped_whole_only_once_nothing_in_it_is_live_or_recent(
    parted: App,
) -> None:
    """Seen failing with the live check left out (the live range went too) and with the
    finish horizon left out (the recent range went too)."""
    start = _past_partitions(parted, 12)
    now = _now(parted)
    long_ago = now - timedelta(days=8)
    with _tx(parted) as conn:
        gone = [_insert(conn, start + timedelta(hours=h), finished=long_ago) for h in (1, 2)]
        live = [_insert(conn, start + timedelta(days=1, hours=1), status="scheduled")]
        recent = [_insert(conn, start + timedelta(days=2, hours=1), finished=now)]
    result = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert (result.partitions_dropped, result.schedules_dropped) == (1, 2)
    assert [_rows(parted, t, gone) for t in PARTITIONED] == [0, 0, 0, 0]
    assert _rows(parted, "scheduled_job_effects", gone) == 0
    for kept in (live, recent):
        assert [_rows(parted, t, kept) for t in PARTITIONED] == [1, 1, 1, 1]
    with _tx(parted) as conn:
        names = {p.name for p in store.partitions(conn)}
    assert partition_name("scheduled_jobs", start) not in names
    assert partition_name("scheduled_jobs", start + timedelta(days=1)) in names


def test_prune_says_how_many_ranges_and_schedules_it_dropped(
    parted: App, database_url: str, redis_url: str
) -> None:
    """Seen failing before the ranges were reported (only the batches' rows were)."""
    start = _past_partitions(parted, 12)
    with _tx(parted) as conn:
        for h in (1, 2, 3):
            _insert(conn, start + timedelta(hours=h), finished=_now(parted) - timedelta(days=8))
    schema = parted.engine.get_execution_options()["duejobs_schema"]
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "DUEJOBS_SCHEMA": schema,
    }
    done = subprocess.run(
        [sys.executable, "-m", "duejobs", "prune", "--older-than", "7d"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    start = _past_partitions(parted, 8)  # ranges of 8, 7 and 6 days ago
    now = _now(parted)
    with _tx(parted) as conn:
        held = [_insert(conn, start + timedelta(hours=1), finished=start + timedelta(hours=2))]
        live = _insert(conn, start + timedelta(hours=3), status="scheduled")
        waits = start + timedelta(days=1)
        early = _insert(conn, waits + timedelta(hours=1), finished=waits + timedelta(hours=2))
        late = _insert(conn, waits + timedelta(hours=3), finished=now - timedelta(days=3))
    result = Pruner(parted, PruneConfig(older_than=timedelta(days=6))).run_once()
    assert (result.partitions_dropped, result.deleted) == (0, 1)
    assert [_rows(parted, t, held) for t in PARTITIONED] == [0, 0, 0, 0]
    assert [_rows(parted, t, [early, late]) for t in PARTITIONED] == [2, 2, 2, 2]
    later = Pruner(parted, PruneConfig(older_than=timedelta(days=2))).run_once()
    assert (later.partitions_dropped, later.deleted) == (2, 0)  # the empty one of 6 days ago
    assert [_rows(parted, t, [early, late]) for t in PARTITIONED] == [0, 0, 0, 0]
    assert _rows(parted, "scheduled_jobs", [live]) == 1


def test_a_drop_checks_again_under_the_lock(parted: App) -> None:
    """A retry between the look and the drop keeps the range. Seen failing with the check
    under the lock left out."""
    start = _past_partitions(parted, 12)
    with _tx(parted) as conn:
        long_ago = store.database_now(conn) - timedelta(days=9)
        sid = _insert(conn, start + timedelta(hours=1), status="failed", finished=long_ago)
        [looked] = [p for p in store.partitions(conn) if p.start == start]
    assert not looked.live
    parted.retry(sid)  # live again
    with _tx(parted) as conn:
        assert not store.drop_partition(conn, looked, timedelta(days=7))
    assert _rows(parted, "scheduled_jobs", [sid]) == 1


def test_an_id_outside_every_range_lands_in_the_default_partition(parted: App) -> None:
    """No insert fails for want of a partition: an occurrence caught up from a range already
    dropped, or ids made while no reconciler made the coming partitions."""
    past = datetime(2001, 1, 1, tzinfo=UTC)
    with _tx(parted) as conn:
        sid = _insert(conn, past)
    assert _partition_of(parted, sid) == "scheduled_jobs_default"
    with _tx(parted) as conn:
        assert [_rows(parted, t, [sid]) for t in PARTITIONED] == [1, 1, 1, 1]


def test_the_reconciler_makes_the_coming_partitions(parted: App) -> None:
    """Seen failing with the reconciler's call left out."""
    last = DAILY.start_of(_now(parted)) + 2 * DAILY.period
    with _tx(parted) as conn:
        for table in reversed(PARTITIONED):
            conn.execute(text(f"DROP TABLE {partition_name(table, last)}"))
    assert Reconciler(parted).run_once().partitions_created == 1
    ahead = sample("duejobs_partitions_ready_ahead_seconds")
    assert 2 * 86400 < ahead <= 3 * 86400
    assert create_ahead(parted.engine) == []
    with _tx(parted) as conn:
        assert last in {p.start for p in store.partitions(conn)}


def test_a_coming_range_is_made_even_when_the_default_partition_holds_rows_of_it(
    parted: App,
) -> None:
    """Schedules made while their period had no partition (no reconciler ran for longer than
    the partitions ahead) wait in the default partition; making the period's partition moves
    them in, key and history with them. Seen failing without the move: PostgreSQL refused the
    new range, and every pass after it."""
    last = DAILY.start_of(_now(parted)) + 2 * DAILY.period
    with _tx(parted) as conn:
        for table in reversed(PARTITIONED):
            conn.execute(text(f"DROP TABLE {partition_name(table, last)}"))
        stray = _insert(conn, last + timedelta(hours=1), status="scheduled", key="stray")
    assert _partition_of(parted, stray) == "scheduled_jobs_default"
    assert create_ahead(parted.engine) == [partition_name("scheduled_jobs", last)]
    assert _partition_of(parted, stray) == partition_name("scheduled_jobs", last)
    assert [_rows(parted, t, [stray]) for t in PARTITIONED] == [1, 1, 1, 1]
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
    start = _past_partitions(parted, 8)  # the first ended less than a period before the horizon
    long_ago = _now(parted) - timedelta(days=9)
    with _tx(parted) as conn:
        old = [_insert(conn, start + timedelta(hours=h), finished=long_ago) for h in (1, 2)]
        kept_by_live = start + timedelta(days=1)
        _insert(conn, kept_by_live, status="scheduled")
        rest = [_insert(conn, kept_by_live + timedelta(hours=1), finished=long_ago)]
    with _tx(parted) as reader:
        reader.execute(text("SELECT count(*) FROM scheduled_job_results"))  # holds its lock
        result = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert (result.partitions_dropped, result.deleted) == (0, 3)
    assert _rows(parted, "scheduled_jobs", [*old, *rest]) == 0
    again = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert again.partitions_dropped == 1


def test_a_range_kept_from_its_drop_a_period_past_its_end_goes_to_the_batches(
    parted: App,
) -> None:
    """A schedule retried again and again (or run long after it was made) keeps its range from
    being dropped; its other finished rows then go in batches once the horizon is a period
    past the range's end, not never. Seen failing with no such bound (they stayed)."""
    start = _past_partitions(parted, 12)
    now = _now(parted)
    with _tx(parted) as conn:
        early = _insert(conn, start + timedelta(hours=1), finished=start + timedelta(hours=2))
        retried = _insert(conn, start + timedelta(hours=3), finished=now - timedelta(hours=1))
    result = Pruner(parted, PruneConfig(older_than=timedelta(days=7))).run_once()
    assert result.deleted == 1 and _rows(parted, "scheduled_jobs", [early]) == 0
    assert _rows(parted, "scheduled_jobs", [retried]) == 1


def test_a_schema_too_long_for_its_staging_schema_is_refused_before_anything_is_touched() -> None:
    """A 63-byte schema's staging name would be cut back to the schema's own."""
    assert store.staging_schema("s" * 50) == "s" * 50 + "_partitioning"
    with pytest.raises(PartitioningError, match="too long to be moved to partitioned mode"):
        store.staging_schema("s" * 51)


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


def _rows_at(conn: Connection, n: int, start: datetime, step: timedelta) -> None:
    """``n`` rows waiting to be pushed for tenants t0..t9, due (and made) from ``start`` on,
    one every ``step``, in the partition of their instant."""
    conn.execute(
        text(
            "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
            "SELECT CAST(lpad(to_hex(CAST(extract(epoch FROM t) * 1000 AS bigint)), 12, '0') "
            "       || '7' || substr(md5(g::text || :start), 1, 19) AS uuid), 't' || (g % 10), "
            "       'x', '{}', t, t "
            "FROM (SELECT g, CAST(:start AS timestamptz) + g * CAST(:step AS interval) AS t "
            "      FROM generate_series(1, :n) g) AS rows"
        ),
        {"n": n, "start": start, "step": step},
    )


WALK = {"window": timedelta(minutes=15), "limit": 1000, "after": "", "front_lane": 2}
SHARES = {
    "window": timedelta(minutes=15),
    "tenants": [f"t{i}" for i in range(10)],
    "shares": [100] * 10,
    "caps": [None] * 10,
}


def test_the_claims_count_of_a_tenants_due_rows_reads_its_own_index_on_a_busy_partition(
    parted: App,
) -> None:
    """20,000 rows due now for ten tenants, all in the current partition: the claim's walk
    counts each tenant's due rows on the per-tenant index, reading about the rows it counts.
    Seen failing (`python -m bench.partitions` at a million rows, 0.85x the plain schema)
    before the claim's transaction turned bitmap scans off and the count took the index's
    order: on that partition the planner read the due_at index and filtered out the other
    tenants' rows (9,000 a tenant at each batch), or read the tenant's rows by bitmap and
    sorted them."""
    with _tx(parted) as conn:
        _rows_at(
            conn, 20_000, store.database_now(conn) - timedelta(minutes=1), timedelta(milliseconds=3)
        )
        conn.execute(text("ANALYZE scheduled_jobs"))
        conn.execute(text(store.QUERIES["claim_plan"].sql))  # as the claim's transaction does
        walk = text("EXPLAIN (ANALYZE) " + store.QUERIES["claim_walk"].sql)
        plan = "\n".join(conn.execute(walk, WALK).scalars())
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    assert sum(removed) < 100, plan
    assert "Bitmap" not in plan and "claim_tenant_idx" in plan, plan


_PARAM = re.compile(r"(?<!:):(\w+)")  # a statement's `:name` (not a `::type` cast)


def _param_names(name: str) -> list[str]:
    """The parameters of the statement ``name``, in the order they first appear."""
    return list(dict.fromkeys(_PARAM.findall(store.QUERIES[name].sql)))


def _generic_plan(conn: Connection, name: str) -> None:
    """Prepare the statement ``name`` as ``generic`` and make its generic plan now, as the
    claim's transaction makes it at the first run on a connection."""
    names = _param_names(name)
    numbered = _PARAM.sub(lambda m: f"${names.index(m[1]) + 1}", store.QUERIES[name].sql)
    conn.exec_driver_sql("PREPARE generic AS " + numbered)
    conn.exec_driver_sql("EXPLAIN EXECUTE generic(" + ", ".join(["NULL"] * len(names)) + ")")


def _run_generic(conn: Connection, name: str, params: dict[str, Any]) -> str:
    """EXPLAIN ANALYZE of the plan :func:`_generic_plan` kept, run with ``params``."""
    types = conn.execute(
        text(
            "SELECT unnest(parameter_types)::text FROM pg_prepared_statements "
            "WHERE name = 'generic'"
        )
    ).scalars()
    driver = conn.connection.driver_connection
    args = ", ".join(
        f"CAST({sql.Literal(params[n]).as_string(driver)} AS {t})"
        for n, t in zip(_param_names(name), types, strict=True)
    )
    explain = f"EXPLAIN (ANALYZE) EXECUTE generic({args})"
    plan = "\n".join(row[0] for row in conn.exec_driver_sql(explain))
    conn.exec_driver_sql("DEALLOCATE generic")
    return plan


@pytest.mark.parametrize(("name", "params"), [("claim_walk", WALK), ("claim_shares", SHARES)])
def test_the_claims_kept_plan_reads_indexes_as_a_partition_planned_empty_fills(
    parted: App, name: str, params: dict[str, Any]
) -> None:
    """The claim runs the plan made at its first run on a connection until PostgreSQL makes
    it again (an ANALYZE), not one made for each batch. Planned while the current partition
    was empty and analyzed, then run after 20,000 rows due in an hour and 1,000 due now came
    in: every partition is still read by its index. Seen failing with sequential scans
    allowed: the walk's test for any due row read the partition's 20,000 later rows."""
    with _tx(parted) as conn:
        conn.execute(text("ANALYZE scheduled_jobs"))
        conn.execute(text(store.QUERIES["claim_plan"].sql))
        _generic_plan(conn, name)
        now = store.database_now(conn)
        _rows_at(conn, 20_000, now + timedelta(hours=1), timedelta(milliseconds=1))
        _rows_at(conn, 1_000, now - timedelta(minutes=1), timedelta(milliseconds=1))
        plan = _run_generic(conn, name, params)
    assert "Seq Scan" not in plan and "Bitmap" not in plan, plan
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    assert sum(removed) < 100, plan
    assert "claim_tenant_idx" in plan, plan


def test_the_claim_plans_its_two_statements_once_per_connection(parted: App) -> None:
    """Three claims on one connection: the walk and the share claim are prepared at their
    first run and run their generic plan every time, no plan made per batch (over nine
    partitions, planning the walk took 8 ms against 1.4 ms to run it). Seen failing with
    the statements left to the driver's own preparing (none prepared after three runs) and
    without the claim's plan_cache_mode (custom plans)."""
    schema = parted.engine.get_execution_options()["duejobs_schema"]
    with _tx(parted) as conn:
        _rows_at(
            conn, 3_000, store.database_now(conn) - timedelta(minutes=1), timedelta(milliseconds=1)
        )
    with parted.engine.connect() as conn:
        for _ in range(3):
            assert len(claim_due(conn, timedelta(minutes=15), 1000).rows) == 1000
            conn.commit()
        plans = {
            name: conn.execute(
                text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE starts_with(statement, :head)"
                ),
                {"head": in_schema(schema)[name].driver_sql.split("%")[0]},
            ).all()
            for name in ("claim_walk", "claim_shares")
        }
    assert plans == {"claim_walk": [(3, 0)], "claim_shares": [(3, 0)]}


@pytest.mark.slow
def test_every_hot_query_reads_indexes_on_every_partition(parted: App) -> None:
    """Half a million schedules over thirty daily partitions, most finished, a few due: the
    claim, the reconciler's scans, the rescue, the worker's claim and finish and the figures
    read the indexes of each partition, never a partition's rows one by one."""
    start = _past_partitions(parted, 30)
    with _tx(parted) as conn:
        for days in range(3, 30, 3):
            store.ensure_ahead(conn, DAILY, start + timedelta(days=days))
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at, status, "
                "finished_at, lease_expires_at, queue_job_id) "
                "SELECT CAST(lpad(to_hex(CAST(extract(epoch FROM t) * 1000 AS bigint)), 12, '0') "
                "       || '7' || substr(md5(g::text), 1, 19) AS uuid), 't' || (g % 50), 'x', "
                "       '{}', t, t, s, CASE WHEN s = 'succeeded' THEN t END, "
                "       CASE WHEN s = 'running' THEN t END, "
                "       CASE WHEN s = 'scheduled' AND g % 2 = 0 THEN 'job' || g END "
                "FROM (SELECT g, CAST(:start AS timestamptz) + g * interval '5 s' AS t, "
                "      CASE WHEN g % 1000 = 0 THEN 'scheduled' WHEN g % 5000 = 1 THEN 'running' "
                "           ELSE 'succeeded' END AS s "
                "      FROM generate_series(1, 500000) g) AS rows"
            ),
            {"start": start},
        )
        conn.execute(text(f"ANALYZE {', '.join(PARTITIONED)}"))

        def explain(name: str, **params: object) -> str:
            statement = text("EXPLAIN " + store.QUERIES[name].sql)
            return "\n".join(conn.execute(statement, params).scalars())

        some = [id_at(start + timedelta(days=d)) for d in (1, 5, 9)]
        plans = {
            "claim": (
                explain(
                    "claim_shares",
                    window=timedelta(minutes=15),
                    tenants=["t1"],
                    shares=[1000],
                    caps=[None],
                ),
                "scheduled_jobs_claim_tenant_idx",
            ),
            "reconcile": (
                explain(
                    "window_page",
                    window=timedelta(minutes=15),
                    after_due=datetime.min.replace(tzinfo=UTC),
                    after_id=uuid.UUID(int=0),
                    limit=1000,
                ),
                "scheduled_jobs_due_idx",
            ),
            "rescue": (explain("rescue_expired", limit=1000), "scheduled_jobs_lease_idx"),
            "states": (explain("schedule_states", ids=some), "scheduled_jobs_pkey"),
            "worker's claim": (
                explain(
                    "claim_runs",
                    ids=some,
                    tenants=["t1"] * 3,
                    versions=[1] * 3,
                    attempts=[1] * 3,
                    worker="w",
                    lease=timedelta(seconds=20),
                    types=["record"],
                    claim="c",
                    synchronous_commit="off",
                ),
                "scheduled_jobs_pkey",
            ),
            "worker's finish": (
                explain(
                    "finish",
                    ids=some,
                    versions=[1] * 3,
                    attempts=[1] * 3,
                    statuses=["succeeded"] * 3,
                    events=["succeeded"] * 3,
                    errors=[None] * 3,
                    retry_ins=[None] * 3,
                    synchronous_commit="off",
                ),
                "scheduled_jobs_pkey",
            ),
            "stats": (
                explain("live_figures", late=timedelta(minutes=1), tenant=None),
                "scheduled_jobs_due_idx",
            ),
            "prune within a span": (
                explain(
                    "prune_finished_within",
                    age=timedelta(days=1),
                    limit=1000,
                    low=first_id_at(start + timedelta(days=12)),
                    high=first_id_at(start + timedelta(days=15)),
                ),
                "scheduled_jobs_finished_idx",
            ),
            "keyed insert": (
                explain(
                    "insert_schedule",
                    id=id_at(start + timedelta(days=30)),
                    tenant="t1",
                    type="x",
                    key="k",
                    payload="{}",
                    run_at=None,
                    delay=timedelta(minutes=1),
                    jitter_offset=timedelta(0),
                    expires_after=None,
                    max_attempts=None,
                    timezone=None,
                    local_run_at=None,
                    queue="duejobs",
                    trace_context=None,
                ),
                "scheduled_jobs_live_key_idx",
            ),
        }
    for name, (plan, index) in plans.items():
        assert full_scans(plan, tables="scheduled_job") == [], (name, plan)
        assert reads_index(plan, index), (name, index, plan)
    outside = partition_name("scheduled_jobs", start + timedelta(days=3))
    span_plan = plans["prune within a span"][0].splitlines()
    span_reads = [line for line in span_plan if "finished" in line]
    assert span_reads and not [line for line in span_reads if outside in line], span_reads
