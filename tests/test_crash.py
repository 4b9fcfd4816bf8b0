"""Servers that go away under a worker: a PostgreSQL crash right after workers acknowledged
their outcomes to RQ, and Redis down while a worker is between two jobs.

The crash is an immediate shutdown of a PostgreSQL of the test's own (SIGQUIT to the
postmaster: no checkpoint, shared memory with its WAL buffers gone; the next start replays
only what reached the disk). The WAL writer is slowed to its 10 s maximum so that the window
a crash can hit is as wide as PostgreSQL allows, as on a busy server.

Seen failing against a build broken on purpose: ``durable_bookkeeping`` ignored (the worker's
commits always ``synchronous_commit = off``)
→ ``test_outcomes_committed_with_durable_bookkeeping_survive_a_postgresql_crash``; RQ's own
heartbeat (which ends the worker when Redis cannot be reached)
→ ``test_a_worker_whose_redis_goes_away_between_two_jobs_keeps_working``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from bench.chaos import Servers
from duejobs import App, Status
from duejobs.scheduler.loop import Scheduler
from duejobs.services.reconciler import Reconciler
from duejobs.worker import Context, Runtime, Worker, WorkerConfig
from tests.support.apps import EFFECTS_TABLE, register

# Starts, pauses, kills or restarts servers of its own on free ports: run on its own
# (`pytest -m serial`), never beside another test process.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    own = Servers(tmp_path_factory.mktemp("crash"))
    try:
        with psycopg.connect(own.database_url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(EFFECTS_TABLE)
        yield own
    finally:
        own.stop()


def _note(ctx: Context, payload: Any) -> None:
    """A handler with no write of its own: its outcome is the worker's bookkeeping alone."""


def _app(servers: Servers) -> App:
    app = register(App(database_url=servers.database_url, redis_url=servers.redis_url))
    app.handler("note")(_note)
    return app


def _config(durable: bool) -> WorkerConfig:
    return WorkerConfig(
        durable_bookkeeping=durable,
        lease=timedelta(seconds=2),
        heartbeat=timedelta(milliseconds=500),
    )


def _work(app: App, durable: bool) -> None:
    runtime = Runtime(app, _config(durable))
    try:
        Worker(runtime).work(burst=True)
    finally:
        runtime.close()


def _acknowledged_then_crash(servers: Servers, durable: bool, types: list[str]) -> list[uuid.UUID]:
    """Schedules run to an outcome RQ has been told of; then PostgreSQL crashes."""
    app = _app(servers)
    try:
        ids = [app.schedule(t, {}, delay=0).id for t in types]
        assert Scheduler(app).run_once().queued == len(ids)
        _work(app, durable)
        for s in ids:
            job_id = app.get(s).queue_job_id  # type: ignore[union-attr]
            job = Job.fetch(job_id, connection=app.deliverer().redis, serializer=JSONSerializer)
            assert job.get_status() == "finished"  # acknowledged
    finally:
        app.close()
    servers.crash_postgres()
    return ids


def _states(app: App, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[Status, int]]:
    states = {}
    for s in ids:
        stored = app.get(s)
        assert stored is not None  # the App's own commits are durable
        states[s] = (stored.status, stored.attempts)
    return states


def test_outcomes_committed_with_durable_bookkeeping_survive_a_postgresql_crash(
    servers: Servers,
) -> None:
    ids = _acknowledged_then_crash(servers, durable=True, types=["note"] * 20)
    app = _app(servers)
    try:
        assert set(_states(app, ids).values()) == {(Status.SUCCEEDED, 1)}  # none to run again
    finally:
        app.close()


def test_outcomes_a_crash_loses_run_again_and_fenced_effects_stay_once(
    servers: Servers,
) -> None:
    ids = _acknowledged_then_crash(servers, durable=False, types=["record"] * 10 + ["note"] * 10)
    fenced, loose = ids[:10], ids[10:]
    app = _app(servers)
    try:
        after_crash = _states(app, ids)
        # The fence commits durably: its `succeeded` and its effect survive together.
        assert {after_crash[s] for s in fenced} == {(Status.SUCCEEDED, 1)}
        lost = [s for s in loose if after_crash[s][0] is not Status.SUCCEEDED]
        assert lost, "the crash lost no commit: it proved nothing"
        scheduler, reconciler = Scheduler(app), Reconciler(app)
        deadline = timedelta(seconds=60)
        started = app.now()
        while any(app.get(s).status is not Status.SUCCEEDED for s in lost):  # type: ignore[union-attr]
            assert app.now() - started < deadline, _states(app, lost)
            reconciler.run_once()
            scheduler.run_once()
            _work(app, durable=False)
        with app.engine.connect() as conn:
            effects = dict(
                conn.exec_driver_sql(
                    "SELECT schedule_id, count(*) FROM test_effects GROUP BY schedule_id"
                ).all()
            )
        assert {effects.get(s) for s in fenced} == {1}
        assert {effects.get(s) for s in loose} == {None}
    finally:
        app.close()


def test_a_worker_whose_redis_goes_away_between_two_jobs_keeps_working(
    servers: Servers,
) -> None:
    app = _app(servers)
    runtime = Runtime(app, _config(durable=True))
    try:
        worker = Worker(runtime)
        worker.wire.register()
        servers.stop_redis()
        try:  # the worker's beat between two jobs: let go, not raised
            assert worker.waits.call("a beat", worker.wire.beat, lambda: True) is None
        finally:
            servers.start_redis()
        s = app.schedule("note", {}, delay=0)
        assert Scheduler(app).run_once().queued == 1
        worker.work(burst=True)
        stored = app.get(s.id)
        assert stored is not None and stored.status is Status.SUCCEEDED
    finally:
        runtime.close()
        app.close()
