"""The schema: seed columns, constraints, indexes, and `duejobs migrate` under concurrency."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import redis
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from duejobs import App, ScheduleRequest, store
from duejobs.config import libpq_url, sqlalchemy_url
from duejobs.core import make_engine
from duejobs.errors import ConfigurationError, SchemaMissingError
from duejobs.scheduler.claim import FRONT_LANE
from duejobs.scheduler.loop import Scheduler
from duejobs.services.reconciler import Reconciler
from duejobs.services.stats import collect
from duejobs.store.migrate import current_revision, head_revision, upgrade
from duejobs.store.queries import PARTITIONED_MODE_TABLES
from duejobs.worker import Runtime, Worker, WorkerConfig
from tests.support.apps import EFFECTS_TABLE, register
from tests.support.plans import full_scans, reads_index
from tests.support.servers import PARTITIONED, Servers

PLAIN_TABLES = [t for t in store.TABLES if t not in PARTITIONED_MODE_TABLES]


@pytest.fixture
def fresh_database(servers: Servers) -> Iterator[str]:
    name = f"duejobs_fresh_{uuid.uuid4().hex[:8]}"
    url = servers.create_database(name)
    yield url
    servers.drop_database(name)


def _cli(*args: str, database_url: str, redis_url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    return subprocess.Popen(
        [sys.executable, "-m", "duejobs", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_scheduled_jobs_keeps_every_seed_column(engine: Engine) -> None:
    with engine.connect() as conn:
        columns = dict(
            conn.execute(
                text(
                    "SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'scheduled_jobs'"
                )
            ).all()
        )
    assert columns["id"] == "uuid"
    assert columns["type"] == "text"
    assert columns["payload"] == "jsonb"
    assert columns["run_at"] == "timestamp with time zone"
    assert columns["status"] == "text"
    assert columns["queue_job_id"] == "text"
    assert columns["version"] == "integer"
    assert columns["created_at"] == "timestamp with time zone"
    for added in ("tenant", "timezone", "local_run_at", "key", "attempts", "updated_at"):
        assert added in columns
    for added in ("last_error", "started_at", "finished_at"):
        assert added in columns


def test_status_outside_the_five_states_is_refused_by_the_database(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    with (
        pytest.raises(IntegrityError, match="scheduled_jobs_status_check"),
        app.engine.begin() as c,
    ):
        c.execute(
            text("UPDATE scheduled_jobs SET status = 'enqueued' WHERE id = :id"), {"id": s.id}
        )


def test_effect_keys_are_unique(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    insert = text(
        "INSERT INTO scheduled_job_effects (effect_key, schedule_id, tenant, version) "
        "VALUES (:k, :id, 'default', 1)"
    )
    with app.engine.begin() as conn:
        conn.execute(insert, {"k": f"x:{s.id}:1", "id": s.id})
    with pytest.raises(IntegrityError), app.engine.begin() as conn:
        conn.execute(insert, {"k": f"x:{s.id}:1", "id": s.id})


def test_the_claim_compiles_no_statement_and_leaves_jit_to_the_session(app: App) -> None:
    """JIT off for the claim's transaction: over a partitioned table its estimated cost passes
    jit_above_cost, and compiling it took as long as running it (docs/benchmarks.md). For
    that transaction alone: a pooled server session's next client keeps the server's JIT."""
    with app.engine.connect() as conn:
        with conn.begin():
            store.walk_pairs(
                conn, timedelta(minutes=15), timedelta(seconds=1), 100, ("", ""), FRONT_LANE
            )
            assert conn.execute(text("SHOW jit")).scalar_one() == "off"
        assert conn.execute(text("SHOW jit")).scalar_one() == "on"


def test_migrate_is_idempotent(fresh_database: str) -> None:
    engine = make_engine(sqlalchemy_url(fresh_database))
    try:
        assert upgrade(engine) == (None, head_revision())
        assert upgrade(engine) == (head_revision(), head_revision())
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_concurrent_migrate_commands_both_succeed_once(fresh_database: str, redis_url: str) -> None:
    procs = [_cli("migrate", database_url=fresh_database, redis_url=redis_url) for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    messages = sorted(out for out, _ in outputs)
    assert sum("upgraded from nothing" in m for m in messages) == 1
    assert sum("already at revision" in m for m in messages) == 2


def test_migration_table_does_not_collide_with_the_applications_alembic(engine: Engine) -> None:
    with engine.connect() as conn:
        tables = set(
            conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            ).scalars()
        )
    assert "duejobs_alembic_version" in tables
    assert "alembic_version" not in tables


@pytest.mark.skipif(
    PARTITIONED,
    reason="the plain schema's plans (partitioned mode's: tests/test_partition_plans.py)",
)
@pytest.mark.long  # a million rows written first, 17 s: make test-long (test-all)
@pytest.mark.slow
def test_claim_query_uses_the_partial_index_with_a_million_far_future_rows(app: App) -> None:
    with app.engine.connect() as conn:
        trans = conn.begin()
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at, status, priority) "
                "SELECT gen_random_uuid(), 'x', '{}', t, t, "
                "       CASE WHEN g % 2 = 0 THEN 'scheduled' ELSE 'succeeded' END, "
                "       CASE WHEN g % 10 = 0 THEN 5 ELSE 0 END "  # a tenth of them urgent
                "FROM (SELECT g, now() + interval '30 days' + g * interval '1s' AS t "
                "      FROM generate_series(1, 1000000) g) AS far"
            )
        )
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at) "
                "SELECT gen_random_uuid(), 'x', '{}', t, t "
                "FROM (SELECT now() - g * interval '1s' AS t FROM generate_series(1, 2000) g) AS d"
            )
        )
        conn.execute(text("ANALYZE scheduled_jobs"))

        def explain(statement: str, **params: object) -> str:
            return "\n".join(conn.execute(text("EXPLAIN " + statement), params).scalars())

        walk = explain(
            store.QUERIES["claim_walk"].sql,
            window=timedelta(minutes=15),
            horizon=timedelta(seconds=1),
            limit=1000,
            after_tenant="",
            after_queue="",
            front_lane=FRONT_LANE,
        )
        claim = explain(
            store.QUERIES["claim_shares"].sql,
            tenants=["default"],
            queues=["duejobs"],
            shares=[1000],
            caps=[None],
            aheads=[timedelta(minutes=15)],
        )
        unlimited = store.NO_LIMITS.params()
        others = {
            "stats": explain(
                store.QUERIES["live_figures"].sql,
                late=timedelta(minutes=1),
                tenant=None,
                **unlimited,
            ),
            "stats of one tenant": explain(
                store.QUERIES["live_figures"].sql,
                late=timedelta(minutes=1),
                tenant="default",
                **unlimited,
            ),
            "reconcile": explain(
                store.QUERIES["window_page"].sql,
                window=timedelta(minutes=15),
                after_due=datetime.min.replace(tzinfo=UTC),
                after_id=uuid.UUID(int=0),
                limit=1000,
            ),
            "rescue": explain(store.QUERIES["rescue_expired"].sql, limit=1000),
        }
        trans.rollback()
    for name, other in others.items():
        assert full_scans(other) == [], (name, other)
    # The walk over (tenant, queue) pairs: probes of the pairs' claim index, nothing sequential.
    assert reads_index(walk, "scheduled_jobs_claim_queue_idx") and "Seq Scan" not in walk, walk
    # The claim: the pairs' partial index, read in due_at order, bounded by due_at and the
    # LIMIT — what is read follows the due rows, never the table.
    assert re.search(
        r"Limit .*\n(?:.*\n)*?\s*->\s+LockRows .*\n\s*->\s+Index Scan using "
        r"scheduled_jobs(?:_default)?_claim_queue_idx .*\n\s*Index Cond: .*due_at",
        claim,
    ), claim
    assert full_scans(claim) == [], claim
    # Its urgent rows first, from their own index, bounded by due_at the same way: 100,000
    # urgent rows due next month are never read. Seen failing without that index.
    assert re.search(
        r"Index Scan using scheduled_jobs(?:_default)?_claim_urgent_idx .*\n"
        r"\s*Index Cond: .*due_at",
        claim,
    ), claim


def test_every_part_runs_with_its_tables_in_a_schema_of_its_own(
    fresh_database: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """Seen failing against a build broken on purpose: statements left unqualified (the
    tables are then missing in ``public``), and the caller's connection not told the schema."""
    url = sqlalchemy_url(fresh_database)
    app = register(App(database_url=url, redis_url=redis_url, schema="jobs"))
    plain = make_engine(url)  # an application's own engine: search_path is public
    try:
        assert app.migrate() == (None, head_revision())
        assert app.migrate() == (head_revision(), head_revision())
        with plain.begin() as conn:
            conn.execute(text(EFFECTS_TABLE))
            placed = conn.execute(
                text(
                    "SELECT table_schema, table_name FROM information_schema.tables "
                    "WHERE table_name = ANY(:names)"
                ),
                {"names": [*PLAIN_TABLES, "duejobs_alembic_version"]},
            ).all()
        assert {schema for schema, _ in placed} == {"jobs"}
        assert len(placed) == len(PLAIN_TABLES) + 1

        own = app.schedule("record", {"n": 1}, delay=0, key="k")
        many = app.schedule_many([ScheduleRequest("record", {"n": n}, delay=0) for n in (2, 3)])
        with plain.begin() as conn:  # the caller's transaction, on its own connection
            theirs = app.schedule("record", {"n": 4}, delay=0, conn=conn)
        with psycopg.connect(libpq_url(url)) as raw:
            mine = app.schedule("record", {"n": 5}, delay=0, conn=raw)
        ids = [own.id, *many, theirs.id, mine.id]

        Scheduler(app).run_once()
        runtime = Runtime(app, WorkerConfig())
        Worker(runtime).work(burst=True)
        runtime.close()
        assert [app.get(i).status.value for i in ids] == ["succeeded"] * 5  # type: ignore[union-attr]
        assert Reconciler(app).run_once().fixed == 0
        (default,) = [a for a in collect(app).activity if a.tenant == "default" and not a.type]
        assert default.counts["succeeded"] == 5

        with pytest.raises(SchemaMissingError):
            App(database_url=url, redis_url=redis_url).get(own.id)  # nothing in public
    finally:
        app.close()
        plain.dispose()


