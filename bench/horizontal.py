"""Horizontal scale: 1, 2 and 4 scheduler processes, and 1, 2 and 4 worker processes, on the
same database — throughput, and a check that nothing was pushed or run twice or lost.

* schedulers: HZ_ROWS (20,000) rows across 20 tenants made due at once while N `duejobs
  scheduler` processes run; the time until every row is pushed; then Redis must hold exactly
  one queue job per row and the table exactly one `enqueued` event per row;
* workers: HZ_JOBS (3,000) jobs pushed, then N burst duejobs worker processes drain them
  (bare RQ SimpleWorkers beside, same N); every row must end `succeeded` with one attempt.

Each figure is the rate with N processes beside the rate with one; the machine has 2 cores,
so the curve flattens where the cores run out — that is the honest result, not a target.

    python -m bench.horizontal
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from redis import Redis
from sqlalchemy import text

from bench.common import Figure, wait_until
from bench.fairness import _reset
from bench.procs import ROOT, stop_all
from bench.worker_throughput import _bare, _env, _ours
from duejobs import App

ROWS = int(os.environ.get("HZ_ROWS", "20000"))
JOBS = int(os.environ.get("HZ_JOBS", "3000"))
COUNTS = (1, 2, 4)


def _schedulers(app: App, database_url: str, redis_url: str, n: int) -> float:
    _reset(app, redis_url)
    env = {**os.environ, **_env(database_url, redis_url), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "duejobs", "scheduler", "--log-level", "warning"]
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT) for _ in range(n)]
    try:
        time.sleep(2.0)  # all up and polling
        with app.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
                    "SELECT gen_random_uuid(), 't' || (g % 20), 'noop', '{}', now(), now() "
                    "FROM generate_series(1, :n) g"
                ),
                {"n": ROWS},
            )
            conn.execute(text("ANALYZE scheduled_jobs"))  # as on a table in use
        started = time.perf_counter()
        query = text(
            "SELECT count(*) FROM scheduled_jobs "
            "WHERE status = 'scheduled' AND queue_job_id IS NULL"
        )

        def pushed() -> bool:
            with app.engine.connect() as conn:
                return bool(conn.execute(query).scalar_one() == 0)

        wait_until(pushed, 300, "pushing every row", every=0.05)
        elapsed = time.perf_counter() - started
    finally:
        stop_all(procs)
    redis = Redis.from_url(redis_url)
    queued = redis.llen(app.deliverer().queue.key)
    with app.engine.connect() as conn:
        events = conn.execute(
            text("SELECT count(*) FROM scheduled_job_events WHERE kind = 'enqueued'")
        ).scalar_one()
    assert queued == ROWS == events, (queued, events)  # none twice, none lost
    return ROWS / elapsed


def _workers(app: App, database_url: str, redis_url: str, n: int) -> tuple[float, float]:
    env = _env(database_url, redis_url)
    redis = Redis.from_url(redis_url)
    _reset(app, redis_url)
    ours = JOBS / _ours(app, redis, JOBS, n, env)
    with app.engine.connect() as conn:
        attempts = conn.execute(text("SELECT count(*) FROM scheduled_job_attempts")).scalar_one()
    assert attempts == JOBS, attempts  # every job run once
    bare = JOBS / _bare(redis, JOBS, n, env)
    return ours, bare


def run(database_url: str, redis_url: str) -> list[Figure]:
    app = App(database_url=database_url, redis_url=redis_url)
    figures = []
    try:
        one = None
        for n in COUNTS:
            rate = _schedulers(app, database_url, redis_url, n)
            one = one or rate
            figures.append(
                Figure(  # duplicates and losses are asserted in _schedulers
                    f"scale: {n} scheduler process(es), rows/s (1 beside)",
                    rate,
                    one,
                    "rows/s",
                    ">= 1.0x one scheduler, none twice or lost",
                    rate >= one,
                )
            )
        for n in COUNTS:
            ours, bare = _workers(app, database_url, redis_url, n)
            figures.append(
                Figure(  # every job once is asserted in _workers
                    f"scale: {n} worker process(es), jobs/s (bare RQ, same count, beside)",
                    ours,
                    bare,
                    "jobs/s",
                    ">= 0.7x bare RQ, every job once",
                    ours >= 0.7 * bare,
                )
            )
    finally:
        _reset(app, redis_url)
        app.close()
    return figures


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
