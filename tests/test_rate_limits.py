"""Rate limits: at most N starts a period for a queue or a tenant, over every worker slot and
scheduler, counted by the database clock; a start turned back uses no attempt and waits for
a slot of its own. Each test was seen failing against the grant broken on purpose (named in
its docstring)."""

from __future__ import annotations

import itertools
import re
import threading
import time
from datetime import datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text
from starlette.testclient import TestClient

from duejobs import App, store
from duejobs.dashboard import Access, create_dashboard
from duejobs.errors import InvalidRateError
from duejobs.models import Delivery, Schedule
from duejobs.rates import Rate, parse_rate
from duejobs.services.pruner import Pruner
from duejobs.services.stats import collect, observe_stats, render
from duejobs.store import RunClaim, SkipReason
from tests.support import wait_for
from tests.support.cli import run_cli
from tests.support.dashboard import auth
from tests.support.rates import most_in_a_window, running, starts, succeeded
from tests.support.slots import count_rows
from tests.support.system import System

BAD_RATES = ["fast", "0/s", "-3/s", "1.5/s", "10/week", "", "5/ s", "5/S"]


@pytest.mark.parametrize("rate", BAD_RATES)
def test_a_bad_rate_is_refused_naming_it_and_nothing_is_written(app: App, rate: str) -> None:
    with pytest.raises(InvalidRateError, match=repr(rate).replace(".", r"\.")):
        app.set_rate_limit("duejobs", rate)
    with pytest.raises(InvalidRateError, match="max_rate"):
        app.set_quota("acme", max_rate=rate)
    with pytest.raises(InvalidRateError):
        app.set_quota("acme", max_live=3, max_rate=rate)  # the valid cap is not written either
    assert app.rate_limits() == [] and app.quotas() == []


def test_limits_are_set_listed_and_cleared(app: App) -> None:
    app.set_rate_limit("sms", "10/s")
    app.set_quota("*", max_rate="60/m")
    app.set_quota("acme", max_rate="1/h", max_inflight=4)
    listed = [(r.scope, r.name, str(r.rate)) for r in app.rate_limits()]
    assert listed == [("queue", "sms", "10/s"), ("tenant", "*", "60/m"), ("tenant", "acme", "1/h")]
    assert [(q.tenant, q.max_inflight, q.max_rate) for q in app.quotas()] == [
        ("*", None, Rate(60, timedelta(minutes=1))),
        ("acme", 4, Rate(1, timedelta(hours=1))),
    ]
    app.set_rate_limit("sms", None)
    app.set_quota("acme", max_rate=None)
    assert [(r.scope, r.name) for r in app.rate_limits()] == [("tenant", "*")]


def _turned_back(app: App) -> int:
    return count_rows(
        app,
        "SELECT count(*) FROM scheduled_job_events "
        "WHERE kind = 'requeued' AND detail ->> 'reason' = 'rate_limited'",
    )


def test_starts_from_a_limited_queue_never_pass_the_limit_in_any_window(
    system: System,
) -> None:
    """50 jobs of five tenants due at once on a queue limited to 20/s, drained by 16 slots:
    in any second at most 21 start (the limit and its one start of tolerance), each schedule
    once, and no attempt is used by a start turned back. Seen failing with the grant letting
    every start through (50 in one second)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "20/s")
    ids = [app.schedule("record", {}, delay=0, tenant=f"t{i % 5}").id for i in range(50)]
    with running(system, 16):
        wait_for(lambda: succeeded(app) == 50, 30, "the limited queue drained")
    assert most_in_a_window(starts(app), timedelta(seconds=1)) <= 21
    assert len(starts(app)) == 50 == len(system.effects())
    assert _turned_back(app) > 0  # the limit was met, not merely not reached
    assert all(app.get(i).attempts == 1 for i in ids)  # type: ignore[union-attr]


def test_a_limit_holds_over_two_workers_and_two_schedulers(system: System) -> None:
    """Two workers of 8 slots and two schedulers share one count. Seen failing with each
    statement's grant counted from nothing (every batch granted its first two starts)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "10/s")
    for _ in range(30):
        app.schedule("record", {}, delay=0)
    with running(system, 8, 8, schedulers=2):
        wait_for(lambda: succeeded(app) == 30, 30, "the limited queue drained")
    assert most_in_a_window(starts(app), timedelta(seconds=1)) <= 11
    assert len(system.effects()) == 30


