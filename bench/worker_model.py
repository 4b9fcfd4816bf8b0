"""The seeded model run of the worker (:mod:`tests.support.worker_model`), long plans over several
seeds at every setting: one slot, 4, 16, and 4 slots in each of 2 processes, then 1, 4 and
16 slots through Redis outages of 1 s, 10 s and 60 s (a worker that exits is a violation,
whatever the outage). Part of
``python -m bench chaos``; ``python -m bench.worker_model [SEED ...]`` runs it alone.

Sizes: WORKER_MODEL_SCHEDULES (300) schedules, a plan of WORKER_MODEL_SECONDS (20) seconds.
Reports, for each seed and setting, the violations of the worker's promises (the target is
none), the handler runs checked and how long after the last fault every schedule finished
(the bound is ``tests.support.worker_model.BOUND``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis
from sqlalchemy import text

from bench.common import TABLES, scratch_database
from duejobs import App
from duejobs.config import DATABASE_ENV, REDIS_ENV
from tests.support.apps import EFFECTS_TABLE, RUNS_TABLE, register
from tests.support.worker_model import BOUND, Report, Setting, run_model

SETTINGS = (
    Setting(1),
    Setting(4),
    Setting(16),
    Setting(4, processes=2),
    *(Setting(slots, outage=seconds) for seconds in (1.0, 10.0, 60.0) for slots in (1, 4, 16)),
)
_ROOT = Path(__file__).resolve().parent.parent
_TABLES = f"{TABLES}, test_effects, test_runs"


@dataclass
class _Worker:
    popen: subprocess.Popen[bytes]


def run(seeds: list[int], database_url: str, redis_url: str) -> list[Report]:
    schedules = int(os.environ.get("WORKER_MODEL_SCHEDULES", "300"))
    seconds = float(os.environ.get("WORKER_MODEL_SECONDS", "20"))
    env = {**os.environ, DATABASE_ENV: database_url, REDIS_ENV: redis_url, "PYTHONPATH": str(_ROOT)}
    env["PYTHONFAULTHANDLER"] = "1"  # a worker stuck at its stop shows where (SIGABRT)

    logs = Path(tempfile.mkdtemp(prefix="duejobs-worker-model-"))
    print(f"worker model: the workers' logs are in {logs}", flush=True)

    def start_worker(flags: list[str]) -> _Worker:
        argv = [sys.executable, "-m", "duejobs", "worker", "--app", "tests.support.apps:app"]
        argv += ["--log-level", "error", *flags]
        with open(logs / f"worker-{len(list(logs.iterdir()))}.log", "wb") as out:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return _Worker(popen)

    app = register(App(database_url=database_url, redis_url=redis_url))
    client = redis.Redis.from_url(redis_url)
    with app.engine.begin() as conn:
        conn.execute(text(EFFECTS_TABLE))
        conn.execute(text(RUNS_TABLE))
    reports = []
    try:
        for seed in seeds:
            for setting in SETTINGS:
                with app.engine.begin() as conn:
                    conn.execute(text(f"TRUNCATE {_TABLES}"))
                client.flushdb()
                report = run_model(
                    app, client, start_worker, setting, seed, schedules=schedules, seconds=seconds
                )
                print(line(report), flush=True)
                reports.append(report)
    finally:
        client.close()
        app.close()
    return reports


def line(report: Report) -> str:
    verdict = "ok" if not report.violations else f"{len(report.violations)} VIOLATIONS"
    head = (
        f"worker model seed {report.seed} {report.setting}: {report.runs} runs, "
        f"{report.actions} changes and faults, every schedule finished "
        f"{report.settled_after:.1f} s after the last fault (bound {BOUND:g} s), "
        f"{report.settled_after_plan:.1f} s after the plan's end: {verdict}"
    )
    return "\n  ".join([head, *report.violations[:20]])


def main(argv: list[str]) -> int:
    seeds = [int(s) for s in argv] or [1, 2, 3]
    with scratch_database() as (database_url, redis_url):
        reports = run(seeds, database_url, redis_url)
    bad = sum(bool(r.violations) for r in reports)
    worst = max(r.settled_after for r in reports)
    print(
        f"worker model: {len(reports)} runs ({len(seeds)} seeds x {len(SETTINGS)} settings), "
        f"{sum(len(r.violations) for r in reports)} violations, slowest to finish "
        f"{worst:.1f} s after the last fault (bound {BOUND:g} s)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
