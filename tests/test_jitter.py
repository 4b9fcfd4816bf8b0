"""Controlled dispersion of peaks: jitter spreads starts after the intended instant."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import text

from duejobs import App
from duejobs.errors import NegativeDelayError
from duejobs.services.reconciler import Reconciler
from tests.support.system import System


def _offsets(app: App) -> list[float]:
    with app.engine.connect() as conn:
        return [
            float(x)
            for x in conn.execute(
                text("SELECT extract(epoch FROM due_at - run_at) FROM scheduled_jobs")
            ).scalars()
        ]


def test_5000_reminders_with_a_60_s_jitter_spread_evenly_over_that_minute(app: App) -> None:
    instant = app.now() + timedelta(hours=1)
    for i in range(5000):
        app.schedule("send-reminder", {"i": i}, run_at=instant, jitter=timedelta(seconds=60))
    offsets = _offsets(app)
    assert len(offsets) == 5000 and min(offsets) >= 0 and max(offsets) < 60
    per_ten_seconds = Counter(int(o // 10) for o in offsets)
    assert sorted(per_ten_seconds) == [0, 1, 2, 3, 4, 5]
    # 833 expected per bucket; a binomial sd of 26, so 150 off is far beyond chance.
    assert all(abs(n - 5000 / 6) < 150 for n in per_ten_seconds.values()), per_ten_seconds
    with app.engine.connect() as conn:
        intended = conn.execute(text("SELECT DISTINCT run_at FROM scheduled_jobs")).scalars()
        assert list(intended) == [instant]  # the intended instant stays recorded


def test_without_jitter_every_reminder_targets_the_instant(app: App) -> None:
    instant = app.now() + timedelta(hours=1)
    for i in range(200):
        app.schedule("send-reminder", {"i": i}, run_at=instant)
    assert set(_offsets(app)) == {0.0}


def test_a_types_default_jitter_applies_to_its_schedules(app: App) -> None:
    app.handler("campaign", jitter=timedelta(seconds=30))(lambda ctx, payload: None)
    spread = [app.schedule("campaign", {}, delay=60) for _ in range(50)]
    exact = app.schedule("campaign", {}, delay=60, jitter=0)
    assert all(timedelta(0) <= s.due_at - s.run_at < timedelta(seconds=30) for s in spread)
    assert len({s.due_at - s.run_at for s in spread}) > 40
    assert exact.due_at == exact.run_at


def test_jitter_is_fixed_per_schedule_across_reschedule_and_reconcile(system: System) -> None:
    s = system.app.schedule("record", {}, delay=timedelta(minutes=5), jitter=120)
    offset = s.due_at - s.run_at
    moved = system.app.reschedule(s.id, delay=timedelta(minutes=10))
    assert moved.due_at - moved.run_at == offset
    system.scheduler.run_once()
    system.redis.flushdb()  # all it holds: its queues
    Reconciler(system.app).run_once()
    registry = system.scheduler.deliverer.queue.scheduled_job_registry
    score = system.redis.zscore(registry.key, registry.get_job_ids()[0])
    assert score == pytest.approx(moved.due_at.timestamp(), abs=0.001)
    created = system.app.history(s.id)[0]
    assert created.detail["due_at"] != created.detail["run_at"]


def test_a_jittered_job_never_starts_before_its_effective_time(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0, jitter=1.5)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    started = next(e for e in system.app.history(s.id) if e.kind.value == "started")
    assert started.at >= s.due_at >= s.run_at


def test_negative_jitter_is_refused_and_nothing_is_written(app: App) -> None:
    with pytest.raises(NegativeDelayError, match="jitter must not be negative"):
        app.schedule("send-reminder", {}, delay=1, jitter=-1)
    assert _offsets(app) == []
