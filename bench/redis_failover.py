"""A Redis failover through Sentinel, duejobs against plain RQ, side by side in one run.

Each side gets a master, a replica and three Sentinels of its own (the Valkey server in
``--sentinel`` mode, `tests/support/sentinel.py`), ``FAILOVER_JOBS`` (2,000) jobs due over
``FAILOVER_SPREAD`` (30) seconds, and the same fault a third of the way in: the master
SIGKILLed, the replica promoted by the Sentinels, the old master started again as its
replica. Counted on each side from records kept in PostgreSQL (outside Redis): jobs lost
(never run, two minutes after the last was due), run twice, started early, processes that
exited, and the time from the fault to the first job finished after it.

* duejobs: a scheduler, a worker (8 slots) and a reconciler, given the Sentinels' URL
  (`tests/support/topology.py`'s workload);
* RQ: ``enqueue_at`` of each job, two ``rq worker --with-scheduler`` processes configured
  with RQ's own ``SENTINEL`` settings, the job recording its start and end.

    python -m bench redis_failover
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from redis.sentinel import Sentinel
from rq import Queue
from rq.serializers import JSONSerializer

from bench.common import Figure
from bench.procs import ROOT
from duejobs.config import libpq_url
from duejobs.dev.embedded import EmbeddedRedis
from tests.support.apps import EFFECTS_TABLE, RUNS_TABLE
from tests.support.sentinel import SERVICE, Sentinels, sentinels
from tests.support.topology import Counts, run_workload

JOBS = int(os.environ.get("FAILOVER_JOBS", "2000"))
SPREAD = float(os.environ.get("FAILOVER_SPREAD", "30"))
RQ_RUNS = (
    "CREATE TABLE IF NOT EXISTS bench_rq_runs "
    "(job text, due timestamptz, started timestamptz, ended timestamptz)"
)


class _Proc:
    """A process of the run, its output in a file (what ``run_workload`` reads)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.popen = subprocess.Popen(
                [sys.executable, *argv],
                env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()


def _ours(database_url: str, ha: Sentinels, folder: Path) -> Counts:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(RUNS_TABLE)
        conn.execute(EFFECTS_TABLE)
    procs: list[_Proc] = []

    def spawn(*args: str, extra_env: dict[str, str] | None = None) -> Any:
        procs.append(_Proc(["-m", "duejobs", *args], extra_env or {}, folder / f"{len(procs)}.log"))
        return procs[-1]

    try:
        return run_workload(
            spawn,
            database_url,
            database_url,
            ha.fail_over,
            seed=46,
            schedules=JOBS,
            spread=SPREAD,
            redis_url=ha.url,
        )
    finally:
        for proc in procs:
            proc.stop()


def _theirs(database_url: str, ha: Sentinels, folder: Path) -> Counts:
    url = libpq_url(database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RQ_RUNS)
    settings = folder / "rq_settings.py"
    hosts = [("127.0.0.1", port) for port in ha.ports]
    settings.write_text(f"SENTINEL = {{'INSTANCES': {hosts!r}, 'MASTER_NAME': {SERVICE!r}}}\n")
    master = Sentinel(hosts).master_for(SERVICE)
    queue = Queue("bench", connection=master, serializer=JSONSerializer)
    start = datetime.now(UTC) + timedelta(seconds=1)
    for i in range(JOBS):
        due = start + timedelta(seconds=SPREAD * i / JOBS)
        queue.enqueue_at(
            due, "bench.failover_jobs.record", f"rq-{i}", due.isoformat(), job_id=f"rq-{i}"
        )
    env = {"BENCH_RUNS_URL": url, "PYTHONPATH": f"{ROOT}:{folder}"}
    argv = ["-m", "rq.cli", "worker", "bench", "-c", "rq_settings", "--with-scheduler"]
    argv += ["-S", "rq.serializers.JSONSerializer", "--logging_level", "WARNING"]
    workers = [_Proc(argv, env, folder / f"rq-{n}.log") for n in range(2)]
    try:
        time.sleep(1 + SPREAD / 3)
        faulted = time.time()
        ha.fail_over()
        deadline = time.monotonic() + SPREAD + 120
        while time.monotonic() < deadline and _rq_count(url)[0] < JOBS:
            time.sleep(1)
        exited = [f"rq worker {n}" for n, w in enumerate(workers) if w.popen.poll() is not None]
        ran, twice, early, first = _rq_count(url, faulted)
        return Counts(JOBS, JOBS - ran, twice, 0, early, exited, first - faulted)
    finally:
        for worker in workers:
            worker.stop()


def _rq_count(url: str, after: float = 0.0) -> tuple[int, int, int, float]:
    with psycopg.connect(url) as conn:
        ran, twice, early = conn.execute(
            "SELECT count(DISTINCT job), count(*) - count(DISTINCT job), "
            "count(*) FILTER (WHERE started < due) FROM bench_rq_runs"
        ).fetchone()
        first = conn.execute(
            "SELECT min(extract(epoch FROM ended)) FROM bench_rq_runs "
            "WHERE started >= to_timestamp(%s)",
            (after,),
        ).fetchone()[0]
    return int(ran), int(twice), int(early), float(first) if first is not None else float("inf")


def run(database_url: str, redis_url: str) -> list[Figure]:
    binary = EmbeddedRedis.binary()
    results = {}
    for name, side in (("duejobs", _ours), ("RQ", _theirs)):
        with (
            tempfile.TemporaryDirectory(prefix="duejobs-failover-") as folder,
            sentinels(binary, Path(folder)) as ha,
        ):
            results[name] = side(database_url, ha, Path(folder))
        print(f"  {results[name].line(f'Redis failover through Sentinel, {name}')}", flush=True)
    ours, theirs = results["duejobs"], results["RQ"]
    return [
        Figure(
            f"Redis failover: jobs lost, twice or early, of {JOBS:,}",
            ours.lost + ours.twice + ours.early,
            theirs.lost + theirs.twice + theirs.early,
            "jobs",
            "0, whatever RQ's",
            ours.lost + ours.twice + ours.early == 0 and not ours.exited,
        )
    ]
