"""The seed's test list on the delivery path: scheduler → RQ → revalidating worker.

Real PostgreSQL, real Redis, real RQ workers (in this process unless a test needs several).

Seen failing against a build broken on purpose: an early delivery put back at once rather
than at its due time
→ ``test_delivery_far_too_early_is_put_back_for_its_time_without_using_an_attempt``;
the job data pickled → ``test_queue_job_carries_ids_and_version_never_the_payload``; the
worker's runtime kept in a module global (the last worker made served every worker of the
process, and a plain RQ worker in that process ran schedules)
→ ``test_two_workers_in_one_process_each_run_their_own_apps_handlers``,
``test_a_plain_rq_worker_never_runs_a_schedule_and_says_why``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from duejobs import App, EventKind, Status, store
from duejobs.config import libpq_url
from duejobs.delivery.wakes import WAKE_TTL, send_wake, wake_key
from duejobs.rq_wire.job_ids import parse_job_id
from duejobs.scheduler.claim import claim_due
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.reconciler import Reconciler
from duejobs.services.stats import collect, render
from duejobs.worker import Outcome, Runtime, Worker, WorkerConfig
from tests.support import sample, wait_for
from tests.support.deliveries import job_id, push_of
from tests.support.system import System


def _kinds(system: System, schedule_id: uuid.UUID) -> list[str]:
    return [e.kind.value for e in system.app.history(schedule_id)]


def _started_at(system: System, schedule_id: uuid.UUID) -> list[datetime]:
    return [e.at for e in system.app.history(schedule_id) if e.kind is EventKind.STARTED]


def _skips(system: System, schedule_id: uuid.UUID) -> list[str]:
    return [
        e.detail["reason"] for e in system.app.history(schedule_id) if e.kind is EventKind.SKIPPED
    ]


def test_relative_delay_runs_once_after_the_delay_by_the_database_clock(system: System) -> None:
    s = system.app.schedule("record", {"reminder_id": 42}, delay=timedelta(seconds=1))
    system.run_until(lambda: system.status(s.id) == "succeeded")
    (started,) = _started_at(system, s.id)
    assert started >= s.run_at
    assert system.effects() == [(f"record:{s.id}:1", 1)]
    assert _kinds(system, s.id) == ["created", "enqueued", "started", "succeeded"]


def test_absolute_time_in_a_zone_runs_at_that_instant(system: System) -> None:
    when = (system.app.now() + timedelta(seconds=1.5)).astimezone(ZoneInfo("America/Sao_Paulo"))
    s = system.app.schedule("record", {}, run_at=when, timezone="America/Sao_Paulo")
    system.run_until(lambda: system.status(s.id) == "succeeded")
    (started,) = _started_at(system, s.id)
    assert started >= when.astimezone(UTC)


def test_late_job_runs_at_once_and_records_its_lag(system: System) -> None:
    s = system.app.schedule("record", {}, run_at=system.app.now() - timedelta(hours=1))
    result = system.scheduler.run_once()
    assert result.queued == 1 and result.deferred == 0
    system.work()
    assert system.status(s.id) == "succeeded"
    started = next(e for e in system.app.history(s.id) if e.kind is EventKind.STARTED)
    assert started.detail["lag_ms"] >= 3_600_000


def test_window_pushes_future_rows_to_the_scheduled_registry_not_beyond(system: System) -> None:
    soon = system.app.schedule("record", {}, delay=timedelta(minutes=10))
    later = system.app.schedule("record", {}, delay=timedelta(minutes=20))
    result = system.scheduler.run_once()
    assert (result.claimed, result.queued, result.deferred) == (1, 0, 1)
    registry = system.scheduler.deliverer.queue.scheduled_job_registry
    stored = system.app.get(soon.id)
    assert stored is not None and stored.queue_job_id in registry.get_job_ids()
    score = system.redis.zscore(registry.key, stored.queue_job_id)
    assert score == pytest.approx(soon.due_at.timestamp(), abs=0.001)  # ms, not whole seconds
    not_yet = system.app.get(later.id)
    assert not_yet is not None and not_yet.queue_job_id is None


def test_deferred_job_is_promoted_only_when_the_database_clock_reaches_it(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(seconds=1.2))
    first = system.scheduler.run_once()
    assert first.deferred == 1 and first.promoted == 0
    assert system.scheduler.deliverer.queue.count == 0
    system.run_until(lambda: system.status(s.id) == "succeeded")
    (started,) = _started_at(system, s.id)
    assert started >= s.run_at


@contextlib.contextmanager
def _polling_every_30_s(system: System) -> Iterator[Scheduler]:
    """A scheduler running in a thread of its own, its poll 30 s: what reaches the queue
    sooner came by another way."""
    scheduler = Scheduler(system.app, SchedulerConfig(poll_interval=timedelta(seconds=30)))
    thread = threading.Thread(target=scheduler.run)
    thread.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()
        thread.join()
        scheduler.close()


def test_a_deferred_job_is_promoted_at_its_time_not_at_the_next_poll(system: System) -> None:
    """The scheduler's pause ends when the earliest deferred job falls due: with a poll of
    30 s, a job due in 1 s reaches its queue long before the next poll, and not before its
    time. Seen failing with the pause the poll interval alone."""
    s = system.app.schedule("record", {}, delay=timedelta(seconds=1))
    with _polling_every_30_s(system):
        queue = system.scheduler.deliverer.queue
        wait_for(lambda: queue.count == 1, 15, "the job promoted before the next poll")
    (promoted,) = queue.get_jobs()
    assert promoted.enqueued_at is not None
    assert promoted.enqueued_at.replace(tzinfo=UTC) >= s.run_at


def test_a_job_due_now_is_pushed_at_once_not_at_the_next_poll(system: System) -> None:
    """A schedule due now wakes the scheduler through Redis: with a poll of 30 s, its job
    reaches the queue long before the next poll. Seen failing with no wake sent."""
    with _polling_every_30_s(system) as scheduler:
        wait_for(lambda: scheduler._last_claims > 0, 15, "the scheduler's first pass")
        system.app.schedule("record", {}, delay=0)
        queue = system.scheduler.deliverer.queue
        wait_for(lambda: queue.count == 1, 10, "the job pushed before the next poll")


def test_a_wake_leaves_one_entry_on_its_list_that_expires(system: System) -> None:
    """Wakes with no scheduler to take them: the list holds one entry, set to expire. Seen
    failing with the list left to grow."""
    key = wake_key(f"wake-test-{uuid.uuid4().hex}")  # a list no scheduler of this run watches
    for _ in range(3):
        send_wake(system.redis, key)
    assert system.redis.llen(key) == 1
    assert 0 < system.redis.ttl(key) <= WAKE_TTL


def test_a_schedule_due_now_does_not_wait_for_a_redis_that_does_not_answer(
    database_url: str,
) -> None:
    """The App's Redis accepts connections and never answers: a schedule due now returns at
    once, written, its wake left to a thread of the App's own. Seen failing with the wake
    sent in the caller's thread (it waited out the client's 10 s timeout)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    app = App(database_url, f"redis://127.0.0.1:{port}/0", strict_types=False)
    try:
        started = time.monotonic()
        s = app.schedule("record", {}, delay=0)
        assert time.monotonic() - started < 2
        assert app.get(s.id) is not None
    finally:
        app.close()
        silent.close()


