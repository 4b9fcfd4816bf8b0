"""Scheduler throughput: duejobs' scheduler against the hand-written loop, same rows, same run.

The hand-written loop (the baseline measured on this kind of machine, ~8.5k rows/s): per batch
of 1000, one transaction — claim `FOR UPDATE SKIP LOCKED`, RQ `enqueue_many` (or, for future
rows, `enqueue_at(pipeline=...)` job by job) in one Redis pipeline, UPDATE, COMMIT.
Like for like: the baseline runs as many claim loops as duejobs' scheduler (two, each on its
own connection, opened before the clock starts), and duejobs' connections are warm too.
Rows: 10,000 in the window plus 90,000 background rows (finished or far future).
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from bench.common import Figure, fill_due
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler, SchedulerConfig

N = int(os.environ.get("BENCH_WINDOW_ROWS", "10000"))
BACKGROUND = int(os.environ.get("BENCH_BACKGROUND_ROWS", "90000"))
BATCH = 1000
LOOPS = 2  # duejobs' default claim loops per pass; the baseline runs as many

_CLAIM = (
    "SELECT id, due_at FROM scheduled_jobs WHERE status = 'scheduled' AND queue_job_id IS NULL "
    "AND due_at <= now() + interval '15 minutes' ORDER BY due_at FOR UPDATE SKIP LOCKED LIMIT %s"
)


def hand_written(url: str, redis: Redis, future: bool) -> float:
    """The baseline: ``LOOPS`` claim loops, each on a connection opened beforehand; returns
    rows per second."""
    connections = [psycopg.connect(url) for _ in range(LOOPS)]
    with ThreadPoolExecutor(LOOPS) as pool:
        start = time.perf_counter()
        moved = sum(pool.map(lambda conn: _loop(conn, redis, future), connections))
        elapsed = time.perf_counter() - start
    for conn in connections:
        conn.close()
    assert moved == N, moved
    return moved / elapsed


def _loop(conn: psycopg.Connection, redis: Redis, future: bool) -> int:
    """One hand-written claim loop until nothing is left; returns the rows it moved."""
    queue = Queue("bench-baseline", connection=redis, serializer=JSONSerializer)
    moved = 0
    while True:
        rows = conn.execute(_CLAIM, (BATCH,)).fetchall()
        if not rows:
            conn.commit()
            break
        with redis.pipeline() as pipe:
            if future:
                for sid, due_at in rows:
                    queue.enqueue_at(
                        due_at, "bench.jobs.noop", str(sid), job_id=f"sj-{sid}", pipeline=pipe
                    )
            else:
                datas = [
                    Queue.prepare_data("bench.jobs.noop", args=[str(sid)], job_id=f"sj-{sid}")
                    for sid, _ in rows
                ]
                queue.enqueue_many(datas, pipeline=pipe)
            pipe.execute()
        conn.execute(
            "UPDATE scheduled_jobs SET queue_job_id = 'sj-' || id WHERE id = ANY(%s)",
            ([sid for sid, _ in rows],),
        )
        conn.commit()
        moved += len(rows)
    return moved


def ours(app: App) -> float:
    """duejobs' scheduler with its defaults (two claim loops) and the same batch size, its
    connections warm."""
    scheduler = Scheduler(app, SchedulerConfig(batch_size=BATCH, concurrency=LOOPS))
    connections = [app.engine.connect() for _ in range(LOOPS + 1)]
    for conn in connections:
        conn.close()  # back to the pool, open
    start = time.perf_counter()
    result = scheduler.run_once()
    elapsed = time.perf_counter() - start
    scheduler.close()
    assert result.claimed == N, result
    return result.claimed / elapsed


def measure(database_url: str, redis_url: str, future: bool, repeats: int = 3) -> Figure:
    url = libpq_url(database_url)
    redis = Redis.from_url(redis_url)
    app = App(database_url=database_url, redis_url=redis_url)
    offset, spread = ("1 minute", "13 minutes") if future else ("-1 minute", "1 minute")
    mine, theirs = [], []
    for _ in range(repeats):
        for side in ("baseline", "duejobs"):
            redis.flushdb()
            fill_due(url, N, job_type="noop", offset=offset, spread=spread, background=BACKGROUND)
            if side == "baseline":
                theirs.append(hand_written(url, redis, future))
            else:
                mine.append(ours(app))
    app.close()
    value, baseline = statistics.median(mine), statistics.median(theirs)
    if future:
        return Figure(
            "scheduler: future rows pushed within the window",
            value,
            baseline,
            "rows/s",
            ">= 2.5x enqueue_at(pipeline)",
            value >= 2.5 * baseline,
        )
    return Figure(
        "scheduler: due rows claimed and pushed",
        value,
        baseline,
        "rows/s",
        ">= 1.0x hand-written loops",
        value >= baseline,
    )


def run(database_url: str, redis_url: str) -> list[Figure]:
    return [
        measure(database_url, redis_url, future=False),
        measure(database_url, redis_url, future=True),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line())
