"""The orders service's jobs: one App with its handlers, for the worker and for the web app.

Run the worker with ``duejobs worker --app examples.jobs:app`` (the URLs come from
``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

import duejobs
from duejobs.context import Context

ORDERS_TABLE = """
CREATE TABLE IF NOT EXISTS example_orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text NOT NULL,
    reminder_id uuid,
    reminded_at timestamptz
)
"""

app = duejobs.App()


@app.handler("order-reminder", max_attempts=5)
def remind(ctx: Context, payload: dict[str, Any]) -> None:
    """Mark the order reminded, exactly once: the update commits with the schedule's success
    (a real service would also call its mail provider here, after ``ctx.ensure_current()``)."""
    with ctx.transaction() as conn:
        conn.execute(
            text("UPDATE example_orders SET reminded_at = now() WHERE id = :id"),
            {"id": payload["order_id"]},
        )
