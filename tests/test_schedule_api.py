"""duejobs.App: writing, changing and reading schedules against a real PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text

from duejobs import App, EventKind, ScheduleRequest, Status
from duejobs.app import reads
from duejobs.config import libpq_url
from duejobs.errors import (
    InvalidListError,
    QuotaExceededError,
    ScheduleNotFoundError,
    ScheduleNotLiveError,
    VersionConflictError,
)
from tests.support import wait_for


def test_relative_delay_is_added_to_the_database_clock(app: App) -> None:
    before = app.now()
    s = app.schedule("send-reminder", {"reminder_id": 42}, delay=timedelta(minutes=30))
    after = app.now()
    assert before + timedelta(minutes=30) <= s.run_at <= after + timedelta(minutes=30)
    assert s.status is Status.SCHEDULED and s.version == 1 and s.attempts == 0
    assert s.run_at.tzinfo is UTC


def test_delay_given_in_seconds(app: App) -> None:
    before = app.now()
    s = app.schedule("send-reminder", {"reminder_id": 1}, delay=90)
    assert s.run_at - before >= timedelta(seconds=90)
    assert s.run_at - before < timedelta(seconds=95)


def test_absolute_aware_run_at_is_stored_as_that_utc_instant(app: App) -> None:
    run_at = datetime.fromisoformat("2026-10-30T09:00:00-03:00")
    s = app.schedule("send-reminder", {"reminder_id": 1}, run_at=run_at)
    stored = app.get(s.id)
    assert stored is not None
    assert stored.run_at == datetime(2026, 10, 30, 12, 0, tzinfo=UTC)
    assert stored.run_at.tzinfo is UTC
    assert stored.timezone is None and stored.local_run_at is None  # an offset is no zone


def test_an_aware_run_at_in_a_zone_keeps_that_zone_and_its_wall_time(app: App) -> None:
    run_at = datetime(2026, 10, 30, 9, 0, tzinfo=ZoneInfo("America/Sao_Paulo"))
    s = app.schedule("send-reminder", {"reminder_id": 1}, run_at=run_at)
    stored = app.get(s.id)
    assert stored is not None
    assert stored.run_at == datetime(2026, 10, 30, 12, 0, tzinfo=UTC)
    assert stored.timezone == "America/Sao_Paulo"
    assert stored.local_run_at == datetime(2026, 10, 30, 9, 0)
    assert stored.run_at_local == run_at


def test_naive_run_at_with_timezone_is_a_wall_time_in_that_zone(app: App) -> None:
    s = app.schedule(
        "send-reminder",
        {"id": 1},
        run_at=datetime(2026, 10, 30, 9, 0),
        timezone="America/Sao_Paulo",
    )
    stored = app.get(s.id)
    assert stored is not None
    assert stored.run_at == datetime(2026, 10, 30, 12, 0, tzinfo=UTC)
    assert stored.timezone == "America/Sao_Paulo"
    assert stored.local_run_at == datetime(2026, 10, 30, 9, 0)
    assert stored.run_at_local.hour == 9


def test_wall_time_in_a_dst_gap_runs_when_the_clocks_jump(app: App) -> None:
    # Europe/Berlin jumps 02:00 -> 03:00 on 2026-03-29: 02:30 does not exist.
    s = app.schedule("x", {}, run_at=datetime(2026, 3, 29, 2, 30), timezone="Europe/Berlin")
    assert s.run_at == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert s.run_at_local.strftime("%H:%M %z") == "03:00 +0200"
    assert s.local_run_at == datetime(2026, 3, 29, 2, 30)


def test_wall_time_in_a_dst_overlap_runs_once_at_its_first_occurrence(app: App) -> None:
    # America/New_York repeats 01:00-02:00 on 2026-11-01.
    s = app.schedule("x", {}, run_at=datetime(2026, 11, 1, 1, 30), timezone="America/New_York")
    assert s.run_at == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT, not EST


def test_late_job_in_the_past_is_accepted_and_already_due(app: App) -> None:
    s = app.schedule("x", {}, run_at=app.now() - timedelta(hours=3))
    assert s.status is Status.SCHEDULED
    assert app.is_past_deadline(s.id) is True


def test_is_past_deadline_answers_with_the_database_clock(app: App) -> None:
    later = app.schedule("x", {}, run_at=app.now() + timedelta(hours=1))
    due = app.schedule("x", {}, delay=0)
    assert app.is_past_deadline(later.id) is False
    assert app.is_past_deadline(due.id) is True
    with pytest.raises(ScheduleNotFoundError):
        app.is_past_deadline(uuid.uuid4())


def test_same_key_returns_the_existing_live_schedule(app: App, count: Callable[..., int]) -> None:
    first = app.schedule("send-reminder", {"reminder_id": 42}, delay=60, key="reminder:42")
    again = app.schedule("send-reminder", {"reminder_id": 99}, delay=600, key="reminder:42")
    assert again.id == first.id
    assert again.payload == {"reminder_id": 42} and again.run_at == first.run_at
    assert count() == 1
    assert [e.kind for e in app.history(first.id)] == [EventKind.CREATED]


def test_key_is_unique_per_tenant_not_globally(app: App) -> None:
    a = app.schedule("x", {}, delay=60, key="k", tenant="acme")
    b = app.schedule("x", {}, delay=60, key="k", tenant="globex")
    assert a.id != b.id


def test_key_is_free_again_once_its_schedule_is_cancelled(app: App) -> None:
    first = app.schedule("x", {}, delay=60, key="k")
    assert app.cancel(first.id)
    second = app.schedule("x", {}, delay=60, key="k")
    assert second.id != first.id


def test_concurrent_schedules_with_one_key_create_one_row(
    app: App, count: Callable[..., int]
) -> None:
    ids: list[uuid.UUID] = []
    barrier = threading.Barrier(8)

    def schedule() -> None:
        barrier.wait()
        ids.append(app.schedule("x", {}, delay=60, key="race").id)

    threads = [threading.Thread(target=schedule) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert count() == 1


def test_schedule_inside_a_rolled_back_caller_transaction_leaves_nothing(
    app: App, count: Callable[..., int]
) -> None:
    with app.engine.connect() as conn:
        trans = conn.begin()
        s = app.schedule("x", {"order": 1}, delay=60, conn=conn)
        assert app.get(s.id, conn=conn) is not None
        trans.rollback()
    assert app.get(s.id) is None
    assert count() == 0 and count("scheduled_job_events") == 0


def test_schedule_inside_a_committed_caller_transaction_commits_with_it(app: App) -> None:
    with app.engine.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE orders (id int) ON COMMIT DROP"))
        conn.execute(text("INSERT INTO orders VALUES (1)"))
        s = app.schedule("x", {"order": 1}, delay=60, conn=conn)
    assert app.get(s.id) is not None


def test_a_plain_psycopg_connection_holds_the_schedule_in_its_transaction(
    app: App, database_url: str, count: Callable[..., int]
) -> None:
    with psycopg.connect(libpq_url(database_url)) as raw:
        app.schedule("x", {}, delay=60, conn=raw)
        raw.rollback()
        assert count() == 0 and count("scheduled_job_events") == 0
        raw.execute("CREATE TEMP TABLE orders (id int) ON COMMIT DROP")
        kept = app.schedule("x", {}, delay=60, conn=raw)
        assert app.get(kept.id) is None and app.get(kept.id, conn=raw) is not None
        raw.commit()
    assert app.get(kept.id) is not None
    with pytest.raises(TypeError, match="a SQLAlchemy Connection or a psycopg Connection, got"):
        app.schedule("x", {}, delay=60, conn="a connection")  # type: ignore[arg-type]
    with psycopg.connect(libpq_url(database_url), autocommit=True) as raw:
        with pytest.raises(TypeError, match="autocommit mode outside a transaction"):
            app.cancel(kept.id, conn=raw)
        with raw.transaction():
            assert app.cancel(kept.id, conn=raw)
    assert app.get(kept.id).status is Status.CANCELLED  # type: ignore[union-attr]


def test_a_batch_or_a_keyed_schedule_first_on_a_psycopg_connection_rolls_back_with_it(
    app: App, database_url: str, count: Callable[..., int]
) -> None:
    """Their savepoint is made inside the caller's transaction, begun first: psycopg's
    transaction() on a connection whose transaction has not begun commits at its end. Seen
    failing with the transaction not begun first: the batch was committed."""
    with psycopg.connect(libpq_url(database_url)) as raw:
        app.schedule_many([ScheduleRequest("x", {}, delay=60, key="b")], conn=raw)
        raw.rollback()
        app.schedule("x", {}, delay=60, key="k", conn=raw)
        raw.rollback()
    assert count() == 0 and count("scheduled_job_events") == 0


def test_a_refused_batch_leaves_a_plain_psycopg_transaction_usable(
    app: App, database_url: str
) -> None:
    app.set_quota("acme", max_live=1)
    with psycopg.connect(libpq_url(database_url)) as raw:
        first = app.schedule("x", {}, delay=60, tenant="acme", conn=raw)
        with pytest.raises(QuotaExceededError):
            app.schedule_many([ScheduleRequest("x", {}, delay=60, tenant="acme")], conn=raw)
        rows = raw.execute("SELECT count(*) FROM scheduled_jobs").fetchone()
        assert rows == (1,)  # the savepoint undid the batch, and only the batch
        raw.commit()
    assert app.get(first.id) is not None


def test_reschedule_later_bumps_the_version_and_records_both_times(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    moved = app.reschedule(s.id, delay=timedelta(hours=2))
    assert moved.version == 2 and moved.run_at > s.run_at + timedelta(hours=1)
    assert moved.status is Status.SCHEDULED
    events = app.history(s.id)
    assert [e.kind for e in events] == [EventKind.CREATED, EventKind.RESCHEDULED]
    detail = events[1].detail
    assert datetime.fromisoformat(detail["old_run_at"]) == s.run_at
    assert datetime.fromisoformat(detail["new_run_at"]) == moved.run_at
    assert events[1].version == 2 and detail["old_version"] == 1


def test_reschedule_earlier(app: App) -> None:
    s = app.schedule("x", {}, delay=timedelta(hours=5))
    target = app.now() + timedelta(minutes=1)
    moved = app.reschedule(s.id, run_at=target)
    assert moved.run_at == target and moved.version == 2


def test_reschedule_in_a_zone_keeps_the_local_intent(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    moved = app.reschedule(s.id, run_at=datetime(2026, 12, 24, 18, 0), timezone="Europe/Lisbon")
    assert moved.timezone == "Europe/Lisbon"
    assert moved.run_at == datetime(2026, 12, 24, 18, 0, tzinfo=UTC)


def test_reschedule_with_a_stale_expected_version_is_refused(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    app.reschedule(s.id, delay=120, expected_version=1)
    with pytest.raises(VersionConflictError, match="version 2, not the expected 1"):
        app.reschedule(s.id, delay=999, expected_version=1)
    current = app.get(s.id)
    assert current is not None and current.version == 2


def test_reschedule_of_a_cancelled_schedule_is_refused(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    app.cancel(s.id)
    with pytest.raises(ScheduleNotLiveError, match="cancelled"):
        app.reschedule(s.id, delay=60)


def test_reschedule_of_an_unknown_id_is_not_found(app: App) -> None:
    with pytest.raises(ScheduleNotFoundError):
        app.reschedule(uuid.uuid4(), delay=60)


def test_cancel_before_execution_persists_and_bumps_the_version(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    assert app.cancel(s.id) is True
    stored = app.get(s.id)
    assert stored is not None
    assert stored.status is Status.CANCELLED and stored.version == 2
    assert stored.finished_at is not None
    assert [e.kind for e in app.history(s.id)] == [EventKind.CREATED, EventKind.CANCELLED]


def test_cancel_during_execution_cancels_a_running_row(app: App) -> None:
    s = app.schedule("x", {}, delay=0)
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET status = 'running' WHERE id = :id"), {"id": s.id}
        )
    assert app.cancel(s.id) is True
    stored = app.get(s.id)
    assert stored is not None and stored.status is Status.CANCELLED and stored.version == 2


def test_reschedule_says_whether_the_version_it_replaced_was_running(app: App) -> None:
    """A running schedule rescheduled: its return value says so (that handler goes on unless
    it calls ``ctx.ensure_current()``), and the schedule is due again at its new time under
    version + 1; one that had not started says it was not running; a read says nothing.
    Seen failing with the field left unset."""
    waiting = app.schedule("x", {}, delay=60)
    running = app.schedule("x", {}, delay=0)
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET status = 'running' WHERE id = :id"),
            {"id": running.id},
        )
    moved = app.reschedule(running.id, delay=30)
    assert moved.was_running is True
    assert (moved.status, moved.version) == (Status.SCHEDULED, 2)
    assert moved.run_at > running.run_at
    assert app.reschedule(waiting.id, delay=90).was_running is False
    read = app.get(running.id)
    assert read is not None and read.was_running is None


def test_cancel_twice_is_harmless(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    assert app.cancel(s.id) is True
    assert app.cancel(s.id) is False
    stored = app.get(s.id)
    assert stored is not None and stored.version == 2
    assert len(app.history(s.id)) == 2


def test_cancel_of_an_unknown_id_returns_false(app: App) -> None:
    assert app.cancel(uuid.uuid4()) is False


def test_ids_may_be_given_as_strings(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    got = app.get(str(s.id))
    assert got is not None and got.id == s.id


def test_history_is_oldest_first_with_database_times(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    app.reschedule(s.id, delay=120)
    app.reschedule(s.id, delay=180)
    app.cancel(s.id)
    events = app.history(s.id)
    assert [e.kind for e in events] == [
        EventKind.CREATED,
        EventKind.RESCHEDULED,
        EventKind.RESCHEDULED,
        EventKind.CANCELLED,
    ]
    assert [e.version for e in events] == [1, 2, 3, 4]
    assert [e.at for e in events] == sorted(e.at for e in events)


def test_a_whole_history_past_its_bound_is_refused_saying_to_read_it_in_pages(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``history(id)`` with no page reads at most ``MAX_WHOLE_HISTORY`` events: a longer one
    (a million, 1.2 GB read in 47 s) is refused at once, saying how to page through it; the
    pages still reach every event. Seen reading the whole history."""
    monkeypatch.setattr(reads, "MAX_WHOLE_HISTORY", 3)
    s = app.schedule("x", {}, delay=60)
    for minutes in (2, 3):
        app.reschedule(s.id, delay=timedelta(minutes=minutes))
    assert len(app.history(s.id)) == 3
    app.reschedule(s.id, delay=timedelta(minutes=4))
    with pytest.raises(InvalidListError, match="a page at a time"):
        app.history(s.id)
    newest = app.history(s.id, newest=3)
    assert [e.kind for e in app.history(s.id, newest=3, before=newest[-1].id)] == [
        EventKind.CREATED
    ]


