"""duejobs on a Redis Cluster: no-op jobs a second on three shards against one shard, the
same worker slots; and the Redis commands a job costs on a cluster against a single node.

Each round: CLUSTER_JOBS (6,000) no-op jobs due now over six queues, pushed by one scheduler
pass, then drained by two ``duejobs worker --burst`` processes of 16 slots serving the six
queues (again after a scheduler pass, when a job was put back for later); the drain is the span
from the first attempt's start to the last one's end (the database's clock). Three layouts,
alternated in each of CLUSTER_ROUNDS (3) rounds, medians reported: a cluster of one master and
its replica, a cluster of three masters and their replicas (both started here, as the test
suite starts them), and the single Redis of the run. Redis' commands are ``INFO commandstats``
summed over every master (a script's commands counted with the script call), after the drain
less before the push.

Start lag of a worker serving the six queues: LAG_JOBS (300) jobs at 20 a second, each at a
random sub-second offset and on the next queue in turn, served by one scheduler and one
8-slot worker process; lag = the ``started`` event's database time minus ``run_at``, p50 and
p99, on three shards against the single Redis (alternated, medians of the rounds' figures).
And the Redis commands a second of that worker's side of RQ idle (a ten-second count of
``INFO commandstats`` over the masters, its takes of up to a second each), on each.

    python -m bench cluster
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis
from redis.cluster import RedisCluster
from sqlalchemy import text

from bench.common import Figure, fill_due, percentile
from bench.lag import duejobs_lags
from bench.procs import ROOT
from duejobs import App
from duejobs.config import libpq_url
from duejobs.rq_wire.worker_side import RqWire
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from tests.support.cluster import QUEUES, Cluster, cluster
from tests.support.valkey import server_binary

JOBS = int(os.environ.get("CLUSTER_JOBS", "6000"))
IDLE_SECONDS = 10.0
ROUNDS = int(os.environ.get("CLUSTER_ROUNDS", "3"))
WORKERS, SLOTS = 2, 16


def _commands(clients: list[Redis]) -> int:
    """Every command the servers ran so far (scripts' own commands included)."""
    return sum(
        int(stats["calls"])
        for client in clients
        for stats in client.info("commandstats").values()
        if isinstance(stats, dict)
    )


def _drain(
    database_url: str, redis_url: str, masters: Callable[[], list[Redis]]
) -> tuple[float, float]:
    """(jobs a second, Redis commands a job) of one round on the Redis of ``redis_url``."""
    app = App(database_url=database_url, redis_url=redis_url, strict_types=False)
    scheduler = Scheduler(app, SchedulerConfig(batch_size=1000))
    try:
        before = _commands(masters())
        fill_due(libpq_url(database_url), JOBS, job_type="noop", offset="-1 second", queues=QUEUES)
        scheduler.run_once()
        env = {
            **os.environ,
            "DUEJOBS_DATABASE_URL": database_url,
            "DUEJOBS_REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
        }
        serving = [flag for queue in QUEUES for flag in ("--queue", queue)]
        cmd = [sys.executable, "-m", "duejobs", "worker", "--app", "bench.jobs:app", "--burst"]
        cmd += ["--concurrency", str(SLOTS), "--log-level", "warning", *serving]
        for _ in range(5):  # a job put back (a claim that timed out) waits for a promotion
            workers = [subprocess.Popen(cmd, env=env, cwd=ROOT) for _ in range(WORKERS)]
            for worker in workers:
                assert worker.wait(600) == 0
            if _succeeded(app) == JOBS:
                break
            scheduler.run_once()
        with app.engine.connect() as conn:
            done, span = conn.execute(
                text(
                    "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
                    "FROM scheduled_job_attempts WHERE status = 'succeeded'"
                )
            ).one()
        assert done == JOBS, done
        return JOBS / float(span), (_commands(masters()) - before) / JOBS
    finally:
        scheduler.close()
        app.close()


def _succeeded(app: App) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")
            ).scalar_one()
        )


