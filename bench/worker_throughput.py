"""Worker throughput with all of duejobs' bookkeeping against a bare RQ worker of the same
class (SimpleWorker) and count, running a no-op job; and the peak: 10,000 jobs due at one
instant drained by two workers against the same two workers draining 10,000 bare jobs.

Throughput: both sides run as separate worker processes in burst mode; it is jobs divided by
the span from the first worker's start to the last one's end.

Peak, like for like: on both sides two workers are already listening when the instant comes,
and the clock runs from the instant to the last job's end — duejobs' scheduler pushing the
rows, or the baseline's producer enqueueing the 10,000 bare jobs (``enqueue_many`` in batches
of 1,000), counts on its side. Median of ``PEAK_ROUNDS`` alternated rounds each.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import psycopg
from redis import Redis
from rq import Queue
from rq import Worker as RQWorker
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import utcparse

from bench.common import Figure, fill_due, wait_until
from bench.procs import ROOT, serve_workers, spawn_workers, stop_all
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler, SchedulerConfig

JOBS = int(os.environ.get("BENCH_WORKER_JOBS", "2000"))
PEAK = int(os.environ.get("BENCH_PEAK_JOBS", "10000"))
PEAK_ROUNDS = int(os.environ.get("BENCH_PEAK_ROUNDS", "3"))


def _env(database_url: str, redis_url: str) -> dict[str, str]:
    return {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}


def _bare(redis: Redis, n: int, workers: int, env: dict[str, str]) -> float:
    redis.flushdb()
    queue = Queue("bare", connection=redis, serializer=JSONSerializer)
    for start in range(0, n, 1000):
        datas = [
            Queue.prepare_data("bench.jobs.noop", args=[i]) for i in range(start, start + 1000)
        ]
        queue.enqueue_many(datas[: n - start])
    spans = spawn_workers("bare", "bare", workers, env)
    assert queue.count == 0
    return max(s["end"] for s in spans) - min(s["start"] for s in spans)


def _ours(app: App, redis: Redis, n: int, workers: int, env: dict[str, str]) -> float:
    redis.flushdb()
    fill_due(libpq_url(app.settings.database_url), n, job_type="noop", offset="-1 second")
    scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
    scheduler.run_once()
    scheduler.close()
    spans = spawn_workers("duejobs", app.queue, workers, env)
    with app.engine.connect() as conn:
        done = conn.exec_driver_sql(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
        ).scalar_one()
    assert done == n, done
    return max(s["end"] for s in spans) - min(s["start"] for s in spans)


def throughput(
    database_url: str, redis_url: str, workers: int, at_least: float, repeats: int = 3
) -> Figure:
    env = _env(database_url, redis_url)
    redis = Redis.from_url(redis_url)
    app = App(database_url=database_url, redis_url=redis_url)
    mine, theirs = [], []
    for _ in range(repeats):
        theirs.append(JOBS / _bare(redis, JOBS, workers, env))
        mine.append(JOBS / _ours(app, redis, JOBS, workers, env))
    app.close()
    value, baseline = statistics.median(mine), statistics.median(theirs)
    return Figure(
        f"worker: jobs/s with bookkeeping, {workers} SimpleWorker(s)",
        value,
        baseline,
        "jobs/s",
        f">= {at_least:g}x bare RQ no-op",
        value >= at_least * baseline,
    )


def _bare_peak(redis: Redis, env: dict[str, str]) -> float:
    """Two bare workers listening; at the instant a producer enqueues PEAK no-op jobs; seconds
    from the instant to the last job's end (RQ's own ``ended_at``)."""
    redis.flushdb()
    queue = Queue("bare", connection=redis, serializer=JSONSerializer)
    workers = serve_workers("bare", "bare", 2, env)
    try:
        wait_until(lambda: len(RQWorker.all(connection=redis)) == 2, 60, "two bare workers")
        instant = time.time()
        for start in range(0, PEAK, 1000):
            datas = [
                Queue.prepare_data("bench.jobs.noop", args=[i], job_id=f"peak-{i}")
                for i in range(start, min(start + 1000, PEAK))
            ]
            queue.enqueue_many(datas)
        finished = FinishedJobRegistry(queue=queue)
        wait_until(lambda: finished.count == PEAK, 600, "the bare peak")
    finally:
        stop_all(workers)
    with redis.pipeline(transaction=False) as pipe:
        for i in range(PEAK):
            pipe.hget(f"rq:job:peak-{i}", "ended_at")
        ended = [utcparse(v.decode()).timestamp() for v in pipe.execute() if v]
    assert len(ended) == PEAK, len(ended)
    return max(ended) - instant


def peak(database_url: str, redis_url: str) -> Figure:
    """10,000 due at one instant, two workers listening on each side; medians of rounds."""
    env = _env(database_url, redis_url)
    redis = Redis.from_url(redis_url)
    mine, theirs = [], []
    for _ in range(PEAK_ROUNDS):
        theirs.append(_bare_peak(redis, env))
        mine.append(_duejobs_peak(database_url, redis_url, env))
    value, bare = statistics.median(mine), statistics.median(theirs)
    return Figure(
        f"peak: {PEAK} due at one instant, 2 workers, drain",
        value,
        bare,
        "s",
        "<= 1.3x bare drain",
        value <= 1.3 * bare,
    )


def _duejobs_peak(database_url: str, redis_url: str, env: dict[str, str]) -> float:
    """Seconds from the instant (``run_at``) to the last ``finished_at``, duejobs' scheduler
    and two workers already running."""
    redis = Redis.from_url(redis_url)
    redis.flushdb()
    app = App(database_url=database_url, redis_url=redis_url)
    fill_due(libpq_url(database_url), PEAK, job_type="noop", offset="8 seconds")
    with psycopg.connect(libpq_url(database_url)) as conn:
        conn.execute("UPDATE scheduled_jobs SET run_at = (SELECT min(run_at) FROM scheduled_jobs)")
        conn.execute("UPDATE scheduled_jobs SET due_at = run_at")
    run = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "duejobs"]
    procs = [
        subprocess.Popen(
            [*cmd, "scheduler", "--batch-size", "1000", "--log-level", "warning"], env=run, cwd=ROOT
        ),
        *[
            subprocess.Popen(
                [*cmd, "worker", "--app", "bench.jobs:app", "--log-level", "warning"],
                env=run,
                cwd=ROOT,
            )
            for _ in range(2)
        ],
    ]
    try:
        deadline = time.monotonic() + 600
        while True:
            with app.engine.connect() as conn:
                left = conn.exec_driver_sql(
                    "SELECT count(*) FROM scheduled_jobs WHERE status <> 'succeeded'"
                ).scalar_one()
            if left == 0:
                break
            assert time.monotonic() < deadline, "peak did not drain"
            time.sleep(0.2)
        with app.engine.connect() as conn:
            drain = conn.exec_driver_sql(
                "SELECT extract(epoch FROM max(finished_at) - min(run_at)) FROM scheduled_jobs"
            ).scalar_one()
    finally:
        stop_all(procs)
        app.close()
    return float(drain)


def run(database_url: str, redis_url: str) -> list[Figure]:
    return [
        throughput(database_url, redis_url, workers=1, at_least=1.0),
        throughput(database_url, redis_url, workers=2, at_least=0.7),
        peak(database_url, redis_url),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
