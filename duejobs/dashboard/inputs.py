"""What the pages read from a request's text: a number, a schedule id, a reschedule's new time
— each None, or the App's own refusal, for text that is not one."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from duejobs.errors import InvalidScheduleError
from duejobs.timespec import parse_duration


def when_given(text: str) -> dict[str, Any]:
    """A reschedule's new time as the form gives it: a delay from now (``30m``, ``1h30m``)
    or an ISO 8601 time with its offset."""
    if not text:
        raise InvalidScheduleError("give the new time: a delay such as 30m, or an ISO 8601 time")
    try:
        return {"run_at": datetime.fromisoformat(text)}
    except ValueError:
        return {"delay": parse_duration(text, "the new time")}


def number(text: str) -> int | None:
    """A page or an event id from a query: ASCII digits that fit a bigint, else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def schedule_id_in(text: str) -> uuid.UUID | None:
    """A schedule id from a path, else None (the page answers 404)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
