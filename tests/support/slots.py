"""The slots of an in-process worker as their tests drive them, and what they read back."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import text

from duejobs import App
from duejobs.worker import Runtime, Worker, WorkerConfig
from tests.support.system import System


@pytest.fixture
def slots(system: System) -> Iterator[Callable[[int], None]]:
    """Drain the queue with an in-process worker of N slots (the worker's loop, this thread)."""
    runtimes: list[Runtime] = []

    def work(n: int) -> None:
        runtime = Runtime(
            system.app, WorkerConfig(heartbeat=timedelta(milliseconds=200), concurrency=n)
        )
        runtimes.append(runtime)
        Worker(runtime).work(burst=True)

    yield work
    for runtime in runtimes:
        runtime.close()


def count_rows(app: App, sql: str, **params: object) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def attempts_of(app: App, schedule_id: uuid.UUID) -> list[tuple[int, str, str | None]]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT attempt, status, error FROM scheduled_job_attempts "
                "WHERE schedule_id = :id ORDER BY attempt"
            ),
            {"id": schedule_id},
        ).all()
    return [(r.attempt, r.status, r.error) for r in rows]


def blocked_on_redis(system: System) -> bool:
    database = str(system.redis.connection_pool.connection_kwargs.get("db", 0))
    return any(
        c.get("cmd") in ("blmove", "blpop") and c.get("db") == database
        for c in system.redis.client_list()
    )
