"""What one Redis node down costs the queues on the others: start lag of their jobs while the
node is down, against the same queues' lag in the same round before it went down.

Three Redis servers of the run's own (``bench.chaos.Servers``), queue ``duejobs`` on the first,
``q1`` on the second, ``q2`` on the third (``DUEJOBS_REDIS_NODES``); one scheduler, one
reconciler (every 1 s) and one worker per queue, as separate processes. Each round schedules
``OUTAGE_RATE`` jobs a second on each queue (20) over three phases of ``OUTAGE_SECONDS`` (10):
before, during — the second node killed at the start of it and started again, empty, at its
end — and after. Lag = the ``started`` event's database time minus ``run_at``. The figure:
p99 of the lag of queues ``duejobs`` and ``q2`` for jobs due while ``q1``'s node is down,
over their p99 for jobs due before it went down (target ≤ 1.2). Every round is printed; the
figure is the worst round's.

``python -m bench.node_outage`` (``OUTAGE_ROUNDS``, 3). Uses DUEJOBS_DATABASE_URL when set, the
embedded PostgreSQL otherwise.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import redis
from sqlalchemy import text

from bench.chaos import Servers
from bench.common import TABLES, Figure, percentile, scratch_database, wait_until
from bench.procs import ROOT, stop_all
from duejobs import App, ScheduleRequest

RATE = float(os.environ.get("OUTAGE_RATE", "20"))
PHASE = float(os.environ.get("OUTAGE_SECONDS", "10"))
ROUNDS = int(os.environ.get("OUTAGE_ROUNDS", "3"))
LEAD = 4.0  # seconds from the last schedule written to the first due, everything started
QUEUES = ("duejobs", "q1", "q2")
DOWN = 1  # the node (and queue) taken down


def _processes(env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "duejobs"]
    quiet = ["--log-level", "error"]
    args = [
        [*cmd, "scheduler", *quiet],
        [*cmd, "reconcile", "--every", "1s", *quiet],
        *([*cmd, "worker", "--app", "bench.jobs:app", "--queue", q, *quiet] for q in QUEUES),
    ]
    return [subprocess.Popen(a, env=env, cwd=ROOT) for a in args]


def one_round(app: App, servers: Servers, env: dict[str, str]) -> tuple[float, float, float]:
    """(p99 before, p99 during, p99 after) in ms, for the queues on the nodes left up."""
    for url in servers.redis_urls:
        redis.Redis.from_url(url).flushdb()
    with app.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES}"))
    procs = _processes(env)
    try:
        n = int(3 * PHASE * RATE)
        base = app.now() + timedelta(seconds=LEAD + n * len(QUEUES) / 20_000)
        app.schedule_many(
            ScheduleRequest("noop", {}, run_at=base + timedelta(seconds=i / RATE), queue=q)
            for i in range(n)
            for q in QUEUES
        )
        down_at = base + timedelta(seconds=PHASE)
        _sleep_until(app, down_at)
        servers.take_down(DOWN, PHASE)
        servers.wait_back()
        done = text("SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")

        def finished() -> bool:
            with app.engine.connect() as conn:
                return int(conn.execute(done).scalar_one()) == n * len(QUEUES)

        wait_until(finished, 2 * PHASE + 120, "every job of the round")
        with app.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT s.run_at, extract(epoch FROM e.at - s.run_at) FROM "
                    "scheduled_job_events e JOIN scheduled_jobs s ON s.id = e.schedule_id "
                    "WHERE e.kind = 'started' AND s.queue <> :down"
                ),
                {"down": QUEUES[DOWN]},
            ).all()
    finally:
        stop_all(procs)
    up_at = down_at + timedelta(seconds=PHASE)
    phases: list[list[float]] = [[], [], []]
    for run_at, lag in rows:
        phases[0 if run_at < down_at else 1 if run_at < up_at else 2].append(float(lag) * 1000)
    before, during, after = (percentile(p, 0.99) for p in phases)
    return before, during, after


def _sleep_until(app: App, when: datetime) -> None:
    time.sleep(max(0.0, (when - app.now()).total_seconds()))


def run(database_url: str) -> list[Figure]:
    rounds = []
    with tempfile.TemporaryDirectory(prefix="duejobs-outage-") as folder:
        servers = Servers(Path(folder), nodes=len(QUEUES), postgres=False)
        nodes = {q: url for q, url in zip(QUEUES[1:], servers.redis_urls[1:], strict=True)}
        env = {
            **os.environ,
            "DUEJOBS_DATABASE_URL": database_url,
            "DUEJOBS_REDIS_URL": servers.redis_url,
            "DUEJOBS_REDIS_NODES": ",".join(f"{q}={url}" for q, url in nodes.items()),
            "PYTHONPATH": str(ROOT),
        }
        app = App(database_url, servers.redis_url, redis_nodes=nodes)
        try:
            for i in range(ROUNDS):
                before, during, after = one_round(app, servers, env)
                rounds.append((before, during))
                print(
                    f"round {i + 1}: other queues' start lag p99 before {before:.0f} ms, "
                    f"during node {DOWN}'s outage {during:.0f} ms ({during / before:.2f}x), "
                    f"after {after:.0f} ms",
                    flush=True,
                )
        finally:
            app.close()
            servers.stop()
    worst = max(rounds, key=lambda r: r[1] / r[0])
    median = statistics.median(d / b for b, d in rounds)
    print(f"median ratio over {ROUNDS} rounds: {median:.2f}x", flush=True)
    return [
        Figure(
            "other queues' start lag p99 during a node outage",
            worst[1],
            worst[0],
            "ms",
            "<= 1.2x the same queues before it (worst round)",
            worst[1] <= 1.2 * worst[0],
        )
    ]


if __name__ == "__main__":
    with scratch_database() as (db, _redis):
        for figure in run(db):
            print(figure.line(), flush=True)
