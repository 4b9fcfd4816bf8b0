"""duejobs against Celery, the incumbent Python teams know: Celery (the bench extra pins it) on
a Redis broker (a database of the bench's Redis of its own), ETA tasks, ``--pool threads``,
its other settings its defaults (``bench.peer_celery_app``).

Figures, each side measured the same way (``bench.peer_duejobs`` for duejobs' side):

* **peak**: ``PEAK_JOBS`` no-op tasks with one ETA, 2 processes x 32 (two ``celery worker
  --pool threads --concurrency 32``); the tasks are sent, and held by the workers, before the
  instant. Drain from the instant to the last end, the first start after it, and CPU per job
  from the instant to the drain's end: every process of the side plus its servers.
* **start accuracy**: ``bench.lag``'s jobs (300 at 20/s, sub-second offsets), one worker of one
  thread; start minus the ETA, p50 and p99 of its absolute value, and the early ones.
* **submitting**: ``PEAK_JOBS`` jobs due in an hour: ``App.schedule_many`` against
  ``apply_async`` per task (Celery has no batch send).
* **Redis restarted empty**: ``EMPTIED_JOBS`` jobs due over 20 s on a Redis of the figure's own,
  killed and started again (no persistence) a quarter of the way in: jobs never run (a worker
  that exits meanwhile runs none after it).

Not measured against Celery: changes (a sent Celery task cannot be moved; ``revoke`` is a
broadcast each worker keeps in memory) and awaited jobs (Celery runs no ``async def`` task).
Medians of ``ROUNDS`` alternated rounds.

    python -m bench peer_celery
"""

from __future__ import annotations

import functools
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

from celery import Celery
from redis import Redis

from bench import peer_duejobs as ours
from bench.chaos import Servers
from bench.common import Figure, wait_until
from bench.cpu import Meter, postgres_reader
from bench.lag import _offsets
from bench.procs import ROOT
from duejobs import App, ScheduleRequest
from duejobs.config import libpq_url

ROUNDS = int(os.environ.get("BENCH_PEER_ROUNDS", "3"))
DONE = "peer-celery:done"


def broker_of(redis_url: str) -> str:
    """The Celery broker's URL: the bench's Redis, the database after duejobs' one."""
    base, _, db = redis_url.rpartition("/")
    number = int(db) if db.isdigit() else 0
    return f"{base}/{(number + 1) % 16}" if db.isdigit() else f"{redis_url.rstrip('/')}/1"


@functools.cache
def _client(broker: str) -> Celery:
    """A Celery app that sends to and pings the workers on ``broker`` (by the task's name, as
    a web process that does not import the tasks' module sends)."""
    client = Celery("peer-client", broker=broker, set_as_current=False)
    client.conf.update(task_serializer="json", accept_content=["json"])
    return client


class Workers:
    """Celery worker processes (threads pool), serving until :meth:`stop`."""

    def __init__(self, broker: str, count: int, concurrency: int) -> None:
        self.spans = tempfile.mktemp(prefix="peer-celery-")
        env = {
            **os.environ,
            "PEER_CELERY_BROKER": broker,
            "PEER_CELERY_SPANS": self.spans,
            "PYTHONPATH": str(ROOT),
        }
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "bench.peer_celery_app",
                    "worker",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(concurrency),
                    "-n",
                    f"w{i}@%h",
                    "--loglevel",
                    "WARNING",
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for i in range(count)
        ]
        client = _client(broker)
        try:
            wait_until(lambda: len(client.control.ping(timeout=0.5)) >= count, 60, "Celery workers")
        except TimeoutError:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> list[tuple[float, float, float]]:
        """SIGTERM each (Celery's warm shutdown); every task's (due, start, end)."""
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            proc.wait(timeout=120)
        spans: list[tuple[float, float, float]] = []
        for path in glob.glob(f"{self.spans}.*"):
            with open(path) as f:
                spans.extend(tuple(s) for s in json.load(f))
            os.unlink(path)
        return spans


