"""Wedged slots, stop signals and the supervisor of several worker processes
(``--processes``, ``--cpus``): what is given up, what finishes, what exits and for whom.

Seen failing against builds broken on purpose:

* the watchdog ending the process at the first wedged slot →
  ``test_a_wedged_slot_is_given_up_while_the_other_slots_work``;
* the supervisor not starting a dead worker again, or not passing SIGTERM on →
  ``test_a_supervisor_starts_again_a_worker_process_that_dies_and_stops_all_warmly``; its
  workers not told of its death → ``test_workers_do_not_outlive_a_killed_supervisor``;
* the watchdog keeping the process alive when it could not close a handler wedged inside
  its effect fence (the row stays locked, no rescue) →
  ``test_a_wedged_slot_inside_its_effect_fence_ends_the_worker_whatever_the_other_slots``;
* a warm shutdown waiting for a slot that was given up →
  ``test_sigterm_with_a_wedged_slot_finishes_the_others_then_exits_for_the_supervisor``;
* a copy of the stop signal taken for a second one (cold shutdown) →
  ``test_the_same_stop_signal_twice_within_a_second_is_one_warm_shutdown``;
* a restarted worker reusing its name (RQ refuses it) →
  ``test_a_named_worker_started_again_takes_a_name_of_its_own``;
* the warm-stop request ignored (as when RQ's ``StopRequested`` is swallowed during its
  start-up, seen once under load) → ``test_a_worker_stopped_while_it_starts_still_stops``;
* the pool not drained before the worker stops (``teardown``): the leases of the handlers
  still running lapse and the reconciler rescues them →
  ``test_sigterm_lets_running_slots_finish_and_leaves_the_rest_untouched``;
* ``--cpus`` not applied to a lone worker, or every supervised worker given the first CPU →
  ``test_workers_pinned_with_cpus_run_every_slot_thread_on_their_cpu``;
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from rq import Queue
from rq import Worker as RQWorker
from rq.serializers import JSONSerializer

from duejobs.services.reconciler import Reconciler
from duejobs.worker import EXIT_WEDGED
from duejobs.worker.supervisor import start_supervised
from tests.support import wait_for
from tests.support.processes import WORKER, Proc
from tests.support.slots import count_rows
from tests.support.system import System


def test_a_wedged_slot_is_given_up_while_the_other_slots_work(
    system: System, spawn: Callable[..., Proc]
) -> None:
    stuck = system.app.schedule("stubborn-once", {"seconds": 120}, delay=0)
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "2", "--timeout-grace", "1s")
    wait_for(lambda: _given_up(system, stuck.id), 30, "the slot to be given up")
    later = [system.app.schedule("record", {}, delay=0).id for _ in range(3)]
    system.scheduler.run_once()
    wait_for(lambda: all(system.status(i) == "succeeded" for i in later), 30, "the free slot")
    assert worker.popen.poll() is None, worker.output()  # one slot still works: no exit
    assert worker.stop(signal.SIGKILL) == -signal.SIGKILL


def _given_up(system: System, schedule_id: uuid.UUID) -> bool:
    stored = system.app.get(schedule_id)
    return stored is not None and "did not return" in (stored.last_error or "")


def test_a_worker_whose_slots_are_all_wedged_exits_for_its_supervisor(
    system: System, spawn: Callable[..., Proc]
) -> None:
    ids = [system.app.schedule("stubborn", {"seconds": 120}, delay=0).id for _ in range(2)]
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "2", "--timeout-grace", "1s")
    assert worker.popen.wait(timeout=30) == EXIT_WEDGED, worker.output()
    assert all(_given_up(system, i) for i in ids)


def test_a_wedged_slot_inside_its_effect_fence_ends_the_worker_whatever_the_other_slots(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """Only the process's end releases the row its fence holds: then the rescue can run."""
    s = system.app.schedule("stubborn-fenced-once", {"seconds": 120}, delay=0)
    system.scheduler.run_once()
    worker = spawn(
        *WORKER,
        "--concurrency",
        "3",
        "--timeout-grace",
        "1s",
        "--lease",
        "2s",
        "--heartbeat",
        "0.5s",
    )
    assert worker.popen.wait(timeout=30) == EXIT_WEDGED, worker.output()
    reconciler = Reconciler(system.app)

    def rescued() -> bool:
        reconciler.run_once()
        return system.status(s.id) != "running"

    wait_for(rescued, 30, "the row to be rescued once the process ended")


def test_sigterm_with_a_wedged_slot_finishes_the_others_then_exits_for_the_supervisor(
    system: System, spawn: Callable[..., Proc]
) -> None:
    release = f"test:release:{uuid.uuid4().hex}"
    stuck = system.app.schedule("stubborn-once", {"seconds": 120}, delay=0)
    fine = system.app.schedule("hold", {"until": release}, delay=0)
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "2", "--timeout-grace", "1s")
    wait_for(lambda: _given_up(system, stuck.id), 30, "the slot to be given up")
    worker.popen.send_signal(signal.SIGTERM)
    system.redis.set(release, 1)
    assert worker.popen.wait(timeout=30) == EXIT_WEDGED, worker.output()
    assert system.status(fine.id) == "succeeded"