def _lags(database_url: str, redis_url: str) -> tuple[float, float]:
    """(p50, p99) in ms of a six-queue worker's start lag on the Redis of ``redis_url``."""
    flags = ("--concurrency", "8")
    lags = [lag * 1000 for lag in duejobs_lags(database_url, redis_url, False, QUEUES, flags)]
    return statistics.median(lags), percentile(lags, 0.99)


def _on_cluster(database_url: str, masters: int) -> tuple[float, float]:
    with (
        tempfile.TemporaryDirectory() as folder,
        cluster(server_binary(), Path(folder), masters) as made,
    ):
        return _drain(database_url, made.url, lambda: _clients(made))


def _clients(made: Cluster) -> list[Redis]:
    return [server.client() for server in made.servers[: made.masters]]


def _idle(client: Redis | RedisCluster, masters: list[Redis]) -> float:
    """Redis commands a second of an idle six-queue worker's takes (one a second)."""
    wire = RqWire(client, QUEUES, "bench-idle")
    wire.register()
    try:
        wire.take(8, 1.0)
        before, started = _commands(masters), time.monotonic()
        while time.monotonic() - started < IDLE_SECONDS:
            wire.take(8, 1.0)
        return (_commands(masters) - before) / (time.monotonic() - started)
    finally:
        wire.retire()


def _lag_rounds(database_url: str, redis_url: str) -> list[Figure]:
    on_cluster: list[tuple[float, float, float]] = []
    on_single: list[tuple[float, float, float]] = []
    for _ in range(ROUNDS):
        with (
            tempfile.TemporaryDirectory() as folder,
            cluster(server_binary(), Path(folder)) as made,
        ):
            on_cluster.append(
                (*_lags(database_url, made.url), _idle(made.client(), _clients(made)))
            )
        single = Redis.from_url(redis_url)
        single.flushdb()
        on_single.append((*_lags(database_url, redis_url), _idle(single, [single])))
    figures = []
    for i, name in enumerate(("p50", "p99")):
        ours = statistics.median(run[i] for run in on_cluster)
        theirs = statistics.median(run[i] for run in on_single)
        print(f"cluster: six-queue worker start lag {name}: {ours:.0f} ms, one node {theirs:.0f}")
        figures.append(
            Figure(
                f"six-queue worker start lag {name}, 3 shards vs one node",
                ours,
                theirs,
                "ms",
                "reported",
                True,
            )
        )
    idle, idle_single = (
        statistics.median(run[2] for run in runs) for runs in (on_cluster, on_single)
    )
    print(f"cluster: six-queue worker idle: {idle:.1f} commands/s, one node {idle_single:.1f}")
    figures.append(
        Figure(
            "six-queue worker idle, 3 shards vs one node",
            idle,
            idle_single,
            "cmds/s",
            "reported",
            True,
        )
    )
    return figures


def run(database_url: str, redis_url: str) -> list[Figure]:
    return [*_throughput(database_url, redis_url), *_lag_rounds(database_url, redis_url)]


def _throughput(database_url: str, redis_url: str) -> list[Figure]:
    one, three, single = [], [], []
    Redis.from_url(redis_url).flushdb()
    for _ in range(ROUNDS):
        one.append(_on_cluster(database_url, 1))
        three.append(_on_cluster(database_url, 3))
        single.append(_drain(database_url, redis_url, lambda: [Redis.from_url(redis_url)]))
    layouts = {"one shard": one, "three shards": three, "single node": single}
    rate = {name: statistics.median(r for r, _ in runs) for name, runs in layouts.items()}
    cost = {name: statistics.median(c for _, c in runs) for name, runs in layouts.items()}
    for name in layouts:
        print(f"cluster: {name}: {rate[name]:.0f} jobs/s, {cost[name]:.1f} Redis commands a job")
    return [
        Figure(
            "no-op jobs/s, 3 shards vs 1 shard (2 x 16 slots)",
            rate["three shards"],
            rate["one shard"],
            "jobs/s",
            "reported",
            True,
        ),
        Figure(
            "Redis commands a job, cluster (3 shards) vs one node",
            cost["three shards"],
            cost["single node"],
            "cmds",
            "reported",
            True,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (database_url, redis_url):
        for figure in run(database_url, redis_url):
            print(figure.line())
