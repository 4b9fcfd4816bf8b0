"""duejobs: durable delayed and scheduled jobs.

PostgreSQL holds the truth about every schedule (what, when, which version, which state);
Redis, through RQ, only delivers work to workers.
"""

from importlib.metadata import PackageNotFoundError, version

from duejobs.app import App
from duejobs.async_app import AsyncApp
from duejobs.errors import Permanent
from duejobs.handlers import RetryPolicy
from duejobs.models import Attempt, Event, EventKind, Page, Schedule, ScheduleRequest, Status

try:
    __version__ = version("duejobs")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "App",
    "AsyncApp",
    "Attempt",
    "Event",
    "EventKind",
    "Page",
    "Permanent",
    "RetryPolicy",
    "Schedule",
    "ScheduleRequest",
    "Status",
]
