"""The promises duejobs is proudest of, each with a test that fails when the promise breaks.

Each was seen failing against a build broken on purpose (what was broken → what caught it):

* ``ctx.ensure_current()`` made a no-op, or blind to another attempt of the same version (a
  rescued attempt still running)
  → ``test_ensure_current_stops_a_handler_whose_schedule_was_changed_meanwhile``;
* the fence's re-check in ``ctx.transaction()`` dropped
  → ``test_the_effect_transaction_refuses_a_schedule_that_moved_on_before_it``;
* ``transaction()`` ignoring what the finish returns, with the effect's writes committed
  anyway → ``test_an_effect_whose_finish_finds_the_attempt_gone_is_rolled_back``;
* a cancel that decides without locking the row (``FOR UPDATE`` dropped from the cancel: it
  then overwrites the fence's ``succeeded``)
  → ``test_a_cancel_during_the_effect_transaction_waits_and_then_finds_it_finished``.
  Dropping the fence's ``FOR UPDATE`` alone survives: the ledger insert's foreign key takes a
  ``KEY SHARE`` lock on the row that a cancel's ``FOR UPDATE`` waits for, and a change that
  slips between the re-check and that insert is rolled back by the finish check — two guards
  on one window, kept on purpose;
* the finished-schedule branch of the orphan check dropped
  → ``test_a_waiting_job_of_a_finished_schedule_is_an_orphan``;
* the live-key lookup not counting running rows as live
  → ``test_a_key_is_held_while_its_schedule_runs_and_freed_when_it_finishes``;
* the worker's queues sorted instead of taken in the order given
  → ``test_a_worker_takes_its_queues_in_the_order_given``;
* the scheduler's backoff uncapped
  → ``test_the_scheduler_backs_off_up_to_its_cap_through_an_outage``;
* the fence committing when the handler raises inside it
  → ``test_a_handler_that_fails_inside_the_effect_transaction_leaves_no_effect``;
* the worker taking a database error for a skip (the RQ job then "finished")
  → ``test_a_worker_that_loses_the_database_fails_the_rq_job_and_leaves_the_row``;
* the cancel refusing a running row
  → ``test_a_running_job_cancelled_says_true_and_its_handler_goes_on_unless_it_checks``;
* the reschedule keeping a running row's status (its new version then waits for a rescue)
  → ``test_a_running_job_rescheduled_runs_again_at_its_new_time``;
* ``schedule_many`` committing in chunks of 50,000 (the cut then comes after a commit)
  → ``test_an_outage_inside_the_apps_transaction_rolls_everything_back``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, text

from duejobs import App, EventKind, ScheduleRequest, Status, store
from duejobs.errors import DatabaseUnavailableError
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.reconciler import Reconciler, orphan_jobs
from duejobs.worker import Context, Runtime, Worker, WorkerConfig
from tests.support import sample, wait_for
from tests.support.apps import register
from tests.support.deliveries import push_of
from tests.support.system import System

FAILED = "duejobs_scheduler_failed_passes_total"


def _write_effect(conn: Connection, ctx: Context) -> None:
    """The handler's own write, made inside ``ctx.transaction()``."""
    conn.execute(
        text(
            "INSERT INTO test_effects (effect_key, schedule_id, attempt, worker_pid) "
            "VALUES (:k, :id, :a, 0)"
        ),
        {"k": ctx.effect_key, "id": ctx.schedule_id, "a": ctx.attempt},
    )


def _effects(system: System, schedule_id: object) -> int:
    with system.app.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM test_effects WHERE schedule_id = :id"),
                {"id": schedule_id},
            ).scalar_one()
        )


def _ledger(system: System, schedule_id: object) -> int:
    with system.app.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM scheduled_job_effects WHERE schedule_id = :id"),
                {"id": schedule_id},
            ).scalar_one()
        )


def _attempt_states(system: System, schedule_id: object) -> list[str]:
    with system.app.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT status FROM scheduled_job_attempts WHERE schedule_id = :id "
                    "ORDER BY version, attempt"
                ),
                {"id": schedule_id},
            ).scalars()
        )


def _run(system: System, job_type: str) -> Any:
    s = system.app.schedule(job_type, {}, delay=0)
    system.scheduler.run_once()
    system.work()
    return s


# -- ctx.ensure_current() ---------------------------------------------------------------------