def test_a_pass_brought_forward_for_a_deferred_jobs_time_only_promotes(system: System) -> None:
    """Under a steady flow of deferred jobs the passes brought forward come every few
    milliseconds: they promote, and leave the claims to the poll's pace — a row due now,
    written meanwhile, waits for the next poll. Seen failing with every pass claiming."""
    deferred = system.app.schedule("record", {}, delay=timedelta(seconds=0.5))
    scheduler = Scheduler(system.app, SchedulerConfig(poll_interval=timedelta(seconds=30)))
    result = scheduler.run_once()
    assert result.deferred == 1
    due_now = system.app.schedule("record", {}, delay=0)
    deadline = time.monotonic() + 15
    while result.promoted == 0:
        assert time.monotonic() < deadline, "the deferred job was never promoted"
        pause = scheduler._pause(result)
        assert pause < timedelta(seconds=30)
        time.sleep(pause.total_seconds())
        result = scheduler.run_once()
        assert (result.claimed, result.batches) == (0, 0)
    assert system.app.get(deferred.id).queue_job_id is not None
    assert system.app.get(due_now.id).queue_job_id is None  # left to the poll's claims
    assert scheduler.run_once().claimed == 1  # a pass not brought forward claims
    scheduler.close()


def test_run_once_reports_what_it_did(system: System) -> None:
    for _ in range(250):
        system.app.schedule("record", {}, delay=0)
    one_loop = Scheduler(system.app, SchedulerConfig(batch_size=100, concurrency=1))
    result = one_loop.run_once()
    assert (result.claimed, result.queued, result.batches) == (250, 250, 3)
    again = system.scheduler.run_once()  # two claim loops: both find nothing
    assert (again.claimed, again.queued, again.batches) == (0, 0, 2)
    one_loop.close()


