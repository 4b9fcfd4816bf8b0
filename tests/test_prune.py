"""`duejobs prune`: finished rows and their history go, in batches; live rows never do."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from duejobs import store
from duejobs.errors import ConfigurationError
from duejobs.services.pruner import PruneConfig, Pruner, PruneResult
from tests.support import sample
from tests.support.system import System


def _age(system: System, schedule_id: object, status: str, days: int) -> None:
    with system.app.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scheduled_jobs SET status = :status, "
                "finished_at = CASE WHEN :status IN ('succeeded', 'failed', 'cancelled') "
                "THEN now() - make_interval(days => :days) END, "
                "run_at = now() - make_interval(days => :days), "
                "due_at = now() - make_interval(days => :days) WHERE id = :id"
            ),
            {"status": status, "days": days, "id": schedule_id},
        )


def _prune(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duejobs", "prune", *args], env=env, capture_output=True, text=True
    )


def test_prune_removes_old_finished_rows_with_their_history_and_keeps_live_ones(
    system: System, database_url: str, redis_url: str, count: Callable[..., int]
) -> None:
    old_done = [system.app.schedule("record", {}, delay=0).id for _ in range(5)]
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in old_done))
    for i in old_done:
        _age(system, i, "succeeded", 40)
    old_cancelled = system.app.schedule("record", {}, delay=60).id
    _age(system, old_cancelled, "cancelled", 40)
    recent_done = system.app.schedule("record", {}, delay=60).id
    _age(system, recent_done, "succeeded", 2)
    old_but_live = [system.app.schedule("record", {}, delay=60).id for _ in range(2)]
    _age(system, old_but_live[0], "scheduled", 90)
    _age(system, old_but_live[1], "running", 90)
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    result = _prune(env, "--older-than", "30d", "--batch-size", "2")
    assert result.returncode == 0, result.stderr
    assert "pruned 6 finished schedules" in result.stdout and "rows/s" in result.stdout
    remaining = {system.app.get(i) is not None for i in [*old_done, old_cancelled]}
    assert remaining == {False}
    assert all(system.app.get(i) is not None for i in [recent_done, *old_but_live])
    assert count() == 3 and count("test_effects") == 5  # the application's rows are its own
    assert count("scheduled_job_effects") == 0 and count("scheduled_job_attempts") == 0
    with system.app.engine.connect() as conn:
        orphans = conn.execute(
            text(
                "SELECT count(*) FROM scheduled_job_events e "
                "LEFT JOIN scheduled_jobs s ON s.id = e.schedule_id WHERE s.id IS NULL"
            )
        ).scalar_one()
    assert orphans == 0


def test_prune_refuses_a_missing_or_zero_age(
    system: System, database_url: str, redis_url: str
) -> None:
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    assert _prune(env).returncode == 2
    zero = _prune(env, "--older-than", "0s")
    assert (
        zero.returncode == 2
        and "--older-than" in zero.stderr
        and "greater than zero" in zero.stderr
    )


def test_the_pruner_deletes_batch_after_batch_and_says_what_it_did(system: System) -> None:
    done = [system.app.schedule("record", {}, delay=0).id for _ in range(5)]
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in done))
    for i in done:
        _age(system, i, "succeeded", 40)
    pruned_before = REGISTRY.get_sample_value("duejobs_pruned_total") or 0.0
    result = Pruner(system.app, PruneConfig(batch_size=2)).run_once()
    assert (result.deleted, result.batches) == (5, 3)  # 2 + 2 + 1: the short batch ends it
    assert REGISTRY.get_sample_value("duejobs_pruned_total") == pruned_before + 5
    assert Pruner(system.app).run_once().deleted == 0


def test_a_failed_prune_pass_is_counted_and_the_loop_goes_on(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}

    def fails_once(*args: object) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return 0

    monkeypatch.setattr(store, "prune_finished", fails_once)
    pruner = Pruner(system.app)
    failed_before = sample("duejobs_pruner_failed_passes_total")
    passes: list[PruneResult] = []

    def report(result: PruneResult) -> None:
        passes.append(result)
        pruner.stop()

    thread = threading.Thread(target=pruner.run, args=(timedelta(milliseconds=10), report))
    thread.start()
    thread.join(20)
    assert not thread.is_alive() and passes == [PruneResult(0, 1, passes[0].seconds)]
    assert sample("duejobs_pruner_failed_passes_total") == failed_before + 1


@pytest.mark.parametrize(
    ("config", "field"),
    [({"older_than": timedelta(0)}, "older_than"), ({"batch_size": 0}, "batch_size")],
)
def test_a_pruner_config_refuses_what_cannot_work(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        PruneConfig(**config)