def test_a_schema_name_that_would_need_quoting_is_refused(fresh_database: str) -> None:
    for bad in ("Jobs", "jobs-x", "pg_jobs", "1jobs", "x" * 64, ""):
        with pytest.raises(ConfigurationError, match="schema must be a lower-case identifier"):
            App(database_url=fresh_database, schema=bad)


def test_the_cli_follows_duejobs_schema(fresh_database: str, redis_url: str) -> None:
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": fresh_database,
        "DUEJOBS_REDIS_URL": redis_url,
        "DUEJOBS_SCHEMA": "ops",
    }

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "duejobs", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    cli("migrate")
    shown = json.loads(cli("schedule", "mail", "--in", "1h", "--json"))
    app = App(database_url=fresh_database, schema="ops")
    try:
        assert app.get(shown["id"]) is not None
    finally:
        app.close()


def test_events_and_attempts_are_stamped_with_their_statements_time(app: App) -> None:
    """Written late in a transaction, an event and an attempt carry the moment of their own
    statement, not the transaction's start. Seen failing with ``now()``: a claim made late
    in its transaction stamped its ``started`` event 1.5 ms before the ``run_at`` it had
    waited for, on a busy machine."""
    s = app.schedule("record", {}, delay=3600)
    with app.engine.connect() as conn:  # one transaction, rolled back at the end
        began = conn.execute(text("SELECT now()")).scalar_one()
        conn.execute(text("SELECT pg_sleep(0.05)"))
        event = conn.execute(
            text(
                "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail) "
                "VALUES (:id, 'default', 'started', 1, '{}') "
                "RETURNING at, statement_timestamp() AS stamp"
            ),
            {"id": s.id},
        ).one()
        attempt = conn.execute(
            text(
                "INSERT INTO scheduled_job_attempts (schedule_id, tenant, version, attempt, "
                "status, worker) VALUES (:id, 'default', 1, 1, 'running', 'w') "
                "RETURNING started_at AS at, statement_timestamp() AS stamp"
            ),
            {"id": s.id},
        ).one()
        conn.rollback()
    for row in (event, attempt):
        assert row.at == row.stamp and row.at > began, (row, began)


