"""The App the fault-injection run's workers serve (`duejobs worker --app bench.chaos_app:app`).

Every handler applies its effect through ``ctx.transaction()``: one row in ``chaos_effects``
carrying the schedule's version, the database time it was applied at and the due time the
attempt was claimed for — what the run's invariants are checked against.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import text

import duejobs
from duejobs.worker import Context

EFFECTS = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    effect_key  text NOT NULL,
    schedule_id uuid NOT NULL,
    version     integer NOT NULL,
    attempt     integer NOT NULL,
    due_at      timestamptz NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_APPLY = text(
    "INSERT INTO chaos_effects (effect_key, schedule_id, version, attempt, due_at) "
    "SELECT :key, id, :version, :attempt, due_at FROM scheduled_jobs WHERE id = :id"
)


def apply(ctx: Context, payload: Any) -> None:
    """The effect, exactly once per (schedule, version) through the fence."""
    with ctx.transaction() as conn:
        conn.execute(
            _APPLY,
            {
                "key": ctx.effect_key,
                "id": ctx.schedule_id,
                "version": ctx.version,
                "attempt": ctx.attempt,
            },
        )


def flaky(ctx: Context, payload: Any) -> None:
    """Fails its first ``fail_times`` attempts, then applies."""
    if ctx.attempt <= int(payload.get("fail_times", 1)):
        raise RuntimeError(f"transient failure on attempt {ctx.attempt}")
    apply(ctx, payload)


def slow(ctx: Context, payload: Any) -> None:
    """Takes a while first, so that kills land mid-handler."""
    time.sleep(float(payload.get("seconds", 1)))
    apply(ctx, payload)


def register(app: duejobs.App) -> duejobs.App:
    quick = timedelta(milliseconds=100)
    app.handler("chaos")(apply)
    app.handler("chaos-flaky", max_attempts=6, backoff=quick, backoff_cap=timedelta(seconds=1))(
        flaky
    )
    app.handler("chaos-slow", timeout=timedelta(seconds=30))(slow)
    return app


app = register(duejobs.App()) if os.environ.get("DUEJOBS_DATABASE_URL") else None
