"""The slots of an in-process worker as their tests drive them, and what they read back."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer
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


@dataclass
class GatedJob:
    """One job whose handler waits for ``go``, run by a worker of two slots that works in a
    thread of its own."""

    system: System
    worker: Worker
    go: threading.Event
    schedule_id: uuid.UUID

    def finished_in_rq(self) -> bool:
        """Whether RQ has the job finished."""
        schedule = self.system.app.get(self.schedule_id)
        assert schedule is not None and schedule.queue_job_id is not None
        job = Job.fetch(
            schedule.queue_job_id, connection=self.system.redis, serializer=JSONSerializer
        )
        return job.get_status() == "finished"


@contextmanager
def gated_job(
    system: System, prepare: Callable[[Worker], None] = lambda worker: None
) -> Iterator[GatedJob]:
    """A :class:`GatedJob` (``prepare`` sees its worker before it starts); at the end its
    handler is let go and its worker stopped, within 30 s."""
    go = threading.Event()
    system.app.handler("gated")(lambda ctx, payload: go.wait(30))
    schedule = system.app.schedule("gated", {}, delay=0)
    system.scheduler.run_once()
    runtime = Runtime(system.app, WorkerConfig(concurrency=2))
    worker = Worker(runtime)
    prepare(worker)
    working = threading.Thread(target=worker.work, daemon=True)
    working.start()
    try:
        yield GatedJob(system, worker, go, schedule.id)
    finally:
        go.set()
        worker.stop()
        working.join(30)
        runtime.close()
    assert not working.is_alive()
