"""Procrastinate's side of ``bench/peer.py``: its App, on the database named by
``PEER_DATABASE_URL``, and the same 50 ms ``async def`` handler duejobs runs."""

from __future__ import annotations

import asyncio
import os

import procrastinate

from bench.bare_jobs import NAP_SECONDS

# psycopg_pool's default of 4 connections would be Procrastinate's limit at 200 jobs at once;
# 50 lets it open as many as it wants (it opens them only when needed).
app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("PEER_DATABASE_URL", ""), min_size=4, max_size=50
    )
)


@app.task(name="anap")
async def anap() -> None:
    """Waits as a network call would."""
    await asyncio.sleep(NAP_SECONDS)


@app.task(name="noop")
async def noop() -> None:
    """Does nothing: a worker's own start-up and bookkeeping around it."""