def test_parallel_claim_loops_never_push_a_row_twice(system: System) -> None:
    for _ in range(3000):
        system.app.schedule("record", {}, delay=timedelta(minutes=1))
    scheduler = Scheduler(system.app, SchedulerConfig(batch_size=200, concurrency=4))
    result = scheduler.run_once()
    scheduler.close()
    assert (result.claimed, result.deferred, result.already_present) == (3000, 3000, 0)
    registry = system.scheduler.deliverer.queue.scheduled_job_registry
    assert registry.count == 3000


def test_queue_job_carries_ids_and_version_never_the_payload(system: System) -> None:
    s = system.app.schedule("record", {"secret": "card-4242"}, delay=0)
    system.scheduler.run_once()
    stored = system.app.get(s.id)
    assert stored is not None and stored.queue_job_id == job_id("default", s.id, 1, 1)
    raw = system.redis.hget(f"rq:job:{stored.queue_job_id}", "data")
    assert raw is not None
    func, instance, args, kwargs = json.loads(raw)  # JSON, not pickle
    assert func == "duejobs.worker.perform" and args == [str(s.id), 1, 1, "default"]
    assert instance is None and kwargs == {}
    assert b"card-4242" not in raw
    job = Job.fetch(stored.queue_job_id, connection=system.redis, serializer=JSONSerializer)
    assert job.args == [str(s.id), 1, 1, "default"] and job.origin == "duejobs"


def test_job_ids_are_deterministic_and_valid_for_rq(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5), tenant="acme.com")
    system.scheduler.run_once()
    first = system.app.get(s.id)
    assert first is not None and first.queue_job_id == f"dj-acme_com-{s.id.hex}-v1-a1"
    system.app.reschedule(s.id, delay=timedelta(minutes=6))
    system.scheduler.run_once()
    moved = system.app.get(s.id)
    assert moved is not None and moved.queue_job_id == f"dj-acme_com-{s.id.hex}-v2-a1"
    assert parse_job_id(moved.queue_job_id) == (s.id, 2, 1)
    assert parse_job_id("dj-acme_com-not-hex-v2-a1") is None


