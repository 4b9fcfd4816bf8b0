"""``duejobs.AsyncApp``: the App's writes and reads from asyncio code, on real PostgreSQL and
Redis, without blocking the event loop.

Seen failing against a build broken on purpose: each call run straight on the event loop's
thread through the synchronous App (the loop stalls while PostgreSQL waits)
→ ``test_a_slow_database_does_not_stall_other_coroutines``; ``conn=`` ignored (each call a
transaction of its own) → ``test_a_schedule_in_the_callers_transaction_rolls_back_with_it``;
the superseded job's removal skipped → ``test_cancel_removes_the_job_waiting_in_redis``; the
tenant scope dropped by ``tenant()`` →
``test_a_tenant_scoped_async_app_cannot_see_move_or_cancel_another_tenants_schedule``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from duejobs import App, AsyncApp, ScheduleRequest, Status
from duejobs.config import libpq_url
from duejobs.errors import (
    DatabaseUnavailableError,
    EmptyTypeError,
    InvalidScheduleError,
    InvalidScheduleIdError,
    NegativeDelayError,
    PayloadTooLargeError,
    QuotaExceededError,
    ScheduleNotFoundError,
)
from tests.support.system import System

T = TypeVar("T")


def run(make: Callable[[AsyncApp], Coroutine[Any, Any, T]], app: App) -> T:
    """``make(AsyncApp(app))`` on a fresh event loop; the AsyncApp closed after."""

    async def main() -> T:
        async with AsyncApp(app) as aapp:
            return await make(aapp)

    return asyncio.run(main())


def test_an_async_schedule_is_stored_as_the_app_stores_it(app: App) -> None:
    async def main(aapp: AsyncApp) -> tuple[Any, Any, Any]:
        first = await aapp.schedule("mail", {"to": "a"}, delay=60, key="k1")
        again = await aapp.schedule("mail", {"to": "b"}, delay=60, key="k1")
        return first, again, await aapp.get(first.id)

    first, again, read = run(main, app)
    assert again.id == first.id and again.payload == {"to": "a"}  # the live key's holder
    assert read == app.get(first.id)
    assert read.status is Status.SCHEDULED and read.version == 1
    assert timedelta(seconds=55) < read.run_at - app.now() <= timedelta(seconds=60)
    assert [e.kind.value for e in app.history(first.id)] == ["created"]


def test_a_schedule_in_the_callers_transaction_commits_with_it(app: App, database_url: str) -> None:
    async def main(aapp: AsyncApp) -> uuid.UUID:
        engine = create_async_engine(database_url)
        async with engine.begin() as conn:
            s = await aapp.schedule("mail", {}, delay=60, conn=conn)
            assert (await aapp.get(s.id, conn=conn)) is not None  # visible inside
            assert app.get(s.id) is None  # not yet outside
        await engine.dispose()
        return s.id

    assert app.get(run(main, app)) is not None


def test_a_schedule_in_the_callers_transaction_rolls_back_with_it(
    app: App, database_url: str, count: Callable[..., int]
) -> None:
    async def main(aapp: AsyncApp) -> None:
        engine = create_async_engine(database_url)
        async with engine.connect() as conn:
            await aapp.schedule("mail", {}, delay=60, conn=conn)
            await aapp.schedule_many([ScheduleRequest("mail", {}, delay=60)], conn=conn)
            await conn.rollback()
        async with AsyncSession(engine) as session:
            await aapp.schedule("mail", {}, delay=60, conn=session)
            await session.rollback()
        await engine.dispose()

    run(main, app)
    assert count() == 0 and count("scheduled_job_events") == 0


def test_a_session_commit_keeps_the_schedule_with_the_sessions_own_work(
    app: App, database_url: str
) -> None:
    async def main(aapp: AsyncApp) -> uuid.UUID:
        engine = create_async_engine(database_url)
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(
                text(
                    "INSERT INTO test_effects (effect_key, schedule_id, attempt, worker_pid)"
                    " VALUES ('order', gen_random_uuid(), 1, 0)"
                )
            )
            s = await aapp.schedule("mail", {}, delay=60, conn=session)
        await engine.dispose()
        return s.id

    sid = run(main, app)
    assert app.get(sid) is not None
    with app.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM test_effects")).scalar_one() == 1


def test_a_plain_psycopg_async_connection_holds_the_schedule_in_its_transaction(
    app: App, database_url: str, count: Callable[..., int]
) -> None:
    async def main(aapp: AsyncApp) -> uuid.UUID:
        url = libpq_url(database_url)
        async with await psycopg.AsyncConnection.connect(url) as raw:
            await aapp.schedule("mail", {}, delay=60, conn=raw)
            await aapp.schedule_many([ScheduleRequest("mail", {}, delay=60)], conn=raw)
            await raw.rollback()
            assert count() == 0
            kept = await aapp.schedule("mail", {}, delay=60, conn=raw)
            assert app.get(kept.id) is None  # not committed yet
            await raw.commit()
        async with (
            await psycopg.AsyncConnection.connect(url, autocommit=True) as raw,
            raw.transaction(),
        ):
            await aapp.cancel(kept.id, conn=raw)
        return kept.id

    sid = run(main, app)
    assert app.get(sid).status is Status.CANCELLED  # type: ignore[union-attr]
    assert count() == 1


def test_a_batch_or_a_keyed_schedule_first_on_a_psycopg_async_connection_rolls_back_with_it(
    app: App, database_url: str, count: Callable[..., int]
) -> None:
    """As with a sync connection (test_schedule_api). Seen failing with the transaction not
    begun first: the batch was committed."""

    async def main(aapp: AsyncApp) -> None:
        async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as raw:
            await aapp.schedule_many([ScheduleRequest("mail", {}, delay=60, key="b")], conn=raw)
            await raw.rollback()
            await aapp.schedule("mail", {}, delay=60, key="k", conn=raw)
            await raw.rollback()

    run(main, app)
    assert count() == 0 and count("scheduled_job_events") == 0


def test_a_refused_batch_leaves_the_callers_async_transaction_usable(
    app: App, database_url: str
) -> None:
    app.set_quota("acme", max_live=1)

    async def main(aapp: AsyncApp) -> tuple[Any, Any]:
        engine = create_async_engine(database_url)
        async with engine.connect() as conn:
            counts = [await _refused_batch(aapp, conn, conn.scalar)]
            await conn.rollback()
        await engine.dispose()
        async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as raw:

            async def scalar(query: Any) -> Any:
                row = await (await raw.execute(str(query))).fetchone()
                return row[0] if row else None

            counts.append(await _refused_batch(aapp, raw, scalar))
        return counts[0], counts[1]

    assert run(main, app) == (1, 1)  # the savepoint undid the batch, and only the batch


async def _refused_batch(aapp: AsyncApp, conn: Any, scalar: Any) -> Any:
    await aapp.schedule("mail", {}, delay=60, tenant="acme", conn=conn)
    with pytest.raises(QuotaExceededError):
        await aapp.schedule_many([ScheduleRequest("mail", {}, delay=60, tenant="acme")], conn=conn)
    return await scalar(text("SELECT count(*) FROM scheduled_jobs"))


def test_schedule_many_copies_through_the_async_connection(app: App) -> None:
    requests = [ScheduleRequest("mail", {"n": n}, delay=60) for n in range(50)]
    requests.append(ScheduleRequest("mail", {"n": "keyed"}, delay=60, key="once"))

    ids = run(lambda aapp: aapp.schedule_many(requests), app)
    assert len(set(ids)) == 51
    assert [app.get(i).payload for i in ids[:2]] == [{"n": 0}, {"n": 1}]  # type: ignore[union-attr]
    assert [e.kind.value for e in app.history(ids[-1])] == ["created"]


def test_bad_input_is_refused_with_the_apps_errors_and_nothing_is_written(
    app: App, count: Callable[..., int], database_url: str
) -> None:
    async def main(aapp: AsyncApp) -> None:
        refused = [
            (aapp.schedule("", {}, delay=1), EmptyTypeError, "type"),
            (aapp.schedule("mail", {"x": "y" * 70_000}, delay=1), PayloadTooLargeError, "bytes"),
            (aapp.schedule("mail", {}, delay=-1), NegativeDelayError, "delay"),
            (
                aapp.schedule_many([ScheduleRequest("mail", {}, delay=1), "nope"]),  # type: ignore[list-item]
                InvalidScheduleError,
                "request 1",
            ),
            (aapp.cancel("not-a-uuid"), InvalidScheduleIdError, "UUID"),
            (aapp.reschedule(uuid.uuid4(), delay=5), ScheduleNotFoundError, "no schedule"),
        ]
        for call, error, named in refused:
            with pytest.raises(error, match=named):
                await call
        with pytest.raises(TypeError, match="AsyncConnection or AsyncSession"):
            await aapp.schedule("mail", {}, delay=1, conn="a connection")  # type: ignore[arg-type]
        url = libpq_url(database_url)
        with psycopg.connect(url) as blocking, pytest.raises(TypeError, match="got psycopg"):
            await aapp.schedule("mail", {}, delay=1, conn=blocking)  # type: ignore[arg-type]
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as raw:
            with pytest.raises(TypeError, match="autocommit mode outside a transaction"):
                await aapp.schedule("mail", {}, delay=1, conn=raw)

    run(main, app)
    assert count() == 0 and count("scheduled_job_events") == 0


def test_a_tenant_scoped_async_app_cannot_see_move_or_cancel_another_tenants_schedule(
    app: App,
) -> None:
    theirs = app.schedule("mail", {}, delay=60, tenant="other")

    async def main(aapp: AsyncApp) -> tuple[Any, ...]:
        mine = aapp.tenant("acme")
        assert mine.scope == "acme"
        own = await mine.schedule("mail", {}, delay=60)
        seen = await mine.get(theirs.id)
        with pytest.raises(ScheduleNotFoundError):
            await mine.reschedule(theirs.id, delay=5)
        cancelled = await mine.cancel(theirs.id)
        return own, seen, cancelled, await mine.history(theirs.id)

    own, seen, cancelled, history = run(main, app)
    assert own.tenant == "acme"
    assert seen is None and cancelled is False and history == []
    assert app.get(theirs.id).status is Status.SCHEDULED  # type: ignore[union-attr]


def test_cancel_removes_the_job_waiting_in_redis(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    moved = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    assert system.scheduler.deliverer.queue.count == 2

    async def main(aapp: AsyncApp) -> tuple[bool, Any]:
        return await aapp.cancel(s.id), await aapp.reschedule(moved.id, delay=3600)

    cancelled, rescheduled = run(main, system.app)  # closing the AsyncApp flushed its removals
    assert cancelled and rescheduled.version == 2
    assert system.scheduler.deliverer.queue.count == 0


def test_a_schedule_written_through_the_async_app_runs_in_a_worker(system: System) -> None:
    s = run(lambda aapp: aapp.schedule("record", {"k": "async"}, delay=0), system.app)
    system.run_until(lambda: system.status(s.id) == "succeeded")
    assert len(system.effects()) == 1


def test_a_slow_database_does_not_stall_other_coroutines(app: App) -> None:
    """A table lock holds the AsyncApp's statement; the loop keeps serving a ticker meanwhile.
    (A blocking build stalls the loop until the lock is given up after 10 s: no tick.)"""
    s = app.schedule("mail", {}, delay=60)
    locked, release = threading.Event(), threading.Event()

    def hold_the_table() -> None:
        with app.engine.begin() as conn:
            conn.execute(text("LOCK TABLE scheduled_jobs IN ACCESS EXCLUSIVE MODE"))
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    assert locked.wait(10)

    async def main(aapp: AsyncApp) -> tuple[int, Any]:
        ticks = 0
        read = asyncio.ensure_future(aapp.get(s.id))
        deadline = time.monotonic() + 10
        while ticks < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            ticks += 1
            assert not read.done(), "the read finished while the table was locked"
        release.set()
        return ticks, await read

    try:
        ticks, read = run(main, app)
    finally:
        release.set()
        holder.join()
    assert ticks == 20 and read is not None and read.id == s.id


def test_an_outage_raises_database_unavailable(redis_url: str) -> None:
    down = App(database_url="postgresql://postgres@127.0.0.1:1/none", redis_url=redis_url)
    with pytest.raises(DatabaseUnavailableError, match="unavailable"):
        run(lambda aapp: aapp.schedule("mail", {}, delay=1), down)


def test_recurring_definitions_and_quotas_through_the_async_app(app: App) -> None:
    async def main(aapp: AsyncApp) -> tuple[Any, ...]:
        made = await aapp.recurring("daily", cron="0 9 * * *", type="mail", timezone="UTC")
        paused = await aapp.pause_recurring("daily")
        updated = await aapp.update_recurring("daily", cron="0 10 * * *")
        await aapp.set_quota("acme", max_live=1)
        quotas = await aapp.quotas()
        await aapp.tenant("acme").schedule("mail", {}, delay=60)
        return made, paused, updated, quotas, await aapp.delete_recurring("daily")

    made, paused, updated, quotas, deleted = run(main, app)
    assert made.version == 1 and paused.status.value == "paused"
    assert updated.cron == "0 10 * * *" and updated.version > paused.version
    assert [(q.tenant, q.max_live) for q in quotas] == [("acme", 1)]
    assert deleted and app.get_recurring("daily") is None
    with pytest.raises(Exception, match="quota"):
        app.tenant("acme").schedule("mail", {}, delay=60)


# What only one side has, and why: the App registers handlers, migrates and hands its engine,
# settings and Core to the worker and the services; the AsyncApp closes with ``aclose`` and
# names the App it was built from.
_APP_ONLY = {"close", "core", "deliverer", "engine", "handler", "handler_for", "migrate", "task"}
_APP_ONLY |= {"queue", "settings", "declare_recurring", "sync_recurring"}
_ASYNC_ONLY = {"aclose", "app"}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_async_app_offers_every_public_method_of_the_app() -> None:
    """Seen failing before ``list_recurring`` and ``next_occurrences`` were added."""
    assert _public(App) - _public(AsyncApp) == _APP_ONLY
    assert _public(AsyncApp) - _public(App) == _ASYNC_ONLY


@pytest.mark.parametrize("name", sorted(_public(App) - _APP_ONLY))
def test_an_async_method_takes_what_the_app_method_takes(name: str) -> None:
    """Names, kinds and defaults of the parameters (``conn=`` takes an async connection)."""
    mine, theirs = getattr(AsyncApp, name), getattr(App, name)
    if isinstance(theirs, property):
        assert isinstance(mine, property)
        return

    def shape(method: Any) -> list[tuple[str, Any, Any]]:
        parameters = inspect.signature(method).parameters.values()
        return [(p.name, p.kind, p.default) for p in parameters]

    assert shape(mine) == shape(theirs)


def test_the_async_app_keeps_every_setting_of_its_app(app: App) -> None:
    """Its Core is the App's on other engines: nothing dropped (``trace_runs`` was)."""
    app.core.trace_runs = "child"
    try:
        async_app = AsyncApp(app)
        mine, theirs = async_app._core, app.core
        kept = ("settings", "max_payload_bytes", "queue", "trace_runs", "read_max_lag")
        assert all(getattr(mine, f) == getattr(theirs, f) for f in kept)
        assert mine.handlers is theirs.handlers and mine.quotas is theirs.quotas
        asyncio.run(async_app.aclose())
    finally:
        app.core.trace_runs = "link"
