"""duejobs' side of the comparisons with the Redis-only peers (``bench.peer_bullmq``,
``bench.peer_celery``): each figure measured the way the peer's module measures its own.

* **peak**: ``PEAK_JOBS`` no-op jobs due at one instant ``LEAD`` seconds ahead, written before
  any process starts; one scheduler and ``worker --processes 2 --concurrency 32``. Drain: from
  the instant to the last job's end; lag: each start minus the instant; CPU: every process of
  the side (scheduler, supervisor and its workers), PostgreSQL and Redis, from the instant to
  the drain's end, per job.
* **start accuracy**: ``bench.lag``'s steady load (a scheduler and a worker; start minus
  ``run_at`` by the database clock).
* **changes**: ``CHANGES`` schedules due in two minutes, pushed; even ones cancelled, odd ones
  rescheduled, one call at a time, or from 32 threads at once.
* **Redis restarted empty**: ``EMPTIED_JOBS`` jobs due over ``EMPTIED_SPREAD`` seconds, the
  scheduler, a worker and a reconciler (``--every 5s``) running on a Redis of the figure's own
  (no persistence), killed and started again a quarter of the way in; lost: those never run
  within two minutes of the last due time.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from redis import Redis
from rq.registry import FinishedJobRegistry

from bench import changes as change_bench
from bench.chaos import Servers
from bench.common import Figure, fill_due, percentile, wait_until
from bench.cpu import Meter
from bench.lag import duejobs_lags
from bench.peer import DUEJOBS, _finish, _instant, _start
from duejobs import App
from duejobs.delivery import DEFAULT_QUEUE

PEAK_JOBS = int(os.environ.get("BENCH_PEER_PEAK_JOBS", "10000"))
LEAD = 8.0  # seconds from writing the peak's jobs to their instant: every process is up
CHANGES = int(os.environ.get("BENCH_PEER_CHANGES", "1000"))
EMPTIED_JOBS = 2000
EMPTIED_SPREAD = 20.0
PEAK_WORKERS = ["worker", "--app", "bench.jobs:app", "--processes", "2", "--concurrency", "32"]
QUIET = ["--log-level", "warning"]


@dataclass(frozen=True)
class Peak:
    """One side's peak: drain seconds, the first start and lag p50/p99 (ms from the instant),
    CPU ms per job by part."""

    drain: float
    first: float
    lag_p50: float
    lag_p99: float
    cpu: dict[str, float]

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu.values())


def peak_of(
    spans: list[tuple[float, float]], instant: float, cpu_seconds: dict[str, float]
) -> Peak:
    """A peak from each job's (start, end) in seconds since the epoch."""
    assert len(spans) == PEAK_JOBS, (len(spans), PEAK_JOBS)
    lags = [(start - instant) * 1000 for start, _ in spans]
    return Peak(
        drain=max(end for _, end in spans) - instant,
        first=min(lags),
        lag_p50=percentile(lags, 0.5),
        lag_p99=percentile(lags, 0.99),
        cpu={part: s * 1000 / PEAK_JOBS for part, s in cpu_seconds.items()},
    )


def median_peak(peaks: list[Peak]) -> Peak:
    return Peak(
        drain=statistics.median(p.drain for p in peaks),
        first=statistics.median(p.first for p in peaks),
        lag_p50=statistics.median(p.lag_p50 for p in peaks),
        lag_p99=statistics.median(p.lag_p99 for p in peaks),
        cpu={part: statistics.median(p.cpu[part] for p in peaks) for part in peaks[0].cpu},
    )


def parts(peak: Peak) -> str:
    """The CPU per job by part, for a report line."""
    return ", ".join(f"{part} {ms:.2f}" for part, ms in peak.cpu.items())


def start_figures(lags: list[float]) -> tuple[float, float, int]:
    """(p50, p99 of |start - due| in ms, starts before their due time) of lags in ms."""
    off = [abs(lag) for lag in lags]
    return percentile(off, 0.5), percentile(off, 0.99), sum(lag < 0 for lag in lags)


def sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def _spans(url: str) -> list[tuple[float, float]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT started_at, finished_at FROM scheduled_jobs WHERE status = 'succeeded'"
        ).fetchall()
    return [(s.timestamp(), e.timestamp()) for s, e in rows]


