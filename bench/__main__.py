"""`python -m bench` (or `make bench`): every figure beside its baseline, measured in one run.

Uses DUEJOBS_DATABASE_URL / DUEJOBS_REDIS_URL when set, the embedded servers otherwise, and a
scratch database created for the run. Sizes can be reduced with the environment variables
named in each module (BENCH_WINDOW_ROWS, BENCH_WORKER_JOBS, BENCH_PEAK_JOBS, LAG_JOBS, ...).
Exit status 1 when a figure misses its target. `python -m bench lag fairness` runs only the
named modules; `python -m bench chaos [SEED ...]` runs the fault-injection suite instead, and
the seeded model run of the worker (`bench.worker_model`) after it.
"""

from __future__ import annotations

import platform
import sys
import time

from bench import (
    bulk,
    changes,
    cluster,
    concurrency,
    durability,
    fairness,
    lag,
    partitions,
    peer,
    peer_bullmq,
    peer_celery,
    prepared,
    priority,
    rate_limits,
    redis_failover,
    scheduler_throughput,
    worker_ab,
    worker_throughput,
)
from bench.common import Figure, scratch_database


def main() -> int:
    if sys.argv[1:2] == ["chaos"]:  # fault injection: its own report, not a ratio
        from bench import chaos

        return chaos.main(sys.argv[2:])
    figures: list[Figure] = []
    started = time.monotonic()
    print(
        f"duejobs benchmarks on {platform.node()} ({platform.machine()}, "
        f"Python {platform.python_version()})",
        flush=True,
    )
    modules = (
        scheduler_throughput,
        worker_throughput,
        concurrency,
        peer,
        peer_bullmq,
        peer_celery,
        lag,
        fairness,
        priority,
        rate_limits,
        bulk,
        changes,
        partitions,
        prepared,
        durability,
        redis_failover,
        cluster,
        worker_ab,
    )
    chosen = sys.argv[1:]
    with scratch_database() as (database_url, redis_url):
        for module in modules:
            if chosen and module.__name__.removeprefix("bench.") not in chosen:
                continue
            for figure in module.run(database_url, redis_url):
                print(figure.line(), flush=True)
                figures.append(figure)
    missed = [f.name for f in figures if not f.ok]
    print(
        f"\n{len(figures) - len(missed)} of {len(figures)} figures on target "
        f"({time.monotonic() - started:.0f} s)"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
