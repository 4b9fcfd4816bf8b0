"""An orders service on FastAPI that schedules a reminder in the same transaction as the order.

``uvicorn examples.fastapi_app:api`` (with ``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL``
set, and ``duejobs migrate`` run once). The lifespan builds the ``AsyncApp`` from the App in
:mod:`examples.jobs`, whose handlers the worker runs: ``duejobs worker --app examples.jobs:app``.

* ``POST /orders`` inserts the order and schedules its reminder in one transaction: the order
  commits with its reminder, or neither exists (``"fail": true`` raises after both were
  written, to show the rollback).
* ``GET /orders/{id}/reminder`` reads the reminder's schedule; ``DELETE`` cancels it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import duejobs
from examples.jobs import ORDERS_TABLE, app


class Order(BaseModel):
    customer: str
    remind_in_seconds: float = Field(default=3600, ge=0)
    fail: bool = False


@contextlib.asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    engine = create_async_engine(app.settings.database_url)
    async with engine.begin() as conn:
        await conn.execute(text(ORDERS_TABLE))
    async with duejobs.AsyncApp(app) as jobs:
        api.state.engine, api.state.jobs = engine, jobs
        yield
    await engine.dispose()


api = FastAPI(lifespan=lifespan)


def _parts(request: Request) -> tuple[AsyncEngine, duejobs.AsyncApp]:
    return request.app.state.engine, request.app.state.jobs


@api.post("/orders", status_code=201)
async def place_order(order: Order, request: Request) -> dict[str, Any]:
    engine, jobs = _parts(request)
    async with engine.begin() as conn:
        order_id = await conn.scalar(
            text("INSERT INTO example_orders (customer) VALUES (:c) RETURNING id"),
            {"c": order.customer},
        )
        reminder = await jobs.schedule(
            "order-reminder",
            {"order_id": order_id},
            delay=order.remind_in_seconds,
            key=f"order-reminder:{order_id}",
            conn=conn,
        )
        await conn.execute(
            text("UPDATE example_orders SET reminder_id = :r WHERE id = :id"),
            {"r": reminder.id, "id": order_id},
        )
        if order.fail:
            raise HTTPException(500, "failed after scheduling: the order and reminder roll back")
    return {"order_id": order_id, "reminder_id": str(reminder.id)}


@api.get("/orders/{order_id}/reminder")
async def reminder(order_id: int, request: Request) -> dict[str, Any]:
    engine, jobs = _parts(request)
    reminder_id, reminded_at = await _order(engine, order_id)
    schedule = await jobs.get(reminder_id)
    assert schedule is not None  # written with the order
    return {
        "reminder_id": str(schedule.id),
        "status": schedule.status.value,
        "run_at": schedule.run_at.isoformat(),
        "reminded_at": reminded_at and reminded_at.isoformat(),
    }


@api.delete("/orders/{order_id}/reminder")
async def cancel_reminder(order_id: int, request: Request) -> dict[str, Any]:
    engine, jobs = _parts(request)
    reminder_id, _ = await _order(engine, order_id)
    return {"cancelled": await jobs.cancel(reminder_id)}


async def _order(engine: AsyncEngine, order_id: int) -> tuple[Any, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT reminder_id, reminded_at FROM example_orders WHERE id = :id"),
                {"id": order_id},
            )
        ).one_or_none()
    if row is None:
        raise HTTPException(404, f"no order {order_id}")
    return row.reminder_id, row.reminded_at
