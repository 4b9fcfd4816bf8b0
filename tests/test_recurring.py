"""Recurring schedules: DST and misfire policies, materialization, updates, pause, delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from sqlalchemy import text

from duejobs import App, store
from duejobs.errors import InvalidCronError, InvalidScheduleError, UnknownTimezoneError
from duejobs.models import DstGap, DstOverlap
from duejobs.scheduler.occurrences import (
    BATCH,
    Materializer,
    MaterializeResult,
    Rule,
    materialize_once,
    occurrences,
)
from tests.support import sample
from tests.support.system import System

WINDOW = timedelta(minutes=15)


def _local(rule: Rule, start: datetime, days: int) -> list[str]:
    found, _ = occurrences(rule, start, start + timedelta(days=days))
    return [o.run_at.astimezone(ZoneInfo(rule.timezone)).isoformat() for o in found]


@pytest.mark.parametrize(
    ("zone", "day_before", "expected_shift"),
    [
        ("Europe/Berlin", datetime(2026, 3, 28, 12, tzinfo=UTC), "2026-03-29T03:00:00+02:00"),
        ("America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC), "2026-03-08T03:00:00-04:00"),
    ],
)
def test_dst_gap_runs_at_the_end_of_the_gap_or_is_skipped(
    zone: str, day_before: datetime, expected_shift: str
) -> None:
    shift = Rule("30 2 * * *", zone, DstGap.SHIFT, DstOverlap.ONCE)
    skip = Rule("30 2 * * *", zone, DstGap.SKIP, DstOverlap.ONCE)
    shifted = _local(shift, day_before, 3)
    assert len(shifted) == 3 and shifted[0] == expected_shift
    skipped = _local(skip, day_before, 3)
    assert len(skipped) == 2 and expected_shift not in skipped
    assert all("T02:30:00" in t for t in skipped)


@pytest.mark.parametrize(
    ("zone", "day_before", "twice"),
    [
        (
            "Europe/Berlin",
            datetime(2026, 10, 24, 12, tzinfo=UTC),
            ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"],
        ),
        (
            "America/New_York",
            datetime(2026, 10, 31, 12, tzinfo=UTC),
            ["2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"],
        ),
    ],
)
def test_dst_overlap_runs_once_or_twice(zone: str, day_before: datetime, twice: list[str]) -> None:
    cron = "30 2 * * *" if zone == "Europe/Berlin" else "30 1 * * *"
    once = _local(Rule(cron, zone, DstGap.SHIFT, DstOverlap.ONCE), day_before, 2)
    both = _local(Rule(cron, zone, DstGap.SHIFT, DstOverlap.TWICE), day_before, 2)
    assert twice[0] in once and twice[1] not in once
    assert twice[0] in both and twice[1] in both
    assert len(both) == len(once) + 1


def _rows(app: App, where: str = "true") -> list[tuple[datetime, str, int]]:
    with app.engine.connect() as conn:
        return [
            (r.run_at, r.status, r.recurring_version)
            for r in conn.execute(
                text(
                    "SELECT run_at, status, recurring_version FROM scheduled_jobs "
                    f"WHERE recurring_id IS NOT NULL AND {where} ORDER BY run_at"
                )
            )
        ]


def test_occurrences_inside_the_window_become_ordinary_schedules(app: App) -> None:
    r = app.recurring("tick", cron="* * * * *", type="record", payload={"k": 1})
    result = materialize_once(app.engine, WINDOW)
    assert result.definitions == 1 and 14 <= result.created <= 16
    rows = _rows(app)
    now = app.now()
    assert all(now < run_at <= now + WINDOW for run_at, _, _ in rows)
    assert {status for _, status, _ in rows} == {"scheduled"}
    assert [t.second for t, _, _ in rows] == [0] * len(rows)
    first = app.get(_ids(app)[0])
    assert first is not None and first.type == "record" and first.payload == {"k": 1}
    assert first.timezone == "UTC" and first.tenant == r.tenant
    assert materialize_once(app.engine, WINDOW).created == 0  # nothing new until time moves


def _ids(app: App) -> list[object]:
    with app.engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT id FROM scheduled_jobs WHERE recurring_id IS NOT NULL ORDER BY run_at")
            ).scalars()
        )


def test_two_schedulers_never_create_an_occurrence_twice(app: App) -> None:
    app.recurring("tick", cron="* * * * *", type="record")
    barrier = threading.Barrier(4)

    def materialize() -> None:
        barrier.wait()
        materialize_once(app.engine, WINDOW)

    threads = [threading.Thread(target=materialize) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = len(_rows(app))
    with app.engine.begin() as conn:  # a scheduler that read a stale position does it again
        conn.execute(text("UPDATE recurring_schedules SET next_run_at = now()"))
    materialize_once(app.engine, WINDOW)
    assert len(_rows(app)) == created and 14 <= created <= 16


def _downtime(app: App, hours: float) -> datetime:
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE recurring_schedules SET next_run_at = now() - make_interval(secs => :s)"),
            {"s": hours * 3600},
        )
        return conn.execute(text("SELECT next_run_at FROM recurring_schedules")).scalar_one()


def _expected_missed(cron: str, since: datetime, until: datetime) -> list[datetime]:
    it = croniter(cron, since - timedelta(microseconds=1))
    found = []
    while (t := it.get_next(datetime)) <= until:
        found.append(t)
    return found


@pytest.mark.parametrize("policy", ["latest", "all", "skip"])
def test_misfire_policy_after_a_downtime_spanning_several_occurrences(
    app: App, policy: str
) -> None:
    app.recurring("every-5", cron="*/5 * * * *", type="record", misfire=policy)
    since = _downtime(app, hours=1)
    now = app.now()
    missed = _expected_missed("*/5 * * * *", since, now)
    assert len(missed) >= 11
    materialize_once(app.engine, WINDOW)
    past = [t for t, _, _ in _rows(app, "run_at <= now()")]
    expected = {"latest": missed[-1:], "all": missed, "skip": []}[policy]
    assert past == expected
    future = _rows(app, "run_at > now()")
    assert len(future) == 3  # the window goes on as usual


def test_grace_counts_recent_misses_as_on_time(app: App) -> None:
    app.recurring("every-5", cron="*/5 * * * *", type="record", grace=timedelta(minutes=30))
    since = _downtime(app, hours=1)
    now = app.now()
    materialize_once(app.engine, WINDOW)
    past = [t for t, _, _ in _rows(app, "run_at <= now()")]
    recent = [
        t for t in _expected_missed("*/5 * * * *", since, now) if t >= now - timedelta(minutes=30)
    ]
    older = [
        t for t in _expected_missed("*/5 * * * *", since, now) if t < now - timedelta(minutes=30)
    ]
    assert past == [older[-1], *recent]


def test_a_missed_occurrence_runs_through_the_whole_pipeline(system: System) -> None:
    system.app.recurring("nightly", cron="0 3 * * *", type="record", timezone="America/Sao_Paulo")
    _downtime(system.app, hours=48)
    system.run_until(lambda: len(system.effects()) == 1)
    ((run_at, status, version),) = _rows(system.app, "run_at <= now()")
    assert status == "succeeded" and version == 1
    assert run_at.astimezone(ZoneInfo("America/Sao_Paulo")).hour == 3


def test_updating_the_cron_bumps_the_version_and_supersedes_unrun_occurrences(app: App) -> None:
    app.recurring("tick", cron="* * * * *", type="record")
    materialize_once(app.engine, WINDOW)
    before = len(_rows(app))
    updated = app.update_recurring("tick", cron="*/5 * * * *")
    assert updated.version == 2
    assert {s for _, s, _ in _rows(app)} == {"cancelled"} and len(_rows(app)) == before
    materialize_once(app.engine, WINDOW)
    live = _rows(app, "status = 'scheduled'")
    assert 3 <= len(live) <= 4 and {v for _, _, v in live} == {2}
    assert all(t.minute % 5 == 0 for t, _, _ in live)


def test_same_definition_again_changes_nothing(app: App) -> None:
    first = app.recurring("tick", cron="0 9 * * MON-FRI", type="record", timezone="Europe/Lisbon")
    again = app.recurring("tick", cron="0 9 * * MON-FRI", type="record", timezone="Europe/Lisbon")
    assert again.version == first.version == 1 and again.id == first.id
    assert first.next_run_at.astimezone(ZoneInfo("Europe/Lisbon")).hour == 9


def test_pause_cancels_unrun_occurrences_and_resume_starts_after_now(app: App) -> None:
    app.recurring("tick", cron="* * * * *", type="record")
    materialize_once(app.engine, WINDOW)
    paused = app.pause_recurring("tick")
    assert paused.status == "paused"
    assert {s for _, s, _ in _rows(app)} == {"cancelled"}
    assert materialize_once(app.engine, WINDOW).definitions == 0
    _downtime(app, hours=2)
    resumed = app.resume_recurring("tick")
    assert resumed.status == "active" and resumed.next_run_at > app.now()
    result = materialize_once(app.engine, WINDOW)
    assert result.misfired == 0 and result.created >= 14


def test_delete_cancels_unrun_occurrences_and_keeps_history(app: App) -> None:
    app.recurring("tick", cron="* * * * *", type="record")
    materialize_once(app.engine, WINDOW)
    assert app.delete_recurring("tick") is True
    assert app.get_recurring("tick") is None
    assert app.delete_recurring("tick") is False
    with app.engine.connect() as conn:
        left = conn.execute(
            text(
                "SELECT count(*), count(recurring_id) FROM scheduled_jobs "
                "WHERE status = 'cancelled'"
            )
        ).one()
    assert left[0] >= 14 and left[1] == 0  # rows stay, detached from the deleted definition


def test_another_tenant_cannot_see_or_change_a_recurring_schedule(app: App) -> None:
    app.tenant("acme").recurring("report", cron="0 8 * * *", type="record")
    globex = app.tenant("globex")
    assert globex.get_recurring("report") is None
    assert globex.delete_recurring("report") is False
    assert app.tenant("acme").get_recurring("report") is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cron": "61 * * * *"}, InvalidCronError, "not a valid cron"),
        ({"timezone": "Mars/Olympus"}, UnknownTimezoneError, "unknown timezone"),
        ({"dst_gap": "later"}, InvalidScheduleError, "dst_gap must be one of"),
        ({"misfire": "sometimes"}, InvalidScheduleError, "misfire must be one of"),
        ({"grace": -5}, InvalidScheduleError, "grace must not be negative"),
    ],
)
def test_bad_recurring_definitions_are_refused_and_nothing_is_written(
    app: App, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    spec: dict[str, object] = {"cron": "0 9 * * *", "type": "record", **kwargs}
    with pytest.raises(error, match=message):
        app.recurring("bad", **spec)  # type: ignore[arg-type]
    assert app.get_recurring("bad") is None


def test_recurring_from_the_shell(app: App, database_url: str, redis_url: str) -> None:
    env = {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "duejobs", "recurring", *args],
            env=env,
            capture_output=True,
            text=True,
        )

    made = run(
        "set",
        "digest",
        "--cron",
        "0 9 * * MON-FRI",
        "--type",
        "record",
        "--tz",
        "America/Sao_Paulo",
        "--tenant",
        "acme",
        "--misfire",
        "skip",
    )
    assert made.returncode == 0, made.stderr
    data = json.loads(made.stdout)
    assert data["misfire"] == "skip" and data["timezone"] == "America/Sao_Paulo"
    assert json.loads(run("pause", "digest", "--tenant", "acme").stdout)["status"] == "paused"
    assert json.loads(run("resume", "digest", "--tenant", "acme").stdout)["status"] == "active"
    assert run("show", "digest").returncode == 1  # the default tenant has none
    bad = run("set", "x", "--cron", "nope", "--type", "record")
    assert bad.returncode == 2 and "not a valid cron" in bad.stderr
    assert run("delete", "digest", "--tenant", "acme").returncode == 0
    assert run("delete", "digest", "--tenant", "acme").returncode == 1


# -- definitions that cannot break the scheduler ---------------------------------------------


def _break_zone(app: App, name: str) -> None:
    """A zone the App's host knew and the scheduler's host's tzdata lacks."""
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE recurring_schedules SET timezone = 'Mars/Olympus' WHERE name = :n"),
            {"n": name},
        )


