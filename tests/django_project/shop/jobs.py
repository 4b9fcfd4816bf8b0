"""The shop's handlers, found by duejobs' application at startup."""

from typing import Any

from django.db.models import F

from duejobs.context import Context
from duejobs.contrib.django import app, fenced
from tests.django_project.shop.models import Order


@app.handler("shop.remind", max_attempts=1)
def remind(ctx: Context, payload: dict[str, Any]) -> None:
    """Count the reminder on the order through the ORM, exactly once (fenced)."""
    with fenced(ctx):
        Order.objects.filter(id=payload["order_id"]).update(reminded=F("reminded") + 1)


@app.handler("shop.cancelled-meanwhile", max_attempts=1)
def cancelled_meanwhile(ctx: Context, payload: dict[str, Any]) -> None:
    """Cancelled (as another process would) before its fence: its ORM write must not stay."""
    app.cancel(ctx.schedule_id)
    with fenced(ctx):
        Order.objects.filter(id=payload["order_id"]).update(reminded=F("reminded") + 1)
