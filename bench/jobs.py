"""Job functions and the duejobs App the benchmarks run in worker processes."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

import duejobs
from bench.bare_jobs import NAP_SECONDS
from duejobs.worker import Context


def noop(*args: Any) -> None:
    """The bare RQ job: does nothing."""


def stamp(target: float) -> None:
    """The bare RQ job of the lag benchmark: records how late it started (seconds)."""
    started = time.time()
    client = redis.Redis.from_url(os.environ["DUEJOBS_REDIS_URL"])
    client.rpush("bench:rq-lag", started - target)


def _noop_handler(ctx: Context, payload: Any) -> None:
    """The duejobs handler: nothing but duejobs' own bookkeeping around it."""


def _nap_handler(ctx: Context, payload: Any) -> None:
    """The duejobs handler standing for a network call."""
    time.sleep(NAP_SECONDS)


async def _async_nap_handler(ctx: Context, payload: Any) -> None:
    """The same network call, awaited."""
    await asyncio.sleep(NAP_SECONDS)


app = duejobs.App() if os.environ.get("DUEJOBS_DATABASE_URL") else None
if app is not None:
    app.handler("noop")(_noop_handler)
    app.handler("nap")(_nap_handler)
    app.handler("anap")(_async_nap_handler)
