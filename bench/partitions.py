"""Partitioned mode beside the plain schema: the same data, the same operations, one run.

Two schemas of one scratch database, ``plain`` and ``parted`` (partitioned mode with its
defaults: partitions of PART_PERIOD_DAYS (7) days, two ahead), each filled with PART_ROWS
(2,000,000) finished schedules made over the last PART_DAYS (30) days — each with two events
and an attempt, as a delivered schedule leaves — and, before each round's claim, PART_DUE
(20,000) schedules due now. Then, on both, each figure the median of PART_ROUNDS rounds, the two
schemas taking turns within a round (a neighbour's burst on a shared machine falls on both):

* claim — the scheduler's passes until PART_DUE due rows are claimed and pushed (batches of
  1,000); the partitioned schema's rows/s beside the plain one's. Target: >= 0.9x.
* retention — ``duejobs prune`` with a horizon one period later at each round (PART_DAYS
  less one, two, three periods): in partitioned mode the range the horizon has just passed
  dropped whole, in the plain schema the same rows deleted in batches of 1,000; the schedules
  removed per second of the pass. Target: >= 10x.
* bulk insert — ``schedule_many`` of PART_BULK (100,000) new schedules into the filled
  tables; rows/s beside the plain schema's. Target: >= 0.8x.

The size is what this machine fills in the bench's time budget; PART_ROWS=10000000 runs the
same at ten million (about ten times as long).

    python -m bench.partitions
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime, timedelta

import redis
from sqlalchemy import text

from bench.common import Figure
from duejobs import App, ScheduleRequest, store
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.partition_maintenance import DEFAULT_AHEAD, create_ahead
from duejobs.services.pruner import PruneConfig, Pruner
from duejobs.store.partitions import Partitioning

ROWS = int(os.environ.get("PART_ROWS", "2000000"))
DAYS = int(os.environ.get("PART_DAYS", "30"))
DUE = int(os.environ.get("PART_DUE", "20000"))
BULK = int(os.environ.get("PART_BULK", "100000"))
ROUNDS = int(os.environ.get("PART_ROUNDS", "3"))
PERIOD = timedelta(days=int(os.environ.get("PART_PERIOD_DAYS", "7")))
MODE = Partitioning(PERIOD, DEFAULT_AHEAD)

# Rows made at instant t get a version 7 id of t, as duejobs' own: 48 bits of milliseconds,
# the version, then bits of a hash.
FILL = """
INSERT INTO {schema}.scheduled_jobs (id, tenant, type, payload, run_at, due_at, status,
    finished_at, created_at, attempts, version, queue_job_id)
SELECT CAST(lpad(to_hex(CAST(extract(epoch FROM t) * 1000 AS bigint)), 12, '0') || '7'
            || substr(md5(g::text || :salt), 1, 19) AS uuid),
       't' || (g % 10), 'remind', '{{"user": 1}}', t, t, :status,
       CASE WHEN :status = 'succeeded' THEN t + interval '1 minute' END, t, :attempts, 1,
       CASE WHEN :status = 'succeeded' THEN 'done' END
FROM (SELECT g, CAST(:start AS timestamptz) + g * CAST(:step AS interval) AS t
      FROM generate_series(1, :n) g) AS rows
"""
HISTORY = """
INSERT INTO {schema}.scheduled_job_events (schedule_id, tenant, kind, version, at)
SELECT id, tenant, k, 1, created_at FROM {schema}.scheduled_jobs,
       unnest(ARRAY['created', 'succeeded']) AS k WHERE status = 'succeeded';
INSERT INTO {schema}.scheduled_job_attempts (schedule_id, tenant, version, attempt, status)
SELECT id, tenant, 1, 1, 'succeeded' FROM {schema}.scheduled_jobs WHERE status = 'succeeded';
ANALYZE {schema}.scheduled_jobs, {schema}.scheduled_job_events, {schema}.scheduled_job_attempts
"""


def make_app(
    database_url: str, redis_url: str, schema: str, partitioned: bool, **options: str
) -> App:
    """An App on ``schema`` (``options``: the App's own, prepared statements say), migrated."""
    app = App(database_url=database_url, redis_url=redis_url, schema=schema, **options)
    app.migrate(partitioned=MODE if partitioned else None)
    return app


def fill(app: App, schema: str, partitioned: bool) -> None:
    with app.engine.begin() as conn:
        now = store.database_now(conn)
        start = now - timedelta(days=DAYS)
        if partitioned:  # the ranges the history falls in, as the reconciler made them
            day = start
            while day < now:
                store.ensure_ahead(conn, MODE, day)
                day += (MODE.ahead + 1) * MODE.period
        step = timedelta(days=DAYS) / ROWS
        fill = text(FILL.format(schema=schema))
        conn.execute(
            fill,
            {
                "salt": "h" + schema,
                "status": "succeeded",
                "attempts": 1,
                "start": start,
                "step": step,
                "n": ROWS,
            },
        )
        for statement in HISTORY.format(schema=schema).split(";"):
            conn.execute(text(statement))
    # Settled as a table in service is: visibility map set, statistics current. Measured
    # straight after the fill instead, the first rounds ran beside autovacuum's first passes
    # over the new rows (more tables in partitioned mode, so more of them).
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in ("scheduled_jobs", "scheduled_job_events", "scheduled_job_attempts"):
            conn.execute(text(f"VACUUM (ANALYZE) {schema}.{table}"))


def add_due(app: App, schema: str, round_: int) -> None:
    """DUE schedules due now, the last minute's, for one round's claim."""
    with app.engine.begin() as conn:
        now = store.database_now(conn)
        conn.execute(
            text(FILL.format(schema=schema)),
            {
                "salt": f"d{schema}{round_}",
                "status": "scheduled",
                "attempts": 0,
                "start": now - timedelta(minutes=1),
                "step": timedelta(minutes=1) / DUE,
                "n": DUE,
            },
        )
        conn.execute(text(f"ANALYZE {schema}.scheduled_jobs"))


def claim_rate(app: App) -> float:
    scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
    started, pushed = time.perf_counter(), 0
    while pushed < DUE:
        done = scheduler.run_once().claimed
        assert done, "the scheduler stopped pushing before every due row"
        pushed += done
    assert pushed == DUE, f"{pushed} pushed of {DUE} due"
    return pushed / (time.perf_counter() - started)


def _finished(app: App, schema: str) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(
                text(f"SELECT count(*) FROM {schema}.scheduled_jobs WHERE status = 'succeeded'")
            ).scalar_one()
        )


