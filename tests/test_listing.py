"""Listing schedules (``App.list``, ``AsyncApp.list``, ``duejobs list``): filters, keyset
pages in a stable order, tenant scope, refusals, and the plan of each filter at a million rows.

Seen failing against builds broken on purpose: the cursor compared with ``>=`` (a page's last
schedule came back first on the next page) →
``test_pages_read_every_schedule_once_in_due_order``; the scoped App's tenant ignored →
``test_a_scoped_app_lists_only_its_own_tenant_and_refuses_another``; the index of finished
schedules by key left out (the key filter then walked every finished schedule) →
``test_each_filter_is_served_by_an_index_at_a_million_rows``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from duejobs import App, AsyncApp, Schedule, Status, store
from duejobs.errors import (
    DatabaseUnavailableError,
    InvalidListError,
    NaiveDatetimeError,
    ReadTimeoutError,
    TenantMismatchError,
)
from tests.support.cli import run
from tests.support.plans import full_scans, reads_index
from tests.support.servers import PARTITIONED


def _order(schedules: list[Schedule]) -> list[tuple[datetime, uuid.UUID]]:
    return [(s.due_at, s.id) for s in schedules]


def _many(app: App, count: int, **kwargs: Any) -> list[Schedule]:
    return [
        app.schedule("record", {}, delay=timedelta(minutes=i // 3), **kwargs) for i in range(count)
    ]


def _set(app: App, schedule_id: uuid.UUID, assignments: str, **params: Any) -> None:
    """A row moved by hand to a state the test needs (a failed run, a recurring occurrence)."""
    with app.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE scheduled_jobs SET {assignments} WHERE id = :id"),
            {"id": schedule_id, **params},
        )


def test_pages_read_every_schedule_once_in_due_order(app: App) -> None:
    made = _many(app, 25)
    seen: list[Schedule] = []
    page = app.list(limit=10)
    pages = 1
    while page.next_cursor is not None:
        seen += page.schedules
        page = app.list(limit=10, after=page.next_cursor)
        pages += 1
    seen += page.schedules
    assert pages == 3 and len(seen) == 25
    assert _order(seen) == sorted(_order(made))


def test_a_cursor_keeps_its_place_while_schedules_are_added_before_it(app: App) -> None:
    made = _many(app, 6)
    first = app.list(limit=3)
    app.schedule("record", {}, run_at=app.now() - timedelta(hours=1))  # before the first page
    rest = app.list(limit=10, after=first.next_cursor)
    assert _order(first.schedules + rest.schedules) == sorted(_order(made))
    assert rest.next_cursor is None


def test_latest_first_reads_the_same_schedules_in_reverse(app: App) -> None:
    made = _many(app, 7)
    first = app.list(limit=4, latest_first=True)
    second = app.list(limit=4, latest_first=True, after=first.next_cursor)
    assert _order(first.schedules + second.schedules) == sorted(_order(made), reverse=True)


@pytest.mark.parametrize(
    "filters",
    [
        {"status": "failed"},
        {"status": [Status.FAILED, Status.CANCELLED]},
        {"type": "other"},
        {"key": "order-7"},
        {"queue": "reports"},
        {"recurring": "nightly"},
        {"due_range": True},
    ],
    ids=lambda f: next(iter(f)),
)
def test_each_filter_keeps_only_its_schedules(app: App, filters: dict[str, Any]) -> None:
    now = app.now()
    plain = _many(app, 4)
    failed = app.schedule("record", {}, delay=timedelta(hours=1))
    _set(app, failed.id, "status = 'failed', finished_at = now()")
    cancelled = app.schedule("record", {}, key="order-7", delay=timedelta(hours=2))
    assert app.cancel(cancelled.id)
    keyed = app.schedule("record", {}, key="order-7", delay=timedelta(hours=3))
    other = app.schedule("other", {}, delay=timedelta(hours=4))
    routed = app.schedule("record", {}, queue="reports", delay=timedelta(hours=5))
    definition = app.recurring("nightly", cron="0 3 * * *", type="record")
    occurrence = app.schedule("record", {}, delay=timedelta(hours=6))
    _set(app, occurrence.id, "recurring_id = :rid", rid=definition.id)
    expected = {
        "status": [failed] if filters.get("status") == "failed" else [failed, cancelled],
        "type": [other],
        "key": [cancelled, keyed],
        "queue": [routed],
        "recurring": [occurrence],
        "due_range": [failed, cancelled],
    }[next(iter(filters))]
    if "due_range" in filters:
        filters = {
            "due_from": now + timedelta(minutes=30),
            "due_before": now + timedelta(hours=2.5),
        }
    listed = app.list(**filters).schedules
    assert [s.id for s in listed] == [s.id for s in expected]
    assert plain[0].id not in {s.id for s in listed}


def test_a_list_that_runs_past_the_read_timeout_is_stopped_with_a_clear_error(
    app: App, database_url: str, redis_url: str
) -> None:
    """An operator's read is bounded: here it waits on a lock a migration would hold; it is
    stopped at ``read_timeout`` with an error naming the lock as the cause, and the App reads
    again after."""
    bounded = App(database_url, redis_url, read_timeout=timedelta(milliseconds=300))
    made = app.schedule("record", {}, delay=60)
    locker = app.engine.connect()
    locker.execute(text("LOCK TABLE scheduled_jobs IN ACCESS EXCLUSIVE MODE"))
    release = threading.Timer(10, locker.rollback)  # unbounded, the list returns at 10 s
    release.start()
    try:
        with pytest.raises(ReadTimeoutError, match=r"waited for a lock .*read_timeout, 0:00:00.3"):
            bounded.list()
    finally:
        release.cancel()
        locker.rollback()
        locker.close()
    assert [s.id for s in bounded.list().schedules] == [made.id]
    bounded.close()


def test_a_replica_read_stopped_behind_a_lock_leaves_the_replica_up(
    app: App, database_url: str, redis_url: str
) -> None:
    """A list on the read replica (here the primary named as one) stopped behind a lock (a
    standby replays the primary's locks): the replica answered, so it is not said down (its
    gauge stays 1, its lag known). Seen failing with the replica marked down by the lock's
    wait."""
    from duejobs.observability.replica import REPLICA_LAG, REPLICA_UP

    bounded = App(
        database_url,
        redis_url,
        read_database_url=database_url,
        read_timeout=timedelta(milliseconds=300),
    )
    bounded.list()  # the replica answers: up
    assert REPLICA_UP._value.get() == 1
    locker = app.engine.connect()
    locker.execute(text("LOCK TABLE scheduled_jobs IN ACCESS EXCLUSIVE MODE"))
    try:
        with pytest.raises(ReadTimeoutError, match="waited for a lock"):
            bounded.list()
    finally:
        locker.rollback()
        locker.close()
        bounded.close()
    assert REPLICA_UP._value.get() == 1 and REPLICA_LAG._value.get() != float("inf")


@pytest.mark.parametrize(
    ("read", "table"),
    [
        ("get", "scheduled_jobs"),
        ("history", "scheduled_job_events"),
        ("attempts", "scheduled_job_attempts"),
    ],
)
def test_a_schedules_reads_are_stopped_at_the_read_timeout_behind_a_lock(
    app: App, database_url: str, redis_url: str, read: str, table: str
) -> None:
    """A schedule's page (``get``, ``history``, ``attempts``: the dashboard's, ``duejobs
    show``) waits on a table a migration or ``VACUUM FULL`` locks: stopped at
    ``read_timeout``, saying so, rather than hanging. Seen failing with those reads made
    outside the limit (each waited for the lock's release, 10 s here)."""
    bounded = App(database_url, redis_url, read_timeout=timedelta(milliseconds=300))
    made = app.schedule("record", {}, delay=60)
    locker = app.engine.connect()
    locker.execute(text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
    release = threading.Timer(10, locker.rollback)  # unbounded, the read returns at 10 s
    release.start()
    try:
        with pytest.raises(ReadTimeoutError, match=r"waited for a lock .*read_timeout, 0:00:00.3"):
            getattr(bounded, read)(made.id)
    finally:
        release.cancel()
        locker.rollback()
        locker.close()
    got = bounded.get(made.id)
    assert got is not None and got.id == made.id
    bounded.close()


def test_a_pool_with_no_connection_free_is_an_outage_naming_the_pool(app: App) -> None:
    """Every connection of the App's pool held (the pool's wait, 0.2 s here, ended): the read
    fails as PostgreSQL unavailable, naming the pool, as the dashboard's 503 and the CLI's
    exit 1 show it. Seen failing with SQLAlchemy's pool timeout raised bare (a 500)."""
    narrow = create_engine(app.engine.url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    core = app.core.with_engines(narrow, None)
    held = narrow.connect()
    try:
        with pytest.raises(DatabaseUnavailableError, match="pool"), core.transaction() as conn:
            conn.exec_driver_sql("SELECT 1")
    finally:
        held.close()
        narrow.dispose()


def test_a_scoped_app_lists_only_its_own_tenant_and_refuses_another(app: App) -> None:
    mine = app.schedule("record", {}, delay=0, tenant="acme")
    app.schedule("record", {}, delay=0, tenant="globex")
    acme = app.tenant("acme")
    assert [s.id for s in acme.list().schedules] == [mine.id]
    with pytest.raises(TenantMismatchError, match="globex"):
        acme.list(tenant="globex")
    assert len(app.list().schedules) == 2  # the unscoped App: every tenant
    assert [s.tenant for s in app.list(tenant="globex").schedules] == ["globex"]


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"limit": 0}, InvalidListError, "limit"),
        ({"limit": 1001}, InvalidListError, "limit"),
        ({"limit": True}, InvalidListError, "limit"),
        ({"status": "done"}, InvalidListError, "unknown status 'done'"),
        ({"status": []}, InvalidListError, "at least one"),
        ({"due_from": datetime(2026, 1, 1)}, NaiveDatetimeError, "due_from"),
        ({"due_before": "tomorrow"}, InvalidListError, "due_before"),
        (
            {
                "due_from": datetime.fromisoformat("2026-01-02T00:00+00:00"),
                "due_before": datetime.fromisoformat("2026-01-01T00:00+00:00"),
            },
            InvalidListError,
            "must be after",
        ),
        ({"after": "not-a-cursor"}, InvalidListError, "cursor"),
        ({"after": "12.zz"}, InvalidListError, "cursor"),
        ({"after": "9" * 20 + "." + "0" * 32}, InvalidListError, "cursor"),
    ],
)
def test_a_bad_list_request_is_refused_naming_the_problem(
    app: App, arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=re.escape(says)):
        app.list(**arguments)