@pytest.mark.parametrize("change", ["cancelled", "rescheduled", "taken over"])
def test_ensure_current_stops_a_handler_whose_schedule_was_changed_meanwhile(
    system: System, change: str
) -> None:
    reached: list[str] = []

    def changed_meanwhile(ctx: Context, payload: Any) -> None:
        if change == "cancelled":
            system.app.cancel(ctx.schedule_id)  # another process, while this runs
        elif change == "rescheduled":
            system.app.reschedule(ctx.schedule_id, delay=timedelta(hours=1))
        else:  # its lease lapsed, it was rescued, and another worker runs the next attempt
            with system.app.engine.begin() as conn:
                conn.execute(
                    text("UPDATE scheduled_jobs SET attempts = attempts + 1 WHERE id = :id"),
                    {"id": ctx.schedule_id},
                )
        ctx.ensure_current()
        reached.append("the external effect")

    system.app.handler("changed-meanwhile")(changed_meanwhile)
    s = _run(system, "changed-meanwhile")
    assert reached == []
    assert _attempt_states(system, s.id) == ["stale"]
    skipped = [e for e in system.app.history(s.id) if e.kind is EventKind.SKIPPED]
    reason = {"cancelled": "cancelled", "rescheduled": "superseded"}.get(change, "duplicate")
    assert [(e.detail["reason"], e.detail["while"]) for e in skipped] == [(reason, "running")]


@pytest.mark.parametrize("ending", ["returns", "raises"])
@pytest.mark.parametrize("change", ["cancelled", "rescheduled"])
def test_an_attempt_that_ends_after_its_schedule_moved_on_is_recorded_stale_and_changes_nothing(
    system: System, change: str, ending: str
) -> None:
    def moved_on_meanwhile(ctx: Context, payload: Any) -> None:
        if change == "cancelled":
            system.app.cancel(ctx.schedule_id)  # another process, while this runs
        else:
            system.app.reschedule(ctx.schedule_id, delay=timedelta(hours=1))
        if ending == "raises":
            raise RuntimeError("failed after the change")

    system.app.handler("moved-on-meanwhile")(moved_on_meanwhile)
    s = _run(system, "moved-on-meanwhile")
    stored = system.app.get(s.id)
    assert stored is not None and stored.version == 2  # the change stands, nothing on top
    expected = Status.CANCELLED if change == "cancelled" else Status.SCHEDULED
    attempts = 1 if change == "cancelled" else 0  # a new version starts its attempts afresh
    assert (stored.status, stored.attempts, stored.last_error) == (expected, attempts, None)
    assert _attempt_states(system, s.id) == ["stale"]
    kinds = [e.kind for e in system.app.history(s.id)]
    assert EventKind.SUCCEEDED not in kinds and EventKind.RETRIED not in kinds
    skipped = [e for e in system.app.history(s.id) if e.kind is EventKind.SKIPPED]
    reason = {"cancelled": "cancelled", "rescheduled": "superseded"}.get(change, "duplicate")
    assert [(e.detail["reason"], e.detail["while"]) for e in skipped] == [(reason, "running")]


def test_ensure_current_lets_a_current_attempt_go_on(system: System) -> None:
    reached: list[str] = []

    def current(ctx: Context, payload: Any) -> None:
        ctx.ensure_current()
        reached.append("the external effect")

    system.app.handler("current")(current)
    s = _run(system, "current")
    assert reached == ["the external effect"] and system.status(s.id) == "succeeded"


# -- a change to a running job ----------------------------------------------------------------


def test_a_running_job_cancelled_says_true_and_its_handler_goes_on_unless_it_checks(
    system: System,
) -> None:
    """``cancel`` of a running job returns True; the handler is not interrupted (only
    ``ctx.ensure_current()`` would stop it) and its attempt ends ``stale``."""
    said: list[bool] = []
    reached: list[str] = []

    def cancelled_meanwhile(ctx: Context, payload: Any) -> None:
        said.append(system.app.cancel(ctx.schedule_id))  # another process, while this runs
        reached.append("the rest of the handler")

    system.app.handler("cancelled-meanwhile")(cancelled_meanwhile)
    s = _run(system, "cancelled-meanwhile")
    assert said == [True] and reached == ["the rest of the handler"]
    assert system.status(s.id) == "cancelled"
    assert _attempt_states(system, s.id) == ["stale"]


