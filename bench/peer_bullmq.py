"""duejobs against BullMQ, the design's own reference for delayed jobs on Redis: BullMQ (the
version ``bench/bullmq/package.json`` pins) installed from the npm registry into the bench's
own folder (``build/peer-bullmq``), run by ``bench/bullmq/peer.mjs`` on the machine's Node.js,
on the same Redis as duejobs. Skipped, saying so, where ``node`` or ``npm`` is missing.

Figures, each side measured the same way (``bench.peer_duejobs`` for duejobs' side):

* **peak**: ``PEAK_JOBS`` no-op jobs due at one instant, 2 processes x 32 (two BullMQ workers
  of concurrency 32); drain from the instant to the last end, and CPU per job from the instant
  to the drain's end: every process of the side plus its servers (PostgreSQL and Redis against
  Redis).
* **start accuracy**: ``bench.lag``'s jobs (300 at 20/s, sub-second offsets), one worker;
  start minus due, p50 and p99 of its absolute value, and the early ones. BullMQ's start is
  its job's ``processedOn`` against the due time the job carries (Node's clock, the machine's).
* **async**: ``ASYNC_JOBS`` jobs of an awaited 50 ms sleep waiting, one process x 200; jobs/s
  from the first start to the last end.
* **changes**: ``CHANGES`` delayed jobs due in two minutes, even ones cancelled (BullMQ:
  ``job.remove()``), odd ones moved (``job.changeDelay``), one call at a time and all at once
  (BullMQ: ``Promise.all``; duejobs: 32 threads).
* **Redis restarted empty**: ``EMPTIED_JOBS`` jobs due over 20 s on a Redis of the figure's
  own, killed and started again (no persistence) a quarter of the way in: jobs never run.

Medians of ``ROUNDS`` alternated rounds. Redis' ``hz`` is printed beside the start figures:
BullMQ's blocked worker wakes by a Redis timeout, whose precision follows it.

    python -m bench peer_bullmq
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from redis import Redis

from bench import peer_duejobs as ours
from bench.chaos import Servers
from bench.common import Figure, wait_until
from bench.cpu import Meter, postgres_reader
from bench.lag import _offsets
from bench.peer import _our_async
from bench.procs import ROOT
from duejobs import App
from duejobs.config import libpq_url

SOURCE = ROOT / "bench" / "bullmq"
FOLDER = ROOT / "build" / "peer-bullmq"
QUEUE = "peer"
ROUNDS = int(os.environ.get("BENCH_PEER_ROUNDS", "3"))
ASYNC_JOBS = int(os.environ.get("BENCH_PEER_ASYNC_JOBS", "2000"))


def install() -> Path | None:
    """BullMQ in the bench's own folder (npm, once per pinned version); None without Node."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None
    FOLDER.mkdir(parents=True, exist_ok=True)
    manifest = FOLDER / "package.json"
    fresh = not manifest.exists() or not filecmp.cmp(SOURCE / "package.json", manifest)
    for name in ("package.json", "peer.mjs"):
        shutil.copyfile(SOURCE / name, FOLDER / name)
    if fresh or not (FOLDER / "node_modules" / "bullmq").is_dir():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel", "error"],
            cwd=FOLDER,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return FOLDER


