"""duejobs against Procrastinate, the PostgreSQL-only peer a team would pick instead.

Both run on the same PostgreSQL (Procrastinate in a scratch database of its own, its schema
applied by its own ``schema --apply``), the same ``async def`` handler (``asyncio.sleep`` of
50 ms, a network call), as real worker processes started by their own command lines:

* **async jobs/s**: ``ASYNC_JOBS`` jobs already waiting; one duejobs worker process with
  ``--concurrency 200`` against one Procrastinate worker with ``--concurrency 200``
  (``--one-shot``: it exits once the queue is empty, as duejobs' ``--burst`` does). Each
  side's time is the span from its first job's start to its last job's end, read from its
  own records (duejobs' ``started_at``/``finished_at``; Procrastinate's ``started`` and
  ``succeeded`` events); and, **start-up counted**, from the moment its process is spawned
  to its last job's end (what a deploy, or a burst worker per batch, pays).
* **first job**: one no-op job waiting; a burst worker's spawn to that job's end, on each
  side (what a worker started per event pays before any work is done).
* **peak**: ``PEAK_JOBS`` jobs all due at one instant ``LEAD`` seconds ahead, written before
  any process starts; 2 processes x 32 on each side (duejobs: ``worker --processes 2
  --concurrency 32`` and one scheduler; Procrastinate: two ``worker --concurrency 32``).
  Drain time: from the instant to the last job's end; lag: each job's start minus the
  instant, p50 and p99.

Procrastinate's settings: its defaults, except a connection pool of up to 50 (psycopg_pool's
default of 4 would be its limit at 200 jobs at once) and, in the peak, a polling interval of
0.1 s (its default is 5 s: a job scheduled for later is found at the next poll, since no
NOTIFY is sent when its time comes), which is the poll interval of duejobs' scheduler.
Medians of ``ROUNDS`` alternated rounds.
"""

from __future__ import annotations

import compileall
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import psycopg
from redis import Redis

from bench.common import Figure, empty_database, fill_due, percentile, wait_until
from bench.procs import ROOT
from duejobs import App
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler, SchedulerConfig

ASYNC_JOBS = int(os.environ.get("BENCH_PEER_ASYNC_JOBS", "2000"))
PEAK_JOBS = int(os.environ.get("BENCH_PEER_PEAK_JOBS", "10000"))
ROUNDS = int(os.environ.get("BENCH_PEER_ROUNDS", "3"))
FIRST_JOB_MS = 300  # a burst worker's spawn to its first job's end, on a quiet machine
LEAD = 20.0  # seconds between writing the peak's jobs and their instant
PEER = ["-m", "procrastinate", "--app", "bench.peer_jobs.app"]
DUEJOBS = ["-m", "duejobs"]
PEAK_WORKERS = ["worker", "--app", "bench.jobs:app", "--processes", "2", "--concurrency", "32"]


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # Procrastinate logs every job; a failure shows in the exit
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[bytes], stop: bool) -> None:
    """Wait for a burst process to end (or stop a serving one warmly first)."""
    if stop:
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=600) == 0, proc.args


@contextmanager
def _peer_database(database_url: str) -> Iterator[str]:
    """A scratch database for Procrastinate beside duejobs' one, its schema applied."""
    with empty_database(libpq_url(database_url), "duejobs_peer") as url:
        _finish(_start([*PEER, "schema", "--apply"], {"PEER_DATABASE_URL": url}), stop=False)
        yield url


def _peer_jobs(url: str, n: int, at: str | None, task: str = "anap") -> None:
    """``n`` Procrastinate jobs of ``task``, due now or at the instant ``at``, written as
    Procrastinate writes a batch (its own defer function), after emptying its tables."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs, procrastinate_workers CASCADE")
        conn.execute(
            "SELECT procrastinate_defer_jobs_v1(array_agg(ROW('default', %(task)s, 0, NULL, "
            "NULL, '{}'::jsonb, %(at)s::timestamptz)::procrastinate_job_to_defer_v1)) "
            "FROM generate_series(1, %(n)s)",
            {"n": n, "at": at, "task": task},
        )


def _peer_times(url: str) -> list[tuple[datetime, datetime]]:
    """(started, succeeded) of every Procrastinate job, from its events."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT min(at) FILTER (WHERE type = 'started'), "
            "min(at) FILTER (WHERE type = 'succeeded') "
            "FROM procrastinate_events GROUP BY job_id"
        ).fetchall()
    return [(s, e) for s, e in rows if s is not None and e is not None]


