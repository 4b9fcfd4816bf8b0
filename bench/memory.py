"""Resident memory of the scheduler and the workers after 1,000 jobs and after MEM_JOBS.

One scheduler and two worker processes run the whole time. 1,000 jobs are made due and
drained; each process's RSS is read; then MEM_JOBS - 1,000 more (99,000 by default) are made
due (spread over MEM_SPREAD seconds, so the window holds them while they drain) and drained;
RSS is read again. Target: RSS after MEM_JOBS <= 1.2x RSS after 1,000, for every process —
memory follows the batch, not the work done or the table.

    python -m bench.memory          # MEM_JOBS=100000 takes about 6 minutes here
"""

from __future__ import annotations

import os

import psutil
from sqlalchemy import text

from bench.common import Figure, wait_until
from bench.fairness import _reset, _start
from bench.procs import stop_all
from duejobs import App

JOBS = int(os.environ.get("MEM_JOBS", "100000"))
SPREAD = float(os.environ.get("MEM_SPREAD", "60"))
WARM = 1_000


def _add(app: App, n: int, spread: float) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
                "SELECT gen_random_uuid(), 't' || (g % 20), 'noop', '{}', t, t FROM ("
                "  SELECT g, now() + make_interval(secs => :spread * g / :n) AS t "
                "  FROM generate_series(1, :n) g) AS d"
            ),
            {"n": n, "spread": spread},
        )


def _drained(app: App, total: int, timeout: float) -> None:
    query = text("SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")

    def done() -> bool:
        with app.engine.connect() as conn:
            return bool(conn.execute(query).scalar_one() >= total)

    wait_until(done, timeout, f"draining {total:,} jobs", every=1.0)


def _rss(pids: list[int]) -> list[float]:
    return [psutil.Process(pid).memory_info().rss / 2**20 for pid in pids]


def run(database_url: str, redis_url: str) -> list[Figure]:
    app = App(database_url=database_url, redis_url=redis_url)
    _reset(app, redis_url)
    procs = _start(database_url, redis_url)
    try:
        _add(app, WARM, 1.0)
        _drained(app, WARM, 120)
        warm = _rss([p.pid for p in procs])
        _add(app, JOBS - WARM, SPREAD)
        _drained(app, JOBS, 60 + JOBS / 50)
        after = _rss([p.pid for p in procs])
    finally:
        stop_all(procs)
        _reset(app, redis_url)
        app.close()
    names = ["scheduler", "worker 1", "worker 2"]
    return [
        Figure(
            f"memory: {name} RSS after {JOBS:,} jobs (after {WARM:,} beside)",
            later,
            first,
            "MiB",
            "<= 1.2x",
            later <= 1.2 * first,
        )
        for name, first, later in zip(names, warm, after, strict=True)
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
