"""Handlers the delivery-path tests run, in-process (``register``) or in worker processes
(``python -m duejobs worker --app tests.support.apps:app``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import time
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import text

import duejobs
from duejobs.worker import Context
from tests.support.faults import end_idle_connections

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS test_effects (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    effect_key text NOT NULL,
    schedule_id uuid NOT NULL,
    attempt integer NOT NULL,
    worker_pid integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
# Every run of a ``traced`` handler, written outside any fence as it starts and as it ends:
# what the worker's promises are checked against (each attempt run once, on the version its
# claim was for, never two at once for one schedule).
RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS test_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id uuid NOT NULL,
    version integer NOT NULL,
    attempt integer NOT NULL,
    worker_pid integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz
)
"""
_INSERT = text(
    "INSERT INTO test_effects (effect_key, schedule_id, attempt, worker_pid) "
    "VALUES (:key, :id, :attempt, :pid)"
)


def _params(ctx: Context) -> dict[str, Any]:
    return {
        "key": ctx.effect_key,
        "id": ctx.schedule_id,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
    }


def record(ctx: Context, payload: Any) -> None:
    """The transactional effect: one row in test_effects, committed with `succeeded`."""
    with ctx.transaction() as conn:
        conn.execute(_INSERT, _params(ctx))


def record_loosely(ctx: Context, payload: Any) -> None:
    """An effect outside the transactional helper (like a call to an external API)."""
    ctx.ensure_current()
    with ctx.engine.begin() as conn:
        conn.execute(_INSERT, _params(ctx))


def fence_idle(ctx: Context, payload: Any) -> None:
    """Inside its effect fence: a marker statement, ``idle`` seconds with nothing sent, then
    its effect — the gap a network blackhole test cuts the connection in."""
    with ctx.transaction() as conn:
        conn.execute(text("SELECT 'inside the fence'"))
        time.sleep(float(payload.get("idle", 0)))
        conn.execute(_INSERT, _params(ctx))


def flaky(ctx: Context, payload: Any) -> None:
    """Fails on the first `fail_times` attempts, then records."""
    if ctx.attempt <= int(payload.get("fail_times", 0)):
        raise RuntimeError(f"transient failure on attempt {ctx.attempt}")
    record(ctx, payload)


def slow(ctx: Context, payload: Any) -> None:
    """Sleeps, checks it is still current, then records."""
    time.sleep(float(payload.get("seconds", 1)))
    record(ctx, payload)


def stall_once(ctx: Context, payload: Any) -> None:
    """Hangs on its first attempt (a worker killed there must be rescued), then records."""
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 60)))
    record(ctx, payload)


def traced(ctx: Context, payload: Any) -> None:
    """Records its run (start and end, outside any fence), sleeps ``seconds``, fails on the
    first ``fail_times`` attempts, then applies its effect through ``ctx.transaction()``.
    With ``end_idle``, after ``before`` seconds, it first ends every other idle session on
    the database: the worker's parked connections, the pool's, the heartbeat's
    (tests.support.faults)."""
    with ctx.engine.begin() as conn:
        run_id = conn.execute(
            text(
                "INSERT INTO test_runs (schedule_id, version, attempt, worker_pid) "
                "VALUES (:id, :version, :attempt, :pid) RETURNING id"
            ),
            {
                "id": ctx.schedule_id,
                "version": ctx.version,
                "attempt": ctx.attempt,
                "pid": os.getpid(),
            },
        ).scalar_one()
    try:
        time.sleep(float(payload.get("before", 0)))
        if payload.get("end_idle"):
            with ctx.engine.begin() as conn:
                end_idle_connections(conn)
        time.sleep(float(payload.get("seconds", 0)))
        if ctx.attempt <= int(payload.get("fail_times", 0)):
            raise RuntimeError(f"failure on attempt {ctx.attempt}, as planned")
        record(ctx, payload)
    finally:
        with ctx.engine.begin() as conn:
            conn.execute(
                text("UPDATE test_runs SET ended_at = clock_timestamp() WHERE id = :id"),
                {"id": run_id},
            )


async def record_async(ctx: Context, payload: Any) -> None:
    """``record`` as an ``async def`` handler (``ctx``'s methods are synchronous)."""
    await asyncio.sleep(0)
    record(ctx, payload)


async def flaky_async(ctx: Context, payload: Any) -> None:
    """``flaky`` as an ``async def`` handler."""
    await asyncio.sleep(0)
    flaky(ctx, payload)


async def slow_async(ctx: Context, payload: Any) -> None:
    """``slow`` as an ``async def`` handler: awaits, then records."""
    await asyncio.sleep(float(payload.get("seconds", 1)))
    record(ctx, payload)


async def stall_once_async(ctx: Context, payload: Any) -> None:
    """``stall_once`` as an ``async def`` handler."""
    if ctx.attempt == 1:
        await asyncio.sleep(float(payload.get("seconds", 60)))
    record(ctx, payload)


def stubborn(ctx: Context, payload: Any) -> None:
    """Swallows everything, its timeout included, for `seconds`: it never returns in time."""
    give_up = time.monotonic() + float(payload.get("seconds", 60))
    while time.monotonic() < give_up:
        with contextlib.suppress(BaseException):  # the point: a handler that will not stop
            time.sleep(0.05)


def stubborn_fenced(ctx: Context, payload: Any) -> None:
    """Swallows its timeout inside the effect fence, holding the row's lock."""
    with ctx.transaction():
        stubborn(ctx, payload)