def test_under_the_default_each_tenant_has_a_count_of_its_own(system: System) -> None:
    """The default ``"*"`` limits each tenant on its own; a tenant's own limit replaces it.
    Seen failing with the tenants' limit keyed on the default (one count for all)."""
    app = system.app
    app.set_quota("*", max_rate="10/s")
    app.set_quota("big", max_rate="20/s")
    for tenant, n in (("a", 15), ("b", 15), ("big", 30)):
        for _ in range(n):
            app.schedule("record", {}, delay=0, tenant=tenant)
    with running(system, 16):
        wait_for(lambda: succeeded(app) == 60, 30, "every tenant drained")
    second = timedelta(seconds=1)
    assert most_in_a_window(starts(app, "a"), second) <= 11
    assert most_in_a_window(starts(app, "b"), second) <= 11
    assert most_in_a_window(starts(app, "big"), second) <= 21
    # Each on its own count: together the two under the default went past its limit.
    assert most_in_a_window(sorted(starts(app, "a") + starts(app, "b")), second) > 11


def test_retries_count_as_starts_under_a_limit(system: System) -> None:
    """Every attempt starts under the limit, a retry's too. Seen failing with the grant
    asked for first attempts only."""
    app = system.app
    app.set_rate_limit(app.core.queue, "10/s")
    for _ in range(12):
        app.schedule("flaky", {"fail_times": 1}, delay=0)
    with running(system, 16):
        wait_for(lambda: succeeded(app) == 12, 30, "every retry succeeded")
    assert len(starts(app)) == 24
    assert most_in_a_window(starts(app), timedelta(seconds=1)) <= 11


def test_an_idle_tenants_count_is_pruned_and_the_limits_set_stay(system: System) -> None:
    """A tenant under the default gets a count of its own at its first start; the pruner
    removes it once idle (its next start makes it again), never a limit set. Seen failing
    with the pruner leaving the counts."""
    app = system.app
    app.set_quota("*", max_rate="100/s")
    app.set_rate_limit("sms", "5/s")
    app.schedule("record", {}, delay=0, tenant="acme")
    system.run_until(lambda: succeeded(app) == 1)
    rows = "SELECT count(*) FROM rate_limits WHERE scope = 'tenant' AND name = 'acme'"
    assert count_rows(app, rows) == 1
    Pruner(app).run_once()
    assert count_rows(app, rows) == 1  # it started just now
    with app.engine.begin() as conn:  # as the pruner finds it ten minutes on
        conn.execute(
            text(
                "UPDATE rate_limits SET started_until = started_until - interval '11 minutes', "
                "paced_until = paced_until - interval '11 minutes', "
                "window_start = window_start - interval '11 minutes' WHERE name = 'acme'"
            )
        )
    Pruner(app).run_once()
    assert count_rows(app, rows) == 0
    assert [(r.scope, r.name) for r in app.rate_limits()] == [("queue", "sms"), ("tenant", "*")]


def test_rate_limits_from_the_shell_and_a_bad_rate_exits_2_writing_nothing(
    app: App, database_url: str, redis_url: str
) -> None:
    """``duejobs rate-limit QUEUE RATE|none`` and ``duejobs quota TENANT --max-rate``; a bad
    rate is named and exits 2. About 6 s (slower than 5 s: six runs of the command line, each
    a Python process of its own). Seen failing with a bad rate said as a failure of the
    system (exit status 1), not of the input."""
    env = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    for args in (("rate-limit", "sms", "10/week"), ("quota", "acme", "--max-rate", "0/s")):
        bad = run_cli(*args, **env)
        assert bad.returncode == 2 and repr(args[-1]) in bad.stderr, bad.stderr
    assert app.rate_limits() == []
    assert run_cli("rate-limit", "sms", "10/s", **env).returncode == 0
    assert run_cli("quota", "acme", "--max-rate", "60/m", **env).returncode == 0
    listing = run_cli("rate-limit", **env)
    assert listing.stdout.splitlines() == [
        "queue sms: 10/s (0 starts over the last period; last grant 0 of 0)",
        "tenant acme: 60/m (0 starts over the last period; last grant 0 of 0)",
    ]
    cleared = run_cli("rate-limit", "sms", "none", **env)
    assert cleared.returncode == 0 and [r.name for r in app.rate_limits()] == ["acme"]


