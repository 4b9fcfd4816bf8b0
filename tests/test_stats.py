"""`duejobs stats`: every figure matches what the test did.

Seen failing against a build broken on purpose: p99 computed as p50, and the lag histogram's
labels swapped → ``test_lag_p99_is_measured_per_tenant_and_shown_for_tenants_with_nothing_live``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

from prometheus_client import REGISTRY
from sqlalchemy import text

from duejobs import App
from duejobs.observability.metrics import _BoundedLabel
from duejobs.services.stats import collect, observe_stats, render
from duejobs.worker import Runtime, WorkerConfig
from tests.support import sample, wait_for
from tests.support.cli import run
from tests.support.system import System


def test_stats_figures_match_what_happened(system: System) -> None:
    app = system.app
    done = [app.schedule("record", {"i": i}, delay=0, tenant="acme").id for i in range(3)]
    flaky = app.schedule("flaky", {"fail_times": 1}, delay=0, tenant="acme").id
    cancelled = app.schedule("record", {}, delay=timedelta(hours=1), tenant="globex")
    app.cancel(cancelled.id)
    moved = app.schedule("record", {}, delay=timedelta(hours=1), tenant="globex")
    app.reschedule(moved.id, delay=timedelta(hours=2))
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in [*done, flaky]))

    # Drift and lateness the figures must show:
    late = app.schedule("record", {}, run_at=app.now() - timedelta(minutes=5), tenant="acme")
    lost = app.schedule("record", {}, delay=0, tenant="globex")
    orphaned = app.schedule("record", {}, delay=0, tenant="globex")
    with app.engine.begin() as conn:  # only these two get pushed
        conn.execute(
            text("UPDATE scheduled_jobs SET due_at = due_at + interval '1 day' WHERE id = :id"),
            {"id": late.id},
        )
    system.scheduler.run_once()
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET due_at = run_at WHERE id = :id"), {"id": late.id}
        )
        app.cancel(orphaned.id, conn=conn)  # its queue job stays in Redis
    lost_job = app.get(lost.id).queue_job_id  # type: ignore[union-attr]
    system.redis.delete(f"rq:job:{lost_job}")  # Redis lost this one

    stats = collect(app, since=timedelta(hours=1), late_after=timedelta(minutes=1))
    overall = stats.overall
    assert (overall.scheduled, overall.running) == (3, 0)  # late, lost, moved
    assert (overall.overdue, overall.late) == (2, 1)
    assert 290 <= stats.oldest_overdue_seconds <= 400
    assert stats.schedules_without_job == 2  # late (never pushed) and lost (job gone)
    assert stats.jobs_without_schedule == 1  # the cancelled one's job
    assert stats.queued == 2  # lost's id is still listed; orphaned's job waits
    counts = stats.recent.counts
    assert counts["cancelled"] == 2 and counts["rescheduled"] == 1
    assert counts["succeeded"] == 4 and counts["retried"] == 1 and counts["started"] == 5
    lag = stats.recent.lag_ms
    assert lag["p50"] is not None and lag["max"] is not None and 0 <= lag["p50"] <= lag["max"]
    by_tenant = {f.tenant: f for f in stats.live if f.tenant}
    assert by_tenant["acme"].late == 1 and by_tenant["globex"].scheduled == 2
    by_type = {a.type: a for a in stats.activity if a.type and a.tenant is None}
    assert by_type["record"].counts["started"] == 3 and by_type["flaky"].counts["started"] == 2
    table = render(stats)
    assert "schedules without job      2" in table and "type flaky" in table


def test_stats_command_prints_a_table_and_json(
    system: System, database_url: str, redis_url: str
) -> None:
    system.app.schedule("record", {}, delay=0, tenant="acme")
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    table = subprocess.run(
        [sys.executable, "-m", "duejobs", "stats"], env=env, capture_output=True, text=True
    )
    assert table.returncode == 0, table.stderr
    assert "scheduled         1" in table.stdout and "acme" in table.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "duejobs", "stats", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    data = json.loads(as_json.stdout)
    overall = next(f for f in data["live"] if f["tenant"] is None and f["type"] is None)
    assert data["schedules_without_job"] == 1 and overall["scheduled"] == 1
    assert data["recurring_behind"] == 0


def test_stats_command_for_one_tenant_shows_that_tenants_figures_alone(
    system: System, env: dict[str, str]
) -> None:
    """``duejobs stats --tenant acme``: acme's figures, no other tenant's rows (20,000
    tenants printed whole before). Seen failing without the option (exit 2)."""
    for tenant in ("acme", "acme", "globex"):
        system.app.schedule("record", {}, delay=timedelta(hours=1), tenant=tenant)
    done = run("stats", "--tenant", "acme", "--json", env=env)
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout)["live"]
    assert {f["tenant"] for f in live} <= {None, "acme"}
    overall = next(f for f in live if f["tenant"] is None and f["type"] is None)
    assert overall["scheduled"] == 2
    refused = run("stats", "--tenant", "", env=env)
    assert refused.returncode == 2 and "tenant" in refused.stderr


def test_the_tenant_gauges_name_the_tenants_with_late_rows_whoever_came_first(
    system: System,
) -> None:
    """Twelve quiet tenants seen first, then three with late rows, six names to give: the
    three late ones are named in ``duejobs_late``, the quiet ones with the most live rows
    take the rest, and ``other`` sums the others. Seen failing with the names given first
    come, first served (the late tenants counted under ``other``)."""
    for n in range(12):
        system.app.schedule("record", {}, delay=60, tenant=f"quiet-{n:02}")
    for n in range(3):
        system.app.schedule("record", {}, delay=0, tenant=f"z-late-{n}")
    observe_stats(collect(system.app, late_after=timedelta(0)), limit=6)
    assert [sample("duejobs_late", tenant=f"z-late-{n}") for n in range(3)] == [1, 1, 1]
    assert sample("duejobs_scheduled", tenant="quiet-00") == 1
    assert sample("duejobs_scheduled", tenant="other") == 9
    assert sample("duejobs_late", tenant="other") == 0


def test_a_tenant_scoped_app_sees_only_its_own_figures(system: System) -> None:
    app = system.app
    for tenant in ("acme", "acme", "globex"):
        app.schedule("record", {}, delay=timedelta(hours=1), tenant=tenant)
    gone = app.schedule("record", {}, delay=0, tenant="globex")
    system.scheduler.run_once()
    with app.engine.begin() as conn:
        app.cancel(gone.id, conn=conn)  # globex's job left behind in Redis
    stats = collect(app.tenant("acme"))
    assert {f.tenant for f in stats.live if f.tenant} == {"acme"}
    assert stats.overall.scheduled == 2
    assert {a.tenant for a in stats.activity if a.tenant} <= {"acme"}
    assert stats.recent.counts["created"] == 2
    assert (stats.queued, stats.deferred, stats.jobs_without_schedule) == (None, None, 0)
    assert "globex" not in render(stats)
    assert collect(app).jobs_without_schedule == 1


def test_tenants_spelled_alike_in_job_ids_count_only_their_own_orphans(system: System) -> None:
    """``team.a`` and ``team_a`` share their job ids' tenant part (``team_a``): a job left by
    one is counted for that one only, by its schedule's row. Seen failing when scoped stats
    compared the ids' spelling alone."""
    app = system.app
    left = app.schedule("record", {}, delay=0, tenant="team.a")
    app.schedule("record", {}, delay=timedelta(hours=1), tenant="team_a")
    system.scheduler.run_once()
    with app.engine.begin() as conn:
        app.cancel(left.id, conn=conn)  # team.a's job left behind in Redis
    assert collect(app.tenant("team.a")).jobs_without_schedule == 1
    assert collect(app.tenant("team_a")).jobs_without_schedule == 0


