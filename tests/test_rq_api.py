"""What RQ's own API and tools read of duejobs' jobs, on every RQ release duejobs supports
(2.0 to 3.0: ``make test-all`` runs this module on RQ 2.0, on the last 2.x and on 3.0).

duejobs writes RQ's job hashes, queues and registries itself (one Lua call per batch) and runs
them through its own worker loop, so nothing but these tests says that ``Job.fetch``,
``get_status``, the queue and its registries, ``rq info``, rq-dashboard and RQ's commands
still make sense of them. Each test leaves one kind of job duejobs writes — queued,
scheduled, at the front, started, finished, skipped, put back, promoted — and reads it back
as RQ would.

Seen failing against builds broken on purpose, on RQ 2.x:

* the worker's ``kill_horse`` left to RQ 2.x, which signals the process group of horse pid 0
  (its own) → ``test_rqs_stop_job_command_leaves_a_duejobs_worker_running``;
* a stale job hash replaced without removing its dead worker's entry from the started
  registry (RQ 2.x's cleanup then fails the new job) →
  ``test_a_job_pushed_again_outlives_rqs_cleanup_of_its_dead_workers_entry``;
* the dequeue's Redis timeout left to RQ 2.x, which ends the worker →
  ``test_a_worker_waits_out_a_redis_that_answers_too_late``;
* a one-slot worker taking the state it started a job with (in a pipeline) for one already
  written, so that ``idle`` was never written after the job →
  ``test_a_one_slot_worker_shows_busy_while_a_job_runs_and_idle_between_jobs``;
* the finish writing the whole hash again (RQ's own save), or leaving out the job's end →
  ``test_a_finished_job_keeps_its_enqueued_hash_and_gains_what_its_run_changed``;
* a one-slot worker's finish left for a take that a stop never makes →
  ``test_a_one_slot_worker_stopped_during_its_job_finishes_it_in_rq_before_it_retires``;
* the worker's own reading of a job's timestamps dropping their fraction, or giving aware
  datetimes where RQ 2.0 gives naive ones →
  ``test_a_job_the_worker_reads_is_the_job_rq_reads``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
import redis
import rq_dashboard.web
from flask.testing import FlaskClient
from rq import Queue
from rq import Worker as RQWorker
from rq.command import send_stop_job_command
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq_dashboard.cli import make_flask_app

from duejobs.config import DEFAULT_RESULT_TTL
from duejobs.rq_wire.bands import bands
from duejobs.rq_wire.job_hash import JOB_FUNCTION, delivery_of
from duejobs.services.reconciler import Reconciler
from duejobs.worker import build_worker
from tests.support import wait_for
from tests.support.deliveries import push_of
from tests.support.processes import WORKER, Proc
from tests.support.system import System


def _queue(system: System) -> Queue:
    return Queue("duejobs", connection=system.redis, serializer=JSONSerializer)


def _job(system: System, schedule_id: uuid.UUID) -> Job:
    """The RQ job of a schedule's current delivery, as RQ reads it."""
    stored = system.app.get(schedule_id)
    assert stored is not None and stored.queue_job_id is not None
    return Job.fetch(stored.queue_job_id, connection=system.redis, serializer=JSONSerializer)


def _started_ids(registry: StartedJobRegistry) -> list[str]:
    """The job ids in a started registry. (RQ 2.0 lists its raw ``job:execution`` entries.)"""
    return [entry.split(":")[0] for entry in registry.get_job_ids()]


class Held(NamedTuple):
    """A ``hold`` job started in RQ by a worker process, until its release key is set."""

    schedule_id: uuid.UUID
    job: Job
    release: str
    worker: Proc


def _held(system: System, spawn: Callable[..., Proc], *flags: str) -> Held:
    """A ``hold`` schedule pushed, a worker spawned with ``flags``, its job seen started."""
    release = f"test:release:{uuid.uuid4().hex}"
    s = system.app.schedule("hold", {"until": release}, delay=0)
    system.scheduler.run_once()
    worker = spawn(*WORKER, *flags)
    job = _job(system, s.id)
    wait_for(lambda: job.get_status() == JobStatus.STARTED, 30, "RQ to see the job started")
    return Held(s.id, job, release, worker)


