"""Worker slots (``duejobs worker --concurrency N``) against RQ's own ways to run jobs at once.

Each side runs as real worker processes in burst mode over jobs already waiting; its time is
the span from the first job's start to the last job's end, read from the jobs themselves
(RQ's ``started_at``/``ended_at``, duejobs' ``started_at``/``finished_at``), so process
start-up counts on neither side. Memory is the largest resident set summed over a side's
process tree (the pool's parent, its workers and their forked work horses), sampled every
0.1 s. Medians of ``ROUNDS`` alternated rounds.

Both the slotted duejobs worker and the bare ``SimpleWorker`` beside it run pinned to the
machine's last CPU (``PIN_CPU``; ``duejobs worker --cpus``, as the README recommends for
slotted workers where other CPUs serve PostgreSQL and Redis); ``rq worker-pool``'s eight
processes are not pinned.

* no-op jobs/s: one duejobs process with 16 slots against one bare RQ ``SimpleWorker``;
* PostgreSQL commits per job (``pg_stat_database.xact_commit`` over the worker's run): the
  slots' batched claims and outcomes against one slot, which claims and closes each job
  alone (two commits a job);
* jobs whose handler sleeps 50 ms (a network call): one duejobs process with 32 slots against
  one bare ``SimpleWorker`` (measured on ``NAP_BARE`` jobs: 2,000 would take it 100 s), and
  against ``rq worker-pool -n 8`` (RQ's default worker class, a fork per job; the bare jobs
  live in a module that imports nothing heavy, so that a fork does not pay for an import).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import utcparse

from bench.common import Figure, fill_due
from bench.procs import ROOT
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler, SchedulerConfig

NOOP = int(os.environ.get("BENCH_SLOTS_NOOP_JOBS", "2000"))
NAP = int(os.environ.get("BENCH_SLOTS_NAP_JOBS", "2000"))
NAP_BARE = int(os.environ.get("BENCH_SLOTS_NAP_BARE_JOBS", "200"))
ROUNDS = int(os.environ.get("BENCH_SLOTS_ROUNDS", "3"))
PIN_CPU = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it (0 once it is gone)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += _rss(int(child))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


def _cpu() -> float:
    """CPU seconds (user and system) of this process's ended children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run(args: list[str], env: dict[str, str], root: Path = ROOT) -> int:
    """Run a burst worker command to its end (the code of the checkout at ``root``); the
    largest RSS of its tree meanwhile."""
    proc = subprocess.Popen(
        args,
        env={**os.environ, **env, "PYTHONPATH": str(root)},
        cwd=root,
        stdout=subprocess.DEVNULL,
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.1):
            peak = max(peak, _rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        assert proc.wait(timeout=1800) == 0, args
    finally:
        stop.set()
        sampler.join()
    return peak


def commands(redis: Redis) -> int:
    """Commands Redis has run since its statistics were last reset (``INFO commandstats``,
    which counts those a script runs), the ``INFO`` asking it left out."""
    stats = redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values()) - 1


def _bare(
    redis: Redis, env: dict[str, str], function: str, n: int, pool: int
) -> tuple[float, int, float]:
    """(jobs/s, peak RSS, Redis commands per job) of bare RQ: one SimpleWorker, or
    ``rq worker-pool -n POOL``."""
    redis.flushdb()
    queue = Queue("bare", connection=redis, serializer=JSONSerializer)
    for start in range(0, n, 1000):
        queue.enqueue_many(
            [
                Queue.prepare_data(function, job_id=f"bare-{i}", result_ttl=3600)
                for i in range(start, min(start + 1000, n))
            ]
        )
    redis.config_resetstat()
    if pool:
        url = env["DUEJOBS_REDIS_URL"]
        command = ["worker-pool", "bare", "-n", str(pool), "-b", "-S", "json", "-u", url]
        rss = _run([sys.executable, "-m", "rq.cli", *command, "-l", "WARNING"], env)
    else:
        pinned = {**env, "BENCH_PIN_CPU": str(PIN_CPU)} if PIN_CPU is not None else env
        rss = _run([sys.executable, "-m", "bench.procs", "bare", "bare"], pinned)
    per_job = commands(redis) / n
    with redis.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.hmget(f"rq:job:bare-{i}", "started_at", "ended_at")
        stamps = [(utcparse(s.decode()), utcparse(e.decode())) for s, e in pipe.execute()]
    span = (max(e for _, e in stamps) - min(s for s, _ in stamps)).total_seconds()
    return n / span, rss, per_job


def _commits(app: App) -> int:
    """Transactions committed in the bench's database so far, once every other session has
    ended (a backend's counts reach the statistics when it exits)."""
    with app.engine.connect() as conn:
        wait_for_alone = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        for _ in range(300):
            if conn.exec_driver_sql(wait_for_alone).scalar_one() == 0:
                break
            conn.rollback()
            time.sleep(0.1)
        conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
        return int(
            conn.exec_driver_sql(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).scalar_one()
        )


