"""Urgent jobs during a backlog on the same queue, beside their lag on an idle system, and
the same run on Procrastinate's priorities.

One scheduler and one worker of PRIO_SLOTS (16) slots (Procrastinate: one worker of as many),
no-op jobs. Three phases each, all times by the database clock:

1. idle: PRIO_URGENT (100) jobs of priority 50 written one every 50 ms, due at once — their
   lag (start minus due) p50/p99 is the baseline;
2. backlog alone: PRIO_BULK (50,000) jobs of priority -50 due at one instant (written
   before, so no start-up is counted) — the time from the instant to the last one's end;
3. backlog with urgent work: the same backlog, and 2 s into its drain the urgent stream of
   phase 1 — the urgent jobs' lag p99, and the backlog's drain time again.

Targets (duejobs): the urgent p99 during the backlog <= 2x its idle p99 (seen 1.3x); the
backlog's drain with them <= 1.1x without. Procrastinate's figures are printed beside
duejobs' (its fetch orders by priority, then id).

    python -m bench.priority
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg

from bench.common import Figure, percentile, wait_until
from bench.peer import DUEJOBS, PEER, _finish, _peer_database, _start
from duejobs.config import libpq_url

BULK = int(os.environ.get("PRIO_BULK", "50000"))
URGENT = int(os.environ.get("PRIO_URGENT", "100"))
SLOTS = int(os.environ.get("PRIO_SLOTS", "16"))
EVERY = 0.05  # seconds between two urgent jobs
INTO = 2.0  # seconds into the backlog's drain the urgent stream begins
LEAD = 8.0  # seconds between writing the backlog and its instant (the processes start)

Lags = list[float]


class Side:
    """One system under the run: how it writes jobs, starts and reads them."""

    name: str

    def __init__(self, url: str) -> None:
        self.url = url

    def start(self) -> list[subprocess.Popen[bytes]]:
        raise NotImplementedError

    def backlog(self, at: datetime) -> None:
        raise NotImplementedError

    def urgent(self, conn: psycopg.Connection) -> None:
        raise NotImplementedError

    def done(self) -> int:
        raise NotImplementedError

    def urgent_lags(self) -> Lags:
        raise NotImplementedError

    def last_bulk_end(self) -> datetime:
        raise NotImplementedError

    def empty(self) -> None:
        raise NotImplementedError


class Ours(Side):
    name = "duejobs"

    def __init__(self, url: str, env: dict[str, str]) -> None:
        super().__init__(url)
        self.env = env

    def start(self) -> list[subprocess.Popen[bytes]]:
        worker = ["worker", "--app", "bench.jobs:app", "--concurrency", str(SLOTS)]
        return [
            _start([*DUEJOBS, "scheduler", "--log-level", "warning"], self.env),
            _start([*DUEJOBS, *worker, "--log-level", "warning"], self.env),
        ]

    def backlog(self, at: datetime) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute(
                "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at, priority) "
                "SELECT gen_random_uuid(), 'noop', '{}', %(at)s, %(at)s, -50 "
                "FROM generate_series(1, %(n)s)",
                {"at": at, "n": BULK},
            )
            conn.execute("ANALYZE scheduled_jobs")

    def urgent(self, conn: psycopg.Connection) -> None:
        # As App.schedule writes it, due now by the database clock, without its Python cost.
        conn.execute(
            "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at, priority) "
            "VALUES (gen_random_uuid(), 'noop', '{}', now(), now(), 50)"
        )

    def done(self) -> int:
        return _one(self.url, "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")

    def urgent_lags(self) -> Lags:
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM started_at - due_at) FROM scheduled_jobs "
                "WHERE priority > 0 AND status = 'succeeded'"
            ).fetchall()
        return [float(r[0]) for r in rows]

    def last_bulk_end(self) -> datetime:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "SELECT max(finished_at) FROM scheduled_jobs WHERE priority < 0"
            ).fetchone()
        assert row is not None
        end: datetime = row[0]
        return end

    def empty(self) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute(
                "TRUNCATE scheduled_jobs, scheduled_job_events, scheduled_job_attempts, "
                "scheduled_job_effects, scheduled_job_results"
            )


class Theirs(Side):
    name = "Procrastinate"

    def start(self) -> list[subprocess.Popen[bytes]]:
        worker = ["worker", "--concurrency", str(SLOTS)]
        return [_start([*PEER, *worker], {"PEER_DATABASE_URL": self.url})]

    def backlog(self, at: datetime) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute(
                "SELECT procrastinate_defer_jobs_v1(array_agg(ROW('default', 'noop', -50, "
                "NULL, NULL, '{}'::jsonb, %(at)s)::procrastinate_job_to_defer_v1)) "
                "FROM generate_series(1, %(n)s)",
                {"at": at, "n": BULK},
            )

    def urgent(self, conn: psycopg.Connection) -> None:
        conn.execute(
            "SELECT procrastinate_defer_jobs_v1(ARRAY[ROW('default', 'noop', 50, NULL, NULL, "
            "'{}'::jsonb, NULL)::procrastinate_job_to_defer_v1])"
        )

    def done(self) -> int:
        return _one(self.url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")

    def urgent_lags(self) -> Lags:
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started') "
                "- min(e.at) FILTER (WHERE e.type = 'deferred')) "
                "FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
                "WHERE j.priority > 0 GROUP BY e.job_id"
            ).fetchall()
        return [float(r[0]) for r in rows if r[0] is not None]

    def last_bulk_end(self) -> datetime:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "SELECT max(e.at) FROM procrastinate_events e "
                "JOIN procrastinate_jobs j ON j.id = e.job_id "
                "WHERE j.priority < 0 AND e.type = 'succeeded'"
            ).fetchone()
        assert row is not None
        end: datetime = row[0]
        return end

    def empty(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("TRUNCATE procrastinate_jobs, procrastinate_workers CASCADE")


def _one(url: str, sql: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _db_now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def _stream(side: Side) -> None:
    """The urgent jobs, one every EVERY seconds, each in a transaction of its own."""
    with psycopg.connect(side.url, autocommit=True) as conn:
        for _ in range(URGENT):
            side.urgent(conn)
            time.sleep(EVERY)


def _phase(side: Side, bulk: bool, urgent: bool) -> tuple[float, Lags]:
    """(the backlog's drain time from its instant, in s; the urgent jobs' lags)."""
    side.empty()
    instant = _db_now(side.url) + timedelta(seconds=LEAD)
    if bulk:
        side.backlog(instant)
    procs = side.start()
    total = (BULK if bulk else 0) + (URGENT if urgent else 0)
    try:
        if urgent:
            _sleep_until(side.url, instant + timedelta(seconds=INTO) if bulk else instant)
            _stream(side)
        finished: Callable[[], bool] = lambda: side.done() >= total  # noqa: E731
        wait_until(finished, 900, f"{side.name}'s jobs", every=0.5)
    finally:
        for proc in procs:
            _finish(proc, stop=True)
    drain = (side.last_bulk_end() - instant).total_seconds() if bulk else 0.0
    return drain, side.urgent_lags() if urgent else []


def _sleep_until(url: str, at: datetime) -> None:
    wait = (at - _db_now(url)).total_seconds()
    if wait > 0:
        time.sleep(wait)


def _figures(side: Side) -> tuple[float, float, float, float, float]:
    """(idle p50, idle p99, busy p99 in ms; drain alone, drain with urgent in s)."""
    _, idle = _phase(side, bulk=False, urgent=True)
    alone, _ = _phase(side, bulk=True, urgent=False)
    busy_drain, busy = _phase(side, bulk=True, urgent=True)
    ms = [1000 * x for x in idle]
    return (
        percentile(ms, 0.5),
        percentile(ms, 0.99),
        percentile([1000 * x for x in busy], 0.99),
        alone,
        busy_drain,
    )


def run(database_url: str, redis_url: str) -> list[Figure]:
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    url = libpq_url(database_url)
    ours = _figures(Ours(url, env))
    with _peer_database(database_url) as peer_url:
        theirs = _figures(Theirs(peer_url))
    for side, (p50, p99, busy, alone, drain) in (("duejobs", ours), ("Procrastinate", theirs)):
        print(
            f"  {side}: urgent lag idle p50 {p50:.0f} ms / p99 {p99:.0f} ms, during a "
            f"{BULK:,} backlog p99 {busy:.0f} ms; backlog drain {alone:.1f} s alone, "
            f"{drain:.1f} s with the urgent jobs",
            flush=True,
        )
    (_, idle99, busy99, alone, drain) = ours
    (_, peer_idle99, peer_busy99, peer_alone, peer_drain) = theirs
    return [
        Figure(
            f"priority: urgent p99 lag during a {BULK:,} backlog",
            busy99,
            idle99,
            "ms",
            "<= 2x idle",
            busy99 <= 2 * idle99,
        ),
        Figure(
            "priority: the backlog's drain with urgent jobs",
            drain,
            alone,
            "s",
            "<= 1.1x alone",
            drain <= 1.1 * alone,
        ),
        Figure(
            "priority: Procrastinate's urgent p99 lag, same run",
            peer_busy99,
            peer_idle99,
            "ms",
            "reported",
            True,
        ),
        Figure(
            "priority: Procrastinate's backlog drain with urgent jobs",
            peer_drain,
            peer_alone,
            "s",
            "reported",
            True,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
