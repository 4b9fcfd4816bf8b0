"""What ``--durable-bookkeeping`` costs a worker whose PostgreSQL waits for a synchronous
standby — the setting that keeps a failover from losing the claims and outcomes a worker
acknowledged (docs/deployment.md).

A primary and a streaming standby made here (``synchronous_standby_names = '*'``, both on
this machine, so a commit waits for the standby's flush over a local socket), DUR_JOBS (2,000)
no-op schedules due at once; one worker process with 8 slots drains them in burst mode, with
and without ``--durable-bookkeeping``, taking turns for DUR_ROUNDS (3) rounds each. The
figure: jobs/s with durable bookkeeping beside without.

    python -m bench.durability
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from redis import Redis

from bench.common import Figure, fill_due
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from tests.support.replication import streaming_pair

JOBS = int(os.environ.get("DUR_JOBS", "2000"))
ROUNDS = int(os.environ.get("DUR_ROUNDS", "3"))
ROOT = Path(__file__).resolve().parent.parent


def _drain(app: App, redis_url: str, durable: bool) -> float:
    """Jobs/s of one worker process (8 slots) draining JOBS due now."""
    Redis.from_url(redis_url).flushdb()
    fill_due(libpq_url(app.settings.database_url), JOBS, job_type="noop", offset="-1 second")
    scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
    while scheduler.run_once().claimed:
        pass
    scheduler.close()
    flag = "--durable-bookkeeping" if durable else "--no-durable-bookkeeping"
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": app.settings.database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "PYTHONPATH": str(ROOT),
    }
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "duejobs",
            "worker",
            "--app",
            "bench.jobs:app",
            "--burst",
            "--concurrency",
            "8",
            flag,
            "--log-level",
            "error",
        ],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=1800,
    )
    elapsed = time.perf_counter() - started
    with app.engine.connect() as conn:
        done = conn.exec_driver_sql(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
        ).scalar_one()
    assert done == JOBS, f"{done} of {JOBS} succeeded"
    return JOBS / elapsed


def run(database_url: str, redis_url: str) -> list[Figure]:
    rates: dict[bool, list[float]] = {True: [], False: []}
    with (
        tempfile.TemporaryDirectory() as base,
        streaming_pair(Path(base) / "pair", synchronous=True) as pair,
    ):
        app = App(pair.primary_url, redis_url)
        app.migrate()
        try:
            for round_ in range(ROUNDS):
                for durable in (True, False) if round_ % 2 == 0 else (False, True):
                    rates[durable].append(_drain(app, redis_url, durable))
                print(
                    f"  round {round_ + 1}: durable {rates[True][-1]:,.0f} jobs/s, "
                    f"not durable {rates[False][-1]:,.0f} jobs/s",
                    flush=True,
                )
        finally:
            app.close()
    durable, not_durable = statistics.median(rates[True]), statistics.median(rates[False])
    return [
        Figure(
            "worker, synchronous standby: --durable-bookkeeping (without beside)",
            durable,
            not_durable,
            "jobs/s",
            "measured: what no lost outcome at a failover costs",
            True,
        )
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (url, redis_url):
        for figure in run(url, redis_url):
            print(figure.line(), flush=True)