def _our_times(url: str) -> list[tuple[datetime, datetime]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT started_at, finished_at FROM scheduled_jobs WHERE status = 'succeeded'"
        ).fetchall()
    return [(s, e) for s, e in rows]


def _done(read: Callable[[str], list[tuple[datetime, datetime]]], url: str, n: int) -> bool:
    return len(read(url)) >= n


def _rate(times: list[tuple[datetime, datetime]], n: int) -> float:
    assert len(times) == n, (len(times), n)
    return n / (max(e for _, e in times) - min(s for s, _ in times)).total_seconds()


def _counted(times: list[tuple[datetime, datetime]], n: int, spawned: datetime) -> float:
    """Jobs per second from the process's spawn to its last job's end."""
    assert len(times) == n, (len(times), n)
    return n / (max(e for _, e in times) - spawned).total_seconds()


Times = list[tuple[datetime, datetime]]


def _our_burst(
    app: App, env: dict[str, str], url: str, redis: Redis, n: int, job_type: str, slots: int
) -> tuple[Times, datetime]:
    """``n`` jobs of ``job_type`` pushed, then a burst worker of ``slots`` spawned: its
    jobs' (start, end) and the instant it was spawned."""
    redis.flushdb()
    fill_due(url, n, job_type=job_type, offset="-1 second")
    scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
    scheduler.run_once()
    scheduler.close()
    worker = ["worker", "--app", "bench.jobs:app", "--burst", "--concurrency", str(slots)]
    spawned = datetime.now(UTC)
    _finish(_start([*DUEJOBS, *worker, "--log-level", "warning"], env), stop=False)
    return _our_times(url), spawned


def _peer_burst(peer_url: str, n: int, task: str, slots: int) -> tuple[Times, datetime]:
    """The same for Procrastinate: ``n`` jobs of ``task``, a ``--one-shot`` worker."""
    _peer_jobs(peer_url, n, None, task=task)
    worker = ["worker", "--concurrency", str(slots), "--one-shot"]
    spawned = datetime.now(UTC)
    _finish(_start([*PEER, *worker], {"PEER_DATABASE_URL": peer_url}), stop=False)
    return _peer_times(peer_url), spawned


def _our_async(app: App, env: dict[str, str], url: str, redis: Redis) -> tuple[float, float]:
    times, spawned = _our_burst(app, env, url, redis, ASYNC_JOBS, "anap", 200)
    return _rate(times, ASYNC_JOBS), _counted(times, ASYNC_JOBS, spawned)


def _peer_async(peer_url: str) -> tuple[float, float]:
    times, spawned = _peer_burst(peer_url, ASYNC_JOBS, "anap", 200)
    return _rate(times, ASYNC_JOBS), _counted(times, ASYNC_JOBS, spawned)


def _first_job_ms(burst: tuple[Times, datetime]) -> float:
    """Milliseconds from a burst worker's spawn to the end of the one job waiting for it."""
    [(_, ended)], spawned = burst
    return (ended - spawned).total_seconds() * 1000


