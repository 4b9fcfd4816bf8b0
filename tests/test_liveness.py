"""Liveness: nothing stays stuck while the figures say all is well.

A job hash alone does not prove a delivery is coming: only its id on its queue (or between
RQ's lists), in its scheduled registry at its time, or started by a worker that is alive.
Each test leaves Redis in one of the states that once fooled the push, the reconciler and
``stats`` into calling a lost job live, and checks that the schedule runs anyway.

Seen failing against a build whose push and ``live()`` trusted the hash's ``status`` alone
(every test below but the ones that check a live job is left alone); and against a worker
that gives up recording an outcome at the first row-lock timeout
→ ``test_an_outcome_waits_out_a_row_lock_held_longer_than_the_claims_timeout`` (and
against one whose batched close waits for the lock instead of skipping the row); against a
claim that gives up at once on a row locked when the batched claim looked →
``test_a_claim_waits_for_a_row_lock_released_within_its_timeout_and_runs``; and against a
batched claim that waits for row locks →
``test_a_claim_gives_up_on_a_row_an_open_transaction_locks_without_using_an_attempt``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.exceptions import RedisError
from sqlalchemy import Connection, text

from duejobs import App, Status, store
from duejobs.errors import ConfigurationError
from duejobs.models import Delivery
from duejobs.rq_wire.keys import WORKER_PREFIX
from duejobs.scheduler import occurrences
from duejobs.scheduler.loop import Scheduler
from duejobs.services import stats
from duejobs.services.reconciler import ReconcileConfig, Reconciler
from duejobs.worker import EXIT_WEDGED, Context, Outcome, Runtime, WorkerConfig
from duejobs.worker.heartbeat import Heartbeat, Watched
from tests.support import sample, wait_for
from tests.support.apps import record, register
from tests.support.processes import WORKER, Proc
from tests.support.system import System

JOB_PREFIX = "rq:job:"


def _pushed(system: System, **when: object) -> tuple[object, str]:
    s = system.app.schedule("record", {}, **when)  # type: ignore[arg-type]
    system.scheduler.run_once()
    pushed = system.app.get(s.id)
    assert pushed is not None and pushed.queue_job_id is not None
    return s.id, pushed.queue_job_id


def _queue_key(system: System) -> str:
    return system.scheduler.deliverer.queue.key


def _registry_key(system: System) -> str:
    return system.scheduler.deliverer.scheduled_key


def _without_job(system: System) -> int:
    return stats.collect(system.app).schedules_without_job


def test_a_queued_job_hash_whose_id_left_the_queue_is_pushed_again(system: System) -> None:
    schedule_id, job = _pushed(system, delay=0)
    system.redis.lrem(_queue_key(system), 0, job)  # a plain pop by a worker that then died
    assert system.redis.hget(JOB_PREFIX + job, "status") == b"queued"
    assert _without_job(system) == 1
    result = Reconciler(system.app).run_once()
    assert result.repushed == 1
    assert system.redis.lrange(_queue_key(system), 0, -1) == [job.encode()]
    assert _without_job(system) == 0
    system.work()
    assert system.status(schedule_id) == "succeeded"
    assert len(system.effects()) == 1


def test_a_scheduled_job_hash_missing_from_its_registry_is_pushed_again(system: System) -> None:
    _schedule_id, job = _pushed(system, delay=timedelta(minutes=5))
    system.redis.zrem(_registry_key(system), job)
    assert system.redis.hget(JOB_PREFIX + job, "status") == b"scheduled"
    assert Reconciler(system.app).run_once().repushed == 1
    assert system.redis.zscore(_registry_key(system), job) is not None


def test_a_job_started_by_a_worker_that_is_gone_is_pushed_again(system: System) -> None:
    schedule_id, job = _pushed(system, delay=0)
    system.redis.lpop(_queue_key(system))
    system.redis.hset(JOB_PREFIX + job, mapping={"status": "started", "worker_name": "ghost"})
    assert _without_job(system) == 1
    assert Reconciler(system.app).run_once().repushed == 1
    system.work()
    assert system.status(schedule_id) == "succeeded"


def test_a_job_started_by_a_live_worker_is_left_alone_until_it_is_stuck(system: System) -> None:
    _schedule_id, job = _pushed(system, delay=0)
    system.redis.lpop(_queue_key(system))
    system.redis.hset(JOB_PREFIX + job, mapping={"status": "started", "worker_name": "busy"})
    system.redis.set(WORKER_PREFIX + "busy", "1")
    patient = Reconciler(system.app, ReconcileConfig(stuck_after=timedelta(hours=1)))
    assert patient.run_once().repushed == 0
    assert _without_job(system) == 0


@pytest.mark.parametrize("where", ["started by a live worker", "between RQ's lists"])
def test_a_row_overdue_past_the_threshold_is_repushed_whatever_its_job_hash_says(
    system: System, where: str
) -> None:
    schedule_id, job = _pushed(system, delay=0)
    system.redis.lpop(_queue_key(system))
    if where == "between RQ's lists":
        system.redis.rpush(_queue_key(system) + ":intermediate", job)
    else:
        system.redis.hset(JOB_PREFIX + job, mapping={"status": "started", "worker_name": "w"})
        system.redis.set(WORKER_PREFIX + "w", "1")
    with system.app.engine.begin() as conn:  # the row has waited a minute for its claim
        conn.exec_driver_sql(
            "UPDATE scheduled_jobs SET due_at = due_at - interval '1 minute' "
            f"WHERE id = '{schedule_id}'"
        )
    before = sample("duejobs_overdue_repushed_total")
    assert _without_job(system) == 1
    result = Reconciler(system.app).run_once()
    assert (result.repushed, result.overdue_repushed) == (1, 1)
    assert sample("duejobs_overdue_repushed_total") == before + 1
    assert system.redis.llen(_queue_key(system) + ":intermediate") == 0
    system.work()
    assert system.status(schedule_id) == "succeeded"
    assert len(system.effects()) == 1


def test_a_job_waiting_on_its_queue_is_never_pushed_twice(system: System) -> None:
    ids = [_pushed(system, delay=0)[0] for _ in range(5)]
    with system.app.engine.begin() as conn:  # a backlog: all overdue past the threshold
        conn.exec_driver_sql("UPDATE scheduled_jobs SET due_at = due_at - interval '1 hour'")
    assert Reconciler(system.app).run_once().repushed == 0
    assert system.redis.llen(_queue_key(system)) == 5
    assert _without_job(system) == 0
    system.work()
    assert all(system.status(i) == "succeeded" for i in ids)


# -- hard time limits, async handlers, locked rows -------------------------------------------


def test_a_handler_that_catches_exception_cannot_swallow_its_timeout(system: System) -> None:
    def retry_forever(ctx: object, payload: object) -> None:
        give_up = time.monotonic() + 5
        while time.monotonic() < give_up:
            try:
                time.sleep(0.05)
            except Exception:  # a retry loop: it used to swallow the timeout here
                continue

    system.app.handler("retry-forever", max_attempts=1, timeout=timedelta(milliseconds=300))(
        retry_forever
    )
    s = system.app.schedule("retry-forever", {}, delay=0)
    system.scheduler.run_once()
    started = time.monotonic()
    system.work()
    assert time.monotonic() - started < 4
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error is not None and stored.last_error.startswith("HandlerTimeoutError")


def test_a_handler_that_never_returns_loses_its_lease_and_its_worker_exits(
    system: System, spawn: Callable[..., Proc]
) -> None:
    s = system.app.schedule("stubborn", {"seconds": 120}, delay=0)
    system.scheduler.run_once()
    worker = spawn(*WORKER, "--burst", "--timeout-grace", "1s")
    # timeout 1 s + grace 1 s; the heartbeat (5 s) must not keep it alive past that
    assert worker.popen.wait(timeout=30) == EXIT_WEDGED, worker.output()
    assert "did not return within 1 s more" in worker.output()
    stored = system.app.get(s.id)
    assert stored is not None
    assert (stored.status, stored.attempts) == (Status.SCHEDULED, 1)  # retried per its policy
    assert stored.last_error is not None and "did not return" in stored.last_error
    with system.app.engine.connect() as conn:
        lease = conn.execute(
            text("SELECT lease_expires_at FROM scheduled_jobs WHERE id = :id"), {"id": s.id}
        ).scalar_one()
    assert lease is None


def test_the_heartbeat_wakes_for_an_attempt_to_give_up_before_its_next_beat(app: App) -> None:
    """A heartbeat that beats every minute, asleep with nothing to renew, is given an attempt
    whose handler's time (timeout and grace) ends in 0.3 s: it gives it up then, not at its
    next beat. Seen failing with the heartbeat woken for no attempt."""
    gave_up = threading.Event()
    heartbeat = Heartbeat(app.core, timedelta(minutes=1), timedelta(minutes=2))
    try:
        time.sleep(0.1)  # the thread asleep for its beat
        delivery = Delivery(uuid.uuid4(), "default", 1, 1, "duejobs")
        watched = Watched(delivery, time.monotonic() + 0.3, gave_up.set)
        with heartbeat.watching(watched):
            assert gave_up.wait(10)
        assert watched.fired
    finally:
        heartbeat.stop()


def test_an_async_handler_is_awaited_before_it_counts_as_succeeded(system: System) -> None:
    async def record_later(ctx: Context, payload: object) -> None:
        await asyncio.sleep(0.01)
        record(ctx, payload)

    system.app.handler("async-record")(record_later)
    s = system.app.schedule("async-record", {}, delay=0)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert [key for key, _ in system.effects()] == [f"async-record:{s.id}:1"]


def test_an_async_handler_past_its_timeout_fails(system: System) -> None:
    async def hang(ctx: Context, payload: object) -> None:
        await asyncio.sleep(10)

    system.app.handler("async-hang", max_attempts=1, timeout=timedelta(milliseconds=300))(hang)
    s = system.app.schedule("async-hang", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error is not None and stored.last_error.startswith("HandlerTimeoutError")


def _lock_row(holder: Connection, schedule_id: object) -> None:
    """Hold the schedule's row lock in ``holder``'s open transaction, as an application might."""
    holder.execute(
        text("SELECT 1 FROM scheduled_jobs WHERE id = :id FOR UPDATE"), {"id": schedule_id}
    )


def test_a_claim_gives_up_on_a_row_an_open_transaction_locks_without_using_an_attempt(
    app: App, redis_client: object
) -> None:
    register(app)
    runtime = Runtime(app, WorkerConfig(claim_lock_timeout=timedelta(milliseconds=200)))
    s = app.schedule("record", {}, delay=0)
    try:
        with app.engine.connect() as holder:
            _lock_row(holder, s.id)
            started = time.monotonic()
            delivered = runtime.deliver(Delivery(s.id, "default", 1, 1, s.queue))
            assert delivered.outcome == Outcome.DEFERRED and delivered.put_back_at is not None
            assert time.monotonic() - started < 2
            holder.rollback()
        stored = app.get(s.id)
        assert stored is not None and (stored.status, stored.attempts) == (Status.SCHEDULED, 0)
        assert runtime.handle(s.id, 1, 1, "default") is Outcome.SUCCEEDED
    finally:
        runtime.close()


def test_a_claim_waits_for_a_row_lock_released_within_its_timeout_and_runs(app: App) -> None:
    """The batched claim skips a locked row; the delivery's own verdict then waits for the
    lock and, finding the row still ready, claims it: one attempt, run at once."""
    register(app)
    runtime = Runtime(app, WorkerConfig(claim_lock_timeout=timedelta(seconds=5)))
    s = app.schedule("record", {}, delay=0)
    try:
        with app.engine.connect() as holder:
            _lock_row(holder, s.id)
            threading.Timer(0.3, holder.rollback).start()
            assert runtime.handle(s.id, 1, 1, "default") is Outcome.SUCCEEDED
    finally:
        runtime.close()
    stored = app.get(s.id)
    assert stored is not None and (stored.status, stored.attempts) == (Status.SUCCEEDED, 1)


def test_an_outcome_waits_out_a_row_lock_held_longer_than_the_claims_timeout(app: App) -> None:
    """An application transaction holds the row while the handler returns: the worker keeps
    trying to record the outcome (each try gives up after ``claim_lock_timeout``) until the
    lock is gone, and the outcome is kept."""
    holding, release = threading.Event(), threading.Event()

    def hold(schedule_id: object) -> None:
        with app.engine.connect() as holder:
            _lock_row(holder, schedule_id)
            holding.set()
            release.wait(30)
            holder.rollback()

    def locked_at_close(ctx: Context, payload: Any) -> None:
        threading.Thread(target=hold, args=(ctx.schedule_id,), daemon=True).start()
        assert holding.wait(10)
        # Released once the outcome has met the lock twice (two rounds of the timeout).
        threading.Timer(0.45, release.set).start()

    app.handler("locked-at-close")(locked_at_close)
    runtime = Runtime(app, WorkerConfig(claim_lock_timeout=timedelta(milliseconds=200)))
    s = app.schedule("locked-at-close", {}, delay=0)
    try:
        assert runtime.handle(s.id, 1, 1, "default") is Outcome.SUCCEEDED
    finally:
        release.set()
        runtime.close()
    stored = app.get(s.id)
    assert stored is not None and stored.status is Status.SUCCEEDED


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"heartbeat": timedelta(seconds=30)}, "heartbeat"),
        ({"lease": timedelta(0)}, "lease"),
        ({"timeout_grace": timedelta(seconds=-1)}, "timeout_grace"),
        ({"max_early_wait": timedelta(hours=1)}, "max_early_wait"),
    ],
)
def test_a_worker_config_that_cannot_work_is_refused(knobs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        WorkerConfig(**knobs)


# -- loops that one bad pass cannot stop ------------------------------------------------------


# Each loop, the function one of its passes calls, and the counter of its failed passes.
_LOOPS = {
    "scheduler": (store, "walk_pairs", "duejobs_scheduler_failed_passes_total"),
    "recurring": (occurrences, "materialize_once", "duejobs_recurring_failed_passes_total"),
    "reconciler": (store, "rescue_expired", "duejobs_reconciler_failed_passes_total"),
}


@pytest.mark.parametrize("loop", list(_LOOPS))
def test_an_unexpected_error_in_a_pass_does_not_stop_the_loop(
    system: System, monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    """The scheduler's claims and its recurring loop run in ``Scheduler.run``; each pass's
    failure is counted on its own loop's counter and the loop goes on to do its work."""
    module, name, counter = _LOOPS[loop]
    calls = {"n": 0}
    real = getattr(module, name)

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug one row's data sets off")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, fails_once)
    service: Scheduler | Reconciler = system.scheduler
    run: Callable[[], None] = system.scheduler.run
    if loop == "reconciler":
        service = Reconciler(system.app)
        run = functools.partial(service.run, timedelta(milliseconds=50))
    failed_before = sample(counter)
    s = system.app.schedule("record", {}, delay=0)
    system.app.recurring("tick", cron="* * * * *", type="record")
    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: system.app.get(s.id).queue_job_id is not None, 10, "a push")  # type: ignore[union-attr]
        if loop != "reconciler":
            wait_for(lambda: system.app.list(recurring="tick").schedules, 10, "an occurrence")
    finally:
        service.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert calls["n"] >= 2
    assert sample(counter) == failed_before + 1


