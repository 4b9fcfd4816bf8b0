"""Partitioned mode as its tests reach it: schemas of their own (``parted`` in partitioned
mode with daily partitions, ``plain`` to be converted), a transaction on them, rows written
at any instant, and where they landed."""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Connection, text

from duejobs import App, store
from duejobs.ids import first_id_at
from duejobs.store.partitions import Partitioning
from tests.support.apps import register

DAILY = Partitioning(timedelta(days=1), 2)


@pytest.fixture
def parted(database_url: str, redis_url: str) -> Iterator[App]:
    """An App whose tables, in a schema of their own, are in partitioned mode."""
    schema = f"parted_{secrets.token_hex(4)}"
    app = register(App(database_url=database_url, redis_url=redis_url, schema=schema))
    app.migrate(partitioned=DAILY)
    yield app
    with schema_tx(app) as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    app.close()


@contextlib.contextmanager
def schema_tx(app: App) -> Iterator[Connection]:
    """A transaction on the App's tables: its schema first on the search path."""
    with app.engine.begin() as conn:
        schema = app.engine.get_execution_options().get("duejobs_schema", "public")
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": schema})
        yield conn


def db_now(app: App) -> datetime:
    with schema_tx(app) as conn:
        return store.database_now(conn)


def id_at(at: datetime) -> uuid.UUID:
    """A version 7 id stamped ``at``, as one made then."""
    return uuid.UUID(int=first_id_at(at).int | 0x7 << 76 | secrets.randbits(76) & ~(0xF << 76))


def insert_at(
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


def rows_of(app: App, table: str, ids: list[uuid.UUID]) -> int:
    column = "id" if table == "scheduled_jobs" else "schedule_id"
    with schema_tx(app) as conn:
        return int(
            conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE {column} = ANY(:ids)"), {"ids": ids}
            ).scalar_one()
        )


def partition_of(app: App, sid: uuid.UUID) -> str:
    with schema_tx(app) as conn:
        return str(
            conn.execute(
                text("SELECT tableoid::regclass::text FROM scheduled_jobs WHERE id = :id"),
                {"id": sid},
            ).scalar_one()
        ).split(".")[-1]


def past_partitions(app: App, days_ago: int) -> datetime:
    """The partitions of ``days_ago`` days ago and of the two days after; its first instant."""
    with schema_tx(app) as conn:
        start = DAILY.start_of(store.database_now(conn) - timedelta(days=days_ago))
        store.ensure_ahead(conn, DAILY, start)
    return start


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


def live_keys(app: App) -> set[tuple[str, str, uuid.UUID]]:
    with schema_tx(app) as conn:
        return set(
            conn.execute(
                text(
                    "SELECT tenant, key, id FROM scheduled_jobs "
                    "WHERE key IS NOT NULL AND status IN ('scheduled', 'running')"
                )
            ).all()
        )
