"""The App the soak run's workers serve (`duejobs worker --app bench.soak_app:app`).

Its handlers apply their effect as the fault-injection run's do (``bench.chaos_app``): one
row in ``chaos_effects`` through ``ctx.transaction()``, with the version and the due time
the attempt was claimed for — what the run's invariants are checked against. ``soak-flaky``
fails its first attempt; ``soak-async`` is an async handler, served by a worker of its own on
the ``soak-async`` queue.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import duejobs
from bench.chaos_app import apply
from duejobs.worker import Context

ASYNC_QUEUE = "soak-async"


def flaky(ctx: Context, payload: Any) -> None:
    """Fails its first attempt (a retry), then applies."""
    if ctx.attempt == 1:
        raise RuntimeError("transient failure on the first attempt")
    apply(ctx, payload)


async def apply_async(ctx: Context, payload: Any) -> None:
    """An async handler: a pause on the event loop, then the effect."""
    await asyncio.sleep(0.001)
    apply(ctx, payload)


def register(app: duejobs.App) -> duejobs.App:
    app.handler("soak")(apply)
    app.handler("soak-flaky", max_attempts=4, backoff=timedelta(milliseconds=200))(flaky)
    app.handler("soak-async", queue=ASYNC_QUEUE)(apply_async)
    return app


app = register(duejobs.App()) if os.environ.get("DUEJOBS_DATABASE_URL") else None
