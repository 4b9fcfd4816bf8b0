"""duejobs behind a real PgBouncer in transaction mode, as teams deploy it: every service
connects, nothing duejobs sets reaches another client of the pooler, and no prepared statement
breaks a claim or an attempt; with prepared statements asked off, none is made.

PgBouncer here has one server connection for the session's database, so every client shares
it: whatever one client left on it, the next one reads.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import make_url, text

from duejobs import App, ScheduleRequest, store
from duejobs.config import libpq_url
from duejobs.errors import ConfigurationError, PartitioningError
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services import partition_maintenance
from duejobs.store.migrate import upgrade
from duejobs.worker import Runtime, Worker, WorkerConfig
from tests.support.apps import register
from tests.support.cli import run_cli
from tests.support.pgbouncer import PgBouncer, start_pgbouncer
from tests.support.servers import Servers

# What a statement of duejobs' sets, and what another client must never read from it.
SETTINGS = (
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "synchronous_commit",
    "statement_timeout",
    "TimeZone",
    "jit",
    "plan_cache_mode",
    "enable_seqscan",
    "enable_sort",
    "enable_bitmapscan",
    "search_path",
)


@pytest.fixture
def bouncer(servers: Servers, database_url: str) -> Iterator[PgBouncer]:
    with start_pgbouncer(servers.server_url, pool_size=1) as running:
        yield running


@pytest.fixture
def pooled(bouncer: PgBouncer, servers: Servers, redis_url: str, app: App) -> Iterator[App]:
    """An App on the session's tables (emptied by ``app``) through the pooler."""
    through = App(bouncer.url_for(servers.database), redis_url)
    register(through)
    yield through
    through.close()


def _probe(url: str) -> dict[str, str]:
    """Each setting as a client of the pooler reads it: another application, say."""
    with psycopg.connect(url, prepare_threshold=None, autocommit=True) as conn:
        values = {
            name: conn.execute(f"SELECT current_setting('{name}')").fetchone()[0]
            for name in SETTINGS
        }
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        values["prepared statements"] = str(prepared)
        temporary = "SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()"
        values["temporary tables"] = str(conn.execute(temporary).fetchone()[0])
    return values


def _drain(app: App, scheduled: list[uuid.UUID], concurrency: int = 4) -> None:
    """Scheduler passes and a worker's bursts through ``app`` until every schedule is done."""
    scheduler = Scheduler(app, SchedulerConfig(poll_interval=timedelta(milliseconds=50)))
    runtime = Runtime(app, WorkerConfig(concurrency=concurrency, heartbeat=timedelta(seconds=1)))
    try:
        for _ in range(40):
            scheduler.run_once()
            Worker(runtime).work(burst=True)
            if all(app.get(i).status.value == "succeeded" for i in scheduled):  # type: ignore[union-attr]
                return
        pytest.fail("the schedules did not all run through the pooler")
    finally:
        runtime.close()


def _runs_per_attempt(app: App) -> dict[tuple[uuid.UUID, int], int]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT schedule_id, attempt, count(*) AS n FROM test_runs GROUP BY 1, 2")
        )
        return {(r.schedule_id, r.attempt): r.n for r in rows}


def test_every_service_works_through_pgbouncer_in_transaction_mode(
    pooled: App, bouncer: PgBouncer, servers: Servers, redis_client: object
) -> None:
    upgrade(pooled.engine)  # `duejobs migrate` through the pooler: already at head, no error
    ids = [pooled.schedule("traced", {"n": n}, delay=timedelta(0)).id for n in range(40)]
    _drain(pooled, ids)
    runs = _runs_per_attempt(pooled)
    assert sorted(runs) == sorted((i, 1) for i in ids)  # each ran once, on its first attempt
    assert set(runs.values()) == {1}


def test_nothing_duejobs_sets_is_read_by_another_client_of_the_pooler(
    pooled: App, bouncer: PgBouncer, servers: Servers, redis_client: object
) -> None:
    url = bouncer.url_for(servers.database)
    before = _probe(libpq_url(servers.database_url))  # the server's own defaults
    before["prepared statements"] = before["temporary tables"] = "0"
    ids = [pooled.schedule("traced", {"n": n}, delay=timedelta(0)).id for n in range(30)]
    _drain(pooled, ids)
    # Bookkeeping with a lock limit, a claim with its plan settings, figures bounded by a
    # statement timeout, keyed schedules staged in bulk: each through the one server
    # connection the probe reads next.
    pooled.list(limit=10)
    keyed = [ScheduleRequest("record", {}, delay=3600, key=f"k{n}") for n in range(3)]
    pooled.schedule_many(keyed)
    assert _probe(url) == before


