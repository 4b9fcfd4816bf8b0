"""Fair claiming across tenants and per-tenant in-flight quotas.

Seen failing against the mutation run's survivor that dropped a capped tenant's jobs in
flight from the claim's walk → ``test_a_tenant_at_its_in_flight_quota_takes_no_share_of_a_batch``.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from duejobs import App, store
from duejobs.errors import InvalidScheduleError, TenantMismatchError
from duejobs.scheduler.claim import Claim, DueRow, claim_due, fair_shares
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.stats import collect, observe_stats, render
from tests.support.system import System

WINDOW = timedelta(minutes=15)


def due_rows(engine: Engine, tenant: str, n: int, *, seconds_ago: float = 60) -> None:
    """``n`` rows of ``tenant`` due ``seconds_ago`` (a little apart, oldest first)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
                "SELECT gen_random_uuid(), :tenant, 'record', '{}', t, t FROM ("
                "  SELECT statement_timestamp() - make_interval(secs => :ago) "
                "         + g * interval '1 ms' AS t FROM generate_series(1, :n) g) AS d"
            ),
            {"tenant": tenant, "n": n, "ago": seconds_ago},
        )


def running(engine: Engine, tenant: str, n: int) -> None:
    """``n`` of ``tenant``'s rows running, with a live lease (jobs in flight)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scheduled_jobs SET status = 'running', queue_job_id = 'x', "
                "lease_expires_at = now() + interval '1 minute' WHERE id IN "
                "(SELECT id FROM scheduled_jobs WHERE tenant = :tenant LIMIT :n)"
            ),
            {"tenant": tenant, "n": n},
        )


def claim(engine: Engine, limit: int, after: tuple[str, str] = ("", "")) -> Claim:
    with engine.begin() as conn:
        return claim_due(conn, WINDOW, limit, after)


def claims_at_once(app: App, n: int) -> list[list[DueRow]]:
    """``n`` claims of 100 in their own transactions, all holding their locks at once."""
    barrier = threading.Barrier(n)
    taken: list[list[DueRow]] = []

    def one() -> None:
        with app.engine.begin() as conn:
            taken.append(claim_due(conn, WINDOW, 100).rows)
            barrier.wait(timeout=10)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return taken


def queued_tenants(system: System) -> list[str]:
    """The tenant of each job on the RQ queue, in the order workers will take them."""
    ids = [i.decode() for i in system.redis.lrange(system.app.deliverer().queue.key, 0, -1)]
    return [i.split("-")[1] for i in ids]


def pushed(engine: Engine, tenant: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM scheduled_jobs WHERE tenant = :t "
                    "AND queue_job_id IS NOT NULL"
                ),
                {"t": tenant},
            ).scalar_one()
        )


# -- sharing a batch ---------------------------------------------------------------------------


def test_fair_shares_are_equal_and_what_one_tenant_does_not_need_goes_to_the_others() -> None:
    assert fair_shares(100, [20_000, 20]) == [80, 20]
    assert fair_shares(100, [500, 500]) == [50, 50]
    assert fair_shares(100, [500, 500, 500]) == [34, 33, 33]
    assert fair_shares(100, [0, 7, 500]) == [0, 7, 93]
    assert fair_shares(2, [5, 5, 5]) == [1, 1, 0]
    assert fair_shares(100, [3, 4]) == [3, 4]
    assert fair_shares(100, []) == []


@given(st.integers(0, 500), st.lists(st.integers(0, 300), max_size=40))
def test_fair_shares_fill_the_batch_without_giving_anyone_more_than_it_wants(
    limit: int, wants: list[int]
) -> None:
    shares = fair_shares(limit, wants)
    assert sum(shares) == min(limit, sum(wants))
    assert all(0 <= s <= w for s, w in zip(shares, wants, strict=True))
    # Max-min fair: a tenant that got less than it wanted got at least everyone else's share
    # minus the one place an uneven split can cost.
    for s, w in zip(shares, wants, strict=True):
        if s < w:
            assert all(s >= other - 1 for other in shares)


# -- fair claiming -----------------------------------------------------------------------------


def test_a_small_tenant_is_claimed_in_the_first_batch_despite_a_large_older_backlog(
    app: App,
) -> None:
    due_rows(app.engine, "big", 2_000, seconds_ago=120)  # older than every row of "small"
    due_rows(app.engine, "small", 20, seconds_ago=60)
    first = claim(app.engine, 100)
    by_tenant = Counter(r.tenant for r in first.rows)
    assert by_tenant == {"big": 80, "small": 20}
    # Pushed in turns: the two tenants alternate while both have rows left.
    assert [r.tenant for r in first.rows[:40]] == ["big", "small"] * 20
    # Within a tenant, oldest first.
    bigs = [r.due_at for r in first.rows if r.tenant == "big"]
    assert bigs == sorted(bigs)


def test_the_walk_resumes_after_the_last_tenant_when_tenants_outnumber_the_batch(
    app: App,
) -> None:
    tenants = [f"t{i}" for i in range(5)]
    for tenant in tenants:
        due_rows(app.engine, tenant, 10)
    first = claim(app.engine, 3)
    assert sorted({r.tenant for r in first.rows}) == ["t0", "t1", "t2"]
    assert first.cursor == ("t2", "duejobs")
    second = claim(app.engine, 3, after=first.cursor)
    assert Counter(r.tenant for r in second.rows) == {"t3": 2, "t4": 1}
    assert second.cursor == ("", "")  # the walk reached the end: the next one starts over
    third = claim(app.engine, 3, after=("t4", "duejobs"))  # nothing after: wraps to the first
    assert sorted({r.tenant for r in third.rows}) == ["t0", "t1", "t2"]


def test_rows_beyond_the_window_and_pushed_rows_are_not_claimed(app: App) -> None:
    due_rows(app.engine, "acme", 5)
    due_rows(app.engine, "acme", 5, seconds_ago=-3600)  # an hour ahead: outside the window
    assert len(claim(app.engine, 100).rows) == 5
    assert claim(app.engine, 100).rows == []


def test_concurrent_claims_take_different_rows(app: App) -> None:
    due_rows(app.engine, "acme", 150)
    due_rows(app.engine, "globex", 150)
    taken = claims_at_once(app, 3)
    ids = [r.schedule_id for rows in taken for r in rows]
    assert len(ids) == len(set(ids)) == 300


def test_the_scheduler_pushes_a_small_tenant_ahead_of_a_large_backlog(system: System) -> None:
    due_rows(system.app.engine, "big", 500, seconds_ago=120)
    due_rows(system.app.engine, "small", 5, seconds_ago=60)
    scheduler = Scheduler(system.app, SchedulerConfig(concurrency=1))
    scheduler.run_once()
    scheduler.close()
    order = queued_tenants(system)
    assert len(order) == 505
    assert max(i for i, t in enumerate(order) if t == "small") < 10


# -- in-flight quotas ------------------------------------------------------------------------


def test_an_in_flight_quota_keeps_the_rest_of_a_burst_in_the_table(system: System) -> None:
    system.app.set_quota("big", max_inflight=10)
    due_rows(system.app.engine, "big", 200)
    waited = REGISTRY.get_sample_value("duejobs_scheduler_throttled_total", {"tenant": "big"})
    result = system.scheduler.run_once()
    assert result.claimed == 10 and result.throttled == {"big"}
    after = REGISTRY.get_sample_value("duejobs_scheduler_throttled_total", {"tenant": "big"})
    assert after == (waited or 0) + 1
    assert pushed(system.app.engine, "big") == 10
    assert system.app.deliverer().depth() == (10, 0)
    assert system.scheduler.run_once().claimed == 0  # no room until some finish
    system.work()
    assert system.scheduler.run_once().claimed == 10  # ten finished: ten more pushed


def test_running_jobs_count_against_the_in_flight_quota(system: System) -> None:
    system.app.set_quota("acme", max_inflight=3)
    due_rows(system.app.engine, "acme", 10)
    running(system.app.engine, "acme", 2)
    assert system.scheduler.run_once().claimed == 1


def test_a_tenant_at_its_in_flight_quota_takes_no_share_of_a_batch(system: System) -> None:
    """Its share would be rows the claim may not take: the batch would come back short and
    the other tenant's rows wait for the next pass."""
    system.app.set_quota("capped", max_inflight=1)
    due_rows(system.app.engine, "capped", 10, seconds_ago=10)
    due_rows(system.app.engine, "open", 4)
    running(system.app.engine, "capped", 1)
    taken = claim(system.app.engine, 4).rows
    assert [r.tenant for r in taken] == ["open"] * 4