def test_gauges_of_a_tenant_that_has_no_live_rows_are_removed(system: System) -> None:
    app = system.app
    s = app.schedule("record", {}, delay=timedelta(hours=1), tenant="vanishing")
    observe_stats(collect(app))
    assert REGISTRY.get_sample_value("duejobs_scheduled", {"tenant": "vanishing"}) == 1
    app.cancel(s.id)
    observe_stats(collect(app))
    assert REGISTRY.get_sample_value("duejobs_scheduled", {"tenant": "vanishing"}) is None


def test_metric_labels_stay_bounded(system: System, producer: App) -> None:
    bounded = _BoundedLabel(2)
    assert [bounded(t) for t in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]
    s = producer.schedule("type-nobody-handles-" + "x" * 150, {}, delay=0)
    labels = {"tenant": "default", "type": "unregistered", "outcome": "failed"}
    before = REGISTRY.get_sample_value("duejobs_deliveries_total", labels) or 0
    system.runtime = Runtime(system.app, WorkerConfig(unknown_type_grace=timedelta(seconds=1)))
    try:
        system.run_until(lambda: system.status(s.id) == "failed")
    finally:
        system.runtime.close()
    assert REGISTRY.get_sample_value("duejobs_deliveries_total", labels) == before + 1


def test_lag_p99_is_measured_per_tenant_and_shown_for_tenants_with_nothing_live(
    system: System,
) -> None:
    app = system.app

    def over_15_min(tenant: str) -> float:
        def sample(le: str) -> float:
            labels = {"tenant": tenant, "type": "record", "le": le}
            return REGISTRY.get_sample_value("duejobs_lag_seconds_bucket", labels) or 0.0

        return sample("+Inf") - sample("900.0")

    before = {t: over_15_min(t) for t in ("late", "prompt")}
    ids = [app.schedule("record", {}, delay=0, tenant="prompt").id for _ in range(10)]
    ids += [app.schedule("record", {}, delay=0, tenant="late").id for _ in range(9)]
    ids.append(
        app.schedule("record", {}, run_at=app.now() - timedelta(minutes=30), tenant="late").id
    )
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in ids))

    stats = collect(app, since=timedelta(hours=1))
    lag = {a.tenant: a.lag_ms for a in stats.activity if a.tenant and a.type is None}
    # p99 of ten starts, one of them 30 min late: 0.91 of the way to it; p50 is prompt.
    assert lag["late"]["p99"] is not None and lag["late"]["p99"] > 25 * 60_000
    assert lag["late"]["p50"] is not None and lag["late"]["p50"] < 60_000
    assert lag["prompt"]["p99"] is not None and lag["prompt"]["p99"] < 60_000
    assert over_15_min("late") - before["late"] == 1  # the histogram, per tenant
    assert over_15_min("prompt") - before["prompt"] == 0
    split = [line.split() for line in render(stats).splitlines()]
    rows = {cells[0]: cells for cells in split if cells[:1] in (["late"], ["prompt"])}
    assert rows["late"][6] == f"{lag['late']['p99']:,.0f}"  # nothing live, still listed
    assert rows["prompt"][6] == f"{lag['prompt']['p99']:,.0f}"