def test_a_report_that_fails_does_not_stop_the_loop(system: System) -> None:
    """The reconciler's report refreshes the gauges, which read PostgreSQL and Redis: an
    outage meeting it there ended the loop (the report ran outside the pass's guard)."""
    reports = {"n": 0}

    def report(result: object) -> None:
        reports["n"] += 1
        if reports["n"] == 1:
            raise RedisError("the gauges met Redis gone")

    reconciler = Reconciler(system.app)
    failed_before = sample("duejobs_reconciler_failed_passes_total")
    thread = threading.Thread(target=reconciler.run, args=(timedelta(milliseconds=20), report))
    thread.start()
    try:
        wait_for(lambda: reports["n"] >= 3, 10, "reports after the failed one")
    finally:
        reconciler.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert sample("duejobs_reconciler_failed_passes_total") == failed_before + 1


def test_a_schedule_due_long_ago_is_pushed_again_after_redis_loses_it(system: System) -> None:
    s = system.app.schedule("record", {}, run_at=datetime(1950, 1, 1, tzinfo=UTC))
    system.scheduler.run_once()
    system.redis.flushdb()  # all it holds: its queues
    assert Reconciler(system.app).run_once().repushed == 1  # the reconciler pages from year 1
    system.work()
    assert system.status(s.id) == "succeeded"


