"""What an operator (or a support tool) does to schedules: retry what failed or was cancelled,
run a schedule now, find, move and cancel by key, know whether ``schedule()`` created — by the
API, the async API and the CLI, on real PostgreSQL and Redis.

Seen failing against a build broken on purpose: retry keeping the attempts count →
``test_a_failed_schedule_retried_runs_again_as_a_new_version``; retry allowed on a live
schedule → ``test_retry_refuses_a_live_or_succeeded_schedule_and_an_unknown_id``; the key
check dropped (the unique index then refuses with a raw IntegrityError) →
``test_retry_refuses_a_key_another_live_schedule_holds``; by-key calls ignoring the tenant →
``test_by_key_calls_find_the_live_holder_of_the_tenant_only``; ``created`` always True →
``test_schedule_says_whether_it_created_the_schedule_or_returned_the_keys_holder``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from duejobs import App, AsyncApp, Status
from duejobs.errors import (
    InvalidKeyError,
    KeyInUseError,
    ScheduleNotFoundError,
    ScheduleNotLiveError,
    ScheduleNotRetryableError,
    TenantMismatchError,
)
from duejobs.worker import Runtime, WorkerConfig
from tests.support.apps import record
from tests.support.processes import ROOT
from tests.support.system import System


def test_schedule_says_whether_it_created_the_schedule_or_returned_the_keys_holder(
    app: App,
) -> None:
    first = app.schedule("mail", {}, delay=60, key="k")
    again = app.schedule("mail", {}, delay=60, key="k")
    assert (first.created, again.created, again.id) == (True, False, first.id)
    assert app.get(first.id).created is None  # type: ignore[union-attr]
    assert app.get(first.id) == first  # the flag does not change what a schedule equals
    app.set_quota("default", max_live=1)
    assert app.schedule("mail", {}, delay=60, key="k").created is False  # at its quota too


def test_a_failed_schedule_retried_runs_again_as_a_new_version(
    system: System, producer: App
) -> None:
    s = producer.schedule("deployed-later", {}, delay=0)
    kept, grace = system.runtime, WorkerConfig(unknown_type_grace=timedelta(seconds=1))
    system.runtime = Runtime(system.app, grace)  # no handler for it: failed after a second
    try:
        system.run_until(lambda: system.status(s.id) == "failed")
    finally:
        system.runtime.close()
        system.runtime = kept
    system.app.handler("deployed-later")(record)  # the fix is deployed

    retried = system.app.retry(s.id)
    assert (retried.status, retried.version, retried.attempts) == (Status.SCHEDULED, 2, 0)
    assert retried.last_error is None and retried.due_at <= system.app.now()
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert system.effects() == [(f"deployed-later:{s.id}:2", 1)]
    (event,) = [e for e in system.app.history(s.id) if e.kind.value == "rescheduled"]
    assert (event.version, event.detail["retry"], event.detail["old_status"]) == (2, True, "failed")


def test_a_cancelled_schedule_is_retried_at_the_time_given(app: App) -> None:
    s = app.schedule("mail", {}, delay=60, key="k")
    app.cancel(s.id)
    retried = app.retry(s.id, delay=timedelta(hours=2))
    assert (retried.status, retried.version, retried.key) == (Status.SCHEDULED, 3, "k")
    assert timedelta(hours=1, minutes=59) < retried.run_at - app.now() <= timedelta(hours=2)
    assert app.get_by_key("k") == retried  # live again, holding its key


def test_retry_refuses_a_live_or_succeeded_schedule_and_an_unknown_id(
    app: App, system: System
) -> None:
    live = app.schedule("record", {}, delay=60)
    with pytest.raises(ScheduleNotRetryableError, match="is scheduled; only failed or cancelled"):
        app.retry(live.id)
    done = system.app.schedule("record", {}, delay=0)
    system.run_until(lambda: system.status(done.id) == "succeeded")
    with pytest.raises(ScheduleNotRetryableError, match="is succeeded"):
        app.retry(done.id)
    with pytest.raises(ScheduleNotFoundError):
        app.tenant("other").retry(live.id)  # another tenant's id is an unknown id
    assert app.get(live.id).version == 1  # type: ignore[union-attr]


def test_retry_refuses_a_key_another_live_schedule_holds(app: App) -> None:
    old = app.schedule("mail", {}, delay=60, key="k")
    app.cancel(old.id)
    new = app.schedule("mail", {}, delay=60, key="k")  # the key was free again
    with pytest.raises(KeyInUseError, match=f"held by live schedule {new.id}"):
        app.retry(old.id)
    assert app.get(old.id).status is Status.CANCELLED  # type: ignore[union-attr]


def test_run_now_makes_a_live_schedule_due_now(app: App) -> None:
    s = app.schedule("mail", {}, delay=3600)
    now = app.run_now(s.id)
    assert now.version == 2 and now.due_at <= app.now()
    app.cancel(s.id)
    with pytest.raises(ScheduleNotLiveError):
        app.run_now(s.id)


def test_by_key_calls_find_the_live_holder_of_the_tenant_only(app: App) -> None:
    acme = app.schedule("mail", {"t": "acme"}, delay=60, key="k", tenant="acme")
    other = app.schedule("mail", {"t": "other"}, delay=60, key="k", tenant="other")
    assert app.get_by_key("k", tenant="acme") == acme
    assert app.tenant("other").get_by_key("k") == other
    assert app.get_by_key("k") is None  # the default tenant holds no such key
    moved = app.tenant("acme").reschedule_by_key("k", delay=120)
    assert moved.id == acme.id and moved.version == 2
    assert app.cancel_by_key("k", tenant="other")
    assert app.get_by_key("k", tenant="other") is None
    assert app.get_by_key("k", tenant="acme") is not None  # untouched
    assert not app.cancel_by_key("k", tenant="other")  # nothing live holds it now
    with pytest.raises(ScheduleNotFoundError, match="no live schedule holds key 'k'"):
        app.reschedule_by_key("k", tenant="other", delay=1)
    with pytest.raises(TenantMismatchError):
        app.tenant("acme").cancel_by_key("k", tenant="other")
    with pytest.raises(InvalidKeyError, match="a key is required"):
        app.get_by_key(None)  # type: ignore[arg-type]


def test_cancel_by_key_removes_the_job_waiting_in_redis(system: System) -> None:
    system.app.schedule("record", {}, delay=0, key="k")
    system.scheduler.run_once()
    assert system.scheduler.deliverer.queue.count == 1
    assert system.app.cancel_by_key("k")
    assert system.app.core.removals().flush()
    assert system.scheduler.deliverer.queue.count == 0


def test_the_async_app_retries_and_works_by_key(app: App) -> None:
    s = app.schedule("mail", {}, delay=60, key="k")
    app.cancel(s.id)

    async def main() -> tuple[object, ...]:
        async with AsyncApp(app) as aapp:
            retried = await aapp.retry(s.id)
            held = await aapp.get_by_key("k")
            moved = await aapp.reschedule_by_key("k", delay=30)
            now = await aapp.run_now(s.id)
            return (
                retried.version,
                held.id if held else None,
                moved.version,
                now.version,
                (await aapp.cancel_by_key("k")),
            )

    assert asyncio.run(main()) == (3, s.id, 4, 5, True)


def _cli(database_url: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    return subprocess.run(
        [sys.executable, "-m", "duejobs", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_retries_and_cancels_by_key_with_json(
    app: App, database_url: str, redis_url: str
) -> None:
    s = app.schedule("mail", {}, delay=60, key="k", tenant="acme")
    cancelled = _cli(database_url, redis_url, "cancel", "--key", "k", "--tenant", "acme", "--json")
    assert (cancelled.returncode, json.loads(cancelled.stdout)) == (0, {"cancelled": True})
    again = _cli(database_url, redis_url, "cancel", "--key", "k", "--tenant", "acme", "--json")
    assert (again.returncode, json.loads(again.stdout)) == (1, {"cancelled": False})

    retried = _cli(database_url, redis_url, "retry", str(s.id), "--in", "5m", "--json")
    assert retried.returncode == 0, retried.stderr
    shown = json.loads(retried.stdout)
    assert (shown["status"], shown["version"]) == ("scheduled", 3)

    refused = _cli(database_url, redis_url, "retry", str(s.id))
    assert refused.returncode == 1 and "only failed or cancelled" in refused.stderr
    both = _cli(database_url, redis_url, "cancel", str(s.id), "--key", "k")
    assert both.returncode == 2 and "not both" in both.stderr
