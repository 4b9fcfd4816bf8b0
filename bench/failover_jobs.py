"""The job plain RQ runs in `bench/redis_failover.py`: it records its start and end in
PostgreSQL (outside Redis), with the time it was due, for the run's counts."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import psycopg


def record(job: str, due: str) -> None:
    started = datetime.now(UTC)
    with psycopg.connect(os.environ["BENCH_RUNS_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bench_rq_runs VALUES (%s, %s, %s, clock_timestamp())",
            (job, datetime.fromisoformat(due), started),
        )
