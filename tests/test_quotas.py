"""Per-tenant quotas on live schedules: admission refused with a clear error, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from duejobs import App
from duejobs.app import scope as scope_module
from duejobs.errors import QuotaExceededError, TenantMismatchError
from tests.support.system import System


def test_a_schedule_beyond_the_quota_is_refused_and_nothing_is_written(
    app: App, count: Callable[..., int]
) -> None:
    app.set_quota("acme", max_live=3)
    for _ in range(3):
        app.schedule("x", {}, delay=60, tenant="acme")
    before = REGISTRY.get_sample_value("duejobs_quota_refusals_total", {"tenant": "acme"}) or 0
    with pytest.raises(QuotaExceededError, match="'acme' has reached its quota of 3"):
        app.schedule("x", {}, delay=60, tenant="acme")
    assert count() == 3 and count("scheduled_job_events") == 3
    after = REGISTRY.get_sample_value("duejobs_quota_refusals_total", {"tenant": "acme"})
    assert after == before + 1
    app.schedule("x", {}, delay=60, tenant="globex")  # other tenants are not affected


def test_the_default_quota_applies_unless_a_tenant_has_its_own(app: App) -> None:
    app.set_quota("*", max_live=1)
    app.set_quota("big", max_live=5)
    app.schedule("x", {}, delay=60, tenant="small")
    with pytest.raises(QuotaExceededError, match="'small' has reached its quota of 1"):
        app.schedule("x", {}, delay=60, tenant="small")
    for _ in range(5):
        app.schedule("x", {}, delay=60, tenant="big")
    with pytest.raises(QuotaExceededError, match="'big' has reached its quota of 5"):
        app.schedule("x", {}, delay=60, tenant="big")
    app.set_quota("*", max_live=None)
    app.schedule("x", {}, delay=60, tenant="small")


def test_a_cleared_tenant_quota_falls_back_to_the_default(app: App) -> None:
    app.set_quota("*", max_live=2)
    app.set_quota("big", max_live=5)
    for _ in range(3):
        app.schedule("x", {}, delay=60, tenant="big")
    app.set_quota("big", max_live=None)  # back to the default of 2, which 3 already exceed
    with pytest.raises(QuotaExceededError, match="'big' has reached its quota of 2"):
        app.schedule("x", {}, delay=60, tenant="big")


def test_another_app_applies_a_changed_quota_once_its_cache_expires(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scope_module, "QUOTA_CACHE_SECONDS", 0.3)
    other = App(database_url=str(app.engine.url.render_as_string(hide_password=False)))
    other.schedule("x", {}, delay=60, tenant="acme")  # caches "no quota"
    app.set_quota("acme", max_live=1)
    other.schedule("x", {}, delay=60, tenant="acme")  # still within the cached answer
    time.sleep(0.35)  # the cache's own period, not a wait for something to happen
    with pytest.raises(QuotaExceededError):
        other.schedule("x", {}, delay=60, tenant="acme")
    other.close()


def test_finished_or_cancelled_schedules_free_their_place(system: System) -> None:
    app = system.app
    app.set_quota("acme", max_live=1)
    done = app.schedule("record", {}, delay=0, tenant="acme")
    with pytest.raises(QuotaExceededError):
        app.schedule("record", {}, delay=60, tenant="acme")
    system.run_until(lambda: system.status(done.id) == "succeeded")
    waiting = app.schedule("record", {}, delay=60, tenant="acme")  # the finished one's place
    with pytest.raises(QuotaExceededError):
        app.schedule("record", {}, delay=60, tenant="acme")
    app.cancel(waiting.id)
    app.schedule("record", {}, delay=60, tenant="acme")  # the cancelled one's place


def test_an_existing_key_is_returned_even_at_the_quota(app: App) -> None:
    app.set_quota("acme", max_live=1)
    first = app.schedule("x", {}, delay=60, tenant="acme", key="k")
    assert app.schedule("x", {}, delay=60, tenant="acme", key="k").id == first.id


def test_concurrent_schedules_never_exceed_the_quota(app: App, count: Callable[..., int]) -> None:
    app.set_quota("acme", max_live=5)
    barrier = threading.Barrier(10)
    refused: list[QuotaExceededError] = []

    def schedule() -> None:
        barrier.wait()
        try:
            app.schedule("x", {}, delay=60, tenant="acme")
        except QuotaExceededError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=schedule) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert count() == 5 and len(refused) == 5


def test_quotas_are_set_by_an_unscoped_app_with_valid_values(app: App) -> None:
    with pytest.raises(TenantMismatchError):
        app.tenant("acme").set_quota("acme", max_live=1)
    with pytest.raises(ValueError, match="max_live"):
        app.set_quota("acme", max_live=-1)


def test_quota_from_the_shell(app: App, database_url: str, redis_url: str) -> None:
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    run = [sys.executable, "-m", "duejobs", "quota"]
    ok = subprocess.run([*run, "acme", "--max-live", "2"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "quota of acme: 2" in ok.stdout
    bad = subprocess.run(
        [*run, "acme", "--max-live", "-3"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2
    for _ in range(2):
        app.schedule("x", {}, delay=60, tenant="acme")
    with pytest.raises(QuotaExceededError):
        app.schedule("x", {}, delay=60, tenant="acme")
    inflight = subprocess.run(
        [*run, "*", "--max-inflight", "50"], env=env, capture_output=True, text=True
    )
    assert inflight.returncode == 0 and "quota of *: 50 jobs in flight" in inflight.stdout
    listing = subprocess.run(run, env=env, capture_output=True, text=True)
    assert listing.stdout.splitlines() == [
        "*: max_live=no cap max_inflight=50 max_rate=no limit",
        "acme: max_live=2 max_inflight=default max_rate=default",
    ]
