"""The worker's first promise at every concurrency: a handler runs only for the current version
of its schedule, each attempt once — with copies of one schedule at several versions taken in
one batch, a batch whose start Redis fails for longer than its claims' lease, a job hash Redis
left half-written, and a handler's task that will not be cancelled.

Seen failing against today's builds and builds broken on purpose:

* the batched claim's answers matched by schedule id alone (a superseded copy took the current
  version's claim and ran; the current one was skipped as a duplicate, then rescued and run
  again) →
  ``test_a_superseded_copy_taken_with_the_current_version_never_runs_in_its_place``;
* jobs whose take's answer was lost, found again once Redis answered, beside a reconciler
  (none may run twice) → ``test_jobs_taken_while_redis_loses_the_answers_run_once_past_a_lease``;
* a batch take that met a job hash without its data ending the loop (a slotted worker
  exited 0 with good jobs left unrun) →
  ``test_a_half_written_job_hash_is_passed_over_and_the_jobs_taken_with_it_run``; an error
  ending the loop reported as a clean stop → ``test_a_worker_ended_by_an_error_exits_non_zero``;
* a task left by an ``async def`` handler that swallows its cancellation running on into the
  slot's next handler → ``test_a_leftover_task_that_refuses_cancellation_never_runs_again``;
* ``retry()`` that loses a key race raising the driver's ``IntegrityError`` →
  ``test_retry_losing_a_key_race_is_key_in_use``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from redis.commands.core import Script
from rq import Queue
from rq.serializers import JSONSerializer
from sqlalchemy import text

from duejobs import App
from duejobs.errors import KeyInUseError
from duejobs.models import Delivery
from duejobs.rq_wire.scripts import TAKE
from duejobs.services.reconciler import Reconciler
from duejobs.worker import Outcome, Runtime, Worker, WorkerConfig
from duejobs.worker.event_loops import EventLoops
from tests.support import wait_for
from tests.support.processes import Proc
from tests.support.system import System

WORKER = ["worker", "--app", "tests.support.apps:app", "--log-level", "warning"]


def _runs(app: App) -> list[tuple[uuid.UUID, int, int]]:
    """Every handler run recorded by ``traced``: (schedule, version, attempt)."""
    with app.engine.connect() as conn:
        rows = conn.execute(text("SELECT schedule_id, version, attempt FROM test_runs ORDER BY id"))
        return [(r.schedule_id, r.version, r.attempt) for r in rows]


def _work(system: System, config: WorkerConfig) -> None:
    runtime = Runtime(system.app, config)
    try:
        Worker(runtime).work(burst=True)
    finally:
        runtime.close()


@pytest.mark.parametrize("concurrency", [4, 16])
def test_a_superseded_copy_taken_with_the_current_version_never_runs_in_its_place(
    system: System, concurrency: int
) -> None:
    """v1's job stays in Redis when v2 is promoted (``reschedule(..., conn=)`` leaves it, as
    does a failed removal); a worker with slots takes both in one batch. v2 runs once, on v2;
    v1 is skipped as superseded."""
    s = system.app.schedule("traced", {}, delay=0)
    system.scheduler.run_once()  # v1 on the queue
    with system.app.engine.begin() as conn:
        moved = system.app.reschedule(s.id, delay=0, conn=conn)  # leaves v1's job
    system.scheduler.run_once()  # v2 on the queue
    queue = Queue("duejobs", connection=system.redis, serializer=JSONSerializer)
    # v1 ahead of v2 in the batch (the scheduler pushed v2 to the front, being due)
    stale = f"dj-default-{s.id.hex}-v1-a1"
    assert system.redis.lrem(queue.key, 0, stale) == 1
    system.redis.lpush(queue.key, stale)
    assert queue.count == 2
    _work(system, WorkerConfig(concurrency=concurrency, heartbeat=timedelta(milliseconds=200)))
    assert _runs(system.app) == [(s.id, moved.version, 1)]
    assert system.status(s.id) == "succeeded"
    assert system.effects() == [(f"traced:{s.id}:{moved.version}", 1)]
    skips = [e.detail for e in system.app.history(s.id) if e.kind.value == "skipped"]
    assert [(d["reason"], d["delivered_version"]) for d in skips] == [("superseded", 1)]


@pytest.fixture
def take_answers_lost(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[float], None]]:
    """For ``seconds`` from the first take that finds jobs, every take's answer is lost
    after Redis ran it (the connection broke on the way back)."""
    outage: dict[str, float] = {}
    real = Script.__call__

    def down(seconds: float) -> None:
        outage["seconds"] = seconds

    def lossy(script: Script, *args: Any, **kwargs: Any) -> Any:
        answer = real(script, *args, **kwargs)
        if script.script == TAKE and (answer or "ends" in outage):
            ends = outage.setdefault("ends", time.monotonic() + outage["seconds"])
            if time.monotonic() < ends:
                raise redis.ConnectionError("the take's answer was lost")
        return answer

    monkeypatch.setattr(Script, "__call__", lossy)
    yield down


def test_jobs_taken_while_redis_loses_the_answers_run_once_past_a_lease(
    system: System, take_answers_lost: Callable[[float], None]
) -> None:
    """Four jobs taken together whose take's answer is lost, and every answer after it for
    longer than a claim's 1 s lease, while a reconciler runs every 0.1 s: the jobs, started
    in RQ for a worker that lives, are not pushed again; the worker finds them once Redis
    answers and each handler runs once, and every schedule succeeds."""
    ids = [system.app.schedule("traced", {}, delay=0).id for _ in range(4)]
    system.scheduler.run_once()
    take_answers_lost(1.8)
    reconciler = Reconciler(system.app)
    stop = threading.Event()

    def reconcile() -> None:
        while not stop.wait(0.1):
            reconciler.run_once()

    looping = threading.Thread(target=reconcile, daemon=True)
    looping.start()
    config = WorkerConfig(
        concurrency=4, lease=timedelta(seconds=1), heartbeat=timedelta(milliseconds=200)
    )
    try:
        _work(system, config)  # the four taken together, found again

        def all_succeeded() -> bool:
            _work(system, config)  # the attempts the reconciler pushed again
            return all(system.status(i) == "succeeded" for i in ids)

        wait_for(all_succeeded, 30, "every schedule to succeed")
    finally:
        stop.set()
        looping.join()
    runs = _runs(system.app)
    assert sorted(r[0] for r in runs) == sorted(ids), runs  # one run each
    closed = {
        (i, a.attempt) for i in ids for a in system.app.attempts(i) if a.status == "succeeded"
    }
    assert {(r[0], r[2]) for r in runs} == closed  # each on the attempt that closed its row


@pytest.fixture
def lapsed_claim(system: System) -> Iterator[tuple[uuid.UUID, Runtime]]:
    """A traced schedule claimed ahead (as with jobs taken together) by a runtime with a 1 s
    lease, and that lease run out before any handler started on it."""
    s = system.app.schedule("traced", {}, delay=0)
    config = WorkerConfig(lease=timedelta(seconds=1), heartbeat=timedelta(milliseconds=200))
    runtime = Runtime(system.app, config)
    try:
        runtime.claim_ahead([Delivery(s.id, "default", 1, 1, s.queue)])
        wait_for(lambda: _lease_ran_out(system.app, s.id), 30, "the claim's lease to run out")
        yield s.id, runtime
    finally:
        runtime.close()


def test_a_claim_made_ahead_is_never_used_once_the_reconciler_rescued_it(
    system: System, lapsed_claim: tuple[uuid.UUID, Runtime]
) -> None:
    """A delivery claimed with others whose handler could not start before the claim's lease
    ran out, and which the reconciler rescued meanwhile, is not run on that claim: skipped,
    and the attempt the rescue pushed runs instead (once)."""
    sid, runtime = lapsed_claim
    assert Reconciler(system.app).run_once().rescued == 1
    assert runtime.handle(sid, 1, 1, "default") is Outcome.SKIPPED
    assert _runs(system.app) == []
    assert runtime.handle(sid, 1, 2, "default") is Outcome.SUCCEEDED
    assert _runs(system.app) == [(sid, 1, 2)]
    assert [a.status for a in system.app.attempts(sid)] == ["abandoned", "succeeded"]


def test_a_claim_made_ahead_whose_lease_ran_out_unrescued_is_renewed_and_runs_once(
    system: System, lapsed_claim: tuple[uuid.UUID, Runtime]
) -> None:
    """The same claim, its lease run out but not rescued yet: renewed (under the row lock,
    which orders it with any rescue), its handler runs once on it, and no attempt is lost."""
    sid, runtime = lapsed_claim
    assert runtime.handle(sid, 1, 1, "default") is Outcome.SUCCEEDED
    assert _runs(system.app) == [(sid, 1, 1)]
    assert Reconciler(system.app).run_once().rescued == 0


def _lease_ran_out(app: App, schedule_id: uuid.UUID) -> bool:
    with app.engine.connect() as conn:
        query = "SELECT lease_expires_at < now() FROM scheduled_jobs WHERE id = :id"
        return bool(conn.execute(text(query), {"id": schedule_id}).scalar_one())


def test_a_half_written_job_hash_is_passed_over_and_the_jobs_taken_with_it_run(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """A job hash left without its ``data`` (a FLUSHDB as a worker finished or put it back),
    taken in one batch with good jobs: passed over, the good ones run, the worker goes on."""
    ids = [system.app.schedule("record", {}, delay=0).id for _ in range(3)]
    system.scheduler.run_once()
    queue = Queue("duejobs", connection=system.redis, serializer=JSONSerializer)
    system.redis.hset("rq:job:half-written", mapping={"status": "finished"})
    system.redis.lpush(queue.key, "half-written")  # taken in the middle of the batch
    system.redis.rpush(queue.key, *[system.redis.lpop(queue.key) for _ in range(2)])
    worker = spawn(*WORKER, "--concurrency", "4", "--burst")
    assert worker.popen.wait(timeout=60) == 0, worker.output()
    assert [system.status(i) for i in ids] == ["succeeded"] * 3, worker.output()


def test_a_worker_ended_by_an_error_exits_non_zero(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """The loop ends on an error it does not expect (a bug, not an outage); the worker's
    command then exits 1 naming it (a supervisor restarts it), never 0 as from a stop."""
    system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    code = (
        "import sys\n"
        "from duejobs.worker.loop import Worker\n"
        "def broken(self, *args, **kwargs):\n"
        "    raise LookupError('a step of the loop broke')\n"
        "Worker._free_slots = broken\n"
        "from duejobs.cli import main\n"
        f"sys.argv = ['duejobs', *{WORKER!r}, '--concurrency', '2', '--burst']\n"
        "main()\n"
    )
    worker = spawn(code=code)
    assert worker.popen.wait(timeout=60) == 1, worker.output()
    assert "ended by LookupError: a step of the loop broke" in worker.output()


def test_a_leftover_task_that_refuses_cancellation_never_runs_again() -> None:
    """A handler leaves a task that swallows its cancellation; the slot's next handler runs
    on the same thread, and the task does not run a step meanwhile (nor after)."""
    steps = [0]

    async def refuses() -> None:
        while True:
            try:
                await asyncio.sleep(0.005)
                steps[0] += 1
            except asyncio.CancelledError:
                continue

    async def leaves_a_task() -> None:
        asyncio.get_running_loop().create_task(refuses(), name="refuses-cancellation")
        await asyncio.sleep(0.02)

    async def next_handler() -> int:
        before = steps[0]
        await asyncio.sleep(0.1)
        return steps[0] - before

    loops = EventLoops()
    try:
        loops.run(leaves_a_task())
        assert steps[0] > 0  # it ran while its handler did
        seen: list[int] = []

        async def observed() -> None:
            seen.append(await next_handler())

        loops.run(observed())
        assert seen == [0]
    finally:
        loops.close()


def test_retry_losing_a_key_race_is_key_in_use(app: App) -> None:
    """``retry()`` of a cancelled schedule while another transaction inserts a live schedule
    with its key and commits after the retry looked: ``KeyInUseError`` (never the driver's
    error), and the rival keeps the key."""
    app.handler("noop")(lambda ctx, payload: None)
    old = app.schedule("noop", {}, delay=timedelta(hours=1), key="race")
    assert app.cancel(old.id)
    outcome: list[BaseException | None] = []

    def retry() -> None:
        try:
            app.retry(old.id)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    with app.engine.connect() as rival:
        rival.begin()
        taken = app.schedule("noop", {}, delay=timedelta(hours=1), key="race", conn=rival)
        retrying = threading.Thread(target=retry)
        retrying.start()
        wait_for(lambda: _waiting_on_a_lock(app), 30, "the retry to wait on the key")
        rival.commit()
    retrying.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], KeyInUseError), outcome
    holder = app.get_by_key("race")
    assert holder is not None and holder.id == taken.id
    stored = app.get(old.id)
    assert stored is not None and stored.status.value == "cancelled"


def _waiting_on_a_lock(app: App) -> bool:
    with app.engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' "
                "AND query LIKE '%status IN (''failed'', ''cancelled'')%'"  # the retry's
            )
        ).scalar_one()
    return int(waiting) > 0
