"""Routing: schedules delivered on their type's (or their own) RQ queue, workers per queue."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import text

from duejobs import App, ScheduleRequest
from duejobs.errors import InvalidQueueError
from duejobs.services.reconciler import Reconciler, orphan_jobs
from duejobs.worker import Worker
from tests.support import apps
from tests.support.system import System


def queued(system: System, queue: str) -> list[str]:
    return [i.decode() for i in system.redis.lrange(f"rq:queue:{queue}", 0, -1)]


def work(system: System, *queues: str) -> None:
    """A real RQ worker on ``queues`` only, draining them and returning."""
    worker = Worker(system.runtime, list(queues))
    worker.work(burst=True)


@pytest.fixture
def routed(system: System) -> System:
    system.app.handler("report", queue="reports")(apps.record)
    return system


def test_a_type_routed_to_its_own_queue_is_pushed_there(routed: System) -> None:
    report = routed.app.schedule("report", {}, delay=0)
    other = routed.app.schedule("record", {}, delay=0)
    assert (report.queue, other.queue) == ("reports", "duejobs")
    routed.scheduler.run_once()
    assert queued(routed, "reports") == [routed.app.get(report.id).queue_job_id]  # type: ignore[union-attr]
    assert queued(routed, "duejobs") == [routed.app.get(other.id).queue_job_id]  # type: ignore[union-attr]


def test_a_backlog_on_one_queue_does_not_hold_up_workers_of_another(routed: System) -> None:
    reports = [routed.app.schedule("report", {}, delay=0).id for _ in range(30)]
    quick = [routed.app.schedule("record", {}, delay=0).id for _ in range(5)]
    routed.scheduler.run_once()
    work(routed, "duejobs")  # the default queue's pool
    assert {routed.status(i) for i in quick} == {"succeeded"}
    assert {routed.status(i) for i in reports} == {"scheduled"}
    assert len(queued(routed, "reports")) == 30
    work(routed, "reports")
    assert {routed.status(i) for i in reports} == {"succeeded"}


def test_a_schedule_can_name_its_own_queue(routed: System) -> None:
    mine = routed.app.schedule("record", {}, delay=0, tenant="acme", queue="tenant-acme")
    many = routed.app.schedule_many(
        [ScheduleRequest("report", {}, delay=0, queue="tenant-acme") for _ in range(2)]
    )
    assert {routed.app.get(i).queue for i in [mine.id, *many]} == {"tenant-acme"}  # type: ignore[union-attr]
    routed.scheduler.run_once()
    assert len(queued(routed, "tenant-acme")) == 3
    work(routed, "tenant-acme")
    assert {routed.status(i) for i in [mine.id, *many]} == {"succeeded"}


def test_a_bad_queue_name_is_refused_and_nothing_is_written(
    app: App, count: Callable[..., int]
) -> None:
    with pytest.raises(InvalidQueueError, match="queue must match"):
        app.schedule("x", {}, delay=1, queue="no spaces")
    with pytest.raises(InvalidQueueError):
        app.schedule_many([ScheduleRequest("x", {}, delay=1, queue="")])
    with pytest.raises(InvalidQueueError):
        app.handler("x", queue="a/b")
    assert count() == 0


def test_cancel_removes_a_waiting_job_from_its_own_queue(routed: System) -> None:
    now = routed.app.schedule("report", {}, delay=0)
    later = routed.app.schedule("report", {}, delay=300)
    routed.scheduler.run_once()
    assert len(queued(routed, "reports")) == 1
    assert routed.redis.zcard("rq:scheduled:reports") == 1
    routed.app.cancel(now.id)
    routed.app.cancel(later.id)
    assert routed.app.core.removals().flush()
    assert queued(routed, "reports") == [] and routed.redis.zcard("rq:scheduled:reports") == 0


def test_promotion_and_reconciliation_cover_every_queue(routed: System) -> None:
    soon = routed.app.schedule("report", {}, delay=1)
    lost = routed.app.schedule("report", {}, delay=0)
    routed.scheduler.run_once()
    assert routed.redis.zcard("rq:scheduled:reports") == 1  # soon, pushed ahead
    routed.redis.delete("rq:queue:reports")  # lost's job vanishes from its queue
    routed.redis.delete(f"rq:job:{routed.app.get(lost.id).queue_job_id}")  # type: ignore[union-attr]
    result = Reconciler(routed.app).run_once()
    assert result.repushed == 1
    assert queued(routed, "reports") == [routed.app.get(lost.id).queue_job_id]  # type: ignore[union-attr]
    routed.run_until(lambda: routed.app.now() > soon.due_at, timeout=10)
    routed.scheduler.run_once()  # promotes soon onto its own queue
    assert len(queued(routed, "reports")) == 2
    assert list(orphan_jobs(routed.app)) == []


def test_the_reconciler_leaves_a_capped_tenants_waiting_rows_to_the_scheduler(
    system: System,
) -> None:
    system.app.set_quota("acme", max_inflight=2)
    for _ in range(10):
        system.app.schedule("record", {}, delay=0, tenant="acme")
    system.scheduler.run_once()
    Reconciler(system.app).run_once()
    with system.app.engine.connect() as conn:
        pushed = conn.execute(
            text("SELECT count(*) FROM scheduled_jobs WHERE queue_job_id IS NOT NULL")
        ).scalar_one()
    assert pushed == 2
    assert system.app.deliverer().depth() == (2, 0)


def test_a_recurring_schedule_delivers_its_occurrences_on_its_types_queue(
    routed: System,
) -> None:
    definition = routed.app.recurring("minutely-report", cron="* * * * *", type="report")
    assert definition.queue == "reports"
    routed.scheduler_pass()
    with routed.app.engine.connect() as conn:
        queues = conn.execute(
            text("SELECT DISTINCT queue FROM scheduled_jobs WHERE recurring_id = :id"),
            {"id": definition.id},
        ).scalars()
        assert list(queues) == ["reports"]  # every occurrence in the window, on "reports"


def test_the_worker_command_takes_its_queues(
    routed: System, database_url: str, redis_url: str
) -> None:
    ids = [routed.app.schedule("record", {}, delay=0, queue="side").id for _ in range(3)]
    routed.scheduler.run_once()
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    worker = [
        sys.executable,
        "-m",
        "duejobs",
        "worker",
        "--app",
        "tests.support.apps:app",
        "--burst",
    ]
    bad = subprocess.run([*worker, "--queue", "no spaces"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "queue must match" in bad.stderr
    ok = subprocess.run(
        [*worker, "--queue", "other", "--queue", "side"], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert {routed.status(i) for i in ids} == {"succeeded"}


def test_an_early_delivery_goes_back_into_its_own_queues_registry(routed: System) -> None:
    s = routed.app.schedule("record", {}, delay=timedelta(minutes=10), queue="reports")
    routed.scheduler.run_once()
    job = routed.app.get(s.id).queue_job_id  # type: ignore[union-attr]
    assert job is not None
    routed.redis.zrem("rq:scheduled:reports", job)  # as if a worker had taken it early
    assert routed.scheduler.deliverer.defer(job, s.due_at, "reports")
    assert routed.redis.zscore("rq:scheduled:reports", job) is not None
    assert routed.redis.zscore(routed.scheduler.deliverer.scheduled_key, job) is None
