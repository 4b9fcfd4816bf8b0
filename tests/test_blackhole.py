"""A network blackhole — packets dropped, no reset — while a handler is inside its effect
fence (``ctx.transaction()``). The client's connection goes silent; the server's session lives
on, idle in its transaction, holding the row's lock, which no heartbeat renews and no rescue
takes (both skip locked rows) until the server's TCP keepalive ends it, hours later. The fence
bounds its own transaction on the server (``fence_idle_timeout``), so the row is free within
it and rescued once its lease ends; the reconciler counts rows held past their lease.

Seen failing on the code before the bound (the row stayed ``running``, locked, past the
deadline, the relay keeping the server's side of the connection alive as a blackhole does).
The first test waits out a real lease and idle bound (about 8 s).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import text

from duejobs import EventKind
from duejobs.config import libpq_url
from duejobs.services.reconciler import Reconciler
from tests.support import wait_for
from tests.support.processes import SCHEDULER, Proc
from tests.support.relay import database_relay
from tests.support.system import System

WORKER = ["worker", "--app", "tests.support.apps:app", "--log-level", "warning"]
FAST_LEASE = ["--lease", "3s", "--heartbeat", "1s"]


def _idle_in_the_fence(system: System) -> bool:
    with system.app.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                    "AND query LIKE '%inside the fence%' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


def test_a_blackhole_inside_the_fence_leaves_the_row_rescued_and_run_once(
    system: System, spawn: Callable[..., Proc], database_url: str
) -> None:
    s = system.app.schedule("fence-idle", {"idle": 1.5}, delay=0)
    with database_relay(database_url) as (relay, through):
        cut_off = spawn(
            *WORKER, *FAST_LEASE, "--fence-idle-timeout", "3s",
            extra_env={"DUEJOBS_DATABASE_URL": through},
        )  # fmt: skip
        spawn(*SCHEDULER)
        spawn("reconcile", "--every", "1", "--log-level", "warning")
        wait_for(lambda: _idle_in_the_fence(system), 30, "the handler inside its fence")
        relay.blackhole()
        cut_off.stop(signal.SIGKILL)  # the worker is gone; its silent connection is not
        spawn(*WORKER, *FAST_LEASE)
        wait_for(lambda: system.status(s.id) == "succeeded", 40, "the schedule to succeed")
    kinds = [e.kind for e in system.app.history(s.id)]
    assert EventKind.ABANDONED in kinds
    assert [attempt for _, attempt in _effects(system)] == [2]


def _effects(system: System) -> list[tuple[str, int]]:
    with system.app.engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(text("SELECT effect_key, attempt FROM test_effects"))
        ]


def test_rows_held_locked_past_their_lease_are_counted_by_the_reconciler(system: System) -> None:
    s = system.app.schedule("record", {}, delay=0)
    with system.app.engine.begin() as conn:  # a running row whose lease ended
        conn.execute(
            text(
                "UPDATE scheduled_jobs SET status = 'running', attempts = 1, "
                "lease_expires_at = now() - interval '1 minute' WHERE id = :id"
            ),
            {"id": s.id},
        )
    holder = system.app.engine.connect()
    try:
        holder.execute(text("SELECT 1 FROM scheduled_jobs WHERE id = :id FOR UPDATE"), {"id": s.id})
        held = Reconciler(system.app).run_once()
        assert (held.locked_past_lease, held.rescued) == (1, 0)
    finally:
        holder.rollback()
        holder.close()
    freed = Reconciler(system.app).run_once()
    assert (freed.locked_past_lease, freed.rescued) == (0, 1)


def test_the_fences_idle_bound_is_set_for_its_transaction_and_a_shorter_one_is_kept(
    system: System, database_url: str
) -> None:
    """The bound is the worker's (1 min) inside the fence; an application's own transaction
    (``conn=``) that set a shorter one keeps it; neither outlives its transaction."""
    seen: list[str] = []
    show = text("SHOW idle_in_transaction_session_timeout")

    @system.app.handler("fence-shows-its-bound")
    def shows(ctx: Any, payload: Any) -> None:
        if payload.get("own"):
            with psycopg.connect(libpq_url(database_url)) as own, own.transaction():
                own.execute("SET LOCAL idle_in_transaction_session_timeout = '5s'")
                with ctx.transaction(conn=own):  # the handler's writes go through its own
                    seen.append(
                        own.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0]
                    )  # type: ignore[index]
                own.execute("SELECT 1")
            with psycopg.connect(libpq_url(database_url)) as again:
                seen.append(again.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0])  # type: ignore[index]
            return
        with ctx.transaction() as conn:
            seen.append(conn.execute(show).scalar_one())

    for own in (False, True):
        s = system.app.schedule("fence-shows-its-bound", {"own": own}, delay=0)
        system.runtime.handle(s.id, 1, 1, "default")
        assert system.status(s.id) == "succeeded"
    assert seen == ["1min", "5s", "0"]
