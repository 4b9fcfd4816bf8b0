"""duejobs: durable delayed and scheduled jobs.

PostgreSQL holds the truth about every schedule (what, when, which version, which state);
Redis, through RQ, only delivers work to workers.

The names below are imported on first use (``from duejobs import App`` as usual), so that a
program that only asks the command line for ``--help`` or ``--version`` loads none of
SQLAlchemy, Redis or RQ.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from duejobs.lazy import lazy_exports

if TYPE_CHECKING:
    from duejobs.app.application import App
    from duejobs.app.async_application import AsyncApp
    from duejobs.app.tasks import Task
    from duejobs.errors import Permanent
    from duejobs.handlers import RetryPolicy
    from duejobs.models import Attempt, Event, EventKind, Page, Schedule, ScheduleRequest, Status
    from duejobs.worker.context import Context

try:
    __version__ = version("duejobs")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# Each public name and the module it lives in.
_HOMES = {
    "App": "duejobs.app.application",
    "AsyncApp": "duejobs.app.async_application",
    "Permanent": "duejobs.errors",
    "RetryPolicy": "duejobs.handlers",
    "Attempt": "duejobs.models",
    "Event": "duejobs.models",
    "EventKind": "duejobs.models",
    "Page": "duejobs.models",
    "Schedule": "duejobs.models",
    "ScheduleRequest": "duejobs.models",
    "Status": "duejobs.models",
    "Task": "duejobs.app.tasks",
    "Context": "duejobs.worker.context",
}

__all__ = [
    "App",
    "AsyncApp",
    "Attempt",
    "Context",
    "Event",
    "EventKind",
    "Page",
    "Permanent",
    "RetryPolicy",
    "Schedule",
    "ScheduleRequest",
    "Status",
    "Task",
]


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
