"""Scheduler throughput: duejobs' scheduler against the hand-written loop, same rows, same run.

The hand-written loop (the baseline measured on this kind of machine, ~8.5k rows/s): per batch
of 1000, one transaction — claim `FOR UPDATE SKIP LOCKED`, RQ `enqueue_many` (or, for future
rows, `enqueue_at(pipeline=...)` job by job) in one Redis pipeline, UPDATE, COMMIT.
Rows: 10,000 in the window plus 90,000 background rows (finished or far future).
"""

from __future__ import annotations

import os
import statistics
import time

import psycopg
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from bench.common import Figure, fill_due
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler import Scheduler, SchedulerConfig

N = int(os.environ.get("BENCH_WINDOW_ROWS", "10000"))
BACKGROUND = int(os.environ.get("BENCH_BACKGROUND_ROWS", "90000"))
BATCH = 1000

_CLAIM = (
    "SELECT id, due_at FROM scheduled_jobs WHERE status = 'scheduled' AND queue_job_id IS NULL "
    "AND due_at <= now() + interval '15 minutes' ORDER BY due_at FOR UPDATE SKIP LOCKED LIMIT %s"
)


def hand_written(url: str, redis: Redis, future: bool) -> float:
    """The baseline loop; returns rows per second."""
    queue = Queue("bench-baseline", connection=redis, serializer=JSONSerializer)
    moved = 0
    start = time.perf_counter()
    with psycopg.connect(url) as conn:
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
    assert moved == N, moved
    return moved / (time.perf_counter() - start)


def ours(app: App) -> float:
    """duejobs' scheduler with its defaults (two claim loops) and the same batch size."""
    scheduler = Scheduler(app, SchedulerConfig(batch_size=BATCH))
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
        ">= 1.0x hand-written loop",
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
