"""What the listing indexes (migrations 0007 and 0011) cost a schedule's life, in one run.

LIST_ROWS (50,000) schedules across 10 tenants go through their life in bulk — created with
`app.schedule_many`, moved to `running`, moved to `succeeded` — in a table with the listing
indexes and in the same table without them, LIST_ROUNDS (5) rounds alternated, each after a
TRUNCATE and a CHECKPOINT; each step's median rows/s with the indexes is divided by its median
without. 0007's indexes are partial on finished rows, so only the step that finishes schedules
should pay; 0011's type and queue indexes hold live rows too, so every step pays for them.
LIST_INDEXES picks which are measured (a LIKE pattern on their names; default all of them).

    python -m bench.list_indexes
    LIST_INDEXES='scheduled_jobs_list_%_type_idx' python -m bench.list_indexes
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import psycopg

from bench.common import scratch_database
from duejobs import App, ScheduleRequest

ROWS = int(os.environ.get("LIST_ROWS", "50000"))
ROUNDS = int(os.environ.get("LIST_ROUNDS", "5"))
PATTERN = os.environ.get("LIST_INDEXES", "scheduled_jobs_list_%")
_STEPS = {
    "running": "UPDATE scheduled_jobs SET status = 'running', attempts = 1, started_at = now()",
    "succeeded": "UPDATE scheduled_jobs SET status = 'succeeded', finished_at = now()",
}


def _round(app: App, url: str, indexes: dict[str, str], on: bool) -> dict[str, float]:
    """One pass of the schedules' life; rows/s per step."""
    requests = [
        ScheduleRequest("bench", {"i": i}, delay=timedelta(minutes=i % 600), tenant=f"t{i % 10}")
        for i in range(ROWS)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE scheduled_jobs, scheduled_job_events CASCADE")
        conn.execute("CHECKPOINT")
        for name, definition in indexes.items():
            conn.execute(
                definition.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1)
                if on
                else f"DROP INDEX IF EXISTS {name}"
            )  # type: ignore[arg-type]
        rates = {}
        started = time.perf_counter()
        app.schedule_many(requests)
        rates["created"] = ROWS / (time.perf_counter() - started)
        for step, statement in _STEPS.items():
            started = time.perf_counter()
            conn.execute(statement)  # type: ignore[arg-type]
            rates[step] = ROWS / (time.perf_counter() - started)
    return rates


def main() -> None:
    with scratch_database() as (url, redis_url):
        app = App(url, redis_url)
        with psycopg.connect(url) as conn:
            indexes = dict(
                conn.execute(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE %s",
                    (PATTERN,),
                ).fetchall()
            )
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for _ in range(ROUNDS):
            for on in (True, False):
                runs[on].append(_round(app, url, indexes, on))
        app.close()
    print(f"{len(indexes)} listing indexes ({PATTERN}), {ROWS:,} schedules, {ROUNDS} rounds")
    for step in ("created", *_STEPS):
        with_, without = (statistics.median(r[step] for r in runs[on]) for on in (True, False))
        print(
            f"{step:<10} {with_:>10,.0f} rows/s with, {without:>10,.0f} without, "
            f"ratio {with_ / without:.2f}"
        )


if __name__ == "__main__":
    main()