def test_a_definition_that_fails_at_run_time_is_quarantined_and_the_pass_goes_on(
    system: System,
) -> None:
    app = system.app
    app.recurring("broken", cron="* * * * *", type="record")
    app.recurring("fine", cron="* * * * *", type="record")
    _break_zone(app, "broken")
    one_off = app.schedule("record", {}, delay=0)
    before = sample("duejobs_recurring_quarantined_total", tenant="default")
    result = system.scheduler_pass()  # raised ZoneInfoNotFoundError before, every pass
    assert result.claimed >= 1
    broken, fine = app.get_recurring("broken"), app.get_recurring("fine")
    assert broken is not None and broken.status == "error"
    assert broken.last_error is not None and "Mars/Olympus" in broken.last_error
    assert fine is not None and fine.status == "active"
    assert [e.kind.value for e in app.history(broken.id)] == ["quarantined"]
    assert sample("duejobs_recurring_quarantined_total", tenant="default") == before + 1
    assert 14 <= len(_rows(app)) <= 16  # every occurrence is the fine one's
    system.work()
    assert system.status(one_off.id) == "succeeded"
    # Set aside, not retried every pass: another pass quarantines nothing again (it may
    # claim the fine definition's next occurrence, come into the window meanwhile).
    system.scheduler_pass()
    assert sample("duejobs_recurring_quarantined_total", tenant="default") == before + 1
    assert [e.kind.value for e in app.history(broken.id)] == ["quarantined"]