def test_payload_comes_back_as_stored(app: App) -> None:
    payload = {"reminder_id": 42, "tags": ["a", "b"], "nested": {"ok": True}, "text": "ação"}
    s = app.schedule("x", payload, delay=60)
    stored = app.get(s.id)
    assert stored is not None and stored.payload == payload


def test_tenant_scope_cannot_read_cancel_or_reschedule_another_tenants_schedule(app: App) -> None:
    acme = app.tenant("acme")
    globex = app.tenant("globex")
    s = acme.schedule("x", {"secret": 1}, delay=60)
    assert globex.get(s.id) is None
    assert globex.history(s.id) == []
    assert globex.cancel(s.id) is False
    with pytest.raises(ScheduleNotFoundError):
        globex.reschedule(s.id, delay=1)
    with pytest.raises(ScheduleNotFoundError):
        globex.is_past_deadline(s.id)
    stored = acme.get(s.id)
    assert stored is not None and stored.status is Status.SCHEDULED and stored.version == 1


def test_tenant_scope_writes_only_for_its_tenant(app: App) -> None:
    acme = app.tenant("acme")
    s = acme.schedule("x", {}, delay=60)
    assert s.tenant == "acme"
    assert acme.schedule("x", {}, delay=60, tenant="acme").tenant == "acme"