def _succeeded(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def peak(env: dict[str, str], url: str, redis: Redis, meter: Meter) -> Peak:
    redis.flushdb()
    at: datetime = _instant(url, LEAD)
    fill_due(url, PEAK_JOBS, job_type="noop", offset=f"{LEAD} seconds")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE scheduled_jobs SET run_at = %(t)s, due_at = %(t)s", {"t": at})
    procs = [
        _start([*DUEJOBS, "scheduler", *QUIET], env),
        _start([*DUEJOBS, *PEAK_WORKERS, *QUIET], env),
    ]
    side = meter.with_pids(p.pid for p in procs)
    try:
        instant = at.timestamp()
        sleep_until(instant)
        before = side.read()
        # Watched in RQ's finished registry, written once each outcome is committed: a read
        # of Redis, as the peers' are watched, not a count of PostgreSQL's rows ten times a
        # second, which would be counted in duejobs' CPU (peak_of counts the rows, once).
        finished = FinishedJobRegistry(DEFAULT_QUEUE, connection=redis).key
        wait_until(lambda: redis.zcard(finished) >= PEAK_JOBS, 600, "duejobs' peak", every=0.1)
        spent = side.read().since(before)
    finally:
        for proc in procs:
            _finish(proc, stop=True)
    return peak_of(_spans(url), instant, spent)


def start_lags(database_url: str, redis_url: str) -> list[float]:
    """``bench.lag``'s steady load: each start's lag in ms (negative: early)."""
    return [lag * 1000 for lag in duejobs_lags(database_url, redis_url)]


def changes(app: App, redis: Redis, together: bool) -> float:
    """Seconds for ``CHANGES`` changes (half cancels, half reschedules) of pushed schedules."""
    ids = change_bench._pushed(app, redis, backlog=0, n=CHANGES)
    calls: list[Callable[[], object]] = [
        partial(app.cancel, s) if i % 2 == 0 else partial(app.reschedule, s, delay=180)
        for i, s in enumerate(ids)
    ]
    rate, _, _ = change_bench._timed(calls, 32 if together else 1)
    return len(calls) / rate


@contextmanager
def own_redis() -> Iterator[Servers]:
    """A Redis server of the figure's own (``bench.chaos.Servers``: no persistence), so that
    restarting it empty is real and touches nothing else; stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="duejobs-peer-") as folder:
        servers = Servers(Path(folder), postgres=False)
        try:
            yield servers
        finally:
            servers.stop()


def spread_due() -> list[float]:
    """The restart figure's due times: ``EMPTIED_JOBS`` over ``EMPTIED_SPREAD`` seconds from
    two seconds on (seconds since the epoch)."""
    start = time.time() + 2
    return [start + EMPTIED_SPREAD * i / EMPTIED_JOBS for i in range(EMPTIED_JOBS)]


def restart_when_a_quarter_is_due(servers: Servers, due: list[float]) -> None:
    """Restart the Redis empty a quarter of the way through ``due``, then wait for the last
    due time and a few seconds more."""
    sleep_until(due[len(due) // 4])
    servers.restart_redis()
    sleep_until(due[-1] + 5)


def restarted_lost(env: dict[str, str], url: str, servers: Servers) -> int:
    """Jobs never run after Redis was restarted empty while they waited (:data:`__doc__`)."""
    env = {**env, "DUEJOBS_REDIS_URL": servers.redis_url}
    due = spread_due()
    fill_due(url, EMPTIED_JOBS, job_type="noop")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE scheduled_jobs s SET run_at = d.at, due_at = d.at FROM (SELECT id, "
            "to_timestamp(%(due)s[row_number() OVER (ORDER BY id)]) AS at FROM scheduled_jobs) d "
            "WHERE d.id = s.id",
            {"due": due},
        )
    procs = [
        _start([*DUEJOBS, "scheduler", *QUIET], env),
        _start([*DUEJOBS, "worker", "--app", "bench.jobs:app", *QUIET], env),
        _start([*DUEJOBS, "reconcile", "--every", "5s", *QUIET], env),
    ]
    try:
        restart_when_a_quarter_is_due(servers, due)
        wait_until(lambda: _succeeded(url) >= EMPTIED_JOBS, 120, "duejobs after the restart")
    except TimeoutError:
        pass  # what did not run is the figure
    finally:
        for proc in procs:
            _finish(proc, stop=True)
    return EMPTIED_JOBS - _succeeded(url)


# -- what every peer's module shares -----------------------------------------------------------


@dataclass
class Rounds:
    """Each figure's value per alternated round: duejobs' under its name, the peer's under
    ``name:peer``."""

    values: dict[str, list[Any]] = field(default_factory=dict)

    def both(self, name: str, mine: Callable[[], Any], theirs: Callable[[], Any]) -> None:
        """One round of a figure: duejobs' side, then the peer's."""
        self.values.setdefault(name, []).append(mine())
        self.values.setdefault(f"{name}:peer", []).append(theirs())

    def medians(self, name: str) -> tuple[float, float]:
        """(duejobs', the peer's) median of a figure measured as one number."""
        mine, theirs = self.values[name], self.values[f"{name}:peer"]
        return statistics.median(mine), statistics.median(theirs)


def shared_figures(
    peer: str, rounds: Rounds, *, instant: str, cpu_most: float, hz: str | None = None
) -> list[Figure]:
    """The figures every peer is held to, printed with the peak's and the starts' detail:
    the peak's drain (``instant`` names how its jobs were due) and its CPU per job (at most
    ``cpu_most`` times the peer's), then start accuracy (``hz``: Redis', where the peer's
    precision follows it)."""
    mine, theirs = median_peak(rounds.values["peak"]), median_peak(rounds.values["peak:peer"])
    starts = [start_figures(r) for r in rounds.values["lags"]]
    peer_starts = [start_figures(r) for r in rounds.values["lags:peer"]]

    def med(values: list[tuple[float, float, int]], i: int) -> float:
        return statistics.median(v[i] for v in values)

    where = "" if hz is None else f" (Redis hz {hz})"
    print(
        f"  peak CPU ms per job: duejobs {parts(mine)}; {peer} {parts(theirs)}\n"
        f"  peak start from the instant first/p50/p99: duejobs {mine.first:.0f}/"
        f"{mine.lag_p50:.0f}/{mine.lag_p99:.0f} ms, {peer} {theirs.first:.0f}/"
        f"{theirs.lag_p50:.0f}/{theirs.lag_p99:.0f} ms\n"
        f"  start |start - due| p50/p99{where}: duejobs {med(starts, 0):.1f}/"
        f"{med(starts, 1):.1f} ms, {med(starts, 2):.0f} early; {peer} "
        f"{med(peer_starts, 0):.1f}/{med(peer_starts, 1):.1f} ms, "
        f"{med(peer_starts, 2):.0f} early",
        flush=True,
    )
    key = peer.lower()
    return [
        Figure(
            f"{key}: peak of {PEAK_JOBS:,} at {instant}, 2 x 32",
            mine.drain,
            theirs.drain,
            "s",
            f"<= 1.0x {peer}",
            mine.drain <= theirs.drain,
        ),
        Figure(
            f"{key}: peak CPU per job, every process and server",
            mine.cpu_total,
            theirs.cpu_total,
            "ms",
            f"<= {cpu_most:.1f}x {peer}",
            mine.cpu_total <= cpu_most * theirs.cpu_total,
        ),
        Figure(
            f"{key}: start |start - due| p50",
            med(starts, 0),
            med(peer_starts, 0),
            "ms",
            "<= 5 ms",
            med(starts, 0) <= 5,
        ),
        Figure(
            f"{key}: start |start - due| p99",
            med(starts, 1),
            med(peer_starts, 1),
            "ms",
            "<= 20 ms, 0 early",
            med(starts, 1) <= 20 and med(starts, 2) == 0,
        ),
    ]


def lost_figure(peer: str, lost: tuple[int, int]) -> Figure:
    """Jobs lost when Redis restarted empty: (duejobs', the peer's)."""
    print(f"  Redis restarted empty, lost of {EMPTIED_JOBS:,}: duejobs {lost[0]}, {peer} {lost[1]}")
    return Figure(
        f"{peer.lower()}: Redis restarted empty, lost of {EMPTIED_JOBS:,}",
        lost[0],
        lost[1],
        "jobs",
        "0",
        lost[0] == 0,
    )