def test_repushing_a_live_job_does_not_create_a_second_one(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    push = push_of(s)
    again = system.scheduler.deliverer.push([push, push], system.app.now())
    assert (again.queued, again.present) == (0, 2)
    assert system.scheduler.deliverer.queue.count == 1


def test_cancel_before_execution_never_runs_and_removes_the_queue_job(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    assert system.scheduler.deliverer.queue.count == 1
    assert system.app.cancel(s.id)
    assert system.app.core.removals().flush()
    assert system.scheduler.deliverer.queue.count == 0
    system.work()
    assert system.effects() == [] and system.status(s.id) == "cancelled"


def test_cancelled_delivery_still_in_the_queue_is_skipped(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    with system.app.engine.begin() as conn:  # conn=: the queue job is left where it is
        system.app.cancel(s.id, conn=conn)
    system.work()
    assert system.effects() == []
    assert _skips(system, s.id) == ["cancelled"]


def test_cancel_during_execution_stops_before_the_effect(system: System) -> None:
    def cancelled_meanwhile(ctx, payload):  # type: ignore[no-untyped-def]
        system.app.cancel(ctx.schedule_id)  # another process cancels while this runs
        ctx.ensure_current()
        raise AssertionError("unreachable: ensure_current must raise")

    system.app.handler("cancel-me")(cancelled_meanwhile)
    s = system.app.schedule("cancel-me", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    assert system.status(s.id) == "cancelled"
    assert _kinds(system, s.id)[-1] == "skipped"
    with system.app.engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM scheduled_job_attempts WHERE schedule_id = :id"), {"id": s.id}
        ).scalar_one()
    assert status == "stale"


def test_cancel_during_execution_waits_for_a_transactional_effect(system: System) -> None:
    """The effect fence locks the row: a cancel that comes too late returns False."""
    outcome = {}

    def effect_then_cancel(ctx, payload):  # type: ignore[no-untyped-def]
        with ctx.transaction() as conn:
            conn.execute(text("SELECT 1"))
        outcome["cancelled"] = system.app.cancel(ctx.schedule_id)

    system.app.handler("effect-then-cancel")(effect_then_cancel)
    s = system.app.schedule("effect-then-cancel", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    assert outcome == {"cancelled": False}
    assert system.status(s.id) == "succeeded"


def test_reschedule_later_skips_the_old_delivery_and_runs_the_new_time_once(
    system: System,
) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    with system.app.engine.begin() as conn:
        moved = system.app.reschedule(s.id, delay=timedelta(seconds=1), conn=conn)
    system.work()  # the v1 delivery is still queued: it must be skipped
    assert _skips(system, s.id) == ["superseded"]
    assert system.effects() == []
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert system.effects() == [(f"record:{s.id}:2", 1)]
    (started,) = _started_at(system, s.id)
    assert started >= moved.run_at


def test_reschedule_earlier_runs_at_the_new_time(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=10))
    system.scheduler.run_once()
    moved = system.app.reschedule(s.id, delay=timedelta(seconds=0.5))
    assert system.app.core.removals().flush()
    registry = system.scheduler.deliverer.queue.scheduled_job_registry
    assert registry.get_job_ids() == []  # the v1 job was removed from Redis
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert system.effects() == [(f"record:{s.id}:2", 1)]
    assert _started_at(system, s.id)[0] >= moved.run_at


def test_stale_version_delivery_is_skipped_and_recorded(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5))
    moved = system.app.reschedule(s.id, delay=0)
    stale = push_of(s)
    system.scheduler.deliverer.push([stale], system.app.now() + timedelta(hours=1))
    counted = {"tenant": "default", "type": "record", "outcome": "skipped"}
    before = sample("duejobs_deliveries_total", **counted)
    outcome = system.runtime.handle(s.id, 1, 1, "default")
    assert outcome is Outcome.SKIPPED
    assert _skips(system, s.id) == ["superseded"]
    assert sample("duejobs_deliveries_total", **counted) == before + 1  # counted under its type
    assert moved.version == 2 and system.status(s.id) == "scheduled"


def test_same_delivery_pushed_twice_applies_one_effect(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    stored = system.app.get(s.id)
    assert stored is not None and stored.queue_job_id is not None
    # The same delivery a second time, as any at-least-once transport may hand it over.
    queue = Queue("duejobs", connection=system.redis, serializer=JSONSerializer)
    queue.enqueue("duejobs.worker.perform", str(s.id), 1, 1, "default", job_id="copy")
    system.work()
    assert system.effects() == [(f"record:{s.id}:1", 1)]
    assert _skips(system, s.id) == ["duplicate"]


def test_not_due_delivery_waits_for_the_database_clock(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(seconds=0.4))
    early = push_of(s)
    system.scheduler.deliverer.push([early], system.app.now() + timedelta(hours=1))  # forced early
    outcome = system.runtime.handle(s.id, 1, 1, "default")
    assert outcome is Outcome.SUCCEEDED
    (started,) = _started_at(system, s.id)
    assert started >= s.run_at


def test_delivery_far_too_early_is_put_back_for_its_time_without_using_an_attempt(
    system: System,
) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5))
    system.scheduler.run_once()
    stored = system.app.get(s.id)
    assert stored is not None and stored.queue_job_id is not None
    deliverer = system.scheduler.deliverer
    assert deliverer.promote(system.app.now() + timedelta(hours=1)).moved == 1  # forced early
    system.work()
    stored = system.app.get(s.id)
    assert stored is not None
    assert stored.status is Status.SCHEDULED and stored.attempts == 0
    assert _kinds(system, s.id)[-1] == "requeued"
    registry = deliverer.queue.scheduled_job_registry
    assert registry.get_job_ids() == [stored.queue_job_id]  # same id, back for due_at
    score = system.redis.zscore(registry.key, stored.queue_job_id)
    assert score == pytest.approx(s.due_at.timestamp(), abs=0.001)
    assert system.redis.ttl(f"rq:job:{stored.queue_job_id}") == -1  # no expiry left on it
    assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.DEFERRED


@pytest.mark.parametrize(("priority", "band"), [(5, "+high"), (-5, "+low")])
def test_an_early_delivery_put_back_returns_to_its_own_bands_registry(
    system: System, priority: int, band: str
) -> None:
    """Put back for its time, an urgent (or a low) job waits in its own band's scheduled
    registry, and is promoted onto its own band's queue. Seen failing with it put back into
    the default band's."""
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5), priority=priority)
    system.scheduler.run_once()
    deliverer = system.scheduler.deliverer
    assert deliverer.promote(system.app.now() + timedelta(hours=1)).moved == 1  # forced early
    system.work()
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.SCHEDULED and stored.attempts == 0
    queue = deliverer.queue.name
    assert system.redis.zrange(f"rq:scheduled:{queue}{band}", 0, -1) == [
        stored.queue_job_id.encode()
    ]
    assert system.redis.zcard(f"rq:scheduled:{queue}") == 0


