"""What a change costs its caller: ``schedule``, ``cancel`` and ``reschedule``, each of
CHANGES_N (1,000) schedules, called one at a time from 1 thread and at once from 32 threads of
one process (a web server's), p50 and p99 of each call and the changes a second. Each
cancelled or rescheduled schedule is due in two minutes and already pushed by the scheduler,
so each change takes its superseded job out of Redis as well.

Baselines, in the same run and the same threads: the floor of any change PostgreSQL keeps, a
one-row ``UPDATE`` of the same table through the same engine (autocommit); and, for the queue's
cost, the 32 threads' cancels again with 50,000 jobs waiting on the queue (a backlog) beside
them with none — a change to a job waiting for its time must not read the queue's list.
Medians of CHANGES_ROUNDS (3) alternated rounds.

    python -m bench.changes
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis import Redis

from bench.common import TABLES, Figure, percentile
from duejobs import App
from duejobs.scheduler.loop import Scheduler

N = int(os.environ.get("CHANGES_N", "1000"))
ROUNDS = int(os.environ.get("CHANGES_ROUNDS", "3"))
BACKLOG = 50_000
THREADS = (1, 32)


def _timed(calls: list[Callable[[], Any]], threads: int) -> tuple[float, float, float]:
    """(calls/s, p50 ms, p99 ms) of ``calls`` made from ``threads`` threads."""
    took: list[float] = []

    def one(call: Callable[[], Any]) -> None:
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)

    started = time.perf_counter()
    if threads == 1:
        for call in calls:
            one(call)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, calls))
    rate = len(calls) / (time.perf_counter() - started)
    return rate, percentile(took, 0.5) * 1e3, percentile(took, 0.99) * 1e3


def _pushed(app: App, redis: Redis, backlog: int, n: int = N) -> list[Any]:
    """``n`` schedules due in two minutes, pushed to Redis; ``backlog`` ids waiting on the
    queue."""
    with app.engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {TABLES}")
    redis.flushdb()
    for start in range(0, backlog, 10_000):
        waiting = (f"backlog-{n}" for n in range(start, min(backlog, start + 10_000)))
        redis.rpush("rq:queue:duejobs", *waiting)
    ids = [app.schedule("noop", {}, delay=120).id for _ in range(n)]
    scheduler = Scheduler(app)
    while scheduler.run_once().claimed:
        pass
    scheduler.close()
    return ids


def _round(app: App, redis: Redis) -> dict[str, tuple[float, float, float]]:
    got: dict[str, tuple[float, float, float]] = {}
    for threads in THREADS:
        with app.engine.begin() as conn:
            conn.exec_driver_sql(f"TRUNCATE {TABLES}")
        got[f"schedule x{threads}"] = _timed(
            [lambda: app.schedule("noop", {}, delay=120) for _ in range(N)], threads
        )
        ids = _pushed(app, redis, 0)
        got[f"update x{threads}"] = _timed([_update(app, i) for i in ids], threads)
        got[f"cancel x{threads}"] = _timed([_call(app.cancel, i) for i in ids], threads)
        ids = _pushed(app, redis, 0)
        got[f"reschedule x{threads}"] = _timed(
            [_call(app.reschedule, i, delay=300) for i in ids], threads
        )
    ids = _pushed(app, redis, BACKLOG)
    got["cancel x32, backlog"] = _timed([_call(app.cancel, i) for i in ids], 32)
    return got


def _call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: method(*args, **kwargs)


def _update(app: App, schedule_id: Any) -> Callable[[], None]:
    def update() -> None:
        with app.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "UPDATE scheduled_jobs SET updated_at = now() WHERE id = %(id)s",
                {"id": schedule_id},
            )

    return update


def run(database_url: str, redis_url: str) -> list[Figure]:
    app = App(database_url, redis_url, strict_types=False)
    redis = Redis.from_url(redis_url)
    rounds: list[dict[str, tuple[float, float, float]]] = []
    try:
        for n in range(ROUNDS):
            rounds.append(_round(app, redis))
            shown = ", ".join(
                f"{name} {rate:,.0f}/s p50 {p50:.2f} p99 {p99:.1f} ms"
                for name, (rate, p50, p99) in rounds[-1].items()
            )
            print(f"  round {n + 1}: {shown}", flush=True)
    finally:
        with app.engine.begin() as conn:
            conn.exec_driver_sql(f"TRUNCATE {TABLES}")
        redis.flushdb()
        app.close()

    def median(name: str, part: int = 0) -> float:
        return statistics.median(r[name][part] for r in rounds)

    figures = []
    for threads in THREADS:
        floor = median(f"update x{threads}")
        for kind in ("schedule", "cancel", "reschedule"):
            rate = median(f"{kind} x{threads}")
            wanted = 2000.0 if threads == 32 else 0.0
            figures.append(
                Figure(
                    f"{kind}, {threads} thread{'s' * (threads > 1)}: changes/s (p50 "
                    f"{median(f'{kind} x{threads}', 1):.2f} ms, p99 "
                    f"{median(f'{kind} x{threads}', 2):.1f} ms; one-row UPDATE beside)",
                    rate,
                    floor,
                    "/s",
                    ">= 2,000/s" if wanted else "measured",
                    rate >= wanted,
                )
            )
    backlog = median("cancel x32, backlog")
    figures.append(
        Figure(
            f"cancel, 32 threads, {BACKLOG:,} jobs waiting on the queue (none beside)",
            backlog,
            median("cancel x32"),
            "/s",
            ">= 0.7x",
            backlog >= 0.7 * median("cancel x32"),
        )
    )
    return figures


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (url, redis_url):
        for figure in run(url, redis_url):
            print(figure.line(), flush=True)