def test_unscoped_app_defaults_to_the_default_tenant_and_sees_all(app: App) -> None:
    s = app.schedule("x", {}, delay=60)
    t = app.schedule("x", {}, delay=60, tenant="acme")
    assert s.tenant == "default"
    assert app.get(t.id) is not None


def test_dropped_database_connection_is_replaced_transparently(app: App) -> None:
    app.schedule("x", {}, delay=60)  # the pool now holds an idle connection
    with psycopg.connect(libpq_url(app.settings.database_url), autocommit=True) as admin:
        pids = [
            row[0]
            for row in admin.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ]
        assert pids
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])

        def gone() -> bool:  # termination is a signal: the backends end a moment later
            left = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
            ).fetchone()
            return left is not None and left[0] == 0

        wait_for(gone, 30, "the terminated backends to end")
    s = app.schedule("x", {}, delay=60)
    assert app.get(s.id) is not None


# 200 days from any day of the year cross a change of Lisbon's offset (summer time): read as
# calendar days in that zone, the delay would be an hour off.
_LONG_DELAY = timedelta(days=200)


def _delayed_by(s: object, delay: timedelta) -> bool:
    """Whether the schedule's run_at is ``delay`` after its creation (created_at is stamped a
    moment after the statement's time, from which the delay counts)."""
    return abs(s.run_at - s.created_at - delay) < timedelta(minutes=1)  # type: ignore[attr-defined]