_AUTOVACUUM = {
    "scheduled_jobs": "autovacuum_vacuum_scale_factor=0.02",
    "scheduled_job_events": "autovacuum_vacuum_scale_factor=0.05",
    "scheduled_job_attempts": "autovacuum_vacuum_scale_factor=0.05",
    "scheduled_job_effects": "autovacuum_vacuum_scale_factor=0.05",
}


def test_the_hot_tables_are_vacuumed_at_a_small_share_of_dead_rows(engine: Engine) -> None:
    """Migration 0013's storage settings, on each plain table — in partitioned mode on every
    partition (a partitioned table takes none), those made later included."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT coalesce(parent.relname, c.relname), c.relname, "
                "coalesce(c.reloptions, '{}') FROM pg_class c "
                "LEFT JOIN pg_inherits i ON i.inhrelid = c.oid "
                "LEFT JOIN pg_class parent ON parent.oid = i.inhparent "
                "WHERE c.relkind = 'r' AND c.relnamespace = to_regnamespace(current_schema()) "
                "AND coalesce(parent.relname, c.relname) = ANY(:tables)"
            ),
            {"tables": list(_AUTOVACUUM)},
        ).all()
    assert {table for table, _, _ in rows} == set(_AUTOVACUUM)
    for table, name, options in rows:
        wanted = {
            _AUTOVACUUM[table],
            "autovacuum_vacuum_threshold=1000",
            "autovacuum_vacuum_cost_delay=0",
        }
        assert wanted <= set(options), (name, options)
    attempts = [set(o) for t, _, o in rows if t == "scheduled_job_attempts"]
    assert all("fillfactor=80" in o for o in attempts)
