"""Lag from the intended time to the handler's start at steady load, next to RQ's own
`enqueue_at` measured in the same run.

Steady load: LAG_JOBS jobs (300) at LAG_RATE per second (20/s), at random sub-second
_offsets. duejobs: one scheduler and one worker process; lag = the `started` event's database
time minus `run_at` (so an early start is a negative lag by the database clock). RQ: one
`rq worker --with-scheduler` (SimpleWorker, JSON); lag = the job's own `time.time()` at start
minus its target.

Due now: the same processes, each job scheduled at the moment it is due (``delay=0``, one
every 1/LAG_RATE s, paced by the clock); lag = its start minus its ``run_at`` (the insert's
database time). Beside it, RQ's plain ``enqueue`` of each job at its moment, the start of a
queue that holds the job itself.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
from sqlalchemy import text

from bench.common import TABLES, Figure, percentile, wait_until
from bench.procs import ROOT, stop_all
from duejobs import App
from duejobs.redis_urls import cluster_url

JOBS = int(os.environ.get("LAG_JOBS", "300"))
RATE = float(os.environ.get("LAG_RATE", "20"))
LEAD = 3.0  # seconds before the first job is due, so that everything is running


def _offsets() -> list[float]:
    rng = random.Random(42)
    return [LEAD + i / RATE + rng.random() / RATE for i in range(JOBS)]


def _paced(call: Callable[[], object]) -> None:
    """``call()`` JOBS times, one every 1/RATE s after LEAD s, by the clock."""
    start = time.monotonic() + LEAD
    for i in range(JOBS):
        time.sleep(max(0.0, start + i / RATE - time.monotonic()))
        call()


def duejobs_lags(
    database_url: str,
    redis_url: str,
    due_now: bool = False,
    queues: tuple[str, ...] = (),
    worker_flags: tuple[str, ...] = (),
) -> list[float]:
    """Each job's start lag (seconds) on the Redis of ``redis_url`` (emptied first, unless a
    cluster the caller started); ``queues``: the jobs spread over them in turn, the worker
    serving them all, given ``worker_flags`` too."""
    app = App(database_url=database_url, redis_url=redis_url)
    if cluster_url(redis_url) is None:
        Redis.from_url(redis_url).flushdb()
    with app.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES}"))
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "duejobs"]
    serving = [flag for queue in queues for flag in ("--queue", queue)]
    worker = [*cmd, "worker", "--app", "bench.jobs:app", *worker_flags, *serving]
    procs = [
        subprocess.Popen([*cmd, "scheduler", "--log-level", "warning"], env=env, cwd=ROOT),
        subprocess.Popen([*worker, "--log-level", "warning"], env=env, cwd=ROOT),
    ]
    placed = (lambda n: {"queue": queues[n % len(queues)]}) if queues else (lambda n: {})
    try:
        if due_now:
            _paced(lambda: app.schedule("noop", {}, delay=0))
        else:
            now = app.now()
            for n, offset in enumerate(_offsets()):
                app.schedule("noop", {}, run_at=now + timedelta(seconds=offset), **placed(n))
        done = text("SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")

        def finished() -> bool:
            with app.engine.connect() as conn:
                return conn.execute(done).scalar_one() == JOBS

        wait_until(finished, LEAD + JOBS / RATE + 60, "lag benchmark")
        with app.engine.connect() as conn:
            lags = conn.execute(
                text(
                    "SELECT extract(epoch FROM e.at - s.run_at) FROM scheduled_job_events e "
                    "JOIN scheduled_jobs s ON s.id = e.schedule_id WHERE e.kind = 'started'"
                )
            ).scalars()
            return [float(x) for x in lags]
    finally:
        stop_all(procs)
        app.close()


def rq_lags(redis_url: str, due_now: bool = False) -> list[float]:
    redis = Redis.from_url(redis_url)
    redis.flushdb()
    rq_cli = str(Path(sys.executable).parent / "rq")
    env = {**os.environ, "DUEJOBS_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [
            rq_cli,
            "worker",
            "--with-scheduler",
            "-w",
            "rq.worker.SimpleWorker",
            "-S",
            "rq.serializers.JSONSerializer",
            "--url",
            redis_url,
            "-q",
            "lag",
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        queue = Queue("lag", connection=redis, serializer=JSONSerializer)
        if due_now:
            _paced(lambda: queue.enqueue("bench.jobs.stamp", time.time()))
        else:
            start = time.time()
            for offset in _offsets():
                target = start + offset
                queue.enqueue_at(datetime.fromtimestamp(target, UTC), "bench.jobs.stamp", target)
        wait_until(
            lambda: redis.llen("bench:rq-lag") == JOBS, LEAD + JOBS / RATE + 60, "lag benchmark"
        )
        return [float(x) for x in redis.lrange("bench:rq-lag", 0, -1)]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)


def run(database_url: str, redis_url: str) -> list[Figure]:
    return [*_at_their_time(database_url, redis_url), *_due_now(database_url, redis_url)]


def _due_now(database_url: str, redis_url: str) -> list[Figure]:
    ours = [lag * 1000 for lag in duejobs_lags(database_url, redis_url, due_now=True)]
    theirs = [lag * 1000 for lag in rq_lags(redis_url, due_now=True)]
    p50, p99 = statistics.median(ours), percentile(ours, 0.99)
    rq50, rq99 = statistics.median(theirs), percentile(theirs, 0.99)
    return [
        Figure(
            "due now: start - run_at, p50 (RQ enqueue beside)", p50, rq50, "ms", "<= 5 ms", p50 <= 5
        ),
        Figure(
            "due now: start - run_at, p99 (RQ enqueue beside)",
            p99,
            rq99,
            "ms",
            "<= 20 ms",
            p99 <= 20,
        ),
    ]


def _at_their_time(database_url: str, redis_url: str) -> list[Figure]:
    ours = duejobs_lags(database_url, redis_url)
    theirs = rq_lags(redis_url)
    early_ours = sum(1 for lag in ours if lag < 0)
    early_rq = sum(1 for lag in theirs if lag < 0)
    # How far from the intended instant, either way: RQ starts many jobs early (negative lag),
    # so a signed median would reward it for that.
    off_ours, off_rq = [abs(lag) for lag in ours], [abs(lag) for lag in theirs]
    p50, p99 = statistics.median(off_ours) * 1000, percentile(off_ours, 0.99) * 1000
    rq50, rq99 = statistics.median(off_rq) * 1000, percentile(off_rq, 0.99) * 1000
    return [
        Figure(
            "|start - run_at|, p50 (RQ enqueue_at beside)",
            p50,
            rq50,
            "ms",
            "<= 1.0x RQ enqueue_at",
            p50 <= rq50,
        ),
        Figure(
            "|start - run_at|, p99 (RQ enqueue_at beside)",
            p99,
            rq99,
            "ms",
            "<= 1.0x RQ enqueue_at",
            p99 <= rq99,
        ),
        Figure(
            f"early starts out of {JOBS} (RQ enqueue_at beside)",
            early_ours,
            early_rq,
            "jobs",
            "0",
            early_ours == 0,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