def test_the_interval_between_starts_is_rounded_up_so_no_window_holds_more() -> None:
    """``3/s`` is a start every 333,334 µs: rounded down (333,333), four grants after the
    first two would fall within one second, five in all. Seen failing with the interval a
    timedelta's division gives (333,333 µs)."""
    assert Rate(3, timedelta(seconds=1)).every == timedelta(microseconds=333_334)
    assert Rate(7_000_000, timedelta(hours=1)).every == timedelta(microseconds=515)
    assert Rate(200, timedelta(seconds=1)).every == timedelta(milliseconds=5)


@pytest.mark.parametrize(
    ("count", "period"),
    [(0, timedelta(seconds=1)), (5, timedelta(days=1)), (10**9, timedelta(seconds=1))],
)
def test_a_rate_made_by_hand_is_checked_too(count: int, period: timedelta) -> None:
    with pytest.raises(InvalidRateError):
        Rate(count, period)


def test_a_retry_is_not_expired_by_its_first_attempts_turn_back(system: System) -> None:
    """A schedule's expiry counts from the due time before a put-back of *that* attempt: a
    first attempt turned back two hours ago does not make the retry due now expire. Seen
    failing with the put-backs of every attempt of the version counted (it was cancelled as
    expired)."""
    app = system.app
    s = app.schedule("record", {}, delay=0, expires_after=timedelta(hours=1))
    with app.engine.begin() as conn:  # attempt 1 was turned back, then ran and failed
        conn.execute(text("UPDATE scheduled_jobs SET attempts = 1 WHERE id = :id"), {"id": s.id})
        conn.execute(
            text(
                "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail) "
                "VALUES (:id, :tenant, 'requeued', 1, jsonb_build_object('reason', "
                "'rate_limited', 'attempt', 1, 'moved_from', now() - interval '2 hours'))"
            ),
            {"id": s.id, "tenant": s.tenant},
        )
    system.run_until(lambda: system.status(s.id) != "scheduled")
    assert system.status(s.id) == "succeeded"


def test_a_limits_row_held_elsewhere_holds_up_no_unlimited_start(system: System) -> None:
    """A transaction that holds a rate limit's row (an operator's, say) keeps the limited
    delivery waiting, put back each ``claim_lock_timeout``, never the unlimited one claimed
    beside it, and the limited one runs once the row is let go. Seen failing with the
    claim's wait for that row unbounded (the unlimited job waited for the release)."""
    app = system.app
    app.set_quota("acme", max_rate="100/s")
    limited = app.schedule("record", {}, delay=0, tenant="acme")
    free = app.schedule("record", {}, delay=0)
    with app.engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM rate_limits WHERE name = 'acme' FOR UPDATE"))
        with running(system, 2, claim_lock_timeout=timedelta(milliseconds=200)):
            try:
                wait_for(lambda: system.status(free.id) == "succeeded", 10, "the unlimited start")
                assert system.status(limited.id) == "scheduled"
            finally:  # let go before the worker stops, whatever happened
                holder.rollback()
            wait_for(lambda: system.status(limited.id) == "succeeded", 20, "the limited start")
    assert app.get(limited.id).attempts == 1  # type: ignore[union-attr]


