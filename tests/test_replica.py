"""Reads off the primary (:mod:`duejobs.observability.replica`) against a real streaming
replica: a primary and a hot standby made here with PostgreSQL's own tools (``initdb``,
``pg_basebackup -R``, ``pg_ctl``) from the embedded PostgreSQL's binaries, on Unix sockets
(:mod:`tests.support.replication`). The replica's replay is paused to make it
fall behind on purpose.

Seen failing against code broken on purpose: ``Core.reading`` on the primary even with a
replica → ``test_stats_and_lists_read_the_replica_and_a_replica_behind_says_so`` (five
schedules counted, not three); the freshness taken as current whatever the replica has
replayed → the same test (no warning) and ``test_the_dashboard_says_when_its_replica_is_behind``;
the claim on the read engine → ``test_decisions_stay_on_the_primary_while_the_replica_is_behind``;
the read taken without waiting for the primary's position (``measure`` reading the replay
position once) →
``test_a_read_waits_for_a_replica_a_moment_behind_and_sees_the_write_just_made`` (no
schedule listed).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from duejobs import App, AsyncApp
from duejobs.dashboard import Access, create_dashboard
from duejobs.errors import DatabaseUnavailableError, SchemaMissingError
from duejobs.models import CURRENT, Freshness, Page
from duejobs.observability import replica
from duejobs.observability.replica import REPLICA_LAG
from duejobs.scheduler.loop import Scheduler
from duejobs.services import stats
from tests.support import wait_for
from tests.support.dashboard import HERE, LOCAL
from tests.support.replication import Pair
from tests.support.replication import pair as pair


@pytest.fixture
def replicated(pair: Pair, redis_url: str) -> Iterator[App]:
    """An App writing to the primary and reading its figures and lists from the replica,
    which it counts as stale a quarter of a second behind; the replica up and caught up."""
    pair.ensure_standby()
    app = App(
        pair.primary_url,
        redis_url,
        queue=f"replica-{uuid.uuid4().hex[:8]}",
        read_database_url=pair.replica_url,
        read_max_lag=timedelta(milliseconds=250),
    )
    app.migrate()

    def caught_up() -> bool:
        try:
            return app.list().freshness.lag == timedelta(0)
        except SchemaMissingError:  # the migration not replayed yet
            return False

    wait_for(caught_up, 30, "the replica to catch up")
    try:
        yield app
    finally:
        pair.on_replica("SELECT pg_wal_replay_resume()")
        with app.engine.begin() as conn:  # each test starts from an empty table
            conn.exec_driver_sql("TRUNCATE scheduled_jobs CASCADE")
        app.close()


def _scheduled(app: App) -> int:
    return stats.collect(app).overall.scheduled


def test_stats_and_lists_read_the_replica_and_a_replica_behind_says_so(
    pair: Pair, replicated: App
) -> None:
    app = replicated
    for i in range(3):
        app.schedule("replicated", {"i": i}, delay=timedelta(hours=1))
    wait_for(lambda: _scheduled(app) == 3, 30, "the replica to show three schedules")
    assert stats.collect(app).freshness == Freshness(
        "replica", timedelta(0), timedelta(seconds=0.25)
    )

    pair.on_replica("SELECT pg_wal_replay_pause()")
    late = [app.schedule("replicated", {"i": i}, delay=timedelta(hours=1)) for i in (3, 4)]
    assert all(app.get(s.id) is not None for s in late)  # a caller reads its writes

    wait_for(lambda: stats.collect(app).freshness.stale, 30, "the replica to count as stale")
    figures = stats.collect(app)
    assert figures.overall.scheduled == 3  # the replica's view, two schedules behind
    assert figures.freshness.source == "replica" and figures.freshness.lag is not None
    assert figures.freshness.lag > app.core.read_max_lag
    assert "behind the primary by" in stats.render(figures)
    assert figures.as_dict()["freshness"]["stale"] is True
    assert REPLICA_LAG._value.get() >= 0.25  # type: ignore[attr-defined]
    page = app.list()
    assert len(page.schedules) == 3 and page.freshness.stale

    pair.on_replica("SELECT pg_wal_replay_resume()")
    wait_for(lambda: _scheduled(app) == 5, 30, "the replica to show all five")
    assert not stats.collect(app).freshness.stale and not app.list().freshness.stale


def test_decisions_stay_on_the_primary_while_the_replica_is_behind(
    pair: Pair, replicated: App
) -> None:
    app = replicated
    pair.on_replica("SELECT pg_wal_replay_pause()")
    due = app.schedule("replicated", {}, delay=0)
    doomed = app.schedule("replicated", {}, delay=timedelta(hours=1))
    app.cancel(doomed.id)
    passed = Scheduler(app).run_once()
    assert passed.claimed == 1 and passed.queued == 1  # claimed from the primary's rows
    pushed = app.get(due.id)
    assert pushed is not None and pushed.queue_job_id is not None
    cancelled = app.get(doomed.id)
    assert cancelled is not None and cancelled.status.value == "cancelled"
    assert app.list().schedules == []  # the replica has seen none of it yet


def test_a_read_waits_for_a_replica_a_moment_behind_and_sees_the_write_just_made(
    pair: Pair, replicated: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list made right after a write, while the replica has not replayed it yet, waits
    for the replica to reach the primary's position (given up to ``CATCH_UP_WAIT``) and
    then sees the write, as current. The replay is paused and resumed a moment after the
    read began; the wait is widened so that a busy machine does not outrun it."""
    monkeypatch.setattr(replica, "CATCH_UP_WAIT", 20.0)
    pair.on_replica("SELECT pg_wal_replay_pause()")
    made = replicated.schedule("replicated", {}, delay=timedelta(hours=1))
    resume = threading.Timer(0.5, pair.on_replica, ("SELECT pg_wal_replay_resume()",))
    resume.start()
    try:
        page = replicated.list()
    finally:
        resume.join()
    assert [s.id for s in page.schedules] == [made.id]
    assert page.freshness == Freshness("replica", timedelta(0), timedelta(seconds=0.25))