def test_a_handler_wedged_inside_its_effect_fence_still_ends_its_worker_and_is_rescued(
    system: System, spawn: Callable[..., Proc]
) -> None:
    s = system.app.schedule("stubborn-fenced", {"seconds": 120}, delay=0)
    system.scheduler.run_once()
    worker = spawn(
        *WORKER, "--burst", "--lease", "4s", "--heartbeat", "1s", "--timeout-grace", "1s"
    )
    # The fence holds the row lock: renewing the lease and closing the attempt must give up on
    # it instead of hanging behind it, and the process must end all the same.
    assert worker.popen.wait(timeout=30) == EXIT_WEDGED, worker.output()

    def rescued() -> bool:
        Reconciler(system.app).run_once()
        stored = system.app.get(s.id)
        return stored is not None and stored.status is Status.SCHEDULED

    wait_for(rescued, 20, "the reconciler to rescue the attempt")


def test_an_async_handler_leaves_nothing_running_into_the_next_job(system: System) -> None:
    late: list[str] = []

    async def fire_and_forget(ctx: Context, payload: object) -> None:
        async def later() -> None:
            await asyncio.sleep(0.3)
            late.append("ran after its attempt closed")

        asyncio.get_running_loop().create_task(later())

    async def long_enough(ctx: Context, payload: object) -> None:
        await asyncio.sleep(0.6)

    system.app.handler("fire-and-forget")(fire_and_forget)
    system.app.handler("long-enough")(long_enough)
    first = system.app.schedule("fire-and-forget", {}, delay=0)
    second = system.app.schedule("long-enough", {}, delay=0)
    system.run_until(lambda: {system.status(first.id), system.status(second.id)} == {"succeeded"})
    assert late == []


