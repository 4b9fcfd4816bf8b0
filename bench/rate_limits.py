"""A rate-limited queue beside an unlimited backlog: `python -m bench rate_limits`
(RATE_LIMITED, RATE_FREE, RATE_LIMIT, RATE_SLOTS, RATE_ROUNDS).

One scheduler and one worker of RATE_SLOTS (32) slots serving two queues, the limited one
listed first (the harder order for the other). No-op jobs, all times by the database clock.

1. alone: RATE_FREE (10,000) jobs due at one instant on queue ``free``: the time from the
   instant to the last one's end — the baseline;
2. beside a limit: the same jobs, and RATE_LIMITED (10,000) jobs due at the same instant on
   queue ``limited`` under RATE_LIMIT (``200/s``): the free queue's drain again (target
   <= 1.1x alone), the limited queue's achieved rate (its starts over the span from its first
   start to its last; target within 5% of the limit) and the most of its starts in any window
   of one period (target <= N + 1);
3. beside the same work unlimited: the limited queue's jobs with no limit, each due one
   interval of the limit after the one before (they arrive at the limit's rate): the free
   queue's drain beside the limit against beside them. Where the machine's cores are all
   busy (this one has two), the limited queue's 200 jobs a second take their share of them
   whether a limit or their due times space them; this figure is what the limit costs beyond
   that work (target <= 1.1x).

RATE_ROUNDS (3) rounds of the three, each round in another order; each figure is the median
of its rounds (one phase's drain moves by a third from run to run on this shared machine, and
the first phase of a run on a fresh database is the slowest).

    python -m bench rate_limits
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from datetime import datetime, timedelta

from redis import Redis
from sqlalchemy import text

from bench.common import TABLES, Figure, wait_until
from bench.peer import DUEJOBS, _start
from duejobs import App, ScheduleRequest
from duejobs.rates import parse_rate

LIMITED = int(os.environ.get("RATE_LIMITED", "10000"))
FREE = int(os.environ.get("RATE_FREE", "10000"))
LIMIT = os.environ.get("RATE_LIMIT", "200/s")
SLOTS = int(os.environ.get("RATE_SLOTS", "32"))
ROUNDS = int(os.environ.get("RATE_ROUNDS", "3"))
LEAD = 8.0  # seconds between writing the jobs and their instant (the processes start)


def _phase(
    database_url: str, redis_url: str, limited: int, spaced: bool = False
) -> dict[str, float]:
    """One phase: FREE jobs on ``free`` and ``limited`` on ``limited``, all due at one instant
    (``spaced``: the limited ones with no limit, one interval of it apart from that instant);
    the free drain (s), and the limited queue's starts: rate (/s) and the most in a window."""
    app = App(database_url=database_url, redis_url=redis_url)
    Redis.from_url(redis_url).flushdb()
    with app.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES}"))
    rate = parse_rate(LIMIT)
    if not spaced:
        app.set_rate_limit("limited", rate)
    at = app.now() + timedelta(seconds=LEAD)
    every = rate.period / rate.count if spaced else timedelta(0)
    app.schedule_many(
        [ScheduleRequest("noop", {}, run_at=at, queue="free") for _ in range(FREE)]
        + [
            ScheduleRequest("noop", {}, run_at=at + i * every, queue="limited")
            for i in range(limited)
        ]
    )
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    worker = [*DUEJOBS, "worker", "--app", "bench.jobs:app", "--concurrency", str(SLOTS)]
    procs = [
        _start([*DUEJOBS, "scheduler", "--log-level", "warning"], env),
        _start([*worker, "--queue", "limited", "--queue", "free", "--log-level", "warning"], env),
    ]
    try:
        done = text("SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")

        def finished() -> bool:
            with app.engine.connect() as conn:
                return int(conn.execute(done).scalar_one()) == FREE + limited

        budget = LEAD + 120 + limited / (rate.count / rate.period.total_seconds()) * 1.5
        wait_until(finished, budget, "the rate-limit benchmark")
        with app.engine.connect() as conn:
            free_end = conn.execute(
                text("SELECT max(finished_at) FROM scheduled_jobs WHERE queue = 'free'")
            ).scalar_one()
            starts = [
                r.started_at
                for r in conn.execute(
                    text(
                        "SELECT a.started_at FROM scheduled_job_attempts a "
                        "JOIN scheduled_jobs s ON s.id = a.schedule_id "
                        "WHERE s.queue = 'limited' ORDER BY a.started_at"
                    )
                )
            ]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
        app.close()
    figures = {"free_drain": (free_end - at).total_seconds()}
    if starts:
        span = (starts[-1] - starts[0]).total_seconds()
        figures["rate"] = (len(starts) - 1) / span if span > 0 else float("inf")
        figures["most"] = float(_most_in_a_window(starts, rate.period))
    return figures


def _most_in_a_window(times: list[datetime], period: timedelta) -> int:
    """The most of ``times`` (sorted) in any window ``[t, t + period)``."""
    most, first = 0, 0
    for last, t in enumerate(times):
        while times[first] <= t - period:
            first += 1
        most = max(most, last - first + 1)
    return most


def run(database_url: str, redis_url: str) -> list[Figure]:
    phases: dict[str, Callable[[], dict[str, float]]] = {
        "alone": lambda: _phase(database_url, redis_url, 0),
        "beside": lambda: _phase(database_url, redis_url, LIMITED),
        "unlimited": lambda: _phase(database_url, redis_url, LIMITED, spaced=True),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in phases}
    order = list(phases)
    for n in range(ROUNDS):
        for name in order[n % 3 :] + order[: n % 3]:  # each round begins with another
            runs[name].append(phases[name]())
    alone, beside, unlimited = (
        {key: statistics.median(r[key] for r in runs[name]) for key in runs[name][0]}
        for name in order
    )
    rate = parse_rate(LIMIT)
    per_second = rate.count / rate.period.total_seconds()
    return [
        Figure(
            f"free queue's drain beside {LIMITED} jobs at {LIMIT} (alone beside)",
            beside["free_drain"],
            alone["free_drain"],
            "s",
            "<= 1.1x",
            beside["free_drain"] <= 1.1 * alone["free_drain"],
        ),
        Figure(
            "free queue's drain beside the limit (beside the same jobs unlimited, spaced)",
            beside["free_drain"],
            unlimited["free_drain"],
            "s",
            "<= 1.1x",
            beside["free_drain"] <= 1.1 * unlimited["free_drain"],
        ),
        Figure(
            "limited queue's achieved rate (the limit beside)",
            beside["rate"],
            per_second,
            "/s",
            "within 5%",
            abs(beside["rate"] - per_second) <= 0.05 * per_second,
        ),
        Figure(
            f"most limited starts in any {rate.period.total_seconds():g} s (N + 1 beside)",
            beside["most"],
            rate.count + 1,
            "starts",
            "<= N + 1",
            beside["most"] <= rate.count + 1,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (database_url, redis_url):
        for figure in run(database_url, redis_url):
            print(figure.line(), flush=True)
