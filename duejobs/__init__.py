"""duejobs: durable delayed and scheduled jobs.

PostgreSQL holds the truth about every schedule (what, when, which version, which state);
Redis, through RQ, only delivers work to workers.

The names below are imported on first use (``from duejobs import App`` as usual), so that a
program that only asks the command line for ``--help`` or ``--version`` loads none of
SQLAlchemy, Redis or RQ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from duejobs.lazy import lazy_exports

if TYPE_CHECKING:
    from duejobs.app.application import App
    from duejobs.app.async_application import AsyncApp
    from duejobs.app.tasks import Task
    from duejobs.errors import Permanent
    from duejobs.handlers import RetryPolicy
    from duejobs.models import Attempt, Event, EventKind, Page, Schedule, ScheduleRequest, Status
    from duejobs.worker.context import Context

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


_exported, __dir__ = lazy_exports(__name__, _HOMES, globals())


def __getattr__(name: str) -> Any:
    """A public name, or ``__version__``, read from the installed package's metadata on first
    use (importing ``importlib.metadata`` costs a worker's start-up about 20 ms)."""
    if name != "__version__":
        return _exported(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("duejobs")
    except PackageNotFoundError:  # a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