def test_a_capped_tenant_is_not_pushed_ahead_of_its_due_time(system: System) -> None:
    system.app.set_quota("capped", max_inflight=100)
    for tenant in ("capped", "free"):
        system.app.schedule("record", {}, delay=300, tenant=tenant)
    result = system.scheduler.run_once()
    assert result.deferred == 1  # only "free" went ahead into RQ's scheduled registry
    assert pushed(system.app.engine, "capped") == 0 and pushed(system.app.engine, "free") == 1


def test_the_default_in_flight_quota_applies_unless_a_tenant_has_its_own(
    system: System,
) -> None:
    system.app.set_quota("*", max_inflight=2)
    system.app.set_quota("vip", max_inflight=20)
    for tenant in ("a", "b", "vip"):
        due_rows(system.app.engine, tenant, 30)
    system.scheduler.run_once()
    assert Counter(queued_tenants(system)) == {"a": 2, "b": 2, "vip": 20}
    system.app.set_quota("vip", max_inflight=None)  # back to the default
    assert [q.tenant for q in system.app.quotas()] == ["*", "vip"]
    assert system.app.quotas()[1].max_inflight is None


def test_concurrent_claims_never_exceed_the_in_flight_quota(app: App) -> None:
    app.set_quota("acme", max_inflight=10)
    due_rows(app.engine, "acme", 100)
    claims_at_once(app, 4)
    assert pushed(app.engine, "acme") == 10
    with app.engine.begin() as conn:  # and later claims see no room either
        assert claim_due(conn, WINDOW, 100).rows == []