def test_a_quarantined_definition_is_active_again_once_it_is_fixed(app: App) -> None:
    app.recurring("broken", cron="* * * * *", type="record")
    _break_zone(app, "broken")
    assert materialize_once(app.engine, WINDOW).quarantined == 1
    fixed = app.update_recurring("broken", timezone="Europe/Lisbon")
    assert (fixed.status, fixed.last_error, fixed.version) == ("active", None, 2)
    assert materialize_once(app.engine, WINDOW).created >= 14


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("*/5 * * * * 10", "seconds field comes first in Quartz"),
        ("0 */5 * * * *", "seconds field comes first in Quartz"),
        ("R 9 * * *", "random or hashed"),
        ("0 9 ? * *", "write \\* instead"),
        ("0 9 * * 1#2", "differs between dialects"),
        ("0 9 15W * *", "differs between dialects"),
        ("@reboot", "unknown nickname"),
        ("0 0 30 2 *", "cannot be evaluated"),
        ("0 9 * *", "has 4 fields"),
    ],
)
def test_cron_that_dialects_read_differently_or_that_never_fires_is_refused(
    app: App, cron: str, message: str
) -> None:
    with pytest.raises(InvalidCronError, match=message):
        app.recurring("bad", cron=cron, type="record")
    assert app.get_recurring("bad") is None