def test_the_same_stop_signal_twice_within_a_second_is_one_warm_shutdown(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """As a terminal's Ctrl+C reaches a whole process group, or a unit's stop every process."""
    ids = [system.app.schedule("slow", {"seconds": 1.5}, delay=0).id for _ in range(2)]
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "2")
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    wait_for(lambda: count_rows(system.app, running) == 2, 30, "two slots to be busy")
    worker.popen.send_signal(signal.SIGTERM)
    (rq_worker,) = RQWorker.all(connection=system.redis)

    def first_taken() -> bool:  # RQ records the warm shutdown it began
        return bool(system.redis.hget(rq_worker.key, "shutdown_requested_date"))

    wait_for(first_taken, 10, "the first signal to be handled")
    worker.popen.send_signal(signal.SIGTERM)  # the copy, a few milliseconds later
    assert worker.popen.wait(timeout=30) == 0, worker.output()
    assert [system.status(i) for i in ids] == ["succeeded"] * 2


@pytest.mark.parametrize("kind", ["slow", "slow-async"])
def test_sigterm_lets_running_slots_finish_and_leaves_the_rest_untouched(
    system: System, spawn: Callable[..., Proc], kind: str
) -> None:
    """Their leases are kept while they finish: handlers longer than the lease, and a
    reconciler passing all the while, rescue nothing."""
    ids = [system.app.schedule(kind, {"seconds": 5}, delay=0).id for _ in range(6)]
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "3", "--lease", "3s", "--heartbeat", "0.5s")
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    wait_for(lambda: count_rows(system.app, running) == 3, 30, "three slots to be busy")
    worker.popen.send_signal(signal.SIGTERM)
    reconciler = Reconciler(system.app)
    rescued = 0
    while worker.popen.poll() is None:
        rescued += reconciler.run_once().rescued
        time.sleep(0.2)  # a pass now and then, as a reconciler loop runs
    assert worker.popen.wait() == 0, worker.output()
    assert rescued == 0
    statuses = sorted(system.status(i) for i in ids)
    assert statuses == ["scheduled"] * 3 + ["succeeded"] * 3
    untouched = "SELECT count(*) FROM scheduled_jobs WHERE status = 'scheduled' AND attempts = 0"
    assert count_rows(system.app, untouched) == 3  # no attempt consumed
    assert Queue("duejobs", connection=system.redis, serializer=JSONSerializer).count == 3


@pytest.mark.parametrize("kind", ["stall-once", "stall-once-async"])
def test_sigkill_leaves_every_running_slot_to_the_reconcilers_rescue(
    system: System, spawn: Callable[..., Proc], kind: str
) -> None:
    ids = [system.app.schedule(kind, {"seconds": 120}, delay=0).id for _ in range(3)]
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--concurrency", "3", "--lease", "2s", "--heartbeat", "0.5s")
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    wait_for(lambda: count_rows(system.app, running) == 3, 30, "three slots to be busy")
    worker.stop(signal.SIGKILL)
    reconciler = Reconciler(system.app)

    def rescued() -> bool:
        reconciler.run_once()
        return count_rows(system.app, running) == 0

    wait_for(rescued, 30, "the rescue of every slot")
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in ids))
    assert sorted(system.effects()) == sorted((f"{kind}:{i}:1", 2) for i in ids)


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def test_a_supervisor_starts_again_a_worker_process_that_dies_and_stops_all_warmly(
    system: System, spawn: Callable[..., Proc]
) -> None:
    supervisor = spawn(*WORKER, "--processes", "2", "--concurrency", "2")
    wait_for(lambda: len(_children(supervisor.popen.pid)) == 2, 30, "two worker processes")
    victim = min(_children(supervisor.popen.pid))
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        now = _children(supervisor.popen.pid)
        return len(now) == 2 and victim not in now

    wait_for(replaced, 30, "the dead worker started again")
    ids = [system.app.schedule("record", {}, delay=0).id for _ in range(6)]
    system.scheduler.run_once()
    wait_for(lambda: all(system.status(i) == "succeeded" for i in ids), 30, "the workers")
    workers = _children(supervisor.popen.pid)
    assert supervisor.stop(signal.SIGTERM) == 0, supervisor.output()
    assert not any(_running(pid) for pid in workers)


def test_a_supervisor_whose_worker_refuses_to_start_stops_all_and_exits_2(
    spawn: Callable[..., Proc],
) -> None:
    """A worker that ends with status 2 (here: a schema ``duejobs migrate`` never made) will
    refuse every start: the supervisor stops the others and ends with 2, saying so, instead
    of starting it again every 30 s for good. Seen failing with the supervisor still
    restarting its workers."""
    absent = f"never_made_{uuid.uuid4().hex[:8]}"
    supervisor = spawn(*WORKER, "--processes", "2", extra_env={"DUEJOBS_SCHEMA": absent})
    wait_for(lambda: supervisor.popen.poll() is not None, 60, "the supervisor to end")
    assert supervisor.popen.returncode == 2, supervisor.output()
    assert "run `duejobs migrate`" in supervisor.output()
    assert "refused to start (status 2)" in supervisor.output()


