"""A connection ended under the worker — by ``idle_session_timeout``, a pooler's restart, a
failover, an administrator — at each step of an attempt: the claim, the heartbeat, the
effect fence, the close, the group commit. Each attempt still runs its handler once and is
closed by the worker itself (no lease left to expire, no rescue, no second run).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from rq.registry import FailedJobRegistry
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from duejobs import EventKind, store
from duejobs.models import Delivery
from duejobs.worker import Runtime, Worker, WorkerConfig
from duejobs.worker.heartbeat import Heartbeat, Watched
from tests.support import sample
from tests.support.faults import end_idle_connections, end_session_in
from tests.support.system import System


def _schedule(system: System, n: int, **payload: Any) -> list[uuid.UUID]:
    return [system.app.schedule("traced", payload, delay=timedelta(0)).id for _ in range(n)]


def _ran_once_each_on_attempt_one(system: System, ids: list[uuid.UUID]) -> None:
    """Each schedule succeeded on its first attempt, closed by the worker (no reconciler ran
    here), its handler run once and its effect applied once."""
    for schedule_id in ids:
        assert system.status(schedule_id) == "succeeded"
    with system.app.engine.connect() as conn:
        runs = conn.execute(text("SELECT schedule_id, attempt FROM test_runs")).all()
    assert sorted(runs) == sorted((i, 1) for i in ids)
    applied = sorted(key.split(":", 1)[1] for key, _ in system.effects())  # type:id:attempt
    assert applied == sorted(f"{i}:1" for i in ids)


def _answer_lost_once(monkeypatch: pytest.MonkeyPatch, statement: str) -> list[object]:
    """The store's ``statement`` (run on the worker's autocommit connection, so committed when
    it returns) has its first answer lost, its connection broken: what the worker sees when
    the server or a pooler drops the connection between the commit and the reply. The list
    fills when that happened."""
    real = getattr(store, statement)
    lost: list[object] = []

    def commit_then_lose_the_answer(conn: Any, *args: Any, **kwargs: Any) -> Any:
        answer = real(conn, *args, **kwargs)
        if not lost:
            lost.append(answer)
            conn.invalidate()
            raise OperationalError(
                statement, {}, ConnectionError("lost"), connection_invalidated=True
            )
        return answer

    monkeypatch.setattr(store, statement, commit_then_lose_the_answer)
    return lost


def _failed_in_rq(system: System) -> int:
    return FailedJobRegistry(system.app.queue, connection=system.redis).count


def test_a_claim_whose_connection_broke_is_made_again_on_a_fresh_one(system: System) -> None:
    ids = _schedule(system, 1)
    system.scheduler.run_once()
    claim = "OLD.status = 'scheduled' AND NEW.status = 'running'"
    with end_session_in(system.app.engine, "scheduled_jobs", claim):
        system.work()
    _ran_once_each_on_attempt_one(system, ids)


def test_a_finished_handler_whose_parked_connections_were_ended_is_closed_once(
    system: System,
) -> None:
    # The handler ends every idle session, then applies its effect (the fence on a pooled
    # connection the server ended) and returns (the close on the claim's parked connection).
    ids = _schedule(system, 3, end_idle=True)
    system.scheduler.run_once()
    system.work()
    _ran_once_each_on_attempt_one(system, ids)
    assert _failed_in_rq(system) == 0


def test_a_heartbeat_whose_connection_was_ended_renews_at_its_next_beat(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "duejobs.worker")
    # Beats every 0.2 s: the heartbeat's connection made and parked before the end, then a
    # second of beats after it.
    ids = _schedule(system, 1, before=0.6, end_idle=True, seconds=1.0)
    system.scheduler.run_once()
    system.work()
    _ran_once_each_on_attempt_one(system, ids)
    assert [r.getMessage() for r in caplog.records if "renew" in r.getMessage()] == []


def test_a_group_commit_whose_connection_died_records_every_outcome_it_carried(
    system: System,
) -> None:
    # Four handlers that return together and apply nothing themselves: the worker's close,
    # batched, is the only statement that closes their attempts, and the first is ended.
    runtime = Runtime(system.app, WorkerConfig(concurrency=4, heartbeat=timedelta(seconds=1)))
    ids = [
        system.app.schedule("meet-and-return", {"group": "gc", "parties": 4}, delay=0).id
        for _ in range(4)
    ]
    system.scheduler.run_once()
    closed = "OLD.status = 'running' AND NEW.status = 'succeeded'"
    try:
        with end_session_in(system.app.engine, "scheduled_job_attempts", closed):
            Worker(runtime).work(burst=True)
    finally:
        runtime.close()
    for schedule_id in ids:
        s = system.app.get(schedule_id)
        assert s is not None and s.status.value == "succeeded" and s.attempts == 1
        assert [e.kind for e in system.app.history(schedule_id)].count(EventKind.SUCCEEDED) == 1
    assert _failed_in_rq(system) == 0


def test_an_outcome_committed_whose_answer_was_lost_is_not_recorded_again(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = _answer_lost_once(monkeypatch, "finish")
    # A handler with no fence of its own: the worker's close is the only finish.
    s = system.app.schedule("record-loosely", {}, delay=timedelta(0))
    counted = {"tenant": "default", "type": "record-loosely"}
    succeeded = sample("duejobs_deliveries_total", outcome="succeeded", **counted)
    system.scheduler.run_once()
    system.work()
    assert lost  # the fault happened
    # counted as the success it was (not as a schedule that moved on meanwhile)
    assert sample("duejobs_deliveries_total", outcome="succeeded", **counted) == succeeded + 1
    assert system.status(s.id) == "succeeded"
    assert len(system.effects()) == 1
    kinds = [e.kind for e in system.app.history(s.id)]
    assert kinds.count(EventKind.SUCCEEDED) == 1
    assert EventKind.SKIPPED not in kinds  # not recorded stale either
    assert _failed_in_rq(system) == 0


def test_a_claim_committed_whose_answer_was_lost_runs_its_handler_on_that_attempt(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without it, the attempt would wait for its lease and be rescued (a type with one
    # attempt: failed for good, its handler never run).
    lost = _answer_lost_once(monkeypatch, "claim_runs")
    ids = _schedule(system, 1)
    system.scheduler.run_once()
    system.work()
    assert lost  # the fault happened
    _ran_once_each_on_attempt_one(system, ids)
    kinds = [e.kind for e in system.app.history(ids[0])]
    assert EventKind.SKIPPED not in kinds  # not taken for a duplicate of itself
    assert _failed_in_rq(system) == 0


def test_lost_claim_answers_are_kept_a_lease_at_most_and_refused_connects_not_at_all(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the claimer keeps to ask whether a claim landed is let go once a lease has
    passed (the reconciler's by then), and a connect refused sent nothing to ask about:
    through a PostgreSQL outage the process keeps no more than a lease's worth. Seen failing
    with every delivery tried during an outage kept for the life of the process."""
    from datetime import timedelta as td

    from duejobs.models import Delivery
    from duejobs.worker.claims import Claimer

    config = WorkerConfig(lease=td(seconds=1), heartbeat=td(milliseconds=200))
    claimer = Claimer(system.app.core, config, system.runtime.bookkeeping, "test-claimer")
    refused = OperationalError("connect", {}, ConnectionError("refused"))

    def _refused(*args: Any, **kwargs: Any) -> Any:
        raise refused

    gone = [Delivery(uuid.uuid4(), "default", 1, 1, "duejobs") for _ in range(3)]
    try:
        with monkeypatch.context() as patched:
            patched.setattr(system.runtime.bookkeeping, "connection", _refused)
            with pytest.raises(OperationalError):
                claimer._claim_batch(gone)
        assert claimer.unanswered == 0
        lost = _answer_lost_once(monkeypatch, "claim_runs")
        with pytest.raises(OperationalError):
            claimer._claim_batch(gone)
        assert lost and claimer.unanswered == 3
        deadline = time.monotonic() + 10
        while claimer.unanswered and time.monotonic() < deadline:
            time.sleep(0.1)
            claimer._landed(Delivery(uuid.uuid4(), "default", 1, 1, "duejobs"))
        assert claimer.unanswered == 0
    finally:
        claimer.close()