def test_delivery_for_another_tenant_is_treated_as_missing(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0, tenant="acme")
    assert system.runtime.handle(s.id, 1, 1, "globex") is Outcome.SKIPPED
    assert system.status(s.id) == "scheduled" and system.effects() == []


def test_handler_reads_the_payload_from_the_row_at_run_time(system: System) -> None:
    seen = []
    system.app.handler("peek")(lambda ctx, payload: seen.append((payload, ctx.payload)))
    s = system.app.schedule("peek", {"v": 1}, delay=0)
    system.scheduler.run_once()
    with system.app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET payload = '{\"v\": 2}' WHERE id = :id"), {"id": s.id}
        )
    system.work()
    assert seen == [({"v": 2}, {"v": 2})]


@pytest.mark.parametrize("due_in_ms", [200, 100, 50, 20])
def test_an_early_delivery_never_starts_before_its_run_at_by_the_database_clock(
    system: System, due_in_ms: int
) -> None:
    """Delivered a moment before it is due (the worker waits for it), the attempt starts at
    or after ``run_at`` by the database clock, to the microsecond: a claim that tolerates
    even a few milliseconds of earliness fails one of these."""
    with system.app.engine.connect() as conn:
        now = conn.execute(text("SELECT statement_timestamp()")).scalar_one()
    s = system.app.schedule("record", {}, run_at=now + timedelta(milliseconds=due_in_ms))
    assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.SUCCEEDED
    (started,) = _started_at(system, s.id)
    assert started >= s.run_at, (started, s.run_at)


def test_the_claim_never_takes_a_row_a_millisecond_before_it_is_due(system: System) -> None:
    """Thirty rows due 1 ms apart, claimed over and over as they come due: each claim's start
    (the database clock) is at or after its row's ``due_at`` — a claim that takes rows even a
    few milliseconds early takes some of these early."""
    with system.app.engine.connect() as conn:
        now = conn.execute(text("SELECT statement_timestamp()")).scalar_one()
    first = now + timedelta(milliseconds=100)
    rows = [
        system.app.schedule("record", {}, run_at=first + timedelta(milliseconds=i))
        for i in range(30)
    ]
    deliveries = [store.Delivery(r.id, r.tenant, 1, 1, r.queue) for r in rows]
    started: dict[uuid.UUID, datetime] = {}
    deadline = time.monotonic() + 30
    with system.app.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        while len(started) < len(rows):
            assert time.monotonic() < deadline, "the rows were not all claimed"
            claims = store.claim_runs(
                conn,
                deliveries,
                worker="test",
                lease=timedelta(minutes=1),
                types=["record"],
                claim="test",
            )
            for delivery, claim in zip(deliveries, claims, strict=True):
                if claim is not None:
                    assert claim.db_now is not None
                    started[delivery.schedule_id] = claim.db_now
    early = [(r.due_at, started[r.id]) for r in rows if started[r.id] < r.due_at]
    assert early == []