def test_rows_waiting_on_a_limit_are_counted_in_stats_and_metrics(system: System) -> None:
    """Rows waiting on a limit are not overdue: ``duejobs stats``, its JSON and the gauges
    count them per queue and per tenant, with the longest wait since their due time, and the
    gauges let them go once none waits. Seen failing with the put-backs of another attempt
    looked for (none counted: the rows showed nowhere) and with the rows waiting in the table
    left out (0 counted, 4 overdue)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "1/m")
    ids = [app.schedule("record", {}, delay=0, tenant=t).id for t in ("a", "a", "b", "b", "b")]
    system.run_until(lambda: succeeded(app) == 1)  # the next start is a minute away
    stats = collect(app)
    overall = [w for w in stats.waiting_on_limits if w.queue is None and w.tenant is None]
    assert [w.waiting for w in overall] == [4] and stats.overall.overdue == 0
    by = {(w.queue, w.tenant): w.waiting for w in stats.waiting_on_limits}
    assert by[app.core.queue, None] == 4 and by[None, "a"] + by[None, "b"] == 4
    assert stats.oldest_wait_on_a_limit_seconds > 0
    assert "waiting on a rate limit      4" in render(stats)
    assert stats.as_dict()["waiting_on_limits"][0]["waiting"] == 4
    observe_stats(stats)
    waiting = "duejobs_rate_limit_waiting"
    assert REGISTRY.get_sample_value(waiting, {"scope": "queue", "name": app.core.queue}) == 4
    for schedule_id in ids:
        app.cancel(schedule_id)
    observe_stats(collect(app))
    assert REGISTRY.get_sample_value(waiting, {"scope": "all", "name": "all"}) == 0
    assert REGISTRY.get_sample_value(waiting, {"scope": "queue", "name": app.core.queue}) is None


def test_a_limit_changed_cleared_and_set_again_mid_run_holds_while_in_force(
    system: System,
) -> None:
    """20/s, lowered to 5/s, cleared, then set again to 10/s for new work, while 16 slots
    drain: every window of starts that lies within one setting keeps to it, and every
    schedule runs once. About 8 s (slower than 5 s: each setting paces its share of the
    work, and the starts a limit turned back keep the times it gave them). Seen failing with
    a change to a limit already set ignored (7 starts in the lowered limit's second)."""
    app, queue, second = system.app, system.app.core.queue, timedelta(seconds=1)
    app.set_rate_limit(queue, "20/s")
    for _ in range(45):
        app.schedule("record", {}, delay=0)
    with running(system, 16):
        wait_for(lambda: succeeded(app) >= 20, 20, "20 starts at 20/s")
        at_20 = app.now()  # the starts before it were all granted at 20/s
        app.set_rate_limit(queue, "5/s")
        lowered = app.now()  # read once the change committed: what starts later sees it
        wait_for(lambda: succeeded(app) >= 27, 20, "27 starts")
        cleared = app.now()  # before: a start from here on may be unlimited
        app.set_rate_limit(queue, None)
        wait_for(lambda: succeeded(app) == 45, 20, "the first 45, once cleared")
        app.set_rate_limit(queue, "10/s")
        again = app.now()
        for _ in range(12):
            app.schedule("record", {}, delay=0)
        wait_for(lambda: succeeded(app) == 57, 20, "12 more at 10/s")
    times = starts(app)

    def between(start: datetime, end: datetime | None = None) -> list[datetime]:
        return [t for t in times if start <= t and (end is None or t < end)]

    assert most_in_a_window(between(times[0], at_20), second) <= 21
    assert most_in_a_window(between(lowered, cleared), second) <= 6
    assert most_in_a_window(between(again), second) <= 11
    assert len(times) == 57 == len(system.effects())


def test_each_limits_use_over_the_last_period_shows_in_stats_metrics_and_the_dashboard(
    system: System,
) -> None:
    """The starts over the last period against N, for a queue's limit and for each tenant
    that follows the default (the default itself: each tenant its own): in ``duejobs stats``,
    its JSON, the gauges and the dashboard's overview. Seen failing with the claim counting
    no start into the window (0 of 1)."""
    app, queue = system.app, system.app.core.queue
    app.set_rate_limit(queue, "2/m")
    app.set_quota("*", max_rate="30/m")
    for tenant in ("a", "a", "b", "b", "b"):
        app.schedule("record", {}, delay=0, tenant=tenant)
    system.run_until(lambda: succeeded(app) == 1)  # the next start is 30 s away
    stats = collect(app)
    assert stats.rate_limits is not None
    use = {(r.scope, r.name, r.follows_default): r.recent_starts for r in stats.rate_limits}
    assert use.pop(("queue", queue, False)) == 1 and use.pop(("tenant", "*", False)) is None
    assert sum(n or 0 for n in use.values()) == 1 and {name for _, name, _ in use} <= {"a", "b"}
    assert f"queue {queue}: at most 2/m, 1 of 2 (50%)" in render(stats)
    assert {"scope": "queue", "name": queue, "use": 0.5} == {
        k: v for k, v in stats.as_dict()["rate_limits"][0].items() if k in ("scope", "name", "use")
    }
    observe_stats(stats)
    ratio = "duejobs_rate_limit_use_ratio"
    assert REGISTRY.get_sample_value(ratio, {"scope": "queue", "name": queue}) == 0.5
    tenants = [REGISTRY.get_sample_value(ratio, {"scope": "tenant", "name": t}) for t in "ab"]
    assert sum(v or 0 for v in tenants) == 1 / 30
    board = create_dashboard(app, Access(user="ops", password="s3cret"))
    with TestClient(board, headers=auth()) as client:
        page = client.get("/").text
    shown = re.sub(r">\s+<", "><", page[page.index('id="rate-limit-use"') :])
    assert f"<td>{queue}</td><td>2/m</td><td>1 (50%)</td><td>4</td>" in shown
    assert "each tenant its own" in shown
    assert "4 rows waiting on a rate limit" in page
    mine = collect(app.tenant("a")).rate_limits  # a tenant sees its own count, nothing else
    assert mine is not None and [(r.scope, r.name) for r in mine] == [("tenant", "a")]


@pytest.mark.parametrize(
    ("started_ago", "window_starts", "previous_starts", "recent"),
    [(15, 4, 8, 10), (90, 10, 3, 5), (180, 10, 3, 0)],
)
def test_a_limits_use_weighs_the_window_before_by_what_the_period_still_covers(
    app: App, started_ago: int, window_starts: int, previous_starts: int, recent: int
) -> None:
    """60/m, its current window begun ``started_ago`` seconds ago: the starts over the last
    minute are the current window's plus the share of the one before that the minute still
    covers (a quarter of 8 gone: 4 + 6); a window ended half a period ago counts for half;
    one ended more than a period ago, for nothing. Seen failing with the window before
    counted whole (4 + 8)."""
    app.set_rate_limit("sms", "60/m")
    with app.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE rate_limits SET window_start = statement_timestamp() - :ago, "
                "window_starts = :now, previous_starts = :before WHERE name = 'sms'"
            ),
            {
                "ago": timedelta(seconds=started_ago),
                "now": window_starts,
                "before": previous_starts,
            },
        )
    [sms] = app.rate_limits()
    assert (sms.recent_starts, sms.use) == (recent, recent / 60)