@pytest.mark.parametrize(
    "cron", ["0 9 L * *", "@daily", "@HOURLY", "0 9 * jan-mar mon-fri", "0 9 * * 7", "*/15 * * * *"]
)
def test_standard_cron_and_its_nicknames_are_accepted(app: App, cron: str) -> None:
    assert app.recurring("ok", cron=cron, type="record").status == "active"


def test_occurrences_count_against_the_tenants_live_quota(app: App) -> None:
    app.set_quota("acme", max_live=3)
    acme = app.tenant("acme")
    acme.schedule("record", {}, delay=timedelta(hours=1))
    acme.recurring("tick", cron="* * * * *", type="record")
    result = materialize_once(app.engine, WINDOW)
    assert (result.created, result.refused >= 12) == (2, True)
    assert len(_rows(app)) == 2


def test_recurring_again_with_a_payload_postgres_normalizes_changes_nothing(app: App) -> None:
    payload = {"threshold": 1e20, "ratio": 0.5, "nested": {"b": [1, 2.0], "a": None}}
    first = app.recurring("tick", cron="* * * * *", type="record", payload=payload)
    materialize_once(app.engine, WINDOW)
    again = app.recurring("tick", cron="* * * * *", type="record", payload=payload)
    assert (again.version, again.id) == (1, first.id)
    assert {status for _, status, _ in _rows(app)} == {"scheduled"}  # nothing superseded


