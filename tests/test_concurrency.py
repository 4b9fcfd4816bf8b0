"""A worker with several slots (``duejobs worker --concurrency N``): N deliveries at once, sync
and ``async def`` handlers in one process, and every guarantee of one slot kept per slot. Jobs
taken together are ``test_slots_taken_together.py``'s; wedged slots, signals and the
supervisor ``test_supervisor.py``'s.

Seen failing against builds broken on purpose:

* an ``async def`` handler in a slot never run (its coroutine closed unawaited) → the
  ``-async`` cases of the revalidation, retry, cancel, SIGTERM and SIGKILL tests, which run
  each of them with sync and with ``async def`` handlers;
* the slots' semaphore sized 1 whatever N (one delivery at a time) →
  ``test_n_slots_run_n_deliveries_at_once_sync_and_async_in_one_process``;
* a job taken from Redis before a slot is free (the semaphore acquired after the dequeue) →
  ``test_a_worker_takes_a_job_only_when_a_slot_is_free``;
* the claim's duplicate verdict dropped (three copies of one delivery racing in slots), or
  the group commit's pending requests told apart by value (``list.remove`` took another
  slot's equal request) →
  ``test_each_slot_revalidates_so_copies_of_one_delivery_apply_one_effect``;
* the thread time limit a no-op →
  ``test_a_sync_handler_past_its_timeout_in_a_slot_fails_its_attempt``;
* async handlers in slots not cancelled at their timeout →
  ``test_an_async_handler_past_its_timeout_in_a_slot_is_cancelled``;
* RQ told ``idle`` while a slot runs a job, or never told ``idle`` once the last slot is
  done, or the state in memory left ``busy`` (a stop no longer reaches the blocked dequeue)
  → ``test_a_worker_with_a_busy_slot_shows_busy_while_it_waits_for_more``;
* the worker's heartbeat never sent again once throttled →
  ``test_a_worker_whose_slots_are_all_busy_keeps_beating``;
* a worker's Redis pool left at redis-py's default of 100 connections (slots past that fail
  their jobs with "Too many connections") →
  ``test_two_hundred_slots_do_not_run_out_of_redis_connections``;
* the executions of jobs started together forgotten (each job then started a second time,
  the first left in the started registry) →
  ``test_a_worker_takes_a_job_only_when_a_slot_is_free``;
* a bookkeeping connection never reused (one opened per step) →
  ``test_many_slots_share_a_few_bookkeeping_connections``;
* a Redis error as a job taken together starts raised into RQ's loop (the worker quits with
  jobs queued) or out of a warm stop (the jobs after it left claimed and unrun), or the job
  dropped at the first error (an attempt lost to the rescue), or a given-up claim kept →
  ``test_a_job_whose_start_redis_fails_is_started_again_and_the_worker_goes_on``,
  ``test_a_warm_stop_runs_every_job_taken_together_though_one_cannot_start``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from rq import Queue
from rq import Worker as RQWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from duejobs import Status, store
from duejobs.worker import Runtime, Worker, WorkerConfig
from duejobs.worker.bookkeeping import MAX_CONNECTIONS
from tests.support import wait_for
from tests.support.apps import snooze
from tests.support.processes import WORKER, Proc
from tests.support.slots import attempts_of, blocked_on_redis, count_rows
from tests.support.slots import slots as slots
from tests.support.system import System


def test_n_slots_run_n_deliveries_at_once_sync_and_async_in_one_process(
    system: System, slots: Callable[[int], None]
) -> None:
    meeting = {"group": uuid.uuid4().hex, "parties": 6}
    ids = [system.app.schedule("meet", meeting, delay=0).id for _ in range(3)]
    ids += [system.app.schedule("meet-async", meeting, delay=0).id for _ in range(3)]
    system.scheduler.run_once()
    slots(6)
    assert [system.status(i) for i in ids] == ["succeeded"] * 6
    assert len(system.effects()) == 6


def test_one_slot_is_the_single_threaded_worker_of_before(
    system: System, slots: Callable[[int], None]
) -> None:
    meeting = {"group": uuid.uuid4().hex, "parties": 2, "wait": 1}
    first = system.app.schedule("meet", meeting, delay=0)
    system.scheduler.run_once()
    slots(1)  # alone in its slot, it waits for a second party that never comes
    stored = system.app.get(first.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error is not None and "only 1 of 2" in stored.last_error


@pytest.mark.parametrize("kind", ["record", "record-async"])
def test_each_slot_revalidates_so_copies_of_one_delivery_apply_one_effect(
    system: System, slots: Callable[[int], None], kind: str
) -> None:
    s = system.app.schedule(kind, {}, delay=0)
    system.scheduler.run_once()
    queue = Queue("duejobs", connection=system.redis, serializer=JSONSerializer)
    for copy in range(3):  # what an at-least-once transport may hand over, at once
        queue.enqueue("duejobs.worker.perform", str(s.id), 1, 1, "default", job_id=f"copy-{copy}")
    slots(4)
    assert system.effects() == [(f"{kind}:{s.id}:1", 1)]
    skipped = count_rows(
        system.app,
        "SELECT count(*) FROM scheduled_job_events WHERE schedule_id = :id AND kind = 'skipped'",
        id=s.id,
    )
    assert skipped == 3


@pytest.mark.parametrize("kind", ["flaky", "flaky-async"])
def test_retries_run_per_slot_until_each_succeeds(
    system: System, slots: Callable[[int], None], kind: str
) -> None:
    ids = [system.app.schedule(kind, {"fail_times": 1}, delay=0).id for _ in range(4)]

    def done() -> bool:
        system.scheduler.run_once()
        slots(4)
        return all(system.status(i) == "succeeded" for i in ids)

    wait_for(done, 30, "every retry to succeed")
    for i in ids:
        assert [a[:2] for a in attempts_of(system.app, i)] == [(1, "failed"), (2, "succeeded")]


def test_a_sync_handler_past_its_timeout_in_a_slot_fails_its_attempt(
    system: System, slots: Callable[[int], None]
) -> None:
    s = system.app.schedule("spin", {"seconds": 5}, delay=0)
    other = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    slots(2)
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error == "HandlerTimeoutError: handler ran past its timeout of 1 s"
    assert system.status(other.id) == "succeeded"


def test_an_async_handler_past_its_timeout_in_a_slot_is_cancelled(
    system: System, slots: Callable[[int], None]
) -> None:
    s = system.app.schedule("snooze", {"seconds": 5}, delay=0)
    system.scheduler.run_once()
    slots(2)
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error == "HandlerTimeoutError: handler ran past its timeout of 1 s"


@pytest.mark.parametrize("kind", ["slow", "slow-async"])
def test_a_cancel_while_a_slot_runs_its_handler_leaves_no_effect(
    system: System, spawn: Callable[..., Proc], kind: str
) -> None:
    s = system.app.schedule(kind, {"seconds": 1.5}, delay=0)
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "3", "--burst")
    wait_for(lambda: system.status(s.id) == "running", 30, "the handler to start")
    assert system.app.cancel(s.id)
    assert worker.popen.wait(timeout=30) == 0, worker.output()
    assert system.effects() == []
    assert [a[:2] for a in attempts_of(system.app, s.id)] == [(1, "stale")]


def test_a_worker_takes_a_job_only_when_a_slot_is_free(
    system: System, spawn: Callable[..., Proc]
) -> None:
    release = f"test:release:{uuid.uuid4().hex}"
    ids = [system.app.schedule("hold", {"until": release}, delay=0).id for _ in range(6)]
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "2", "--burst")
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    queue = Queue("duejobs", connection=system.redis, serializer=JSONSerializer)

    def both_busy() -> bool:  # claimed together, then started in RQ one after the other
        return count_rows(system.app, running) == 2 and queue.started_job_registry.count == 2

    wait_for(both_busy, 30, "two slots to be busy")
    assert queue.count == 4  # the other jobs wait in Redis for any worker
    # What RQ's tools show: two jobs started by one busy worker.
    (rq_worker,) = RQWorker.all(connection=system.redis)
    assert rq_worker.get_state() == "busy"
    entries = queue.started_job_registry.get_job_ids()
    started = [Job.fetch(e.split(":")[0], connection=system.redis) for e in entries]
    assert [job.worker_name for job in started] == [rq_worker.name] * 2
    system.redis.set(release, 1)
    assert worker.popen.wait(timeout=60) == 0, worker.output()
    assert [system.status(i) for i in ids] == ["succeeded"] * 6
    assert (queue.started_job_registry.count, queue.finished_job_registry.count) == (0, 6)


def test_a_worker_with_a_busy_slot_shows_busy_while_it_waits_for_more(
    system: System, spawn: Callable[..., Proc]
) -> None:
    release = f"test:release:{uuid.uuid4().hex}"
    ids = [system.app.schedule("hold", {"until": release}, delay=0).id for _ in range(2)]
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "3")
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    wait_for(lambda: count_rows(system.app, running) == 2, 30, "two slots to be busy")
    # The third slot's dequeue blocks on Redis: RQ set the worker idle just before it.
    wait_for(lambda: blocked_on_redis(system), 30, "the free slot to wait on the queue")
    (rq_worker,) = RQWorker.all(connection=system.redis)
    assert rq_worker.get_state() == "busy"
    system.redis.set(release, 1)
    wait_for(lambda: all(system.status(i) == "succeeded" for i in ids), 30, "the slots")
    wait_for(lambda: rq_worker.refresh() or rq_worker.get_state() == "idle", 30, "idle")
    assert worker.stop() == 0, worker.output()  # a stop still reaches the blocked dequeue


def test_a_worker_whose_slots_are_all_busy_keeps_beating(
    system: System, spawn: Callable[..., Proc]
) -> None:
    release = f"test:release:{uuid.uuid4().hex}"
    for _ in range(2):
        system.app.schedule("hold", {"until": release}, delay=0)
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "2")
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    wait_for(lambda: count_rows(system.app, running) == 2, 30, "both slots to be busy")
    (rq_worker,) = RQWorker.all(connection=system.redis)
    first = rq_worker.last_heartbeat
    assert first is not None
    # Beats are sent at most once a second, but they are sent.
    wait_for(lambda: rq_worker.refresh() or rq_worker.last_heartbeat > first, 10, "a beat")
    system.redis.set(release, 1)
    assert worker.stop() == 0, worker.output()


def test_many_slots_share_a_few_bookkeeping_connections(system: System) -> None:
    ids = [system.app.schedule("record-loosely", {}, delay=0).id for _ in range(64)]
    system.scheduler.run_once()
    runtime = Runtime(system.app, WorkerConfig(concurrency=32))
    try:
        Worker(runtime).work(burst=True)
        # one claim batch and one outcome batch at a time, each on a connection of its own
        assert runtime.bookkeeping.opened <= 3
    finally:
        runtime.close()
    assert [system.status(i) for i in ids] == ["succeeded"] * 64


def test_single_slots_steps_all_at_once_share_a_bounded_number_of_connections(
    system: System,
) -> None:
    """Forty slots' own steps at one instant (verdicts, claims made ahead renewed: what a
    loaded machine brings together) open at most ``MAX_CONNECTIONS``; the others wait for one.
    Seen failing without the bound: 40 connections, and 200 slots on a busy machine filled
    the test server's hundred (``too many clients already``)."""
    runtime = Runtime(system.app, WorkerConfig(concurrency=64))
    together = threading.Barrier(40)
    peak: list[int] = []

    def step() -> None:
        together.wait()
        with runtime.bookkeeping.connection() as conn:
            store.database_now(conn)
            peak.append(runtime.bookkeeping.opened)
            time.sleep(0.05)  # held while the others arrive

    threads = [threading.Thread(target=step) for _ in range(40)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        runtime.close()
    assert len(peak) == 40 and max(peak) <= MAX_CONNECTIONS


def test_two_hundred_slots_do_not_run_out_of_redis_connections(
    system: System, slots: Callable[[int], None]
) -> None:
    """A thousand 0.2 s handlers on 200 slots, each starting and finishing with RQ. Their
    time limit is far off (30 s): what is checked is Redis' connections, not a timeout a busy
    machine can bring a 0.2 s handler to (it failed once under another run with 1 s)."""
    system.app.handler("nap-briefly", timeout=timedelta(seconds=30), max_attempts=1)(snooze)
    ids = [system.app.schedule("nap-briefly", {"seconds": 0.2}, delay=0).id for _ in range(1000)]
    system.scheduler.run_once()
    slots(200)  # every slot busy, slots starting and finishing with RQ at once
    assert [system.status(i) for i in ids] == ["succeeded"] * 1000