@pytest.mark.parametrize(("started_ago", "previous"), [(70, 7), (200, 0)])
def test_a_claim_counts_its_starts_into_the_window_of_one_period_it_falls_in(
    system: System, started_ago: int, previous: int
) -> None:
    """A start 70 s into a 60/m count's window begins the next window (the one before
    keeping its 7 starts); one more than two periods on, a new window with nothing before.
    Seen failing with every start counted into the window the count began with."""
    app = system.app
    app.set_rate_limit(app.core.queue, "60/m")
    with app.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE rate_limits SET window_start = statement_timestamp() - :ago, "
                "window_starts = 7"
            ),
            {"ago": timedelta(seconds=started_ago)},
        )
    app.schedule("record", {}, delay=0)
    system.run_until(lambda: succeeded(app) == 1)
    with app.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT window_starts, previous_starts, "
                "extract(epoch FROM statement_timestamp() - window_start) AS age "
                "FROM rate_limits"
            )
        ).one()
    assert (row.window_starts, row.previous_starts) == (1, previous)
    begun = started_ago - 60 if previous else 0  # one period on, or at the start itself
    assert begun <= row.age < begun + 30


def test_a_start_whose_time_is_milliseconds_away_waits_in_its_slot_not_in_redis(
    system: System,
) -> None:
    """At 50/s, four starts asked at once: two are granted, and the two turned back, given
    times 20 and 40 ms on, wait for them in their slots and start then — none goes back to
    RQ's scheduled registry, whose trip would miss the limit's pace. Seen failing with every
    start turned back put back in Redis (two deferred)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "50/s")
    deferred = deferrals()
    for _ in range(4):
        app.schedule("record", {}, delay=0)
    with running(system, 4):
        wait_for(lambda: succeeded(app) == 4, 20, "four starts")
    assert deferrals() == deferred
    first, _, third, fourth = starts(app)
    assert third - first >= timedelta(milliseconds=20)  # each at the time the grant gave
    assert fourth - first >= timedelta(milliseconds=40)


def deferrals() -> float:
    """The starts rate limits put back in Redis, so far, over every tenant."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "duejobs_rate_limited_deliveries"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def test_a_limit_set_again_as_it_is_keeps_its_count_and_a_changed_one_starts_again(
    system: System,
) -> None:
    """A limit applied again unchanged (a deploy's configuration, say) leaves its count — a
    count started again would grant its start of tolerance at once, over and over —, and so
    does the default's, for each tenant's count under it; a changed limit starts its count
    again. Seen failing with every set starting the counts again (the next start's time
    gone)."""
    app, queue = system.app, system.app.core.queue
    app.set_rate_limit(queue, "1/m")
    app.set_quota("*", max_rate="1/m")
    app.schedule("record", {}, delay=0, tenant="acme")
    system.run_until(lambda: succeeded(app) == 1)

    def counts() -> dict[tuple[str, str], datetime | None]:
        return {(r.scope, r.name): r.next_start for r in system.app.rate_limits()} | {
            ("follower", r.name): r.next_start
            for r in collect(system.app).rate_limits or []
            if r.follows_default
        }

    before = counts()
    assert before[("queue", queue)] is not None and before[("follower", "acme")] is not None
    app.set_rate_limit(queue, "1/m")
    app.set_quota("*", max_rate="1/m")
    assert counts() == before
    app.set_rate_limit(queue, "2/m")
    app.set_quota("*", max_rate="2/m")
    after = counts()
    assert after[("queue", queue)] is None and after.get(("follower", "acme")) is None