def _send(broker: str, due: list[float]) -> float:
    """Seconds to send one ETA task per due time, one ``apply_async`` each."""
    client = _client(broker)
    started = time.perf_counter()
    for at in due:
        client.send_task("noop", (at,), eta=datetime.fromtimestamp(at, UTC))
    return time.perf_counter() - started


def _done(broker: Redis) -> int:
    return int(broker.get(DONE) or 0)


def _peak(broker_url: str, broker: Redis, meter: Meter) -> ours.Peak:
    broker.flushdb()
    workers = Workers(broker_url, 2, 32)
    side = meter.with_pids(workers.pids)
    try:
        instant = float(int(time.time() + ours.LEAD * 4))  # Celery's sends take seconds
        _send(broker_url, [instant] * ours.PEAK_JOBS)
        ours.sleep_until(instant)
        before = side.read()
        wait_until(lambda: _done(broker) >= ours.PEAK_JOBS, 600, "Celery's peak", every=0.1)
        spent = side.read().since(before)
    finally:
        spans = workers.stop()
    return ours.peak_of([(s, e) for _, s, e in spans], instant, spent)


def _lags(broker_url: str, broker: Redis) -> list[float]:
    broker.flushdb()
    workers = Workers(broker_url, 1, 1)
    try:
        now = time.time()
        offsets = _offsets()
        _send(broker_url, [now + o for o in offsets])
        wait_until(lambda: _done(broker) >= len(offsets), 120, "Celery's lag tasks")
    finally:
        spans = workers.stop()
    return [(start - due) * 1000 for due, start, _ in spans]


def _restarted_lost(servers: Servers) -> int:
    workers = Workers(servers.redis_url, 1, 32)
    try:
        due = ours.spread_due()
        _send(servers.redis_url, due)
        ours.restart_when_a_quarter_is_due(servers, due)
    finally:
        ran = len(workers.stop())
    return ours.EMPTIED_JOBS - ran


def _our_submit(app: App) -> float:
    requests = [ScheduleRequest("noop", {}, delay=3600) for _ in range(ours.PEAK_JOBS)]
    started = time.perf_counter()
    app.schedule_many(requests)
    return time.perf_counter() - started


def _their_submit(broker_url: str, broker: Redis) -> float:
    broker.flushdb()
    seconds = _send(broker_url, [time.time() + 3600] * ours.PEAK_JOBS)
    broker.flushdb()
    return seconds


def run(database_url: str, redis_url: str) -> list[Figure]:
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    url = libpq_url(database_url)
    redis = Redis.from_url(redis_url)
    broker_url = broker_of(redis_url)
    broker = Redis.from_url(broker_url)
    meter = Meter(redis, postgres_reader(url))
    rounds = ours.Rounds()
    app = App(database_url=database_url, redis_url=redis_url)
    try:
        for _ in range(ROUNDS):
            rounds.both(
                "peak",
                lambda: ours.peak(env, url, redis, meter),
                lambda: _peak(broker_url, broker, meter),
            )
            rounds.both(
                "lags",
                lambda: ours.start_lags(database_url, redis_url),
                lambda: _lags(broker_url, broker),
            )
            rounds.both(
                "submit", lambda: _our_submit(app), lambda: _their_submit(broker_url, broker)
            )
        with ours.own_redis() as servers:
            lost = ours.restarted_lost(env, url, servers), _restarted_lost(servers)
    finally:
        app.close()
    return _figures(rounds, lost)


def _figures(rounds: ours.Rounds, lost: tuple[int, int]) -> list[Figure]:
    submit, peer_submit = rounds.medians("submit")
    return [
        *ours.shared_figures("Celery", rounds, instant="one ETA", cpu_most=1.5),
        Figure(
            f"celery: submitting {ours.PEAK_JOBS:,} due in an hour",
            submit,
            peer_submit,
            "s",
            "<= 1.0x Celery",
            submit <= peer_submit,
        ),
        ours.lost_figure("Celery", lost),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