def test_a_retry_waits_exactly_its_backoff(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the jitter fixed (half the ceiling), each retry is due exactly its backoff after
    the failed attempt closed: 25 ms after the first (ceiling 50 ms), 50 ms after the second
    (ceiling 100 ms)."""
    monkeypatch.setattr("duejobs.handlers.random.random", lambda: 0.5)
    s = system.app.schedule("flaky", {"fail_times": 2}, delay=0)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    with system.app.engine.connect() as conn:
        waits = conn.execute(
            text(
                "SELECT next_attempt_at - finished_at FROM scheduled_job_attempts "
                "WHERE schedule_id = :id AND status = 'failed' ORDER BY attempt"
            ),
            {"id": s.id},
        ).scalars()
        assert list(waits) == [timedelta(milliseconds=25), timedelta(milliseconds=50)]


def test_handler_failure_retries_with_jittered_backoff_and_run_at_untouched(
    system: System,
) -> None:
    s = system.app.schedule("flaky", {"fail_times": 2}, delay=0)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    stored = system.app.get(s.id)
    assert stored is not None and stored.run_at == s.run_at and stored.attempts == 3
    assert system.effects() == [(f"flaky:{s.id}:1", 3)]
    with system.app.engine.connect() as conn:
        attempts = conn.execute(
            text(
                "SELECT attempt, status, error, next_attempt_at, finished_at "
                "FROM scheduled_job_attempts WHERE schedule_id = :id ORDER BY attempt"
            ),
            {"id": s.id},
        ).all()
    assert [(a.attempt, a.status) for a in attempts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),
    ]
    for failed in attempts[:2]:
        assert "transient failure" in failed.error
        wait = (failed.next_attempt_at - failed.finished_at).total_seconds()
        assert 0 <= wait <= 1.0  # full jitter under the capped exponential ceiling
    retried = [e for e in system.app.history(s.id) if e.kind is EventKind.RETRIED]
    assert [e.detail["attempt"] for e in retried] == [1, 2]


def test_exhausted_attempts_fail_with_the_last_error(system: System) -> None:
    s = system.app.schedule("flaky", {"fail_times": 5}, delay=0)
    system.run_until(lambda: system.status(s.id) == "failed")
    stored = system.app.get(s.id)
    assert stored is not None and stored.attempts == 3
    assert stored.last_error == "RuntimeError: transient failure on attempt 3"
    assert stored.finished_at is not None and system.effects() == []


def test_a_delivery_of_an_unknown_type_goes_back_for_a_worker_that_knows_it(
    system: System, producer: App
) -> None:
    """A worker without the type's handler (a rolling deploy: producers first) claims
    nothing and uses no attempt: the job goes back, backing off, counted; a worker with the
    handler runs it."""
    s = producer.schedule("deployed-later", {}, delay=0)
    system.scheduler.run_once()
    before = sample("duejobs_unknown_type_deliveries_total", tenant="default")
    system.work()
    stored = system.app.get(s.id)
    assert stored is not None and (stored.status, stored.attempts) == (Status.SCHEDULED, 0)
    requeued = [e.detail for e in system.app.history(s.id) if e.kind is EventKind.REQUEUED]
    assert [d["reason"] for d in requeued] == ["unknown_type"]
    assert sample("duejobs_unknown_type_deliveries_total", tenant="default") == before + 1
    assert system.scheduler.deliverer.queue.scheduled_job_registry.count == 1  # backing off
    assert Reconciler(system.app).run_once().fixed == 0  # where it belongs: left alone
    shown = collect(system.app)  # what `duejobs stats` and the dashboard's overview show
    assert shown.recent.counts["unknown_type"] == 1
    assert "unknown_type 1" in render(shown)
    system.app.handler("deployed-later")(lambda ctx, payload: None)  # the new worker
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert [(a.attempt, a.status) for a in system.app.attempts(s.id)] == [(1, "succeeded")]


def test_a_delivery_of_an_unknown_type_fails_naming_it_after_the_grace(
    system: System, producer: App
) -> None:
    s = producer.schedule("no-such-type", {}, delay=0)
    system.runtime = Runtime(system.app, WorkerConfig(unknown_type_grace=timedelta(seconds=1)))
    try:
        system.run_until(lambda: system.status(s.id) == "failed")
    finally:
        system.runtime.close()
    stored = system.app.get(s.id)
    assert stored is not None and stored.attempts == 0 and stored.finished_at is not None
    assert stored.last_error == (
        "no handler registered for type 'no-such-type' in any worker that took it within 1s"
    )
    kinds = [e.kind for e in system.app.history(s.id)]
    assert kinds.count(EventKind.REQUEUED) >= 1 and kinds[-1] is EventKind.FAILED


def _due_now(app: App, schedule_id: uuid.UUID) -> None:
    """The row due at once (the time its put-back or its retry's backoff set, passed)."""
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET due_at = now() WHERE id = :id"), {"id": schedule_id}
        )


def test_a_retried_attempt_gets_the_unknown_type_grace_of_its_own(
    system: System, producer: App
) -> None:
    """Two services on one queue: attempt 1 was put back once by the one without the type's
    handler, an hour ago, then run (and failed) by the one with it; attempt 2 lands on the
    one without: it goes back for the other, its grace counted from its own first put-back.
    Seen failing with the grace counted from the version's first put-back (attempt 2 failed
    for good at once)."""
    s = producer.schedule("deployed-later", {}, delay=0)
    without = Runtime(producer)
    try:
        assert without.handle(s.id, 1, 1, "default") is Outcome.DEFERRED
        with system.app.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE scheduled_job_events SET at = at - interval '1 hour' "
                    "WHERE schedule_id = :id AND kind = 'requeued'"
                ),
                {"id": s.id},
            )

        @system.app.handler("deployed-later", max_attempts=3)
        def fails(ctx: object, payload: object) -> None:
            raise ValueError("first attempt fails")

        _due_now(system.app, s.id)
        assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.RETRYING
        _due_now(system.app, s.id)
        assert without.handle(s.id, 1, 2, "default") is Outcome.DEFERRED
    finally:
        without.close()
    stored = system.app.get(s.id)
    assert stored is not None and (stored.status, stored.attempts) == (Status.SCHEDULED, 1)


