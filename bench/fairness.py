"""A small tenant's lag while a large tenant's burst drains, beside its lag on an idle system.

One scheduler and two worker processes; every tenant under the default in-flight quota
(FAIR_INFLIGHT, 20). Tenant "b" schedules FAIR_B_JOBS (300) jobs at FAIR_B_RATE (10/s):

1. idle: nothing else runs — b's lag p50/p99 (the `started` event minus `run_at`, database
   clock) is the baseline;
2. burst: tenant "a" has FAIR_A_JOBS (60,000) rows due at once, then b schedules the same
   stream — b's lag p50/p99 again, and how many of a's rows were still waiting when b's last
   job started (the burst was still draining throughout).

Target: b's p99 during the burst <= 2x its p99 when idle. With FAIR_UNCAPPED=1 the burst
phase is run once more without any in-flight quota, to show what the quota buys.

    python -m bench.fairness
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta

from redis import Redis
from sqlalchemy import text

from bench.common import TABLES, Figure, percentile, wait_until
from bench.procs import ROOT, stop_all
from duejobs import App

# Enough that a's burst is still draining when b's 30 s stream ends, on a fast box too.
A_JOBS = int(os.environ.get("FAIR_A_JOBS", "60000"))
B_JOBS = int(os.environ.get("FAIR_B_JOBS", "300"))
B_RATE = float(os.environ.get("FAIR_B_RATE", "10"))
INFLIGHT = int(os.environ.get("FAIR_INFLIGHT", "20"))
LEAD = 1.0  # seconds before b's first job is due


def _b_stream(app: App) -> datetime:
    """Schedule b's jobs, evenly spread from LEAD seconds on; returns when the stream starts."""
    start = app.now() + timedelta(seconds=LEAD)
    for i in range(B_JOBS):
        app.schedule("noop", {}, run_at=start + timedelta(seconds=i / B_RATE), tenant="b")
    return start


def _b_lags(app: App, since: datetime, kind: str = "started") -> list[float]:
    """b's lags (seconds) from ``run_at`` to its ``kind`` event for the jobs due from
    ``since``, once they all have one."""
    query = text(
        "SELECT extract(epoch FROM e.at - s.run_at) FROM scheduled_job_events e "
        "JOIN scheduled_jobs s ON s.id = e.schedule_id "
        "WHERE e.kind = :kind AND s.tenant = 'b' AND s.run_at >= :since"
    )

    def lags() -> list[float]:
        with app.engine.connect() as conn:
            rows = conn.execute(query, {"since": since, "kind": kind}).scalars()
            return [float(x) for x in rows]

    wait_until(lambda: len(lags()) >= B_JOBS, LEAD + B_JOBS / B_RATE + 120, "fairness benchmark")
    return lags()


def _burst(app: App) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
                "SELECT gen_random_uuid(), 'a', 'noop', '{}', now(), now() "
                "FROM generate_series(1, :n)"
            ),
            {"n": A_JOBS},
        )
        # As on a table in use: 60,000 rows landing in an empty table would otherwise leave
        # the planner with the statistics of an empty one until autovacuum catches up.
        conn.execute(text("ANALYZE scheduled_jobs"))


def _a_waiting(app: App) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM scheduled_jobs WHERE tenant = 'a' "
                    "AND status = 'scheduled'"
                )
            ).scalar_one()
        )


def _reset(app: App, redis_url: str) -> None:
    Redis.from_url(redis_url).flushdb()
    with app.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES}"))


def _start(database_url: str, redis_url: str) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "duejobs"]
    worker = [*cmd, "worker", "--app", "bench.jobs:app", "--log-level", "warning"]
    return [
        # The same polling in both phases: a throttled tenant makes the scheduler poll every
        # 25 ms, so the idle phase polls that often too (else "b is faster during a burst").
        subprocess.Popen(
            [*cmd, "scheduler", "--poll-interval", "25ms", "--log-level", "warning"],
            env=env,
            cwd=ROOT,
        ),
        subprocess.Popen(worker, env=env, cwd=ROOT),
        subprocess.Popen(worker, env=env, cwd=ROOT),
    ]


def _phase(
    app: App, database_url: str, redis_url: str, *, burst: bool, cap: int | None
) -> tuple[list[float], int]:
    _reset(app, redis_url)
    if cap is not None:
        app.set_quota("*", max_inflight=cap)
    procs = _start(database_url, redis_url)
    try:
        time.sleep(1.0)  # processes up
        if burst:
            _burst(app)
        since = _b_stream(app)
        lags = _b_lags(app, since)
        left = _a_waiting(app)
        pushed = _b_lags(app, since, "enqueued")
        print(
            f"  {'burst' if burst else 'alone'}, cap {cap}: b pushed after p50 "
            f"{statistics.median(pushed) * 1000:,.0f} ms / p99 "
            f"{percentile(pushed, 0.99) * 1000:,.0f} ms, started after p50 "
            f"{statistics.median(lags) * 1000:,.0f} ms / p99 "
            f"{percentile(lags, 0.99) * 1000:,.0f} ms",
            flush=True,
        )
        return lags, left
    finally:
        stop_all(procs)


def run(database_url: str, redis_url: str) -> list[Figure]:
    app = App(database_url=database_url, redis_url=redis_url)
    try:
        idle, _ = _phase(app, database_url, redis_url, burst=False, cap=INFLIGHT)
        busy, a_left = _phase(app, database_url, redis_url, burst=True, cap=INFLIGHT)
        if os.environ.get("FAIR_UNCAPPED") == "1":
            free, free_left = _phase(app, database_url, redis_url, burst=True, cap=None)
            print(
                f"  without an in-flight quota: b's lag p50 {statistics.median(free) * 1000:,.0f}"
                f" ms, p99 {percentile(free, 0.99) * 1000:,.0f} ms "
                f"({free_left:,} of a's rows still waiting)",
                flush=True,
            )
    finally:
        _reset(app, redis_url)
        app.close()
    p50, p99 = statistics.median(busy) * 1000, percentile(busy, 0.99) * 1000
    idle50, idle99 = statistics.median(idle) * 1000, percentile(idle, 0.99) * 1000
    print(f"  a's rows still waiting when b's last job started: {a_left:,}", flush=True)
    return [
        Figure(
            f"fair: b's lag p50, a's {A_JOBS:,} due (b alone beside)",
            p50,
            idle50,
            "ms",
            "<= 2x alone, a still draining",
            p50 <= 2 * idle50 and a_left > 0,
        ),
        Figure(
            f"fair: b's lag p99, a's {A_JOBS:,} due (b alone beside)",
            p99,
            idle99,
            "ms",
            "<= 2x alone, a still draining",
            p99 <= 2 * idle99 and a_left > 0,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