def test_async_app_lists_the_same_page(app: App) -> None:
    made = _many(app, 3)

    async def listed() -> list[uuid.UUID]:
        async with AsyncApp(app) as async_app:
            return [s.id for s in (await async_app.list(limit=5)).schedules]

    assert asyncio.run(listed()) == [s.id for s in sorted(made, key=lambda s: (s.due_at, s.id))]


def test_duejobs_list_prints_a_page_and_the_cursor_of_the_next(
    app: App, env: dict[str, str]
) -> None:
    made = _many(app, 3, tenant="acme")
    first = run("list", "--tenant", "acme", "--limit", "2", "--json", env=env)
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    rest = run("list", "--limit", "2", "--after", page["next"], "--json", env=env)
    ids = [s["id"] for s in page["schedules"] + json.loads(rest.stdout)["schedules"]]
    assert ids == [str(s.id) for s in sorted(made, key=lambda s: (s.due_at, s.id))]
    shown = run("list", "--status", "scheduled", "--limit", "2", env=env)
    assert shown.returncode == 0 and f"--after {page['next']}" in shown.stdout
    refused = run("list", "--status", "done", env=env)
    assert refused.returncode == 2 and "done" in refused.stderr


@pytest.mark.skipif(
    PARTITIONED,
    reason="the plain schema's plans (partitioned mode's: tests/test_partition_plans.py)",
)
@pytest.mark.long  # a million rows written first, 28 s: make test-long (test-all)
@pytest.mark.slow
def test_each_filter_is_served_by_an_index_at_a_million_rows(app: App) -> None:
    """A million schedules, most of them finished (1 in 20,000 failed), a third waiting (half
    of those pushed), 1 in 1,000 running, 1 in 5,000 an occurrence of a recurring definition,
    1 in 100,000 of a rare type and a rare queue: each part of each list reads an index, never
    the table, and a rare type or queue is found by its own index, not by walking every finished
    schedule in due order until a page is full (seconds at ten million rows)."""
    definition = app.recurring("nightly", cron="0 3 * * *", type="record")
    with app.engine.connect() as conn:
        trans = conn.begin()
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, tenant, type, key, payload, run_at, due_at, "
                "status, queue, finished_at, queue_job_id, lease_expires_at, recurring_id) "
                "SELECT gen_random_uuid(), 't' || (g % 100), "
                "       CASE WHEN g % 100000 = 7 THEN 'rare' ELSE 'type' || (g % 5) END, "
                "       CASE WHEN g % 10 = 0 THEN 'k' || g END, '{}', t, t, s, "
                "       CASE WHEN g % 100000 = 8 THEN 'q-rare' ELSE 'q' || (g % 3) END, "
                "       CASE WHEN s IN ('succeeded', 'failed') THEN t END, "
                "       CASE WHEN g % 6 = 0 THEN 'job' || g END, "
                "       CASE WHEN s = 'running' THEN t END, "
                "       CASE WHEN g % 5000 = 0 THEN CAST(:definition AS uuid) END "
                "FROM (SELECT g, now() - interval '30 days' + g * interval '3s' AS t, "
                "      CASE WHEN g % 20000 = 0 THEN 'failed' WHEN g % 1000 = 1 THEN 'running' "
                "           WHEN g % 3 = 0 THEN 'scheduled' ELSE 'succeeded' END AS s "
                "      FROM generate_series(1, 1000000) g) AS rows"
            ),
            {"definition": definition.id},
        )
        conn.execute(text("ANALYZE scheduled_jobs"))

        def plan(**filters: Any) -> str:
            params = {
                "tenant": None,
                "statuses": None,
                "type": None,
                "key": None,
                "queue": None,
                "due_from": None,
                "due_before": None,
                "recurring_ids": None,
                "after_due": None,
                "after_id": None,
                "limit": 51,
                **filters,
            }
            explained = conn.execute(text("EXPLAIN " + store.QUERIES["list_schedules"].sql), params)
            return "\n".join(explained.scalars())

        now = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
        live = {"scheduled_jobs_claim_idx", "scheduled_jobs_due_idx", "scheduled_jobs_lease_idx"}
        # The unpushed rows of one tenant: by the tenant's claim index, or (PostgreSQL 18 on
        # some samples of ANALYZE, this tenant holding 1% of the rows) by walking the claim
        # index in due order and keeping the tenant's, which reads about limit / 1% entries.
        tenant_live = {
            ("scheduled_jobs_claim_tenant_idx", "scheduled_jobs_claim_idx"),
            "scheduled_jobs_pushed_idx",
        }
        plans = {
            "nothing": (plan(), {*live, "scheduled_jobs_list_finished_idx"}),
            "tenant": (
                plan(tenant="t7"),
                {*tenant_live, "scheduled_jobs_list_finished_tenant_idx"},
            ),
            "failed": (plan(statuses=["failed"]), {"scheduled_jobs_list_problem_idx"}),
            "scheduled": (plan(statuses=["scheduled"]), live - {"scheduled_jobs_lease_idx"}),
            "key": (
                plan(tenant="t7", key="k500"),
                {"scheduled_jobs_live_key_idx", "scheduled_jobs_list_finished_key_idx"},
            ),
            "type": (plan(type="type3"), set()),
            "queue": (plan(queue="q1"), set()),
            "rare type": (
                plan(type="rare"),
                {"scheduled_jobs_list_live_type_idx", "scheduled_jobs_list_finished_type_idx"},
            ),
            "rare queue": (
                plan(queue="q-rare"),
                {"scheduled_jobs_list_live_queue_idx", "scheduled_jobs_list_finished_queue_idx"},
            ),
            "due range": (
                plan(due_from=now, due_before=now + timedelta(hours=1)),
                {
                    "scheduled_jobs_claim_idx",
                    "scheduled_jobs_due_idx",
                    "scheduled_jobs_list_finished_idx",
                    # the running rows (a worker's slots): few, by whichever index is cheaper
                    # (PostgreSQL 18 skips through a live index's few queues or types)
                    (
                        "scheduled_jobs_lease_idx",
                        "scheduled_jobs_list_live_queue_idx",
                        "scheduled_jobs_list_live_type_idx",
                    ),
                },
            ),
            "recurring": (
                plan(recurring_ids=[definition.id]),
                {"scheduled_jobs_recurring_idx", "scheduled_jobs_list_finished_recurring_idx"},
            ),
            "next page": (
                plan(after_due=now, after_id=uuid.UUID(int=0), tenant="t7"),
                {*tenant_live, "scheduled_jobs_list_finished_tenant_idx"},
            ),
        }
        trans.rollback()
    for name, (shown, indexes) in plans.items():
        assert full_scans(shown) == [], (name, shown)
        for index in indexes:
            either = index if isinstance(index, tuple) else (index,)
            assert any(reads_index(shown, one) for one in either), (name, index, shown)
