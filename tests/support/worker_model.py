"""A seeded model run of the worker: a random plan of changes and faults against real
PostgreSQL, Redis and worker processes, then the worker's promises checked on what the
handlers recorded (``tests.support.apps.traced``, outside any fence).

The plan (one seed, one setting: ``--concurrency`` N, or ``--processes``): ``schedules``
traced schedules due throughout the plan, of every priority band, some failing their first
attempt; then, over ``seconds``, reschedules (some to another band) and cancels with and
without ``conn=`` (which leaves the old job in Redis), retries of finished ones, superseded
copies and second copies of current deliveries pushed to Redis, every Redis client
connection dropped at once, Redis out of reach for longer than a lease (every connection to
its database cut as soon as it is made, for ``OUTAGE`` seconds), one FLUSHDB and one SIGKILL
of the worker (a new one started), more of each in a longer plan. A scheduler and a
reconciler run in this process throughout.

The promises (:func:`violations`):

* every handler run was on a claimed attempt of the version it ran for (no superseded
  delivery runs in the current one's place);
* runs of one version of a schedule never overlap in time, but for one whose worker was killed
  mid-handler (a new version may start while a cancelled or rescheduled one finishes: its
  effects are fenced);
* every ``ctx.transaction()`` effect happens at most once;
* no attempt's handler runs twice, and none runs on an attempt the reconciler rescued
  (``abandoned``) unless its worker was killed;
* every schedule is finished (succeeded, failed or cancelled) within ``BOUND`` of the last
  fault.

Used by ``tests/test_worker_model.py`` (short plans, every setting) and ``python -m bench
chaos`` (longer plans, more seeds).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from sqlalchemy import text

from duejobs import App
from duejobs.errors import DuejobsError
from duejobs.rates import Rate, parse_rate
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.reconciler import ReconcileConfig, Reconciler
from tests.support.rates import most_in_a_window, starts

# Every schedule is finished within this of the last fault: the worker's lease (2 s) for a
# killed worker's claims, the reconciler's stuck rule (2 s) and pass (0.5 s) for jobs Redis
# lost, and retries' backoff, with room for a loaded machine.
BOUND = 30.0
_LEASE = ["--lease", "2s", "--heartbeat", "500ms"]
# How long Redis stays out of reach in an outage: longer than the lease, so that claims made
# as jobs were taken outlive it while their starts fail.
OUTAGE = 3.0
# A warm stop finishes the handlers running (under a second here) and puts the rest back.
STOP_WITHIN = 60


@dataclass(frozen=True)
class Setting:
    """How the worker runs: slots per process, processes under a supervisor."""

    concurrency: int
    processes: int = 1
    outage: float = OUTAGE  # how long the plan's Redis outage lasts (seconds)
    rate: str | None = None  # a rate limit on the App's queue through the plan ("20/s")

    @property
    def flags(self) -> list[str]:
        flags = ["--concurrency", str(self.concurrency)]
        return flags + (["--processes", str(self.processes)] if self.processes > 1 else [])

    def __str__(self) -> str:
        named = f"c{self.concurrency}" + (f"p{self.processes}" if self.processes > 1 else "")
        named += f"-limit{self.rate.replace('/', 'per')}" if self.rate else ""
        return named + (f"-outage{self.outage:g}s" if self.outage != OUTAGE else "")


@dataclass
class Report:
    """What one model run saw: the violations (none, when the promises hold), and how long
    after the last fault the last schedule finished."""

    seed: int
    setting: Setting
    violations: list[str] = field(default_factory=list)
    settled_after: float = 0.0  # from the last fault
    settled_after_plan: float = 0.0  # from the plan's last change
    runs: int = 0
    actions: int = 0


class _Background:
    """The scheduler's and the reconciler's passes in threads of this process; a pass that
    fails (Redis dropped or flushed under it) is counted and the loop goes on."""

    def __init__(self, app: App) -> None:
        self._stop = threading.Event()
        scheduler = Scheduler(app, SchedulerConfig(poll_interval=timedelta(milliseconds=50)))
        reconciler = Reconciler(app, ReconcileConfig(stuck_after=timedelta(seconds=2)))
        self.failures = 0
        self._threads = [
            threading.Thread(target=self._loop, args=(scheduler.run_once, 0.1), daemon=True),
            threading.Thread(target=self._loop, args=(reconciler.run_once, 0.5), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, step: Callable[[], object], every: float) -> None:
        while not self._stop.wait(every):
            try:
                step()
            except Exception:
                self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _drop_connections(client: redis.Redis) -> None:
    """Every connection to this Redis database dropped at once, as a restart or a network cut
    drops them (other databases' clients, another test run's, untouched)."""
    database = str(client.connection_pool.connection_kwargs.get("db", 0))
    me = client.client_id()
    for other in client.client_list():
        if other.get("db") == database and int(other["id"]) != me:
            with contextlib.suppress(redis.ResponseError):  # gone meanwhile
                client.client_kill_filter(_id=other["id"])


def _redis_outage(client: redis.Redis, seconds: float) -> None:
    """This Redis database out of reach for ``seconds``: every connection to it cut as soon as
    it is made (the workers', the scheduler's, the reconciler's; other databases untouched)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        _drop_connections(client)
        time.sleep(0.02)


def _group_pids(leader: int) -> set[int]:
    """The processes of a process group (a worker and, under a supervisor, its children)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == leader:  # the process group
                pids.add(int(entry.name))
    return pids


# The priorities the plan's schedules are given: one of each band, the default band the most.
PRIORITIES = (-50, 0, 0, 50)


class _Plan:
    """One seed's plan, carried out against the App and Redis."""

    def __init__(
        self, app: App, client: redis.Redis, seed: int, schedules: int, seconds: float
    ) -> None:
        self.app, self.redis, self.rng = app, client, random.Random(seed)
        self.ids = [
            app.schedule(
                "traced",
                {
                    "seconds": self.rng.choice([0, 0, 0.01, 0.05]),
                    "fail_times": int(self.rng.random() < 0.2),
                },
                delay=self.rng.uniform(0, seconds),  # due throughout the plan: faults meet work
                priority=self.rng.choice(PRIORITIES),  # every band of the queue in use
            ).id
            for _ in range(schedules)
        ]

    def actions(self, seconds: float) -> list[tuple[float, str]]:
        """(when, what): changes spread over the plan, the faults among them."""
        kinds = ["reschedule", "reschedule_conn", "cancel", "cancel_conn", "retry"]
        kinds += ["stray", "stray", "copy"]
        changes, blips, kills = max(60, int(12 * seconds)), max(3, int(seconds / 5)), 1
        kills += int(seconds / 15)
        plan = [(self.rng.uniform(0, seconds), self.rng.choice(kinds)) for _ in range(changes)]
        plan += [(self.rng.uniform(0, seconds), "redis_blip") for _ in range(blips)]
        plan += [(self.rng.uniform(seconds * 0.1, seconds * 0.5), "redis_outage")]
        plan += [(self.rng.uniform(seconds * 0.3, seconds * 0.6), "flushdb")]
        plan += [(self.rng.uniform(seconds * 0.5, seconds * 0.9), "kill") for _ in range(kills)]
        return sorted(plan)

    def change(self, kind: str) -> None:
        """One change to a random schedule; one that no longer applies (a finished schedule
        rescheduled, a live one retried) is refused by the App, as it would be for a user."""
        sid = self.rng.choice(self.ids)
        with contextlib.suppress(DuejobsError):
            if kind == "reschedule":  # to another band, at times
                self.app.reschedule(
                    sid, delay=self.rng.uniform(0, 1), priority=self.rng.choice(PRIORITIES)
                )
            elif kind == "reschedule_conn":
                with self.app.engine.begin() as conn:
                    self.app.reschedule(sid, delay=self.rng.uniform(0, 1), conn=conn)
            elif kind == "cancel":
                self.app.cancel(sid)
            elif kind == "cancel_conn":
                with self.app.engine.begin() as conn:
                    self.app.cancel(sid, conn=conn)
            elif kind == "retry":
                self.app.retry(sid, delay=self.rng.uniform(0, 0.5))
            elif kind == "stray":  # made due now, its old job left, the two taken together
                with self.app.engine.begin() as conn:
                    self.app.reschedule(sid, delay=0, conn=conn)
                self._push_copy(sid, stale=True)
            elif kind == "copy":
                self._push_copy(sid, stale=False)

    def _push_copy(self, sid: uuid.UUID, *, stale: bool) -> None:
        """Jobs for deliveries no scheduler would push now: a second job id for the current
        delivery (what an at-least-once transport may do), at the queue's tail; or, with
        ``stale``, an older version's job and a copy of the current one at the queue's front
        in one transaction, so that a worker with free slots takes them in one batch."""
        s = self.app.get(sid)
        if s is None or (stale and s.version == 1):
            return
        queue = Queue(s.queue, connection=self.redis, serializer=JSONSerializer)
        versions = [s.version - 1, s.version] if stale else [s.version]
        jobs = [
            Job.create(
                "duejobs.worker.perform",
                args=(str(sid), version, s.attempts + 1, s.tenant),
                connection=self.redis,
                id=f"model-copy-{uuid.uuid4().hex}",
                origin=s.queue,
                serializer=JSONSerializer,
                status=JobStatus.QUEUED,
            )
            for version in versions
        ]
        with self.redis.pipeline() as pipe:
            for job in jobs:
                job.save(pipeline=pipe)
            if stale:  # LPUSH k current older: the older one at the head
                pipe.lpush(queue.key, *[job.id for job in reversed(jobs)])
            else:
                pipe.rpush(queue.key, *[job.id for job in jobs])
            pipe.execute()


def run_model(
    app: App,
    client: redis.Redis,
    start_worker: Callable[[list[str]], Any],
    setting: Setting,
    seed: int,
    *,
    schedules: int = 100,
    seconds: float = 5.0,
) -> Report:
    """Carry out one seed's plan under ``setting`` and check the promises. ``start_worker``
    starts ``duejobs worker`` with the given extra flags in a process group of its own and
    returns an object with ``popen``."""
    report = Report(seed, setting)
    if setting.rate is not None:
        app.set_rate_limit(app.core.queue, setting.rate)
    plan = _Plan(app, client, seed, schedules, seconds)
    actions = plan.actions(seconds)
    report.actions = len(actions)
    killed: set[int] = set()
    background = _Background(app)
    worker = start_worker(setting.flags + _LEASE)
    began = time.monotonic()
    last_fault = began
    try:
        for at, kind in actions:
            time.sleep(max(0.0, began + at - time.monotonic()))
            if kind == "redis_blip":
                _drop_connections(client)
            elif kind == "redis_outage":
                _redis_outage(client, setting.outage)
            elif kind == "flushdb":
                client.flushdb()
            elif kind == "kill":
                killed |= _group_pids(worker.popen.pid)
                os.killpg(worker.popen.pid, signal.SIGKILL)
                worker.popen.wait()
                worker = start_worker(setting.flags + _LEASE)
            else:
                plan.change(kind)
                continue
            last_fault = time.monotonic()
        plan_ended = time.monotonic()
        deadline = last_fault + BOUND
        while not _all_finished(app, plan.ids):
            if time.monotonic() > deadline:
                report.violations.append(
                    f"schedules not finished {BOUND:g} s after the last fault: "
                    f"{_unfinished(app, plan.ids)}"
                )
                break
            time.sleep(0.1)
        report.settled_after = time.monotonic() - last_fault
        report.settled_after_plan = time.monotonic() - plan_ended
        if worker.popen.poll() is not None:  # Redis, however long away, never ends one
            report.violations.append(f"the worker exited (status {worker.popen.returncode})")
    finally:
        background.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.popen.pid, signal.SIGTERM)
        try:
            worker.popen.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            report.violations.append(
                f"the worker did not stop within {STOP_WITHIN} s of SIGTERM "
                "(every thread's stack is in its log)"
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.popen.pid, signal.SIGABRT)  # faulthandler: the stacks
            worker.popen.wait(timeout=STOP_WITHIN)
    report.runs, found = violations(app, killed)
    report.violations += found
    if setting.rate is not None:
        report.violations += over_the_limit(app, parse_rate(setting.rate))
    return report