def test_an_hourly_defaults_count_is_kept_while_its_starts_count_in_its_use(
    system: System,
) -> None:
    """Under a default of 10/h, a tenant's count idle for ten minutes still holds starts of
    the last hour: the pruner keeps it (its use would read 0 otherwise); once its window is
    two periods old, it goes. Seen failing with the counts pruned after ten minutes idle,
    whatever their period."""
    app = system.app
    app.set_quota("*", max_rate="10/h")
    app.schedule("record", {}, delay=0, tenant="acme")
    system.run_until(lambda: succeeded(app) == 1)
    rows = "SELECT count(*) FROM rate_limits WHERE name = 'acme'"

    def age(column: str, by: str) -> None:
        with app.engine.begin() as conn:
            conn.execute(
                text(
                    f"UPDATE rate_limits SET {column} = {column} - interval '{by}' "
                    "WHERE name = 'acme'"
                )
            )

    age("started_until", "20 minutes")  # its next start (6 min on) ten minutes past
    age("paced_until", "20 minutes")  # by the scheduler's pace too
    Pruner(app).run_once()
    assert count_rows(app, rows) == 1
    age("window_start", "121 minutes")
    Pruner(app).run_once()
    assert count_rows(app, rows) == 0


def test_the_overview_lists_the_busiest_tenants_under_the_default_a_page_at_most(
    app: App,
) -> None:
    """Forty tenants counting under the default: the overview lists the limits set, then the
    busiest tenants, 25 rows in all, and says how many it left out. Seen failing with every
    tenant listed."""
    app.set_quota("*", max_rate="100/m")
    with app.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO rate_limits (scope, name, every, window_start, window_starts) "
                "SELECT 'tenant', 't' || lpad(CAST(i AS text), 2, '0'), interval '600 ms', "
                "statement_timestamp(), i FROM generate_series(1, 40) AS i"
            )
        )
    board = create_dashboard(app, Access(user="ops", password="s3cret"))
    with TestClient(board, headers=auth()) as client:
        page = client.get("/").text
    table = page[
        page.index('id="rate-limit-use"') : page.index(
            "</table>", page.index('id="rate-limit-use"')
        )
    ]
    assert table.count("<tr>") == 1 + 25  # the header, the default, the 24 busiest
    assert "<td>t40 (default)</td>" in table and "<td>t17 (default)</td>" in table
    assert "t16" not in table and "and 16 more tenants under the default" in page


def _claim(app: App, rows: list[Schedule], hold: timedelta) -> list[RunClaim | None]:
    """The rows' first deliveries claimed in one statement, as a worker's batch is."""
    with app.engine.begin() as conn:
        return store.claim_runs(
            conn,
            [Delivery(r.id, r.tenant, r.version, 1, r.queue) for r in rows],
            worker="test",
            lease=timedelta(minutes=1),
            types=["record"],
            claim="batch",
            hold=hold,
        )