def _retention_rate(app: App, schema: str, older_than: timedelta) -> tuple[float, int]:
    """Schedules removed per second of one pruner pass, and the ranges it dropped."""
    before = _finished(app, schema)
    started = time.perf_counter()
    result = Pruner(app, PruneConfig(older_than=older_than, batch_size=1000)).run_once()
    elapsed = time.perf_counter() - started
    return (before - _finished(app, schema)) / elapsed, result.partitions_dropped


def _bulk_rate(app: App, day: int) -> float:
    start = datetime.now(UTC) + timedelta(days=day)
    requests = [
        ScheduleRequest(
            "remind", {"user": i}, run_at=start + timedelta(seconds=i % 86_400), tenant=f"t{i % 10}"
        )
        for i in range(BULK)
    ]
    started = time.perf_counter()
    app.schedule_many(requests)
    return BULK / (time.perf_counter() - started)


def _rounds(apps: dict[str, App]) -> dict[str, dict[str, list[float]]]:
    """Each operation, round after round, on each schema in turn (the order swapped at each
    round); the rates by schema and operation."""
    rates: dict[str, dict[str, list[float]]] = {s: {} for s in apps}
    order = list(apps)
    for operation in ("claim", "retention", "bulk"):
        # Each retention round drops the next period's range: the history holds so many.
        rounds = min(ROUNDS, DAYS // PERIOD.days - 1) if operation == "retention" else ROUNDS
        for round_ in range(rounds):
            for schema in order if round_ % 2 == 0 else order[::-1]:
                app = apps[schema]
                if operation == "claim":
                    add_due(app, schema, round_)
                    rate = claim_rate(app)
                elif operation == "retention":
                    older_than = timedelta(days=DAYS) - (round_ + 1) * PERIOD
                    rate, dropped = _retention_rate(app, schema, older_than)
                    rates[schema].setdefault("dropped", []).append(dropped)
                else:
                    rate = _bulk_rate(app, round_ + 1)
                rates[schema].setdefault(operation, []).append(rate)
            plain, parted = rates["plain"][operation][-1], rates["parted"][operation][-1]
            print(
                f"  {operation} round {round_ + 1}: partitioned {parted:,.0f}/s, "
                f"plain {plain:,.0f}/s ({parted / plain:.2f}x)",
                flush=True,
            )
    return rates


def run(database_url: str, redis_url: str) -> list[Figure]:
    flush = redis.Redis.from_url(redis_url)
    apps = {
        schema: make_app(database_url, redis_url, schema, partitioned)
        for schema, partitioned in (("plain", False), ("parted", True))
    }
    try:
        for schema, app in apps.items():
            fill(app, schema, schema == "parted")
        flush.flushdb()
        create_ahead(apps["parted"].engine)
        rates = _rounds(apps)
    finally:
        for schema, app in apps.items():
            with app.engine.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            app.close()
        flush.flushdb()
    plain = {op: statistics.median(r) for op, r in rates["plain"].items()}
    parted = {op: statistics.median(r) for op, r in rates["parted"].items()}
    dropped = int(sum(rates["parted"]["dropped"]))
    return [
        Figure(
            f"partitioned: claim {DUE:,} due among {ROWS:,} (plain beside)",
            parted["claim"],
            plain["claim"],
            "rows/s",
            ">= 0.9x the plain schema",
            parted["claim"] >= 0.9 * plain["claim"],
        ),
        Figure(
            f"partitioned: retention, {dropped} ranges dropped in "
            f"{len(rates['parted']['retention'])} passes (prune beside)",
            parted["retention"],
            plain["retention"],
            "rows/s",
            ">= 10x batched deletes",
            parted["retention"] >= 10 * plain["retention"],
        ),
        Figure(
            f"partitioned: schedule_many of {BULK:,} (plain beside)",
            parted["bulk"],
            plain["bulk"],
            "rows/s",
            ">= 0.8x the plain schema",
            parted["bulk"] >= 0.8 * plain["bulk"],
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (url, redis_url):
        for figure in run(url, redis_url):
            print(figure.line(), flush=True)