def ours(
    app: App,
    redis: Redis,
    env: dict[str, str],
    job_type: str,
    n: int,
    slots: int,
    root: Path = ROOT,
) -> tuple[float, int, float, float, float]:
    """(jobs/s, peak RSS, PostgreSQL commits per job, CPU milliseconds per job, start-up
    included, Redis commands per job) of one duejobs worker process with ``slots`` slots,
    running the code of the checkout at ``root``."""
    redis.flushdb()
    fill_due(libpq_url(app.settings.database_url), n, job_type=job_type, offset="-1 second")
    scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
    scheduler.run_once()
    scheduler.close()
    app.engine.dispose()
    before = _commits(app)
    worker = ["worker", "--app", "bench.jobs:app", "--burst", "--concurrency", str(slots)]
    if slots > 1 and PIN_CPU is not None:
        worker += ["--cpus", str(PIN_CPU)]
    cpu = _cpu()
    redis.config_resetstat()
    rss = _run([sys.executable, "-m", "duejobs", *worker, "--log-level", "warning"], env, root)
    per_job = commands(redis) / n
    cpu = _cpu() - cpu
    commits = _commits(app) - before
    with app.engine.connect() as conn:
        done, span = conn.exec_driver_sql(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
            "extract(epoch FROM max(finished_at) - min(started_at)) FROM scheduled_jobs"
        ).one()
    assert done == n, done
    return n / float(span), rss, commits / n, 1000 * cpu / n, per_job


def _median_rounds(
    sides: list[Callable[[], tuple[float, ...]]],
) -> list[tuple[float, ...]]:
    """Each side once per round, alternated; the median of each of a side's figures."""
    results: list[list[tuple[float, ...]]] = [[] for _ in sides]
    for _ in range(ROUNDS):
        for i, side in enumerate(sides):
            results[i].append(side())
    return [tuple(statistics.median(column) for column in zip(*rs, strict=True)) for rs in results]


def run(database_url: str, redis_url: str) -> list[Figure]:
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    redis = Redis.from_url(redis_url)
    app = App(database_url=database_url, redis_url=redis_url)
    try:
        sixteen, bare, one = _median_rounds(
            [
                lambda: ours(app, redis, env, "noop", NOOP, 16),
                lambda: _bare(redis, env, "bench.bare_jobs.noop", NOOP, 0),
                lambda: ours(app, redis, env, "noop", NOOP, 1),
            ]
        )
        noop, _, noop_commits, noop_cpu, noop_commands = sixteen
        bare_noop, _, bare_commands = bare
        one_commits, one_commands = one[2], one[4]
        (nap, nap_rss, nap_commits, nap_cpu, _), (bare_nap, *_), (pool_nap, pool_rss, _) = (
            _median_rounds(
                [
                    lambda: ours(app, redis, env, "nap", NAP, 32),
                    lambda: _bare(redis, env, "bench.bare_jobs.nap", NAP_BARE, 0),
                    lambda: _bare(redis, env, "bench.bare_jobs.nap", NAP, 8),
                ]
            )
        )
    finally:
        app.close()
    print(
        f"  CPU per job of the worker process, start-up included: no-op x 16 slots "
        f"{noop_cpu:.2f} ms, 50 ms x 32 slots {nap_cpu:.2f} ms",
        flush=True,
    )
    print(
        f"  Redis commands per no-op job: 16 slots {noop_commands:.1f} at {noop:.0f} jobs/s, "
        f"1 slot {one_commands:.1f}; a bare SimpleWorker {bare_commands:.1f}",
        flush=True,
    )
    mib = 1024 * 1024
    return [
        Figure(
            "slots: no-op jobs/s, 1 process x 16 slots",
            noop,
            bare_noop,
            "jobs/s",
            ">= 3x 1 bare SimpleWorker",
            noop >= 3 * bare_noop,
        ),
        Figure(
            "slots: 50 ms jobs/s, 1 process x 32 slots",
            nap,
            bare_nap,
            "jobs/s",
            ">= 20x 1 bare SimpleWorker",
            nap >= 20 * bare_nap,
        ),
        Figure(
            "slots: 50 ms jobs/s vs rq worker-pool -n 8",
            nap,
            pool_nap,
            "jobs/s",
            ">= 1.0x the pool",
            nap >= pool_nap,
        ),
        Figure(
            "slots: Redis commands/job, 16 slots, no-op",
            noop_commands,
            bare_commands,
            "cmds",
            "<= 12 per job",
            noop_commands <= 12,
        ),
        Figure(
            "slots: Redis commands/job, 1 slot, no-op",
            one_commands,
            bare_commands,
            "cmds",
            "<= 12 per job",
            one_commands <= 12,
        ),
        Figure(
            "slots: PostgreSQL commits/job, 16 slots, no-op",
            noop_commits,
            one_commits,
            "commits",
            "<= 0.5x one slot (unbatched)",
            noop_commits <= 0.5 * one_commits,
        ),
        Figure(
            "slots: PostgreSQL commits/job, 32 slots, 50 ms",
            nap_commits,
            one_commits,
            "commits",
            "<= 0.5x one slot (unbatched)",
            nap_commits <= 0.5 * one_commits,
        ),
        Figure(
            "slots: memory (RSS), 1 x 32 slots vs the pool of 8",
            nap_rss / mib,
            pool_rss / mib,
            "MiB",
            "<= 0.25x the pool",
            nap_rss <= 0.25 * pool_rss,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
