"""The scheduler's claim query at 10k, 100k and 1M rows: plan and time stay flat.

Rows: a fixed 2,000 due; the rest far-future `scheduled` or finished (half each).
Prints the median time of 10 executions per size, its ratio to the 10k size, and the
EXPLAIN (ANALYZE, BUFFERS) plan at the largest size.

    python -m bench.explain_claim            # SIZES=10000,100000,1000000 by default
"""

from __future__ import annotations

import os
import statistics
import time

import psycopg

from bench.common import scratch_database

CLAIM = """
    SELECT id, type, run_at, version FROM scheduled_jobs
    WHERE status = 'scheduled' AND queue_job_id IS NULL
      AND run_at <= now() + interval '15 minutes'
    ORDER BY run_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1000
"""
DUE = 2000


def fill(conn: psycopg.Connection, total: int) -> None:
    conn.execute("TRUNCATE scheduled_jobs CASCADE")
    conn.execute(
        "INSERT INTO scheduled_jobs (id, type, payload, run_at, status) "
        "SELECT gen_random_uuid(), 'x', '{}', now() + interval '30 days' + g * interval '1s', "
        "CASE WHEN g %% 2 = 0 THEN 'scheduled' ELSE 'succeeded' END "
        "FROM generate_series(1, %s) g",
        (total - DUE,),
    )
    conn.execute(
        "INSERT INTO scheduled_jobs (id, type, payload, run_at) "
        "SELECT gen_random_uuid(), 'x', '{}', now() - g * interval '1ms' "
        "FROM generate_series(1, %s) g",
        (DUE,),
    )
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE scheduled_jobs")
    conn.autocommit = False


def timed(conn: psycopg.Connection) -> float:
    samples = []
    for _ in range(10):
        start = time.perf_counter()
        rows = conn.execute(CLAIM).fetchall()
        samples.append(time.perf_counter() - start)
        assert len(rows) == 1000
        conn.rollback()
    return statistics.median(samples)


def main() -> None:
    sizes = [int(s) for s in os.environ.get("SIZES", "10000,100000,1000000").split(",")]
    with scratch_database() as (url, _redis), psycopg.connect(url) as conn:
        base = None
        for size in sizes:
            fill(conn, size)
            seconds = timed(conn)
            base = base or seconds
            print(
                f"claim LIMIT 1000 at {size:>9,} rows: {seconds * 1000:6.2f} ms  "
                f"ratio to {sizes[0]:,}: {seconds / base:.2f}x"
            )
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + CLAIM).fetchall()
        conn.rollback()
        print(f"\nplan at {sizes[-1]:,} rows:")
        for (line,) in plan:
            print("  " + line)


if __name__ == "__main__":
    main()