def test_a_running_job_rescheduled_runs_again_at_its_new_time(system: System) -> None:
    """``reschedule`` of a running job: that handler ends, and the schedule's new version
    runs once more, not before its new time by the database clock."""
    calls: list[int] = []
    moved_to: list[Any] = []

    def moved_meanwhile(ctx: Context, payload: Any) -> None:
        calls.append(ctx.version)
        if ctx.version == 1:
            moved = system.app.reschedule(ctx.schedule_id, delay=timedelta(seconds=1))
            assert moved.was_running is True
            moved_to.append(moved.run_at)

    system.app.handler("moved-meanwhile")(moved_meanwhile)
    s = _run(system, "moved-meanwhile")
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert calls == [1, 2]
    assert _attempt_states(system, s.id) == ["stale", "succeeded"]
    with system.app.engine.connect() as conn:
        started = conn.execute(
            text(
                "SELECT started_at FROM scheduled_job_attempts WHERE schedule_id = :id "
                "AND version = 2"
            ),
            {"id": s.id},
        ).scalar_one()
    assert started >= moved_to[0]


# -- the effect fence: ctx.transaction() ------------------------------------------------------


@pytest.mark.parametrize("change", ["cancelled", "rescheduled"])
def test_the_effect_transaction_refuses_a_schedule_that_moved_on_before_it(
    system: System, change: str
) -> None:
    inside: list[str] = []

    def moved_before(ctx: Context, payload: Any) -> None:
        if change == "cancelled":
            system.app.cancel(ctx.schedule_id)
        else:
            system.app.reschedule(ctx.schedule_id, delay=timedelta(hours=1))
        with ctx.transaction() as conn:
            inside.append("the handler's writes")
            _write_effect(conn, ctx)

    system.app.handler("moved-before")(moved_before)
    s = _run(system, "moved-before")
    assert inside == []
    assert (_effects(system, s.id), _ledger(system, s.id)) == (0, 0)
    assert system.status(s.id) == ("cancelled" if change == "cancelled" else "scheduled")


def test_the_effect_transaction_refuses_a_superseded_version_whose_successor_runs(
    system: System,
) -> None:
    """The case the fence's version check guards: a schedule rescheduled while its handler
    runs, version 2 claimed at attempt 1 by another worker (running, attempt 1, as the old
    one's claim reads) before the old handler enters ``ctx.transaction()``: the old block never
    runs; version 2's does, once. Seen failing with the fence's locked re-check comparing the
    status and the attempt alone (version 1's effect written beside version 2's)."""
    started = {1: threading.Event(), 2: threading.Event()}
    go = {1: threading.Event(), 2: threading.Event()}
    inside: list[int] = []

    @system.app.handler("fenced-late", max_attempts=1)
    def fenced_late(ctx: Context, payload: Any) -> None:
        started[ctx.version].set()
        assert go[ctx.version].wait(30)
        with ctx.transaction() as conn:
            inside.append(ctx.version)
            _write_effect(conn, ctx)

    s = system.app.schedule("fenced-late", {}, delay=0)
    other = Runtime(system.app, WorkerConfig(heartbeat=timedelta(milliseconds=200)))
    outcomes: dict[int, Any] = {}
    runs = [
        threading.Thread(
            target=lambda: outcomes.update({1: system.runtime.handle(s.id, 1, 1, "default")})
        ),
        threading.Thread(target=lambda: outcomes.update({2: other.handle(s.id, 2, 1, "default")})),
    ]
    try:
        runs[0].start()
        assert started[1].wait(30)
        system.app.reschedule(s.id, delay=timedelta(0))
        runs[1].start()
        assert started[2].wait(30)  # version 2 running at attempt 1
        go[1].set()
        runs[0].join(30)
        go[2].set()
        runs[1].join(30)
    finally:
        go[1].set()
        go[2].set()
        other.close()
    assert (outcomes[1].value, outcomes[2].value) == ("stale", "succeeded")
    assert inside == [2] and (_effects(system, s.id), _ledger(system, s.id)) == (1, 1)


def _lock_waiters(app: App) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_a_cancel_during_the_effect_transaction_waits_and_then_finds_it_finished(
    system: System,
) -> None:
    answer: dict[str, bool] = {}

    def cancel_from_elsewhere(ctx: Context, payload: Any) -> None:
        with ctx.transaction() as conn:
            canceller = threading.Thread(
                target=lambda: answer.setdefault("cancelled", system.app.cancel(ctx.schedule_id))
            )
            canceller.start()
            # The cancel must queue behind the fence's row lock (or, without one, finish).
            wait_for(lambda: _lock_waiters(system.app) == 1 or "cancelled" in answer, 10, "lock")
            _write_effect(conn, ctx)
        canceller.join(10)

    system.app.handler("cancel-from-elsewhere")(cancel_from_elsewhere)
    s = _run(system, "cancel-from-elsewhere")
    assert answer == {"cancelled": False}
    assert system.status(s.id) == "succeeded" and _effects(system, s.id) == 1