def test_a_pooler_is_told_apart_from_postgresql_itself(
    bouncer: PgBouncer, servers: Servers, database_url: str
) -> None:
    with psycopg.connect(bouncer.url_for(servers.database), prepare_threshold=None) as conn:
        assert store.behind_pooler(conn)
    with psycopg.connect(libpq_url(database_url)) as conn:
        assert not store.behind_pooler(conn)


def test_behind_a_pooler_prepared_statements_are_off_and_said_so_once(
    pooled: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "duejobs.store")
    with pooled.engine.connect() as one, pooled.engine.connect() as two:
        for conn in (one, two):
            assert conn.connection.driver_connection.prepare_threshold is None  # type: ignore[union-attr]
    said = [r for r in caplog.records if "connection pooler" in r.getMessage()]
    assert len(said) == 1
    assert "secret-pw" not in said[0].getMessage()


def test_prepared_statements_on_behind_a_pooler_is_said_on_every_connection(
    bouncer: PgBouncer, servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "duejobs.store")
    on = App(bouncer.url_for(servers.database), prepared_statements="on")
    try:
        with on.engine.connect(), on.engine.connect():  # two connections made
            pass
    finally:
        on.close()
    said = [r for r in caplog.records if "reached a connection pooler" in r.getMessage()]
    assert len(said) == 2 and all(r.levelno == logging.WARNING for r in said)
    assert "secret-pw" not in said[0].getMessage()


def _prepared_after_claims(app: App) -> int:
    """Statements prepared on one connection after ten claims on it."""
    with app.engine.connect() as conn:
        for _ in range(10):
            with conn.begin():
                store.walk_pairs(
                    conn, timedelta(minutes=15), timedelta(seconds=1), 100, ("", ""), 2
                )
        return int(conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one())


def test_prepared_statements_off_prepares_nothing(database_url: str, app: App) -> None:
    off = App(database_url, prepared_statements="off")
    try:
        assert _prepared_after_claims(off) == 0
    finally:
        off.close()
    assert _prepared_after_claims(app) > 0  # on a direct connection, by default: the claim's


def test_prepare_threshold_none_in_the_url_turns_preparing_off(database_url: str, app: App) -> None:
    url = make_url(database_url).update_query_dict({"prepare_threshold": "None"})
    off = App(url.render_as_string(hide_password=False))
    try:
        assert off.schedule("record", {}, delay=timedelta(hours=1)).status.value == "scheduled"
        assert _prepared_after_claims(off) == 0
    finally:
        off.close()


@pytest.mark.parametrize("read", [False, True], ids=["database-url", "read-database-url"])
def test_a_prepare_threshold_that_is_not_a_count_is_refused_as_the_app_is_made(
    database_url: str, read: bool
) -> None:
    """Seen failing once engines were made on first use: the App was made, and the refusal
    came with its first query."""
    bad = make_url(database_url).update_query_dict({"prepare_threshold": "often"})
    bad_url = bad.render_as_string(hide_password=False)
    with pytest.raises(ConfigurationError, match=r"prepare_threshold .* got 'often'"):
        if read:
            App(database_url, read_database_url=bad_url)
        else:
            App(bad_url)


@pytest.mark.parametrize("value", ["sometimes", "", 1])
def test_a_bad_prepared_statements_value_is_refused_naming_it(
    database_url: str, value: object
) -> None:
    with pytest.raises(ConfigurationError, match="prepared_statements"):
        App(database_url, prepared_statements=value)  # type: ignore[arg-type]


def test_a_bad_prepared_statements_variable_is_refused_naming_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUEJOBS_PREPARED_STATEMENTS", "maybe")
    with pytest.raises(ConfigurationError, match="DUEJOBS_PREPARED_STATEMENTS"):
        App(database_url)


def test_the_online_conversion_is_refused_through_a_pooler(pooled: App) -> None:
    # It holds a session lock across its transactions, which the pooler may hand on.
    with pytest.raises(PartitioningError, match="reaches PostgreSQL itself"):
        partition_maintenance.abort_conversion(pooled.engine)


def test_the_cli_takes_prepared_statements_for_every_command(
    database_url: str, redis_url: str, app: App
) -> None:
    schedule = ("schedule", "remind", "--in", "30m", "--json")
    urls = {
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "DUEJOBS_PREPARED_STATEMENTS": "maybe",
    }
    refused = run_cli(*schedule, **urls)
    assert refused.returncode != 0 and "DUEJOBS_PREPARED_STATEMENTS" in refused.stderr
    given = run_cli("--prepared-statements", "off", *schedule, **urls)  # the flag decides
    assert given.returncode == 0, given.stderr
    bad = run_cli("--prepared-statements", "sometimes", *schedule, **urls)
    assert bad.returncode == 2 and "--prepared-statements" in bad.stderr