def _instant(url: str, lead: float = LEAD) -> datetime:
    """A whole second ``lead`` seconds ahead, by the database clock."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT date_trunc('second', now()) + make_interval(secs => %s)", (lead,)
        ).fetchone()
    assert row is not None
    instant: datetime = row[0]
    return instant


def _peak_figures(
    times: list[tuple[datetime, datetime]], instant: datetime, n: int
) -> tuple[float, float, float]:
    """(drain seconds, lag p50, lag p99 in ms) from the instant."""
    assert len(times) == n, (len(times), n)
    lags = [(s - instant).total_seconds() * 1000 for s, _ in times]
    drain = (max(e for _, e in times) - instant).total_seconds()
    return drain, percentile(lags, 0.5), percentile(lags, 0.99)


def _our_peak(env: dict[str, str], url: str, redis: Redis) -> tuple[float, float, float]:
    redis.flushdb()
    instant = _instant(url)
    fill_due(url, PEAK_JOBS, job_type="anap", offset=f"{LEAD} seconds")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE scheduled_jobs SET run_at = %(t)s, due_at = %(t)s", {"t": instant})
    procs = [
        _start([*DUEJOBS, "scheduler", "--log-level", "warning"], env),
        _start([*DUEJOBS, *PEAK_WORKERS, "--log-level", "warning"], env),
    ]
    try:
        wait_until(lambda: _done(_our_times, url, PEAK_JOBS), 600, "duejobs' peak", every=0.5)
    finally:
        for proc in procs:
            _finish(proc, stop=True)
    return _peak_figures(_our_times(url), instant, PEAK_JOBS)


def _peer_peak(peer_url: str) -> tuple[float, float, float]:
    instant = _instant(peer_url)
    _peer_jobs(peer_url, PEAK_JOBS, instant.isoformat())
    worker = ["worker", "--concurrency", "32", "--fetch-job-polling-interval", "0.1"]
    procs = [_start([*PEER, *worker], {"PEER_DATABASE_URL": peer_url}) for _ in range(2)]
    try:
        wait_until(
            lambda: _done(_peer_times, peer_url, PEAK_JOBS), 600, "Procrastinate's peak", 0.5
        )
    finally:
        for proc in procs:
            _finish(proc, stop=True)
    return _peak_figures(_peer_times(peer_url), instant, PEAK_JOBS)


def _median(values: list[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(statistics.median(column) for column in zip(*values, strict=True))


def run(database_url: str, redis_url: str) -> list[Figure]:
    # duejobs' modules compiled as an install from a wheel has them (Procrastinate's are, in
    # site-packages): a source tree run with PYTHONDONTWRITEBYTECODE compiles them at each
    # start, 80 ms of a worker's start-up.
    compileall.compile_dir(ROOT / "duejobs", quiet=1)
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    url = libpq_url(database_url)
    redis = Redis.from_url(redis_url)
    ours: list[tuple[float, ...]] = []
    theirs: list[tuple[float, ...]] = []
    app = App(database_url=database_url, redis_url=redis_url)
    try:
        with _peer_database(database_url) as peer_url:
            for _ in range(ROUNDS):
                ours.append(
                    (
                        *_our_async(app, env, url, redis),
                        *_our_peak(env, url, redis),
                        _first_job_ms(_our_burst(app, env, url, redis, 1, "noop", 1)),
                    )
                )
                theirs.append(
                    (
                        *_peer_async(peer_url),
                        *_peer_peak(peer_url),
                        _first_job_ms(_peer_burst(peer_url, 1, "noop", 1)),
                    )
                )
    finally:
        app.close()
    (
        (rate, counted, drain, p50, p99, first),
        (
            peer_rate,
            peer_counted,
            peer_drain,
            peer_p50,
            peer_p99,
            peer_first,
        ),
    ) = (_median(ours), _median(theirs))
    print(  # reported beside the drain time, without a target
        f"  peak lag from the instant: duejobs p50 {p50:.0f} ms / p99 {p99:.0f} ms, "
        f"Procrastinate p50 {peer_p50:.0f} ms / p99 {peer_p99:.0f} ms",
        flush=True,
    )
    return [
        Figure(
            "peer: async 50 ms jobs/s, 1 process x 200",
            rate,
            peer_rate,
            "jobs/s",
            ">= 1.0x Procrastinate",
            rate >= peer_rate,
        ),
        Figure(
            "peer: the same, start-up counted (spawn to last job)",
            counted,
            peer_counted,
            "jobs/s",
            ">= 1.3x Procrastinate",
            counted >= 1.3 * peer_counted,
        ),
        Figure(
            "peer: spawn to the first job's end (1 no-op waiting)",
            first,
            peer_first,
            "ms",
            f"<= {FIRST_JOB_MS} ms",
            first <= FIRST_JOB_MS,
        ),
        Figure(
            f"peer: peak of {PEAK_JOBS:,} at one instant, 2 x 32",
            drain,
            peer_drain,
            "s",
            "<= 1.0x Procrastinate",
            drain <= peer_drain,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