def _threads_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets each thread of a process may run on (a thread ending meanwhile skipped)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # ProcessLookupError, FileNotFoundError
            found.add(frozenset(os.sched_getaffinity(int(task.name))))
    return found


def test_workers_pinned_with_cpus_run_every_slot_thread_on_their_cpu(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """``--cpus``: a lone worker runs its main thread and every slot's thread on the first CPU
    listed; under ``--processes`` the i-th worker on the i-th CPU, round robin. Seen failing
    with the lone worker left unpinned, and with every child given the first CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("pinning shows only on a machine with two CPUs or more")
    listed = [allowed[-1], allowed[0]]
    cpus = ",".join(map(str, listed))
    ids = [system.app.schedule("record", {}, delay=0).id for _ in range(4)]
    system.scheduler.run_once()
    lone = spawn(*WORKER, "--concurrency", "2", "--cpus", cpus)
    wait_for(lambda: all(system.status(i) == "succeeded" for i in ids), 30, "the lone worker")
    assert _threads_cpus(lone.popen.pid) == {frozenset({listed[0]})}
    assert lone.stop(signal.SIGTERM) == 0, lone.output()

    supervisor = spawn(
        *WORKER, "--processes", "2", "--concurrency", "2", "--cpus", cpus, "--name", "pinned"
    )
    keys = [f"rq:worker:pinned-{i}" for i in range(2)]  # the i-th worker, as RQ registers it
    wait_for(lambda: all(system.redis.exists(k) for k in keys), 30, "two registered workers")
    ids = [system.app.schedule("record", {}, delay=0).id for _ in range(8)]
    system.scheduler.run_once()
    wait_for(lambda: all(system.status(i) == "succeeded" for i in ids), 30, "the workers")
    given = {int(system.redis.hget(k, "pid")): listed[i] for i, k in enumerate(keys)}

    def each_on_its_cpu() -> bool:
        return all(_threads_cpus(pid) == {frozenset({cpu})} for pid, cpu in given.items())

    wait_for(each_on_its_cpu, 30, "every thread of each worker on its CPU")
    assert supervisor.stop(signal.SIGTERM) == 0, supervisor.output()


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_do_not_outlive_a_killed_supervisor(
    system: System, spawn: Callable[..., Proc]
) -> None:
    supervisor = spawn(*WORKER, "--processes", "2")
    wait_for(lambda: len(_children(supervisor.popen.pid)) == 2, 30, "two worker processes")
    workers = _children(supervisor.popen.pid)
    os.kill(supervisor.popen.pid, signal.SIGKILL)
    try:
        wait_for(lambda: not any(_running(pid) for pid in workers), 30, "the workers to stop")
    finally:  # a worker left running would take the next tests' jobs
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_whose_supervisor_died_before_it_started_ends_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The death seen before the worker's program runs, with the supervisor's own Python
    signal handler still in place in the child (its flag dies with the exec): the SIGTERM must
    end the child, not trip that handler in vain. Seen failing with the handlers left as
    inherited: the child ran on."""
    monkeypatch.setattr(os, "getppid", lambda: -1)  # in the child: its parent is gone
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # as the supervisor's
    try:
        child = start_supervised([sys.executable, "-c", "import time; time.sleep(60)"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_a_named_worker_started_again_takes_a_name_of_its_own(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """RQ refuses a name that a killed worker left registered."""
    supervisor = spawn(*WORKER, "--processes", "2", "--name", "w")

    def names() -> set[str]:
        return {w.name for w in RQWorker.all(connection=system.redis)}

    wait_for(lambda: names() >= {"w-0", "w-1"}, 30, "both workers registered")
    victim = next(w.pid for w in RQWorker.all(connection=system.redis) if w.name == "w-0")
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "w-0.2" in names(), 30, "the worker started again under a new name")
    assert supervisor.stop(signal.SIGTERM) == 0, supervisor.output()


def test_supervised_burst_workers_end_with_the_queue(
    system: System, spawn: Callable[..., Proc]
) -> None:
    ids = [system.app.schedule("record", {}, delay=0).id for _ in range(6)]
    system.scheduler.run_once()
    supervisor = spawn(*WORKER, "--processes", "2", "--burst")
    assert supervisor.popen.wait(timeout=60) == 0, supervisor.output()
    assert [system.status(i) for i in ids] == ["succeeded"] * 6


@pytest.mark.parametrize("slots", ["1", "2"])
def test_a_worker_stopped_while_it_starts_still_stops(
    system: System, spawn: Callable[..., Proc], slots: str
) -> None:
    """SIGTERM at moments spread over a worker's start-up (before and during RQ's own start):
    each run ends, however early the stop came."""
    for delay in (0.3, 0.5, 0.7, 0.9, 1.1, 1.3):
        worker = spawn(*WORKER, "--concurrency", slots)
        time.sleep(delay)  # the moment of the stop, not a wait for a result
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.popen.wait(timeout=20) in (0, -signal.SIGTERM), worker.output()