def over_the_limit(app: App, rate: Rate) -> list[str]:
    """The windows of one period in which more attempts started than the limit allows (N,
    plus one start's tolerance), by the database clock."""
    most = most_in_a_window(starts(app), rate.period)
    if most <= rate.count + 1:
        return []
    return [f"{most} attempts started within {rate.period}, over the limit of {rate}"]


def _all_finished(app: App, ids: list[uuid.UUID]) -> bool:
    return not _unfinished(app, ids)


def _unfinished(app: App, ids: list[uuid.UUID]) -> dict[str, int]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT status, count(*) AS n FROM scheduled_jobs "
                "WHERE id = ANY(:ids) AND status IN ('scheduled', 'running') GROUP BY status"
            ),
            {"ids": ids},
        )
        return {r.status: r.n for r in rows}


def violations(app: App, killed: set[int]) -> tuple[int, list[str]]:
    """(runs seen, the promises each run broke) from what the handlers and the database
    recorded; ``killed``: the worker processes killed during the plan."""
    with app.engine.connect() as conn:
        runs = conn.execute(
            text(
                "SELECT r.id, r.schedule_id, r.version, r.attempt, r.worker_pid, r.started_at, "
                "r.ended_at, a.status AS attempt_status "
                "FROM test_runs r LEFT JOIN scheduled_job_attempts a ON a.schedule_id = "
                "r.schedule_id AND a.version = r.version AND a.attempt = r.attempt "
                "ORDER BY r.schedule_id, r.version, r.started_at"
            )
        ).all()
        twice = conn.execute(
            text("SELECT effect_key FROM test_effects GROUP BY effect_key HAVING count(*) > 1")
        ).all()
    found = [f"effect {r.effect_key} applied more than once" for r in twice]
    seen: dict[tuple[uuid.UUID, int, int], int] = {}
    previous: Any = None
    for run in runs:
        where = f"schedule {run.schedule_id} v{run.version} attempt {run.attempt}"
        was_killed = run.worker_pid in killed
        if run.attempt_status is None:
            found.append(f"{where}: run on an attempt never claimed at that version")
        if run.ended_at is None and not was_killed:
            found.append(f"{where}: handler never ended, its worker not killed")
        if run.attempt_status == "abandoned" and not was_killed:
            found.append(f"{where}: run on an attempt rescued from a live worker")
        attempt = (run.schedule_id, run.version, run.attempt)
        seen[attempt] = seen.get(attempt, 0) + 1
        if seen[attempt] == 2:
            found.append(f"{where}: handler ran twice")
        if (
            previous is not None
            and (previous.schedule_id, previous.version) == (run.schedule_id, run.version)
            and not (previous.ended_at is None and previous.worker_pid in killed)
            and (previous.ended_at is None or run.started_at < previous.ended_at)
        ):
            found.append(f"{where}: started while attempt {previous.attempt} still ran")
        previous = run
    return len(runs), found
