"""The worker of this checkout against the worker of another (``BENCH_BASELINE_TREE``, say a
``git worktree add ../baseline main``), in one run: no-op jobs/s at one slot and at 16,
50 ms jobs/s at 32 slots, and Redis commands per job, each side the same worker command over
the same jobs, alternated for ``ROUNDS`` rounds (medians). Both trees run on this checkout's
servers and schema; the baseline must accept this schema (a change to it is A/B'd apart).

``python -m bench worker_ab`` with the variable set; without it, nothing is measured.
"""

from __future__ import annotations

import os
from pathlib import Path

from redis import Redis

from bench.common import Figure
from bench.concurrency import NAP, NOOP, _median_rounds, ours
from duejobs import App

BASELINE = os.environ.get("BENCH_BASELINE_TREE")
# (job type, jobs, slots, the least ratio to the baseline that counts as within noise)
CASES = (("noop", NOOP, 1, 0.9), ("noop", NOOP, 16, 0.9), ("nap", NAP, 32, 0.9))


def run(database_url: str, redis_url: str) -> list[Figure]:
    if not BASELINE:
        print("  worker_ab: BENCH_BASELINE_TREE not set (a checkout to compare with)")
        return []
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    redis = Redis.from_url(redis_url)
    app = App(database_url=database_url, redis_url=redis_url)
    figures = []
    try:
        for job_type, n, slots, least in CASES:
            mine, theirs = _median_rounds(
                [
                    lambda: ours(app, redis, env, job_type, n, slots),  # noqa: B023
                    lambda: ours(app, redis, env, job_type, n, slots, Path(BASELINE)),  # noqa: B023
                ]
            )
            print(
                f"  {job_type} x {slots} slots: Redis commands per job {mine[4]:.1f} "
                f"(baseline {theirs[4]:.1f}); CPU ms per job {mine[3]:.2f} ({theirs[3]:.2f})",
                flush=True,
            )
            figures.append(
                Figure(
                    f"A/B: {job_type} jobs/s, 1 process x {slots} slots",
                    mine[0],
                    theirs[0],
                    "jobs/s",
                    f">= {least}x the baseline tree",
                    mine[0] >= least * theirs[0],
                )
            )
    finally:
        app.close()
    return figures