def test_a_burst_with_an_in_flight_quota_does_not_hold_up_another_tenant(
    system: System,
) -> None:
    system.app.set_quota("*", max_inflight=10)
    due_rows(system.app.engine, "big", 300, seconds_ago=120)
    system.scheduler.run_once()
    small = [system.app.schedule("record", {}, delay=0, tenant="small") for _ in range(5)]
    system.scheduler.run_once()
    # "small" waits behind at most the ten jobs "big" may have in flight, not its backlog.
    assert max(i for i, t in enumerate(queued_tenants(system)) if t == "small") < 15
    system.work()
    assert {system.status(s.id) for s in small} == {"succeeded"}
    with system.app.engine.connect() as conn:
        done = conn.execute(
            text(
                "SELECT count(*) FROM scheduled_jobs WHERE tenant = 'big' AND status = 'succeeded'"
            )
        ).scalar_one()
    assert done == 10


def test_quotas_take_valid_caps_from_an_unscoped_app(app: App) -> None:
    with pytest.raises(InvalidScheduleError, match="max_inflight must be an int >= 0"):
        app.set_quota("acme", max_inflight=-1)
    with pytest.raises(InvalidScheduleError, match="needs max_live=, max_inflight= or max_rate="):
        app.set_quota("acme")
    with pytest.raises(TenantMismatchError):
        app.tenant("acme").set_quota("acme", max_inflight=1)
    with pytest.raises(TenantMismatchError):
        app.tenant("acme").quotas()
    assert app.quotas() == []


def test_setting_one_cap_keeps_the_other(app: App) -> None:
    app.set_quota("acme", max_live=5)
    app.set_quota("acme", max_inflight=2)
    assert app.quotas() == [store.Quota("acme", 5, 2)]


def test_stats_show_each_tenants_in_flight_jobs_against_its_quota(system: System) -> None:
    system.app.set_quota("*", max_live=1_000)
    system.app.set_quota("big", max_inflight=10)
    due_rows(system.app.engine, "big", 200)
    due_rows(system.app.engine, "small", 3)
    system.scheduler.run_once()
    stats = collect(system.app)
    by_tenant = {f.tenant: f for f in stats.live if f.tenant and f.type is None}
    assert (by_tenant["big"].in_flight, by_tenant["small"].in_flight) == (10, 3)
    assert stats.caps("big") == (1_000, 10) and stats.caps("small") == (1_000, None)
    split = [line.split() for line in render(stats).splitlines()]
    rows = {cells[0]: cells[1:3] for cells in split if cells[:1] in (["big"], ["small"])}
    assert rows == {"big": ["200/1000", "10/10"], "small": ["3/1000", "3"]}
    observe_stats(stats)
    assert REGISTRY.get_sample_value("duejobs_in_flight", {"tenant": "big"}) == 10


def test_a_tenant_with_nothing_in_flight_gets_its_next_job_to_the_front_of_the_queue(
    system: System,
) -> None:
    system.app.set_quota("*", max_inflight=50)
    due_rows(system.app.engine, "big", 200)
    system.scheduler.run_once()  # big: 50 queued
    for _ in range(3):
        system.app.schedule("record", {}, delay=0, tenant="small")
    system.scheduler.run_once()
    # small had nothing queued or running: its first job goes first, the others to the back;
    # big, with jobs in the queue, stays at the back.
    assert queued_tenants(system)[:2] == ["small", "big"]
    assert queued_tenants(system)[-2:] == ["small", "small"]
    assert len(queued_tenants(system)) == 53


def test_a_light_tenant_keeps_the_front_while_fewer_than_two_of_its_jobs_wait(
    system: System,
) -> None:
    system.app.set_quota("*", max_inflight=50)
    due_rows(system.app.engine, "big", 200)
    system.scheduler.run_once()  # big: 50 queued
    for expected_head in (["small"], ["small", "small"]):
        system.app.schedule("record", {}, delay=0, tenant="small")
        system.scheduler.run_once()
        assert queued_tenants(system)[: len(expected_head)] == expected_head
    system.app.schedule("record", {}, delay=0, tenant="small")
    system.scheduler.run_once()  # two of small's wait already: this one goes to the back
    assert queued_tenants(system)[-1] == "small" and queued_tenants(system)[:3] != ["small"] * 3