def _node(command: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one command of peer.mjs to its end; its JSON answer."""
    done = subprocess.run(
        ["node", "peer.mjs", command],
        cwd=FOLDER,
        input=json.dumps(args),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


class Workers:
    """BullMQ worker processes, serving until :meth:`stop`."""

    def __init__(self, redis_url: str, count: int, concurrency: int, nap_ms: int = 0) -> None:
        args = {"redis": redis_url, "queue": QUEUE, "concurrency": concurrency, "napMs": nap_ms}
        self.procs = [
            subprocess.Popen(
                ["node", "peer.mjs", "work"],
                cwd=FOLDER,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for _ in range(count)
        ]
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(args))
            proc.stdin.close()
        for proc in self.procs:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline()) == {"ready": True}, proc.args

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM each (BullMQ's warm close), then each one's last JSON line."""
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        answers = []
        for proc in self.procs:
            assert proc.stdout is not None
            out = proc.stdout.read()
            assert proc.wait(timeout=60) == 0, proc.args
            answers.append(json.loads(out.strip().splitlines()[-1]))
        return answers


def _add(redis_url: str, due: list[float]) -> None:
    _node("add", {"redis": redis_url, "queue": QUEUE, "due": [round(d * 1000) for d in due]})


def _completed(redis: Redis) -> int:
    return int(redis.zcard(f"bull:{QUEUE}:completed"))


def _spans(redis: Redis) -> list[tuple[float, float, float]]:
    """(due, start, end) in seconds since the epoch of every completed job."""
    ids = redis.zrange(f"bull:{QUEUE}:completed", 0, -1)
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(f"bull:{QUEUE}:{job_id.decode()}", "data", "processedOn", "finishedOn")
    return [
        (json.loads(data)["due"] / 1000, int(start) / 1000, int(end) / 1000)
        for data, start, end in pipe.execute()
    ]


def _peak(redis_url: str, redis: Redis, meter: Meter) -> ours.Peak:
    redis.flushdb()
    instant = float(int(time.time() + ours.LEAD))
    _add(redis_url, [instant] * ours.PEAK_JOBS)
    workers = Workers(redis_url, 2, 32)
    side = meter.with_pids(workers.pids)
    try:
        ours.sleep_until(instant)
        before = side.read()
        wait_until(lambda: _completed(redis) >= ours.PEAK_JOBS, 600, "BullMQ's peak", every=0.1)
        spent = side.read().since(before)
    finally:
        workers.stop()
    return ours.peak_of([(s, e) for _, s, e in _spans(redis)], instant, spent)


def _lags(redis_url: str, redis: Redis) -> list[float]:
    redis.flushdb()
    workers = Workers(redis_url, 1, 1)
    try:
        now = time.time()
        offsets = _offsets()
        _add(redis_url, [now + o for o in offsets])
        wait_until(lambda: _completed(redis) >= len(offsets), 120, "BullMQ's lag jobs")
    finally:
        workers.stop()
    return [(start - due) * 1000 for due, start, _ in _spans(redis)]


def _async_rate(redis_url: str, redis: Redis) -> float:
    redis.flushdb()
    _add(redis_url, [0.0] * ASYNC_JOBS)
    workers = Workers(redis_url, 1, 200, nap_ms=50)
    try:
        wait_until(lambda: _completed(redis) >= ASYNC_JOBS, 300, "BullMQ's async jobs")
    finally:
        workers.stop()
    spans = _spans(redis)
    return len(spans) / (max(e for _, _, e in spans) - min(s for _, s, _ in spans))


def _changes(redis_url: str, redis: Redis, together: bool) -> float:
    redis.flushdb()
    args = {"redis": redis_url, "queue": QUEUE, "n": ours.CHANGES, "together": together}
    seconds: float = _node("changes", args)["seconds"]
    return seconds


def _restarted_lost(servers: Servers) -> int:
    workers = Workers(servers.redis_url, 1, 32)
    try:
        due = ours.spread_due()
        _add(servers.redis_url, due)
        ours.restart_when_a_quarter_is_due(servers, due)
    finally:
        ran = sum(answer["ran"] for answer in workers.stop())
    return ours.EMPTIED_JOBS - ran


def run(database_url: str, redis_url: str) -> list[Figure]:
    if install() is None:
        print("  peer_bullmq: skipped, no node/npm on the PATH", flush=True)
        return []
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    url = libpq_url(database_url)
    redis = Redis.from_url(redis_url)
    hz = str(redis.config_get("hz").get("hz", "?"))
    meter = Meter(redis, postgres_reader(url))
    rounds = ours.Rounds()
    app = App(database_url=database_url, redis_url=redis_url)
    try:
        for _ in range(ROUNDS):
            rounds.both(
                "peak",
                lambda: ours.peak(env, url, redis, meter),
                lambda: _peak(redis_url, redis, meter),
            )
            rounds.both(
                "lags",
                lambda: ours.start_lags(database_url, redis_url),
                lambda: _lags(redis_url, redis),
            )
            rounds.both(
                "async",
                lambda: _our_async(app, env, url, redis)[0],
                lambda: _async_rate(redis_url, redis),
            )
            for together in (False, True):
                rounds.both(
                    f"changes {together}",
                    lambda t=together: ours.changes(app, redis, t),
                    lambda t=together: _changes(redis_url, redis, t),
                )
        with ours.own_redis() as servers:
            lost = ours.restarted_lost(env, url, servers), _restarted_lost(servers)
    finally:
        app.close()
    return _figures(rounds, lost, hz)


def _figures(rounds: ours.Rounds, lost: tuple[int, int], hz: str) -> list[Figure]:
    one, peer_one = rounds.medians("changes False")
    all_, peer_all = rounds.medians("changes True")
    rate, peer_rate = rounds.medians("async")
    return [
        *ours.shared_figures("BullMQ", rounds, instant="one instant", cpu_most=2.0, hz=hz),
        Figure(
            "bullmq: async 50 ms jobs/s, 1 process x 200",
            rate,
            peer_rate,
            "jobs/s",
            ">= 1.0x BullMQ",
            rate >= peer_rate,
        ),
        Figure(
            f"bullmq: {ours.CHANGES:,} changes one by one",
            one,
            peer_one,
            "s",
            "<= 2.0x BullMQ",
            one <= 2 * peer_one,
        ),
        Figure(
            f"bullmq: {ours.CHANGES:,} changes at once",
            all_,
            peer_all,
            "s",
            f">= 2,000/s ({ours.CHANGES / all_:,.0f}/s)",
            ours.CHANGES / all_ >= 2000,
        ),
        ours.lost_figure("BullMQ", lost),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
