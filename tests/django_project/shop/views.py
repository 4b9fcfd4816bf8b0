"""A view as docs/django.md writes one: the App imported at module level."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from duejobs.contrib.django import app


def remind(request: HttpRequest, order_id: int) -> JsonResponse:
    with transaction.atomic():
        schedule = app.schedule("shop.remind", {"order_id": order_id}, delay=3600)
    return JsonResponse({"schedule": str(schedule.id)})
