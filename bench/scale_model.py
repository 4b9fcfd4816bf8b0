"""A model of one billion schedules and 10,000 jobs/s, from what one job costs here.

Runs MODEL_JOBS no-op jobs (20,000 by default) through the whole path on the servers of the
run — ``schedule()`` one by one, one scheduler draining the window, an in-process worker with
16 slots — and measures what each job cost every component:

* PostgreSQL: commits (``pg_stat_database.xact_commit``, read once the sessions have ended),
  write-ahead log bytes (``pg_wal_lsn_diff`` of ``pg_current_wal_lsn()``), and the bytes a
  finished schedule keeps with its history (its row, events, attempt, indexes:
  ``pg_total_relation_size``);
* Redis: commands (``INFO commandstats``, the server's own count);
* the processes: jobs/s of one worker process with 16 slots, rows/s of one scheduler.

It then scales those costs to ``MODEL_RATE`` jobs/s (10,000) and ``MODEL_ROWS`` rows
(1,000,000,000) and prints each component's load. Per-job costs do not depend on the table's
size: every hot statement reads through a partial index that holds only the rows in its state
(docs/schema.md asserts the plans at 1M rows; the claim costs the same at 10k and 10M rows,
docs/benchmarks.md). What the model cannot know is each component's capacity on the target
host, so it prints loads, and docs/scaling.md reads them against documented capacities.

    python -m bench.scale_model
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from redis import Redis

from bench.common import scratch_database
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.worker import Runtime, Worker, WorkerConfig

JOBS = int(os.environ.get("MODEL_JOBS", "20000"))
RATE = float(os.environ.get("MODEL_RATE", "10000"))
ROWS = float(os.environ.get("MODEL_ROWS", "1e9"))
SLOTS = 16
TABLES = (
    "scheduled_jobs",
    "scheduled_job_events",
    "scheduled_job_attempts",
    "scheduled_job_effects",
)


@dataclass(frozen=True)
class Reading:
    """The counters one phase moves."""

    commits: int
    wal_bytes: int
    redis_commands: int


def _counters(database_url: str, redis: Redis) -> tuple[int, str, int]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn()::text FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    stats = redis.info("commandstats")
    commands = sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))
    return int(row[0]), str(row[1]), commands


def _measure(database_url: str, redis: Redis, phase: Callable[[], App]) -> tuple[Reading, float]:
    """What ``phase`` moved, its own commits and the reading's excluded, and its seconds.
    The phase returns its App, closed here so its sessions end and report their commits."""
    commits0, lsn0, commands0 = _counters(database_url, redis)
    started = time.monotonic()
    app = phase()
    seconds = time.monotonic() - started
    app.close()
    time.sleep(1.5)  # ended sessions' statistics reach pg_stat_database
    commits1, lsn1, commands1 = _counters(database_url, redis)
    with psycopg.connect(libpq_url(database_url)) as conn:
        wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (lsn1, lsn0)).fetchone()
    assert wal is not None
    # the readings themselves: one commit each (and this one), one INFO each
    return Reading(commits1 - commits0 - 2, int(wal[0]), commands1 - commands0 - 1), seconds


def _handlers(app: App) -> App:
    app.handler("noop")(lambda ctx, payload: None)
    return app


def run_model(database_url: str, redis_url: str) -> list[str]:
    redis = Redis.from_url(redis_url)
    redis.flushdb()

    def schedule() -> App:
        app = App(database_url, redis_url)
        for i in range(JOBS):
            app.schedule("noop", {"i": i}, delay=timedelta(seconds=1), tenant=f"t{i % 20}")
        return app

    def push() -> App:
        app = App(database_url, redis_url)
        scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
        while scheduler.run_once().claimed:
            pass
        scheduler.close()
        return app

    def work() -> App:
        app = _handlers(App(database_url, redis_url))
        time.sleep(1.2)  # every job due
        Scheduler(app).run_once()  # promotion
        runtime = Runtime(app, WorkerConfig(concurrency=SLOTS))
        Worker(runtime).work(burst=True)
        runtime.close()
        return app

    written, schedule_s = _measure(database_url, redis, schedule)
    pushed, push_s = _measure(database_url, redis, push)
    ran, work_s = _measure(database_url, redis, work)
    with psycopg.connect(libpq_url(database_url)) as conn:
        done = conn.execute(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
        ).fetchone()
        size = conn.execute(
            "SELECT " + " + ".join(f"pg_total_relation_size('{t}')" for t in TABLES)
        ).fetchone()
    assert done is not None and size is not None and int(done[0]) == JOBS, done
    redis.close()
    phases = {"schedule()": written, "scheduler": pushed, "worker": ran}
    lines = [f"measured over {JOBS:,} no-op jobs (worker: 1 process x {SLOTS} slots)", ""]
    lines.append(f"  {'per job':<12}{'commits':>10}{'WAL bytes':>12}{'Redis cmds':>12}")
    for name, r in phases.items():
        lines.append(
            f"  {name:<12}{r.commits / JOBS:>10.2f}{r.wal_bytes / JOBS:>12,.0f}"
            f"{r.redis_commands / JOBS:>12.1f}"
        )
    commits = sum(r.commits for r in phases.values()) / JOBS
    wal = sum(r.wal_bytes for r in phases.values()) / JOBS
    commands = sum(r.redis_commands for r in phases.values()) / JOBS
    stored = int(size[0]) / JOBS
    lines.append(f"  {'total':<12}{commits:>10.2f}{wal:>12,.0f}{commands:>12.1f}")
    lines.append(f"  stored per finished schedule with its history: {stored:,.0f} bytes")
    per_worker, per_scheduler = JOBS / work_s, JOBS / push_s
    lines.append(
        f"  one worker process: {per_worker:,.0f} jobs/s; one scheduler: {per_scheduler:,.0f} "
        f"rows/s; schedule() from one thread: {JOBS / schedule_s:,.0f}/s"
    )
    lines += [
        "",
        f"at {RATE:,.0f} jobs/s and {ROWS:,.0f} rows:",
        f"  PostgreSQL commits      {commits * RATE:>12,.0f} /s",
        f"  PostgreSQL WAL          {wal * RATE / 2**20:>12,.1f} MiB/s "
        f"({wal * RATE * 86400 / 2**40:,.2f} TiB/day)",
        f"  stored history          {stored * ROWS / 2**40:>12,.2f} TiB "
        f"(all {ROWS:,.0f} rows kept; prune or partitions bound it)",
        f"  Redis commands          {commands * RATE:>12,.0f} /s",
        f"  worker processes        {RATE / per_worker:>12,.0f}    (at this machine's rate)",
        f"  scheduler processes     {RATE / per_scheduler:>12,.1f}",
    ]
    return lines


def main() -> None:
    with scratch_database() as (database_url, redis_url):
        for line in run_model(database_url, redis_url):
            print(line, flush=True)


if __name__ == "__main__":
    main()