def test_a_batch_under_its_queues_limit_and_its_tenants_starts_each_at_the_latest_they_give(
    system: System,
) -> None:
    """Six rows due a moment ago, one of each of six tenants limited to 100/s, on a queue
    limited to 200/s: the queue's pace gives them now, now (its start of tolerance), then 5,
    10, 15 and 20 ms on, each tenant's own now — each starts at the later, all within the
    worker's wait, none turned back. Seen failing with a row whose limits gave different times
    turned back (the last four)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "200/s")
    for i in range(6):
        app.set_quota(f"t{i}", max_rate="100/s")
    rows = [app.schedule("record", {}, delay=0, tenant=f"t{i}") for i in range(6)]
    claims = _claim(app, rows, timedelta(milliseconds=50))
    assert all(c is not None and c.skip is None for c in claims), claims
    times = sorted(c.started_at for c in claims if c is not None and c.started_at)
    gaps = [round((b - a).total_seconds() * 1000, 3) for a, b in itertools.pairwise(times)]
    assert gaps == [0, 5, 5, 5, 5]


def test_a_start_under_a_limit_is_never_granted_past_its_expiry(system: System) -> None:
    """At 1/s four rows due now start now, now (the start of tolerance), 1 s and 2 s on: the
    third, which expires 1.5 s after its due time, is granted its start; the fourth, expiring
    as soon, is turned back rather than started past its expiry. Seen failing with the grant
    checking the expiry at the statement's clock only (the fourth granted 2 s on)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "1/s")
    rows = [
        app.schedule("record", {}, delay=0, expires_after=timedelta(seconds=1.5)) for _ in range(4)
    ]
    claims = _claim(app, rows, timedelta(seconds=5))
    assert [c.skip if c else None for c in claims] == [None, None, None, SkipReason.RATE_LIMITED]
    third = claims[2]
    assert third is not None and third.started_at is not None
    assert third.started_at <= rows[2].due_at + timedelta(seconds=1.5)


def test_a_start_granted_for_its_slot_just_ahead_is_claimed_at_once_and_waited_for(
    system: System,
) -> None:
    """A row under a limit whose slot is within the claim's wait is claimed in the same
    statement for that slot — its attempt started then, the worker waiting for it — rather
    than left for a second claim at its time: so a fast limit's jobs, sent together a little
    ahead of their slots, cost one statement for the group. Seen failing with the grant
    claiming only rows due by the statement's clock (no claim)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "50/s")
    row = app.schedule("record", {}, run_at=app.now() + timedelta(seconds=2))
    (claim,) = _claim(app, [row], timedelta(seconds=5))
    answered = time.monotonic()
    assert claim is not None and claim.skip is None
    assert claim.db_now is not None and claim.started_at == row.due_at > claim.db_now
    ahead = (claim.started_at - claim.db_now).total_seconds()
    assert answered < claim.not_before <= answered + ahead  # waited for from its answer
    with app.engine.connect() as conn:
        started = conn.execute(
            text("SELECT started_at FROM scheduled_job_attempts WHERE schedule_id = :id"),
            {"id": row.id},
        ).scalar_one()
    assert started == row.due_at  # the start the limit counts is the slot's


def test_a_limit_changed_while_a_grant_waits_for_its_row_keeps_its_new_pace(
    system: System,
) -> None:
    """A queue's 1/s limit raised to 100/s in a transaction that holds its row while a
    worker's grant waits for it: the grant, once the change commits, counts its start at
    the new pace and leaves the new interval in place. Seen failing with the grant writing
    back the interval it read before its wait (1 s: the 100/s limit kept at 1/s's pace)."""
    app = system.app
    app.set_rate_limit(app.core.queue, "1/s")
    row = app.schedule("record", {}, delay=0)
    answers: list[RunClaim | None] = []
    grant = threading.Thread(target=lambda: answers.extend(_claim(app, [row], timedelta(0))))
    with app.engine.begin() as conn:
        store.set_rate_limit(conn, "queue", app.core.queue, parse_rate("100/s"))
        grant.start()
        wait_for(lambda: _grants_waiting(app) == 1, 10, "the grant waiting for the limit's row")
    grant.join(10)
    assert len(answers) == 1 and answers[0] is not None and answers[0].skip is None
    with app.engine.connect() as conn:
        limit = conn.execute(
            text(
                "SELECT every, started_until - (SELECT started_at FROM scheduled_job_attempts) "
                "AS ahead FROM rate_limits WHERE scope = 'queue'"
            )
        ).one()
    assert limit.every == limit.ahead == timedelta(milliseconds=10)


def _grants_waiting(app: App) -> int:
    """Statements of this database waiting for a lock (the grant: nothing else runs)."""
    return count_rows(
        app,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
    )