def test_a_recurring_definition_no_scheduler_has_reached_shows_as_behind(system: System) -> None:
    """An occurrence past its time by more than ``late_after`` and not yet a row — the
    scheduler's recurring loop stopped or failing — is counted (of its tenant alone for a
    tenant's App), exported, and cleared by the loop's next pass."""
    app = system.app
    app.recurring("digest", cron="* * * * *", type="record", tenant="acme")
    app.recurring("digest", cron="0 9 * * *", type="record", tenant="globex")
    assert collect(app).recurring_behind == 0
    with app.engine.begin() as conn:  # the loop has not run for ten minutes
        conn.execute(
            text(
                "UPDATE recurring_schedules SET next_run_at = now() - interval '10 minutes' "
                "WHERE tenant = 'acme'"
            )
        )
    stats = collect(app)
    assert stats.recurring_behind == 1 and "recurring behind      1" in render(stats)
    assert collect(app.tenant("globex")).recurring_behind == 0
    observe_stats(stats)
    assert sample("duejobs_recurring_behind") == 1
    system.scheduler.recurring.run_once()
    assert collect(app).recurring_behind == 0


def test_stats_show_each_tables_size_and_its_dead_tuples(system: System) -> None:
    """What grows in PostgreSQL: each table's size, and the dead tuples vacuum has yet to
    remove (the statistics collector counts them shortly after the commit: polled)."""
    app = system.app
    ids = [app.schedule("record", {}, delay=timedelta(hours=1)).id for _ in range(20)]
    for schedule_id in ids:
        app.cancel(schedule_id)

    def jobs() -> object:
        return next(t for t in collect(app).tables or () if t.table == "scheduled_jobs")

    wait_for(lambda: jobs().dead_tuples >= 20, 30, "the dead tuples to be counted")  # type: ignore[attr-defined]
    figures = collect(app)
    jobs_table = next(t for t in figures.tables or () if t.table == "scheduled_jobs")
    assert jobs_table.bytes > jobs_table.index_bytes > 0
    assert {t.table for t in figures.tables or ()} >= {"scheduled_jobs", "scheduled_job_events"}
    observe_stats(figures)
    assert sample("duejobs_table_dead_tuples", table="scheduled_jobs") >= 20
    assert "scheduled_jobs" in render(figures) and "dead" in render(figures)
    assert collect(app.tenant("acme")).tables is None  # everyone's: not a tenant's figure


def test_stats_show_redis_memory_and_each_structure(system: System) -> None:
    app = system.app
    for _ in range(5):
        app.schedule("record", {}, delay=0)
    for _ in range(3):
        app.schedule("record", {}, delay=timedelta(minutes=5))
    system.scheduler_pass()
    figures = collect(app)
    assert figures.redis is not None
    held = figures.redis.structures
    assert (held["queue"].entries, held["scheduled"].entries) == (5, 3)
    assert held["queue"].bytes > 0 and figures.redis.used_memory > 0 and figures.redis.keys >= 8
    observe_stats(figures)
    assert sample("duejobs_redis_entries", structure="queue") == 5
    assert json.loads(json.dumps(figures.as_dict()))["redis"]["structures"]["scheduled"] == {
        "entries": 3,
        "bytes": held["scheduled"].bytes,
    }


def test_tenants_named_all_or_other_keep_series_of_their_own(system: System) -> None:
    """The aggregate series are ``tenant="all"`` (every tenant) and ``tenant="other"`` (those
    past the named ones): a tenant literally called so is spelled ``tenant:all`` and
    ``tenant:other`` (a ':' no tenant name has), never added into them."""
    app = system.app
    for tenant, n in (("all", 2), ("other", 3), ("acme", 4)):
        for _ in range(n):
            app.schedule("record", {}, delay=timedelta(hours=1), tenant=tenant)
    observe_stats(collect(app))

    def scheduled(label: str) -> float | None:
        return REGISTRY.get_sample_value("duejobs_scheduled", {"tenant": label})

    assert (scheduled("all"), scheduled("tenant:all"), scheduled("tenant:other")) == (9, 2, 3)
    assert scheduled("other") in (None, 0)
    bounded = _BoundedLabel(1)
    assert [bounded(t) for t in ("other", "all", "x")] == ["tenant:other", "other", "other"]