def test_an_effect_whose_finish_finds_the_attempt_gone_is_rolled_back(system: System) -> None:
    def rescued_inside(ctx: Context, payload: Any) -> None:
        with ctx.transaction() as conn:
            _write_effect(conn, ctx)
            # What only a broken fence allows: the attempt stops being current under it.
            conn.execute(
                text("UPDATE scheduled_jobs SET attempts = attempts + 1 WHERE id = :id"),
                {"id": ctx.schedule_id},
            )

    system.app.handler("rescued-inside", max_attempts=1)(rescued_inside)
    s = _run(system, "rescued-inside")
    assert (_effects(system, s.id), _ledger(system, s.id)) == (0, 0)


def test_a_handler_that_fails_inside_the_effect_transaction_leaves_no_effect(
    system: System,
) -> None:
    def half_done(ctx: Context, payload: Any) -> None:
        with ctx.transaction() as conn:
            _write_effect(conn, ctx)
            if ctx.attempt == 1:
                raise RuntimeError("failed after writing")

    system.app.handler(
        "half-done", backoff=timedelta(milliseconds=10), backoff_cap=timedelta(milliseconds=10)
    )(half_done)
    s = _run(system, "half-done")
    stored = system.app.get(s.id)
    assert stored is not None and (stored.status, stored.attempts) == (Status.SCHEDULED, 1)
    assert (_effects(system, s.id), _ledger(system, s.id)) == (0, 0)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert (_effects(system, s.id), _ledger(system, s.id)) == (1, 1)


# -- keys, orphans, queues, backoff -----------------------------------------------------------


def test_a_key_is_held_while_its_schedule_runs_and_freed_when_it_finishes(system: System) -> None:
    seen: list[object] = []

    def reschedule_same_key(ctx: Context, payload: Any) -> None:
        seen.append(system.app.schedule("record", {}, delay=60, key="k").id)  # while running

    system.app.handler("keyed")(reschedule_same_key)
    first = system.app.schedule("keyed", {}, delay=0, key="k")
    system.scheduler.run_once()
    system.work()
    assert seen == [first.id]  # held while running: the same schedule came back
    assert system.status(first.id) == "succeeded"
    again = system.app.schedule("record", {}, delay=60, key="k")
    assert again.id != first.id  # freed once it finished


