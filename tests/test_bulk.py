"""`app.schedule_many`: many schedules in one COPY and one statement, all or nothing."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from duejobs import App, ScheduleRequest, ids, store
from duejobs.errors import (
    InvalidScheduleError,
    NaiveDatetimeError,
    QuotaExceededError,
    TenantMismatchError,
)
from tests.support.system import System


def test_schedule_many_writes_every_request_with_its_history_in_order(app: App) -> None:
    db_now = app.now()
    at = datetime(2031, 3, 30, 2, 30)  # a wall time in Berlin's spring-forward gap
    ids = app.schedule_many(
        [
            ScheduleRequest("remind", {"n": 1}, delay=60, tenant="acme"),
            ScheduleRequest("remind", {"n": 2}, run_at=at, timezone="Europe/Berlin"),
            ScheduleRequest("expire", {"n": 3}, delay=timedelta(hours=1), jitter=30),
        ]
    )
    first, second, third = (app.get(i) for i in ids)
    assert first is not None and second is not None and third is not None
    assert (first.tenant, first.payload) == ("acme", {"n": 1})
    assert timedelta(seconds=59) < first.run_at - db_now < timedelta(seconds=70)  # DB clock
    assert second.run_at == datetime(2031, 3, 30, 1, 0, tzinfo=UTC)  # 03:00 CEST, as schedule()
    assert second.local_run_at == at and second.timezone == "Europe/Berlin"
    assert third.run_at <= third.due_at < third.run_at + timedelta(seconds=30)
    assert [e.kind.value for e in app.history(ids[0])] == ["created"]


def test_a_schedule_made_in_bulk_has_the_created_event_schedule_gives_it(app: App) -> None:
    wall = datetime(2031, 6, 2, 9, 0)
    plain: dict[str, Any] = {"run_at": datetime(2031, 6, 1, 7, 0, tzinfo=UTC)}
    rich: dict[str, Any] = {"run_at": wall, "timezone": "Europe/Berlin", "key": "k-1", "jitter": 30}

    def created(schedule_id: uuid.UUID) -> dict[str, Any]:
        detail = app.history(schedule_id)[0].detail
        return {**detail, "due_at": "jittered"} if "due_at" in detail else detail

    single = [app.schedule("remind", {}, **kw).id for kw in (plain, rich)]
    app.cancel(single[1])  # frees the key for the batch
    requests = [ScheduleRequest("remind", {}, **kw) for kw in (plain, rich)]
    one = [created(i) for i in single]
    many = [created(i) for i in app.schedule_many(requests)]
    assert (
        one
        == many
        == [
            {"run_at": "2031-06-01T07:00:00+00:00"},
            {
                "run_at": "2031-06-02T07:00:00+00:00",
                "timezone": "Europe/Berlin",
                "local_run_at": "2031-06-02T09:00:00",
                "key": "k-1",
                "due_at": "jittered",
            },
        ]
    )


def test_a_bad_request_names_its_position_and_nothing_is_written(
    app: App, count: Callable[..., int]
) -> None:
    good = ScheduleRequest("remind", {}, delay=60)
    with pytest.raises(NaiveDatetimeError, match=r"request 1: run_at .* is naive"):
        app.schedule_many([good, ScheduleRequest("remind", {}, run_at=datetime(2030, 1, 1))])
    with pytest.raises(InvalidScheduleError, match="request 2: payload is not JSON"):
        app.schedule_many([good, good, ScheduleRequest("remind", {1j}, delay=1)])
    with pytest.raises(InvalidScheduleError, match=r"expected a duejobs\.ScheduleRequest"):
        app.schedule_many([good, {"type": "remind"}])  # type: ignore[list-item]
    with pytest.raises(TenantMismatchError):
        app.tenant("acme").schedule_many([ScheduleRequest("x", {}, delay=1, tenant="globex")])
    assert count() == 0 and count("scheduled_job_events") == 0
    assert app.schedule_many([]) == []


def test_a_key_in_a_batch_returns_the_live_schedule_holding_it(
    app: App, count: Callable[..., int]
) -> None:
    held = app.schedule("remind", {}, delay=60, key="order-1")
    ids = app.schedule_many(
        [
            ScheduleRequest("remind", {}, delay=60, key="order-1"),
            ScheduleRequest("remind", {}, delay=60, key="order-2"),
            ScheduleRequest("remind", {}, delay=60, key="order-2"),
            ScheduleRequest("remind", {}, delay=60, key="order-1", tenant="globex"),
        ]
    )
    assert ids[0] == held.id
    assert ids[1] == ids[2] and ids[1] != held.id
    assert len(set(ids)) == 3 and count() == 3


def test_a_batch_that_would_pass_the_live_quota_is_refused_whole(
    app: App, count: Callable[..., int]
) -> None:
    app.set_quota("acme", max_live=5)
    app.schedule("remind", {}, delay=60, tenant="acme")
    batch = [ScheduleRequest("remind", {}, delay=60, tenant="acme") for _ in range(5)]
    with pytest.raises(QuotaExceededError, match="'acme' has reached its quota of 5"):
        app.schedule_many(batch)
    assert count() == 1
    assert len(app.schedule_many(batch[:4])) == 4


def test_schedule_many_joins_the_callers_transaction(app: App, count: Callable[..., int]) -> None:
    batch = [ScheduleRequest("remind", {"i": i}, delay=60) for i in range(3)]
    with app.engine.connect() as conn:
        trans = conn.begin()
        app.schedule_many(batch, conn=conn)
        app.schedule_many(batch, conn=conn)  # a second batch in the same transaction
        trans.rollback()
    assert count() == 0
    with app.engine.begin() as conn:
        first = app.schedule_many(batch, conn=conn)
        bad = ScheduleRequest("remind", {}, delay=-5)
        with pytest.raises(InvalidScheduleError, match="request 3"):
            app.schedule_many([*batch, bad], conn=conn)  # refused: the transaction goes on
        second = app.schedule_many(batch, conn=conn)
    assert count() == 6 and not set(first) & set(second)


def test_each_schedule_made_in_bulk_gets_one_created_event(
    app: App, count: Callable[..., int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's events are written from its rows between its first and last id: a schedule
    # another transaction (or this one, before the batch) made inside that range keeps its own.
    drawn = [uuid.UUID(bytes=raw) for raw in itertools.islice(ids.id_stream(), 6)]
    outsider, insider = drawn[1], drawn[4]
    streams = iter([[drawn[0], drawn[2]], [drawn[3], drawn[5]], [drawn[3], drawn[5]]])
    monkeypatch.setattr(store.bulk, "id_stream", lambda: (i.bytes for i in next(streams)))
    monkeypatch.setattr(store.schedules, "new_id", iter([outsider, insider]).__next__)
    app.schedule("remind", {}, delay=60)  # committed, with an id inside the batch's range
    batch = [ScheduleRequest("remind", {"i": i}, delay=60) for i in range(2)]
    first = app.schedule_many(batch)
    with app.engine.begin() as conn:
        app.schedule("remind", {}, delay=60, conn=conn)  # same transaction, before the batch
        with pytest.raises(InvalidScheduleError):  # a refused batch leaves no event behind
            app.schedule_many([*batch, ScheduleRequest("remind", {}, delay=-1)], conn=conn)
        second = app.tenant("acme").schedule_many(batch, conn=conn)
    assert (first, second) == ([drawn[0], drawn[2]], [drawn[3], drawn[5]])
    with app.engine.connect() as conn:
        per_schedule = conn.execute(
            text(
                "SELECT s.id, s.tenant, count(e.id) FROM scheduled_jobs s "
                "LEFT JOIN scheduled_job_events e ON e.schedule_id = s.id AND e.kind = 'created' "
                "GROUP BY s.id, s.tenant"
            )
        ).all()
    assert sorted((str(i), t, n) for i, t, n in per_schedule) == sorted(
        [(str(outsider), "default", 1), (str(insider), "default", 1)]
        + [(str(i), "default", 1) for i in first]
        + [(str(i), "acme", 1) for i in second]
    )


def test_schedules_made_in_bulk_run_like_any_other(system: System) -> None:
    ids = system.app.schedule_many(
        [ScheduleRequest("record", {"i": i}, delay=0, tenant="acme") for i in range(20)]
    )
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in ids))
    assert len(system.effects()) == 20