# Handlers that meet: each arrives in its group and waits (up to `wait` seconds, 10 by
# default) until `parties` have arrived, so a group succeeds only if that many run at once in
# this process.
_ARRIVED: collections.Counter[str] = collections.Counter()
_ARRIVED_LOCK = threading.Lock()


def _arrive(payload: Any) -> tuple[str, int, float]:
    with _ARRIVED_LOCK:
        _ARRIVED[payload["group"]] += 1
    give_up = time.monotonic() + float(payload.get("wait", 10))
    return payload["group"], int(payload["parties"]), give_up


def _all_here(group: str, parties: int, give_up: float) -> bool:
    if time.monotonic() > give_up:
        raise RuntimeError(f"only {_ARRIVED[group]} of {parties} handlers ran at once")
    return _ARRIVED[group] >= parties


def meet(ctx: Context, payload: Any) -> None:
    """A sync handler that waits for its group, then records."""
    waiting = _arrive(payload)
    while not _all_here(*waiting):
        time.sleep(0.01)
    record(ctx, payload)


def meet_traced(ctx: Context, payload: Any) -> None:
    """``traced``, once its whole group has arrived: the group's handlers return together."""
    waiting = _arrive(payload)
    while not _all_here(*waiting):
        time.sleep(0.01)
    traced(ctx, payload)


_MET: collections.defaultdict[str, threading.Event] = collections.defaultdict(threading.Event)


def meet_and_return(ctx: Context, payload: Any) -> None:
    """A sync handler that waits for its group, all of which return at the same moment;
    it records nothing (the worker closes its attempt)."""
    group, parties, give_up = _arrive(payload)
    with _ARRIVED_LOCK:
        met = _MET[group]
        if _ARRIVED[group] >= parties:
            met.set()
    if not met.wait(max(0.0, give_up - time.monotonic())):
        raise RuntimeError(f"only {_ARRIVED[group]} of {parties} handlers ran at once")


async def meet_async(ctx: Context, payload: Any) -> None:
    """An ``async def`` handler that waits for its group on its event loop, then records."""
    waiting = _arrive(payload)
    while not _all_here(*waiting):
        await asyncio.sleep(0.01)
    record(ctx, payload)


def spin(ctx: Context, payload: Any) -> None:
    """Busy in Python code for `seconds`."""
    give_up = time.monotonic() + float(payload.get("seconds", 60))
    while time.monotonic() < give_up:
        pass


def hold(ctx: Context, payload: Any) -> None:
    """Waits (up to 30 s) until the test sets the Redis key ``payload["until"]``, then
    records."""
    client = redis.Redis.from_url(os.environ["DUEJOBS_REDIS_URL"])
    give_up = time.monotonic() + 30
    while not client.exists(payload["until"]) and time.monotonic() < give_up:
        time.sleep(0.02)
    record(ctx, payload)


async def snooze(ctx: Context, payload: Any) -> None:
    """Awaits far past its timeout."""
    await asyncio.sleep(float(payload.get("seconds", 60)))


FORGED = "2026-01-01 00:00:00,000 ERROR duejobs.worker: a forged line"


def forges_a_log_line(ctx: Context, payload: Any) -> None:
    """Fails with an error whose text holds what would read as a log line of its own."""
    raise ValueError(f"refused\n{FORGED}")


def register(app: duejobs.App) -> duejobs.App:
    fast = timedelta(milliseconds=50)
    app.handler("record")(record)
    app.handler("traced", max_attempts=3, backoff=timedelta(milliseconds=50))(traced)
    app.handler("record-loosely")(record_loosely)
    app.handler("fence-idle", max_attempts=3)(fence_idle)
    app.handler("record-async")(record_async)
    for name, flaky_kind in (("flaky", flaky), ("flaky-async", flaky_async)):
        app.handler(name, max_attempts=3, backoff=fast, backoff_cap=timedelta(seconds=1))(
            flaky_kind
        )
    app.handler("slow", timeout=timedelta(seconds=60))(slow)
    app.handler("slow-async", timeout=timedelta(seconds=60))(slow_async)
    app.handler("stall-once", timeout=timedelta(minutes=5))(stall_once)
    app.handler("stall-once-async", timeout=timedelta(minutes=5))(stall_once_async)
    app.handler("stubborn", timeout=timedelta(seconds=1), max_attempts=2)(stubborn)
    app.handler("stubborn-fenced", timeout=timedelta(seconds=1), max_attempts=2)(stubborn_fenced)
    app.handler("meet", max_attempts=1)(meet)
    app.handler("meet-async", max_attempts=1)(meet_async)
    app.handler("meet-and-return", max_attempts=1)(meet_and_return)
    app.handler("meet-traced", max_attempts=1)(meet_traced)
    app.handler("spin", timeout=timedelta(seconds=1), max_attempts=1)(spin)
    app.handler("snooze", timeout=timedelta(seconds=1), max_attempts=1)(snooze)
    app.handler("hold", timeout=timedelta(seconds=60))(hold)
    app.handler("forges-a-log-line", max_attempts=1)(forges_a_log_line)
    app.handler("stubborn-once", timeout=timedelta(seconds=1), max_attempts=1)(stubborn)
    app.handler("stubborn-fenced-once", timeout=timedelta(seconds=1), max_attempts=1)(
        stubborn_fenced
    )
    return app


app = register(duejobs.App()) if os.environ.get("DUEJOBS_DATABASE_URL") else None