def test_a_due_job_is_queued_as_rq_queues_one(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    job = _job(system, s.id)
    assert job.get_status() == JobStatus.QUEUED
    assert _queue(system).get_job_ids() == [job.id] and _queue(system).count == 1
    assert (job.func_name, job.args, job.kwargs) == (JOB_FUNCTION, [str(s.id), 1, 1, "default"], {})
    ttl = DEFAULT_RESULT_TTL  # RQ's own result_ttl: both kept as long
    assert (job.origin, job.result_ttl, job.failure_ttl) == ("duejobs", ttl, ttl)
    assert job.enqueued_at is not None and job.created_at is not None


def test_a_job_due_later_is_in_rqs_scheduled_registry_at_its_time(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5))
    system.scheduler.run_once()
    job = _job(system, s.id)
    assert job.get_status() == JobStatus.SCHEDULED
    registry = _queue(system).scheduled_job_registry
    assert registry.get_job_ids() == [job.id] and _queue(system).count == 0
    at = registry.get_scheduled_time(job)
    assert abs(at.timestamp() - s.due_at.timestamp()) < 1  # RQ reads whole seconds


def test_a_job_pushed_to_the_front_is_first_on_rqs_queue(system: System) -> None:
    first = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    urgent = system.app.schedule("record", {}, delay=0)
    push = push_of(urgent)
    front = type(push)(push.delivery, front=True)
    assert system.scheduler.deliverer.push([front], system.app.now()).queued == 1
    assert _queue(system).get_job_ids() == [front.delivery.job_id, _job(system, first.id).id]
    urgent_job = Job.fetch(
        front.delivery.job_id, connection=system.redis, serializer=JSONSerializer
    )
    assert urgent_job.get_status() == JobStatus.QUEUED


def test_a_promoted_job_is_queued_in_rq_and_leaves_the_scheduled_registry(
    system: System,
) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5))
    system.scheduler.run_once()
    assert system.scheduler.deliverer.promote(system.app.now() + timedelta(hours=1)).moved == 1
    job = _job(system, s.id)
    assert job.get_status() == JobStatus.QUEUED
    assert _queue(system).get_job_ids() == [job.id]
    assert _queue(system).scheduled_job_registry.count == 0


def test_a_running_job_is_started_in_rq_by_its_worker(
    system: System, spawn: Callable[..., Proc]
) -> None:
    _, job, release, worker = _held(system, spawn, "--burst")
    assert _started_ids(_queue(system).started_job_registry) == [job.id]
    (rq_worker,) = RQWorker.all(connection=system.redis)
    job.refresh()
    assert job.worker_name == rq_worker.name and rq_worker.get_state() == "busy"
    assert rq_worker.get_current_job_id() is None  # see test_rq_dashboard_shows_...
    system.redis.set(release, 1)
    assert worker.popen.wait(timeout=60) == 0, worker.output()


