"""Task objects: a handler and the way to schedule it under one name, as Celery's,
Procrastinate's and ``django.tasks``' users write them.

::

    @app.task("reminders.send", max_attempts=3, queue="emails")
    def send_reminder(ctx: Context, payload: Reminder) -> None: ...

    send_reminder.schedule({"user": 7}, delay=timedelta(minutes=30), key="user-7")

``@app.task`` registers the function as :meth:`App.handler <duejobs.App.handler>` does (the
same options) and returns a :class:`Task`: calling it runs the function (a test can call it
with a context of its own), ``.schedule`` / ``.schedule_many`` / ``.request`` write schedules
of its type through the App it was declared on, with the payload typed by the function's
second parameter for a type checker. ``app.schedule("reminders.send", ...)`` keeps working.

Without a name the type is ``module.function`` (``billing.tasks.send_reminder``): moving or
renaming the function then changes the type, and the schedules already written under the old
one find no handler — name types that outlive a refactoring.

Promises: a Task writes exactly what ``app.schedule(task.type, ...)`` writes, with the same
checks and refusals; it holds no state of its own beyond its App, type and function.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, Unpack, overload

from duejobs.core import Conn
from duejobs.models import Schedule, ScheduleRequest

if TYPE_CHECKING:
    from duejobs.worker.context import Context

P = TypeVar("P")
F = TypeVar("F", bound=Callable[..., Any])
Duration = timedelta | float


class Writes(Protocol):
    """What a Task needs of its App (the App itself: named so this module imports none)."""

    def handler(self, job_type: str, **options: Any) -> Callable[[F], F]: ...

    def schedule(self, job_type: str, payload: Any, **options: Any) -> Schedule: ...

    def schedule_many(
        self, requests: Iterable[ScheduleRequest], *, conn: Conn | None = None
    ) -> list[uuid.UUID]: ...

    def declare_recurring(self, name: str, *, cron: str, type: str, timezone: str) -> None: ...


class When(TypedDict, total=False):
    """When and how a task's schedule is written: :meth:`App.schedule
    <duejobs.App.schedule>`'s keyword arguments."""

    delay: Duration | None
    run_at: datetime | None
    timezone: str | None
    key: str | None
    tenant: str | None
    jitter: Duration | None
    expires_after: Duration | None
    queue: str | None
    priority: int | None


@dataclass(frozen=True)
class Task(Generic[P]):
    """A registered handler of type ``type``, and the way to schedule it."""

    app: Writes
    type: str
    func: Callable[[Context, P], Any]

    def __call__(self, ctx: Context, payload: P) -> Any:
        """Run the function itself, as a worker would (no schedule involved)."""
        return self.func(ctx, payload)

    def schedule(
        self, payload: P, *, conn: Conn | None = None, **options: Unpack[When]
    ) -> Schedule:
        """:meth:`App.schedule <duejobs.App.schedule>` of this task's type (the same
        keyword arguments: ``delay``/``run_at``, ``timezone``, ``key``, ``tenant``,
        ``jitter``, ``expires_after``, ``queue``, ``priority``)."""
        return self.app.schedule(self.type, payload, conn=conn, **options)

    def request(self, payload: P, **options: Unpack[When]) -> ScheduleRequest:
        """A request of this task's type for :meth:`App.schedule_many
        <duejobs.App.schedule_many>`, when each schedule of a batch has options of its own."""
        return ScheduleRequest(self.type, payload, **options)

    def schedule_many(
        self, payloads: Iterable[P], *, conn: Conn | None = None, **options: Unpack[When]
    ) -> list[uuid.UUID]:
        """One schedule of this task's type per payload, all with the same options, at once
        and all or nothing (:meth:`App.schedule_many <duejobs.App.schedule_many>`)."""
        return self.app.schedule_many((self.request(p, **options) for p in payloads), conn=conn)


class TaskAPI:
    """The App's ``task`` decorator (its options are :meth:`App.handler`'s)."""

    @overload
    def task(self, name: Callable[[Context, P], Any], /) -> Task[P]: ...

    @overload
    def task(
        self,
        name: str | None = None,
        /,
        *,
        cron: str | None = None,
        timezone: str = "UTC",
        **options: Any,
    ) -> Callable[[Callable[[Context, P], Any]], Task[P]]: ...

    def task(
        self,
        name: str | Callable[[Context, P], Any] | None = None,
        /,
        *,
        cron: str | None = None,
        timezone: str = "UTC",
        **options: Any,
    ) -> Task[P] | Callable[[Callable[[Context, P], Any]], Task[P]]:
        """Register a function as the handler of a type and return it as a :class:`Task`:
        ``@app.task``, ``@app.task("type")`` or ``@app.task("type", max_attempts=3, ...)``
        with :meth:`App.handler`'s options (refused the same way). The type defaults to
        ``module.function``. With ``cron`` (and ``timezone``, default UTC), it also declares
        a recurring definition of that name running the task with an empty payload
        (:meth:`App.declare_recurring`), written when a service with ``--app`` starts."""
        app: Writes = self  # type: ignore[assignment]  # a mixin of the App only
        if callable(name):
            return self.task()(name)

        def declare(func: Callable[[Context, P], Any]) -> Task[P]:
            job_type = name if name is not None else f"{func.__module__}.{func.__qualname__}"
            app.handler(job_type, **options)(func)
            if cron is not None:
                app.declare_recurring(job_type, cron=cron, type=job_type, timezone=timezone)
            return Task(app, job_type, func)

        return declare