def test_a_slot_keeps_its_event_loop_from_one_async_handler_to_the_next(system: System) -> None:
    """A loop set up per job would cost every async delivery its setup and leak loops."""
    loops: list[int] = []

    async def note_loop(ctx: Context, payload: object) -> None:
        loops.append(id(asyncio.get_running_loop()))

    system.app.handler("note-loop")(note_loop)
    for _ in range(2):
        s = system.app.schedule("note-loop", {}, delay=0)
        assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.SUCCEEDED
    assert len(loops) == 2 and loops[0] == loops[1]


def test_the_workers_session_settings_never_reach_the_apps_pool(app: App) -> None:
    register(app)
    runtime = Runtime(app, WorkerConfig())
    runtime.handle(app.schedule("record", {}, delay=0).id, 1, 1, "default")
    runtime.close()
    connections = [app.engine.connect() for _ in range(5)]  # the pool's, and new ones
    try:
        settings = {
            c.exec_driver_sql("SHOW synchronous_commit").scalar_one()
            + "/"
            + c.exec_driver_sql("SHOW lock_timeout").scalar_one()
            for c in connections
        }
    finally:
        for c in connections:
            c.close()
    assert settings == {"on/0"}


def test_an_error_text_postgres_cannot_store_is_recorded_anyway(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker's warning carries the raw traceback, lone surrogate and all: kept out of the
    # test's report, which pytest-xdist sends between processes as UTF-8.
    caplog.set_level(logging.ERROR, logger="duejobs.worker")

    def unprintable(ctx: Context, payload: object) -> None:
        raise RuntimeError("bad\x00byte \ud800 here")

    system.app.handler("unprintable", max_attempts=1)(unprintable)
    s = system.app.schedule("unprintable", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error == "RuntimeError: bad\\x00byte \\ud800 here"


def test_the_schedulers_backoff_stays_capped_however_long_the_outage(system: System) -> None:
    assert system.scheduler.backoff(1) < system.scheduler.backoff(2)
    assert system.scheduler.backoff(5000) == system.scheduler.config.max_backoff.total_seconds()


def test_the_bookkeepings_limits_end_with_each_statement_on_its_own_connection(
    app: App,
) -> None:
    """Read directly on the worker's own bookkeeping connection after a delivery: no limit it
    set (``lock_timeout``, ``synchronous_commit``) is left on the session, which a pooler
    would hand to another client. Seen passing every other test with the limits set for the
    session (the pooler's test did not see them)."""
    register(app)
    runtime = Runtime(app, WorkerConfig(claim_lock_timeout=timedelta(milliseconds=1500)))
    try:
        assert runtime.handle(app.schedule("record", {}, delay=0).id, 1, 1, "default") is (
            Outcome.SUCCEEDED
        )
        with runtime.bookkeeping.connection() as conn:
            store.bookkeeping_durability(conn)  # a statement with the bookkeeping's limits
            driver = getattr(conn, "driver_connection", None) or conn.connection.driver_connection
            shown = [
                driver.execute(f"SHOW {name}").fetchone()[0]
                for name in ("lock_timeout", "synchronous_commit")
            ]
    finally:
        runtime.close()
    assert shown == ["0", "on"]