def test_the_async_api_lists_from_the_replica_too(pair: Pair, replicated: App) -> None:
    async def main() -> Page:
        async with AsyncApp(replicated) as app:
            pair.on_replica("SELECT pg_wal_replay_pause()")
            created = await app.schedule("replicated", {}, delay=timedelta(hours=1))
            assert await app.get(created.id) is not None  # on the primary
            return await app.list()

    page = asyncio.run(main())
    assert page.schedules == [] and page.freshness.source == "replica"


def test_the_dashboard_says_when_its_replica_is_behind(pair: Pair, replicated: App) -> None:
    app = replicated
    board = create_dashboard(app, Access(), refresh=1)
    with TestClient(board, client=LOCAL, base_url=HERE) as client:
        assert 'id="replica-behind"' not in client.get("/").text
        pair.on_replica("SELECT pg_wal_replay_pause()")
        app.schedule("replicated", {}, delay=timedelta(hours=1))
        wait_for(
            lambda: 'id="replica-behind"' in client.get("/schedules").text,
            30,
            "the list page to say the replica is behind",
        )
        wait_for(
            lambda: 'id="replica-behind"' in client.get("/").text,
            30,
            "the overview to say the replica is behind",
        )


def test_a_replica_that_does_not_answer_is_an_error_naming_it(
    database_url: str, redis_url: str
) -> None:
    app = App(
        database_url, redis_url, read_database_url="postgresql://ops:s3cret@127.0.0.1:1/nowhere"
    )
    try:
        with pytest.raises(DatabaseUnavailableError, match="read replica") as raised:
            app.list()
        assert "s3cret" not in str(raised.value)
    finally:
        app.close()


def test_without_a_replica_every_read_is_current(app: App) -> None:
    assert app.list().freshness == CURRENT
    assert stats.collect(app).freshness == CURRENT
    assert not CURRENT.stale and CURRENT.warning() is None


def test_dead_tuples_are_counted_on_the_primary_when_the_figures_read_the_replica(
    pair: Pair, replicated: App
) -> None:
    """A standby's statistics count no dead tuples (replay is not a write): read there, the
    bloat of the hot table would never show. The table figures come from the primary."""
    app = replicated
    ids = [app.schedule("replicated", {}, delay=timedelta(hours=1)).id for _ in range(20)]
    for schedule_id in ids:
        app.cancel(schedule_id)

    def dead() -> int:
        tables = stats.collect(app).tables or []
        return next(t.dead_tuples for t in tables if t.table == "scheduled_jobs")

    wait_for(lambda: dead() >= 20, 30, "the primary's dead tuples in the figures")