def test_a_one_slot_worker_shows_busy_while_a_job_runs_and_idle_between_jobs(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """RQ's worker state, job after job: the one-slot worker writes ``idle`` once between two
    jobs (RQ writes it after a job and again before the next dequeue)."""

    def states() -> list[str]:
        return [w.get_state() for w in RQWorker.all(connection=system.redis)]

    spawn(*WORKER)
    for _ in range(2):
        release = f"test:release:{uuid.uuid4().hex}"
        s = system.app.schedule("hold", {"until": release}, delay=0)
        system.scheduler.run_once()
        wait_for(lambda: states() == ["busy"], 30, "the worker busy with the job")
        system.redis.set(release, 1)
        wait_for(
            lambda: system.status(s.id) == "succeeded" and states() == ["idle"],  # noqa: B023
            30,
            "the worker idle after the job",
        )


def test_a_finished_job_is_in_rqs_finished_registry_with_its_outcome(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    job = _job(system, s.id)
    assert job.get_status() == JobStatus.FINISHED and job.return_value() == "succeeded"
    queue = _queue(system)
    assert queue.finished_job_registry.get_job_ids() == [job.id]
    assert (queue.count, _started_ids(queue.started_job_registry)) == (0, [])


def test_a_one_slot_worker_stopped_during_its_job_finishes_it_in_rq_before_it_retires(
    system: System,
) -> None:
    """At one slot a job's finish in RQ goes with the next take; a worker stopped while the
    job runs takes no more, and still writes the job finished, idle, before it retires. Seen
    failing with the finish left for a take that never came (the job ``started`` in RQ)."""
    worker = build_worker(system.app)
    system.app.handler("stops_its_worker")(lambda ctx, payload: worker.stop())
    s = system.app.schedule("stops_its_worker", {}, delay=0)
    system.scheduler.run_once()
    try:
        worker.work()
    finally:
        worker.runtime.close()
    job = _job(system, s.id)
    assert (job.get_status(), job.return_value()) == (JobStatus.FINISHED, "succeeded")
    queue = _queue(system)
    assert queue.finished_job_registry.get_job_ids() == [job.id]
    assert _started_ids(queue.started_job_registry) == []


def test_a_finished_job_keeps_its_enqueued_hash_and_gains_what_its_run_changed(
    system: System,
) -> None:
    """The worker's finish writes the fields of the job's hash that its run changed (RQ's
    own finish writes the whole hash again): RQ reads the job whole, as it was enqueued, with
    its run's status, times and worker."""
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    key = f"rq:job:{_job(system, s.id).id}"
    enqueued = system.redis.hgetall(key)
    system.work()
    run = {b"status", b"started_at", b"ended_at", b"last_heartbeat", b"worker_name"}
    finished = system.redis.hgetall(key)
    assert {f: v for f, v in finished.items() if f not in run} == {
        f: v for f, v in enqueued.items() if f not in run
    }
    job = _job(system, s.id)
    assert job.get_status() == JobStatus.FINISHED and job.return_value() == "succeeded"
    assert job.func_name == JOB_FUNCTION and job.args == [str(s.id), 1, 1, "default"]
    assert job.worker_name  # the worker that ran it (gone once its burst ended)
    assert job.started_at is not None and job.ended_at is not None
    assert job.started_at <= job.ended_at == job.last_heartbeat


def test_a_job_the_worker_reads_is_the_job_rq_reads(system: System) -> None:
    """The worker reads a job's delivery from its hash its own way (the data field alone)
    and gets what RQ reads from it."""
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    job = _job(system, s.id)
    delivery = delivery_of(system.redis.hget(job.key, "data"), job.origin)
    assert [str(delivery.schedule_id), delivery.version, delivery.attempt, delivery.tenant] == [
        *job.args
    ]
    assert delivery.queue == job.origin


def test_a_skipped_delivery_finishes_in_rq_with_the_reason_it_was_skipped(
    system: System,
) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    stale = _job(system, s.id)
    system.app.reschedule(s.id, delay=timedelta(minutes=5))
    system.scheduler.deliverer.push([push_of(s)], system.app.now())  # a stray old copy
    system.work()
    stale.refresh()
    assert stale.get_status() == JobStatus.FINISHED and stale.return_value() == "skipped"
    assert _queue(system).finished_job_registry.get_job_ids() == [stale.id]


def test_a_delivery_put_back_is_scheduled_again_in_rq_under_its_own_id(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5))
    system.scheduler.run_once()
    system.scheduler.deliverer.promote(system.app.now() + timedelta(hours=1))  # forced early
    system.work()
    job = _job(system, s.id)
    assert job.get_status() == JobStatus.SCHEDULED
    registry = _queue(system).scheduled_job_registry
    assert registry.get_job_ids() == [job.id] and _queue(system).count == 0
    assert abs(registry.get_scheduled_time(job).timestamp() - s.due_at.timestamp()) < 1


def test_rq_info_counts_duejobs_queues_and_workers(system: System, redis_url: str) -> None:
    for _ in range(3):
        system.app.schedule("record", {}, delay=0)
    system.app.schedule("record", {}, delay=timedelta(minutes=5))
    system.scheduler.run_once()
    rq = Path(sys.executable).with_name("rq")
    shown = subprocess.run(
        [str(rq), "info", "--url", redis_url, "--only-queues", "duejobs"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    counted = re.search(r"^duejobs\s+\|\S*\s+(\d+)", shown, re.MULTILINE)
    assert counted is not None, shown
    assert counted[1] == "3", shown  # the queued ones; the scheduled one waits apart


def _rq_dashboard(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> FlaskClient:
    """rq-dashboard's own Flask app on ``redis_url``, reading jobs with RQ's JSON serializer
    (its ``--json`` option: duejobs' jobs are JSON, and never unpickled)."""
    monkeypatch.setattr(rq_dashboard.web.config, "serializer", JSONSerializer)
    dashboard = make_flask_app(None, None, None, "")
    dashboard.config["RQ_DASHBOARD_REDIS_URL"] = redis_url
    rq_dashboard.web.setup_rq_connection(dashboard)
    return dashboard.test_client()


def test_rq_dashboard_shows_duejobs_queues_jobs_and_workers(
    system: System, spawn: Callable[..., Proc], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rq-dashboard's pages' data over a duejobs queue: the queue with its waiting job and
    its registries counted, a finished job with its outcome, the running job in the started
    registry, and the worker busy with its counts — its current job, shown by unpickling it
    whatever the serializer on RQ 2, not named (the running job is in the started registry).
    Seen failing on RQ 2.12 with the worker's ``current_job`` written: the workers page a 500
    (``UnpicklingError``) while a duejobs worker is busy."""
    done = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    _, held_job, release, worker = _held(system, spawn)
    waiting = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    name, done_id = held_job.origin, _job(system, done.id).id
    waiting_id = _job(system, waiting.id).id
    dashboard = _rq_dashboard(redis_url, monkeypatch)

    (queue,) = dashboard.get("/0/data/queues.json").json["queues"]
    assert (queue["name"], queue["count"], queue["started_job_registry_count"]) == (name, 1, 1)
    assert (queue["finished_job_registry_count"], queue["failed_job_registry_count"]) == (1, 0)
    pages = {
        registry: dashboard.get(f"/0/data/jobs/{name}/{registry}/8/asc/1.json").json["jobs"]
        for registry in ("queued", "started", "finished")
    }
    assert {r: [j["id"] for j in jobs] for r, jobs in pages.items()} == {
        "queued": [waiting_id],
        "started": [held_job.id],
        "finished": [done_id],
    }
    finished = dashboard.get(f"/0/data/job/{done_id}.json").json
    assert (finished["status"], finished["result"], finished["origin"]) == (
        "finished",
        "succeeded",
        name,
    )
    assert finished["ended_at"] and finished["exc_info"] is None
    (shown,) = dashboard.get("/0/data/workers.json").json["workers"]
    listened = bands([name])  # the queue's RQ queues, one per priority band
    assert (shown["state"], shown["queues"], shown["successful_job_count"]) == (
        "busy",
        listened,
        0,
    )
    assert shown["current_job"] == "idle"  # rq-dashboard's word for none

    system.redis.set(release, 1)
    wait_for(lambda: system.status(waiting.id) == "succeeded", 30, "the waiting job run")
    worker.stop()


def test_rqs_stop_job_command_leaves_a_duejobs_worker_running(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """A job runs in the worker's own process and the worker hears no RQ command: RQ's
    "stop job" neither stops the job nor ends the worker (cancel the schedule instead)."""
    schedule_id, job, release, worker = _held(system, spawn)
    send_stop_job_command(system.redis, job.id, serializer=JSONSerializer)
    system.redis.set(release, 1)
    wait_for(lambda: system.status(schedule_id) == "succeeded", 30, "the job to finish")
    assert worker.popen.poll() is None, worker.output()
    assert worker.stop() == 0, worker.output()


def test_a_job_pushed_again_outlives_rqs_cleanup_of_its_dead_workers_entry(
    system: System,
) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    queue, job = _queue(system), _job(system, s.id)
    # A worker takes the job, starts it as RQ does, and dies before its entry expires.
    system.redis.lrem(queue.key, 0, job.id)
    with system.redis.pipeline() as pipe:
        pipe.zadd(queue.started_job_registry.key, {f"{job.id}:run": time.time() + 60})
        job.set_status(JobStatus.STARTED, pipeline=pipe)
        pipe.hset(job.key, "worker_name", "ghost")
        pipe.execute()
    assert Reconciler(system.app).run_once().repushed == 1
    queue.started_job_registry.cleanup(timestamp=time.time() + 3600)  # the entry has expired
    assert job.get_status() == JobStatus.QUEUED and queue.get_job_ids() == [job.id]
    system.work()
    assert system.status(s.id) == "succeeded"


@pytest.mark.long  # waits out RQ's own timeouts, 27 s: make test-long (test-all)
@pytest.mark.slow
@pytest.mark.serial  # pauses the whole Redis server: never beside another test process
def test_a_worker_waits_out_a_redis_that_answers_too_late(
    system: System, spawn: Callable[..., Proc], redis_url: str
) -> None:
    """A Redis that stops answering (paused, overloaded, failing over) for longer than the
    worker's socket timeout must not end the worker. (The test pauses the whole server.)"""
    worker = spawn(*WORKER)
    # Idle, i.e. in its dequeue: a worker still starting up fails on a Redis timeout (its
    # supervisor starts it again), which is not what this test is about.
    wait_for(
        lambda: [w.get_state() for w in RQWorker.all(connection=system.redis)] == ["idle"],
        30,
        "the worker to start and wait for jobs",
    )
    # Past the worker's socket timeout (REDIS_TIMEOUT, 10 s) and its one retry.
    system.redis.execute_command("CLIENT", "PAUSE", 25_000, "ALL")
    with redis.Redis.from_url(redis_url, socket_timeout=60) as patient:
        patient.ping()  # answered when the pause ends
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    wait_for(lambda: system.status(s.id) == "succeeded", 30, "the worker to run the job")
    assert "waiting for it" in worker.output(), worker.output()
    assert worker.popen.poll() is None, worker.output()
    assert worker.stop() == 0, worker.output()