def test_a_put_back_does_not_extend_the_expiry(system: System, producer: App) -> None:
    """A delivery of an unknown type put back moves its row's due time (so the reconciler
    finds its job where it belongs), but its expiry stays measured from the due time it had:
    past that, a worker with the handler expires it rather than running it. Seen failing with
    the expiry measured from the moved due time (the schedule ran)."""
    s = producer.schedule("deployed-later", {}, delay=0, expires_after=timedelta(seconds=4))
    with system.app.engine.begin() as conn:
        deadline = conn.execute(
            text(
                "UPDATE scheduled_jobs SET due_at = now() - interval '2 seconds' WHERE id = :id "
                "RETURNING due_at + expires_after"
            ),
            {"id": s.id},
        ).scalar_one()
    without = Runtime(producer)
    try:
        assert without.handle(s.id, 1, 1, "default") is Outcome.DEFERRED
    finally:
        without.close()
    wait_for(lambda: _db_past(system.app, deadline), 10, "the first due time's expiry")
    system.app.handler("deployed-later")(lambda ctx, payload: None)
    _due_now(system.app, s.id)
    assert system.runtime.handle(s.id, 1, 1, "default") is Outcome.SKIPPED
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.CANCELLED and stored.attempts == 0
    assert stored.last_error is not None and stored.last_error.startswith("expired")


def _db_past(app: App, instant: datetime) -> bool:
    with app.engine.connect() as conn:
        return bool(conn.execute(text("SELECT now() > :at"), {"at": instant}).scalar_one())


def test_handler_timeout_counts_as_a_failed_attempt(system: System) -> None:
    import time

    system.app.handler("hang", max_attempts=1, timeout=timedelta(milliseconds=300))(
        lambda ctx, payload: time.sleep(5)
    )
    s = system.app.schedule("hang", {}, delay=0)
    system.scheduler.run_once()
    system.work()
    stored = system.app.get(s.id)
    assert stored is not None and stored.status is Status.FAILED
    assert stored.last_error is not None and "timeout" in stored.last_error