def test_a_delay_is_absolute_time_in_a_callers_session_with_summer_time(
    app: App, database_url: str
) -> None:
    with psycopg.connect(libpq_url(database_url)) as conn:
        conn.execute("SET TimeZone = 'Europe/Lisbon'")
        s = app.schedule("record", {}, delay=_LONG_DELAY, conn=conn)
    assert _delayed_by(s, _LONG_DELAY)


def test_a_delay_is_absolute_time_on_a_server_whose_sessions_observe_summer_time(
    database_url: str, app: App
) -> None:
    # The server's default zone, as a connection option: what a postgresql.conf sets.
    zone = {"options": "-c TimeZone=Europe/Lisbon"}
    url = make_url(database_url).update_query_dict(zone).render_as_string(hide_password=False)
    lisbon = App(url)
    try:
        assert lisbon.now().utcoffset() == timedelta(0)  # instants read as UTC
        s = lisbon.schedule("record", {}, delay=_LONG_DELAY)
        assert _delayed_by(s, _LONG_DELAY)
    finally:
        lisbon.close()


def test_a_delay_is_absolute_time_on_a_callers_own_engine_with_summer_time(
    app: App, database_url: str
) -> None:
    theirs = create_engine(database_url)  # the application's own engine, not duejobs'
    try:
        with theirs.begin() as conn:
            conn.exec_driver_sql("SET LOCAL TimeZone = 'Europe/Lisbon'")
            s = app.schedule("record", {}, delay=_LONG_DELAY, conn=conn)
    finally:
        theirs.dispose()
    assert _delayed_by(s, _LONG_DELAY)


def test_a_change_of_one_statement_leaves_its_pooled_connection_in_transactions(
    app: App,
) -> None:
    """A cancel and a reschedule run as one statement in autocommit (one round trip, not
    three); the connection goes back to the pool as it was lent, so the next change that
    needs a transaction of several statements gets one. Seen failing with the isolation
    level set on the pooled connection outside SQLAlchemy's execution options."""
    first, second = (app.schedule("x", {}, delay=60) for _ in range(2))
    assert app.cancel(first.id) is True
    app.reschedule(second.id, delay=120)
    pool = app.core.engine.pool
    lent = [pool.connect() for _ in range(pool.checkedin())]
    try:
        assert lent and all(not c.driver_connection.autocommit for c in lent)
    finally:
        for c in lent:
            c.close()
    assert app.get(first.id).status is Status.CANCELLED
    assert app.get(second.id).version == 2