def test_an_outcome_whose_connects_are_refused_is_recorded_on_the_next_one(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler returns while PostgreSQL refuses new connections (a restart, a failover
    under way) and the worker's parked connections are gone: the close waits out the refused
    connects and records the outcome once a connect succeeds — the attempt closed by the
    worker, its handler run once, nothing left to the lease. Made deterministic: seen caught
    before only when an outcome happened to land during a failover test."""
    core = system.app.core
    real, refused = core.connect_directly, [0]
    armed = [False]

    def refusing() -> Any:
        if armed[0] and refused[0] < 2:
            refused[0] += 1
            raise DBAPIError.instance(
                None, None, psycopg.OperationalError("connection refused"), psycopg.Error
            )
        return real()

    monkeypatch.setattr(core, "connect_directly", refusing)

    @system.app.handler("returns-while-refused")
    def returns(ctx: Any, payload: Any) -> None:
        with system.app.engine.connect() as conn:
            end_idle_connections(conn)  # the worker's parked bookkeeping connections
        armed[0] = True

    s = system.app.schedule("returns-while-refused", {}, delay=timedelta(0))
    system.scheduler.run_once()
    system.work()
    assert refused[0] == 2 and system.status(s.id) == "succeeded"
    kinds = [e.kind for e in system.app.history(s.id)]
    assert kinds.count(EventKind.STARTED) == 1 and EventKind.ABANDONED not in kinds


def _running_row(system: System) -> Delivery:
    """A running attempt whose lease has ended: what a renewal must push forward."""
    s = system.app.schedule("record", {}, delay=timedelta(0))
    with system.app.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduled_jobs SET status = 'running', attempts = 1 WHERE id = :id"),
            {"id": s.id},
        )
    delivery = Delivery(s.id, "default", 1, 1, system.app.queue)
    _lease_ended(system, delivery)
    return delivery


def _lease_ended(system: System, delivery: Delivery) -> None:
    with system.app.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scheduled_jobs SET lease_expires_at = now() - interval '1 s' WHERE id = :id"
            ),
            {"id": delivery.schedule_id},
        )


def _lease_ahead(system: System, delivery: Delivery) -> bool:
    with system.app.engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT lease_expires_at > now() FROM scheduled_jobs WHERE id = :id"),
                {"id": delivery.schedule_id},
            ).scalar_one()
        )


@pytest.mark.parametrize("when", ["ended while parked", "broken during the beat"])
def test_a_beat_whose_connection_was_lost_renews_the_lease_at_that_beat(
    system: System, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    """The heartbeat's own connection ended by the server while parked between beats, or
    broken in the middle of a beat: that very beat renews the lease on a new connection, with
    no warning. Beats called one by one, no timing: seen failing in 4 of 5 runs only, when a
    test had to land its fault between two beats."""
    caplog.set_level(logging.WARNING, "duejobs.worker")
    delivery = _running_row(system)
    beats = Heartbeat(system.app.core, timedelta(hours=1), timedelta(seconds=20))  # no own beat
    try:
        watched = Watched(delivery, give_up_at=float("inf"), overrun=lambda: None)
        beats._renew([watched])  # its connection made and parked
        _lease_ended(system, delivery)
        if when == "ended while parked":
            with system.app.engine.connect() as conn:
                assert end_idle_connections(conn) >= 1
        else:
            real, broke = store.extend_leases, []

            def breaks_once(conn: Any, *args: Any) -> None:
                if not broke:
                    broke.append(True)
                    conn.invalidate()
                    raise OperationalError(
                        "extend_leases", {}, ConnectionError("lost"), connection_invalidated=True
                    )
                real(conn, *args)

            monkeypatch.setattr(store, "extend_leases", breaks_once)
        beats._renew([watched])
    finally:
        beats.stop()
    assert _lease_ahead(system, delivery)
    assert [r for r in caplog.records if "renew" in r.getMessage()] == []
