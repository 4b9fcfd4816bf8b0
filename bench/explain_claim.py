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
from datetime import timedelta

import psycopg

from bench.common import scratch_database
from duejobs import store

# The scheduler's own statement (duejobs.store.CLAIM_DUE) in psycopg's parameter style.
CLAIM = store.CLAIM_DUE.text.replace(":window", "%(window)s").replace(":limit", "%(limit)s")
PARAMS = {"window": timedelta(minutes=15), "limit": 1000}
DUE = 2000


def fill(conn: psycopg.Connection, total: int) -> None:
    conn.execute("TRUNCATE scheduled_jobs CASCADE")
    conn.execute(
        "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at, status) "
        "SELECT gen_random_uuid(), 'x', '{}', t, t, "
        "CASE WHEN g %% 2 = 0 THEN 'scheduled' ELSE 'succeeded' END "
        "FROM (SELECT g, now() + interval '30 days' + g * interval '1s' AS t "
        "      FROM generate_series(1, %s) g) AS far",
        (total - DUE,),
    )
    conn.execute(
        "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at) "
        "SELECT gen_random_uuid(), 'x', '{}', t, t "
        "FROM (SELECT now() - g * interval '1ms' AS t FROM generate_series(1, %s) g) AS d",
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
        rows = conn.execute(CLAIM, PARAMS).fetchall()
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
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + CLAIM, PARAMS).fetchall()
        conn.rollback()
        print(f"\nplan at {sizes[-1]:,} rows:")
        for (line,) in plan:
            print("  " + line)


if __name__ == "__main__":
    main()