def test_the_same_new_definition_made_by_many_processes_at_once_is_made_once(app: App) -> None:
    barrier = threading.Barrier(8)
    made: list[object] = []
    errors: list[BaseException] = []

    def boot() -> None:  # every replica of a service registers its definitions at start
        barrier.wait()
        try:
            made.append(app.recurring("boot", cron="0 9 * * *", type="record"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=boot) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert {(r.id, r.version) for r in made} == {(made[0].id, 1)}  # type: ignore[attr-defined]


def test_two_updates_at_once_each_keep_the_others_change(app: App) -> None:
    app.recurring("digest", cron="0 8 * * *", type="record", payload={"v": 1})
    done: list[object] = []
    with app.engine.connect() as other:  # a concurrent update, holding the definition's lock
        other.execute(text("SELECT 1 FROM recurring_schedules WHERE name = 'digest' FOR UPDATE"))
        updater = threading.Thread(
            target=lambda: done.append(app.update_recurring("digest", payload={"v": 2}))
        )
        updater.start()
        deadline = time.monotonic() + 20
        while not _waits_for_a_lock(app):
            assert updater.is_alive() and time.monotonic() < deadline, done
            time.sleep(0.01)
        other.execute(
            text("UPDATE recurring_schedules SET cron = '0 9 * * *' WHERE name = 'digest'")
        )
        other.commit()
        updater.join(20)
    stored = app.get_recurring("digest")
    assert stored is not None and (stored.cron, stored.payload) == ("0 9 * * *", {"v": 2})


def _waits_for_a_lock(app: App) -> bool:
    with app.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_a_tenant_whose_quota_lock_is_held_waits_and_the_others_go_on(app: App) -> None:
    """An application's transaction holding a tenant's quota lock (``schedule_many`` on its
    own connection, left open) holds back that tenant's occurrences for the next pass, not
    everyone's: seen failing with the lock waited for without bound (the pass, and every
    tenant's occurrences, held until the application committed)."""
    app.set_quota("acme", max_live=100)
    app.recurring("digest", cron="* * * * *", type="record", tenant="acme")
    app.recurring("digest", cron="* * * * *", type="record", tenant="globex")
    holder = app.engine.connect()
    holder.begin()
    store.count_live_up_to(holder, "acme", 100)  # the tenant's lock, held to the commit
    passes: list[MaterializeResult] = []
    thread = threading.Thread(target=lambda: passes.append(materialize_once(app.engine, WINDOW)))
    thread.start()
    try:
        thread.join(20)
        assert not thread.is_alive(), "the pass waited for the lock without bound"
    finally:
        holder.rollback()
        holder.close()
        thread.join()
    assert passes[0].waiting == 1 and passes[0].created >= 14
    assert _rows(app, "tenant = 'acme'") == []
    assert materialize_once(app.engine, WINDOW).created >= 14  # acme's, on the next pass
    assert len(_rows(app, "tenant = 'acme'")) >= 14


def test_the_recurring_loop_says_when_it_last_finished_a_pass(system: System) -> None:
    """``duejobs_recurring_last_pass_timestamp_seconds``: what an alert on a stalled loop
    reads (a pass that raised leaves it where it was)."""
    before = time.time()
    system.scheduler.recurring.run_once()
    assert sample("duejobs_recurring_last_pass_timestamp_seconds") >= before


def test_a_full_batch_of_definitions_is_followed_by_the_next_pass_at_once(app: App) -> None:
    """A backlog after downtime is caught up without waiting a poll interval per batch."""
    loop = Materializer(app, WINDOW, timedelta(seconds=1), timedelta(seconds=5))
    full, short = MaterializeResult(definitions=BATCH), MaterializeResult(definitions=BATCH - 1)
    assert (loop._pause(full), loop._pause(short)) == (timedelta(0), timedelta(seconds=1))