@pytest.mark.parametrize("version", [1, 2])
def test_lease_is_renewed_while_a_long_handler_runs(system: System, version: int) -> None:
    leases = []

    def long_running(ctx, payload):  # type: ignore[no-untyped-def]
        import time

        for _ in range(3):
            with system.app.engine.connect() as conn:
                leases.append(
                    conn.execute(
                        text("SELECT lease_expires_at FROM scheduled_jobs WHERE id = :id"),
                        {"id": ctx.schedule_id},
                    ).scalar_one()
                )
            time.sleep(0.5)

    system.app.handler("long")(long_running)
    s = system.app.schedule("long", {}, delay=0)
    if version == 2:  # its version and its attempt differ: the renewal must match both
        system.app.reschedule(s.id, delay=0)
    system.scheduler.run_once()
    system.work()
    assert system.status(s.id) == "succeeded"
    assert leases[0] < leases[1] < leases[2]  # the heartbeat (every 0.2 s here) moved it


def test_sql_and_python_spell_queue_job_ids_alike(system: System) -> None:
    for tenant in ("default", "acme.com", "a-b_c.d.e", "T0"):
        system.app.schedule("record", {}, delay=0, tenant=tenant)
    system.scheduler.run_once()
    with system.app.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, tenant, version, attempts, queue_job_id FROM scheduled_jobs")
        ).all()
    assert len(rows) == 4
    for r in rows:
        assert r.queue_job_id == job_id(r.tenant, r.id, r.version, r.attempts + 1)


def test_a_connection_dropped_mid_pass_surfaces_as_a_database_error(system: System) -> None:
    system.app.schedule("record", {}, delay=0)
    with system.app.engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with psycopg.connect(libpq_url(system.app.settings.database_url), autocommit=True) as a:
            a.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(OperationalError):
            claim_due(conn, timedelta(minutes=15), 10)
        assert conn.invalidated
    assert system.scheduler.run_once().claimed == 1  # the pool hands out a fresh connection


def test_a_schedule_later_than_its_expiry_is_skipped_and_recorded_as_expired(
    system: System,
) -> None:
    stale = system.app.schedule(
        "record", {}, run_at=system.app.now() - timedelta(days=3), expires_after=timedelta(days=1)
    )
    late_but_fine = system.app.schedule(
        "record", {}, run_at=system.app.now() - timedelta(days=3)
    )  # no expiry: a late schedule runs anyway
    in_time = system.app.schedule("record", {}, delay=0, expires_after=timedelta(hours=1))
    system.scheduler.run_once()
    system.work()
    expired = system.app.get(stale.id)
    assert expired is not None and expired.status is Status.CANCELLED
    assert expired.last_error is not None and expired.last_error.startswith("expired")
    assert _skips(system, stale.id) == ["expired"]
    assert system.status(late_but_fine.id) == "succeeded"
    assert system.status(in_time.id) == "succeeded"
    assert len(system.effects()) == 2


def test_negative_expiry_is_refused(system: System) -> None:
    with pytest.raises(ValueError, match="expires_after must not be negative"):
        system.app.schedule("record", {}, delay=0, expires_after=-1)


def test_two_workers_in_one_process_each_run_their_own_apps_handlers(
    system: System, database_url: str, redis_url: str
) -> None:
    other = App(database_url=database_url, redis_url=redis_url, queue="other")
    ran: list[str] = []
    other.handler("mark")(lambda ctx, payload: ran.append("mark"))
    s = other.schedule("mark", {}, delay=0)
    system.scheduler.run_once()  # pushed onto the queue of its App
    runtime = Runtime(other, WorkerConfig())
    try:
        theirs = Worker(runtime)
        Worker(system.runtime)  # another worker made since, in the same process
        theirs.work(burst=True)
    finally:
        runtime.close()
        other.close()
    assert ran == ["mark"] and system.status(s.id) == "succeeded"


def test_a_plain_rq_worker_never_runs_a_schedule_and_says_why(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    queue = system.scheduler.deliverer.queue
    SimpleWorker([queue], connection=system.redis, serializer=JSONSerializer).work(burst=True)
    job = Job.fetch(
        system.app.get(s.id).queue_job_id,  # type: ignore[union-attr,arg-type]
        connection=system.redis,
        serializer=JSONSerializer,
    )
    result = job.latest_result()
    assert job.get_status() == "failed" and result is not None
    assert "duejobs worker --app" in (result.exc_string or "")
    assert system.status(s.id) == "scheduled" and system.effects() == []  # the row untouched