def test_a_waiting_job_of_a_finished_schedule_is_an_orphan(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    stored = system.app.get(s.id)
    assert stored is not None
    # A stray job of the same (schedule, version) left waiting: its version still matches.
    leftover = push_of(stored, stored.version, 2)
    system.scheduler.deliverer.push([leftover], system.app.now())
    assert list(orphan_jobs(system.app)) == [leftover.delivery.job_id]
    assert Reconciler(system.app).run_once().orphans_removed == 1
    assert system.scheduler.deliverer.queue.count == 0


def test_a_worker_takes_its_queues_in_the_order_given(system: System) -> None:
    app = system.app
    low = [app.schedule("record", {}, delay=0, queue="zz-low").id for _ in range(3)]
    high = [app.schedule("record", {}, delay=0, queue="aa-high").id for _ in range(3)]
    system.scheduler.run_once()
    Worker(system.runtime, ["zz-low", "aa-high"]).work(burst=True)
    with app.engine.connect() as conn:
        order = list(
            conn.execute(
                text(
                    "SELECT schedule_id FROM scheduled_job_events WHERE kind = 'started' "
                    "ORDER BY at, id"
                )
            ).scalars()
        )
    assert order == low + high  # the first queue named drains first, whatever its name


def test_the_scheduler_backs_off_up_to_its_cap_through_an_outage(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    dead = App(
        database_url=str(app.engine.url.render_as_string(hide_password=False)),
        redis_url="redis://127.0.0.1:1/0",
    )
    config = SchedulerConfig(
        poll_interval=timedelta(milliseconds=10), max_backoff=timedelta(milliseconds=80)
    )
    scheduler = Scheduler(dead, config)
    failed_before = sample(FAILED)
    dead.schedule("record", {}, delay=0)  # something to push, so the pass reaches Redis
    thread = threading.Thread(target=scheduler.run)
    with caplog.at_level(logging.WARNING, logger="duejobs.scheduler"):
        thread.start()
        wait_for(lambda: sample(FAILED) >= failed_before + 6, 20, "passes")
        scheduler.stop()
        thread.join(10)
    waits = [float(r.args[2]) for r in caplog.records if "retrying in" in r.msg]  # type: ignore[index]
    assert waits[:3] == pytest.approx([0.02, 0.04, 0.08]) and max(waits) == pytest.approx(0.08)
    scheduler.close()
    dead.close()


def test_a_worker_that_loses_the_database_fails_the_rq_job_and_leaves_the_row(
    system: System,
) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    broken = App(
        database_url="postgresql://nobody@127.0.0.1:1/none",
        redis_url=system.app.settings.require_redis(),
    )
    register(broken)
    runtime = Runtime(broken, WorkerConfig())
    try:
        Worker(runtime).work(burst=True)
    finally:
        runtime.close()
        broken.close()
    job = system.scheduler.deliverer.queue.fetch_job(system.app.get(s.id).queue_job_id)  # type: ignore[union-attr]
    assert job is not None and job.get_status() == "failed"
    stored = system.app.get(s.id)
    assert stored is not None and (stored.status, stored.attempts) == (Status.SCHEDULED, 0)
    assert Reconciler(system.app).run_once().repushed == 1  # the reconciler takes it from here
    system.work()
    assert system.status(s.id) == "succeeded"


def test_an_outage_inside_the_apps_transaction_rolls_everything_back(app: App, count: Any) -> None:
    terminated: list[int] = []
    batch = 200_000

    def cut_the_copy() -> None:
        """The server drops the connection once the COPY has taken in half the batch."""
        with app.engine.connect() as watcher:
            deadline = time.monotonic() + 30
            while not terminated and time.monotonic() < deadline:
                terminated.extend(
                    watcher.execute(
                        text(
                            "SELECT pid FROM pg_stat_progress_copy "
                            "WHERE datname = current_database() AND tuples_processed >= :half "
                            "AND pg_terminate_backend(pid)"
                        ),
                        {"half": batch // 2},
                    ).scalars()
                )
                watcher.commit()

    cutter = threading.Thread(target=cut_the_copy)
    cutter.start()
    try:
        with pytest.raises(DatabaseUnavailableError):
            app.schedule_many(ScheduleRequest("record", {"i": i}, delay=60) for i in range(batch))
    finally:
        cutter.join(30)
    assert terminated, "the COPY was never seen running"
    assert count() == 0 and count("scheduled_job_events") == 0
    assert len(app.schedule_many([ScheduleRequest("record", {}, delay=60)])) == 1


@pytest.mark.parametrize(("durable", "expected"), [(False, "off"), (True, "on")])
def test_durable_bookkeeping_decides_whether_the_workers_commits_wait_for_the_disk(
    app: App, durable: bool, expected: str
) -> None:
    runtime = Runtime(app, WorkerConfig(durable_bookkeeping=durable))
    try:
        with runtime.bookkeeping.connection() as conn:
            assert store.bookkeeping_durability(conn).synchronous_commit == expected
            # for its statements alone: the session itself keeps the server's setting
            session = conn.connection.driver_connection.execute("SHOW synchronous_commit")
            assert session.fetchone() == ("on",)
    finally:
        runtime.close()


def test_each_run_of_a_delivery_has_an_identity_of_its_own(system: System) -> None:
    """``ctx.run_id`` names one run of a handler: the same for the whole run, another for the
    next attempt — and another for a second run of the same attempt (the documented
    exceptions: a failover that lost the claim), which an effect outside the database can
    then tell apart from the first by (``ctx.effect_key``, ``ctx.run_id``)."""
    runs: list[tuple[int, uuid.UUID, uuid.UUID]] = []

    @system.app.handler("records-its-run", max_attempts=2, backoff=timedelta(milliseconds=1))
    def records(ctx: Context, payload: object) -> None:
        runs.append((ctx.attempt, ctx.run_id, ctx.run_id))
        if ctx.attempt == 1:
            raise RuntimeError("retried")

    s = system.app.schedule("records-its-run", {}, delay=0)
    system.runtime.handle(s.id, 1, 1, "default")
    system.runtime.handle(s.id, 1, 2, "default")
    assert [attempt for attempt, _, _ in runs] == [1, 2]
    assert all(isinstance(first, uuid.UUID) and first == again for _, first, again in runs)
    assert runs[0][1] != runs[1][1]
