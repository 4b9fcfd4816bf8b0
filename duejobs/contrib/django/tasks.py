"""Django's Tasks framework (``django.tasks`` from Django 6.0, the ``django_tasks`` backport
before it) on duejobs::

    TASKS = {"default": {"BACKEND": "duejobs.contrib.django.tasks.DuejobsBackend"}}

``task.enqueue(...)`` writes a schedule (type ``django.task.<alias>``) through the project's
App — on Django's connection, so inside ``transaction.atomic()`` it commits or rolls back with
the view's work, and ``transaction.on_commit`` is not needed. ``manage.py duejobs_worker``
runs it (with ``duejobs_scheduler`` and ``duejobs_reconcile``, as for any schedule).

What maps:

* ``run_after`` → ``run_at`` (``supports_defer``); no ``run_after`` → due now.
* ``queue_name`` → the RQ queue (``"default"`` → the App's queue, ``DUEJOBS['QUEUE']``); the
  backend's ``QUEUES`` lists the names allowed, as Django's own backends do.
* ``get_result()`` / ``refresh()`` (``supports_get_result``) read the schedule: ``scheduled``
  → READY, ``running`` → RUNNING, ``succeeded`` → SUCCESSFUL, ``failed`` and ``cancelled`` →
  FAILED (a cancelled task carries one error saying so). ``worker_ids``, ``started_at``,
  ``last_attempted_at`` come from its attempts; each failed attempt's exception class and
  traceback are kept as its ``TaskError``.
* The return value is stored as JSON (at most ``OPTIONS['MAX_RESULT_BYTES']``, 64 KiB by
  default), committed with the task's success through the effect fence; a value that is not
  JSON or too large fails the task with an error that says so.
* ``takes_context`` works: the context's ``task_result`` is read when the attempt starts.
* ``async def`` tasks run to completion in the worker (``supports_async_task``).
* Django's signals: ``task_enqueued`` once the schedule is committed (in the caller's process;
  none for an enqueue whose atomic block rolls back),
  ``task_started`` before each attempt and ``task_finished`` after the last one — its success,
  or the failure of its last attempt — in the worker's.
* Attempts: ``OPTIONS['MAX_ATTEMPTS']`` (default 1, Django's own behaviour: an exception fails
  the task), retried with duejobs' backoff when larger; ``OPTIONS['TIMEOUT']`` seconds
  (default 300).

* ``priority`` (Django's range, -100 to 100, higher first; ``supports_priority``) → the
  schedule's priority (:meth:`duejobs.App.schedule`).
"""

from __future__ import annotations

import traceback
import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from duejobs import store
from duejobs.contrib.django import get_app
from duejobs.errors import InvalidScheduleError
from duejobs.models import Schedule, Status
from duejobs.validation import DEFAULT_MAX_PAYLOAD_BYTES, payload_encoder
from duejobs.worker.closing import is_last
from duejobs.worker.context import Context

try:  # Django 6.0 and later
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, exceptions, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # the backport
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, exceptions, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.signals import task_enqueued, task_finished, task_started

# Django 6.1 names it InvalidTask; 6.0 and the backport, InvalidTaskError.
InvalidTaskError = getattr(exceptions, "InvalidTask", None) or exceptions.InvalidTaskError
TaskResultDoesNotExist = exceptions.TaskResultDoesNotExist

__all__ = ["TASK_TYPE", "DuejobsBackend", "TaskResultError"]

TASK_TYPE = "django.task"
_MAX_TRACEBACK = 16_000
_STATUS = {
    Status.SCHEDULED: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
}


class TaskResultError(InvalidScheduleError):
    """A task returned a value that cannot be stored (not JSON, or too large)."""


class DuejobsBackend(BaseTaskBackend):
    """Django's task backend on duejobs (see the module docstring)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.type = f"{TASK_TYPE}.{alias}"
        self.max_result_bytes = int(self.options.get("MAX_RESULT_BYTES", DEFAULT_MAX_PAYLOAD_BYTES))
        self.max_attempts = int(self.options.get("MAX_ATTEMPTS", 1))
        get_app().handler(
            self.type,
            max_attempts=self.max_attempts,
            timeout=timedelta(seconds=float(self.options.get("TIMEOUT", 300))),
        )(self._run)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the task's schedule (in the caller's atomic block, if any)."""
        self.validate_task(task)
        payload = {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        app = get_app()
        queue = None if task.queue_name == DEFAULT_TASK_QUEUE_NAME else task.queue_name
        rank = task.priority
        if task.run_after is None:
            schedule = app.schedule(self.type, payload, delay=0, queue=queue, priority=rank)
        else:
            schedule = app.schedule(
                self.type, payload, run_at=task.run_after, queue=queue, priority=rank
            )
        result = self._result(task, schedule, payload, store.StoredResult(None, [], []))
        # Once the schedule is committed for good: none for an atomic block rolled back.
        app.core.after_commit(lambda: task_enqueued.send(type(self), task_result=result))
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now (``TaskResultDoesNotExist`` for an unknown id)."""
        try:
            schedule_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        app = get_app()
        with app.core.transaction(None) as conn:
            schedule = app.get(schedule_id, conn=conn)
            if schedule is None or schedule.type != self.type:
                raise TaskResultDoesNotExist(result_id)
            stored = store.outcome_of(conn, schedule_id, None)
        payload = schedule.payload
        return self._result(self._task(payload["task"]), schedule, payload, stored)

    def _result(
        self, task: Task, schedule: Schedule, payload: dict[str, Any], stored: store.StoredResult
    ) -> TaskResult:
        errors = [TaskError(**error) for error in stored.errors]
        if schedule.status is Status.CANCELLED:
            errors.append(
                TaskError(
                    exception_class_path="duejobs.errors.ScheduleChangedError",
                    traceback=f"schedule {schedule.id} was cancelled",
                )
            )
        attempts = stored.attempts
        result = TaskResult(
            task=task,
            id=str(schedule.id),
            status=_STATUS[schedule.status],
            enqueued_at=schedule.created_at,
            started_at=attempts[0].started_at if attempts else None,
            finished_at=schedule.finished_at,
            last_attempted_at=attempts[-1].started_at if attempts else None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=errors,
            worker_ids=[a.worker for a in attempts if a.worker],
        )
        object.__setattr__(result, "_return_value", stored.return_value)
        return result

    def _task(self, path: str) -> Task:
        task = import_string(path)
        if not isinstance(task, Task):
            raise InvalidTaskError(f"{path} is not a task (decorate it with @task)")
        return task

    def _run(self, ctx: Context, payload: dict[str, Any]) -> None:
        """The handler of this backend's schedules: call the task, keep what it returned
        (fenced: once, with the success) or what it raised (then raise it again). Sends
        Django's ``task_started`` before each attempt and ``task_finished`` after the last
        (its success, or the failure of its last attempt)."""
        if task_started.has_listeners(type(self)):  # the result read only for a listener
            task_started.send(type(self), task_result=self.get_result(str(ctx.schedule_id)))
        try:
            task = self._task(payload["task"])
            args, kwargs = payload["args"], payload["kwargs"]
            if task.takes_context:
                context = TaskContext(task_result=self.get_result(str(ctx.schedule_id)))
                value = task.call(context, *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            try:
                encoded = payload_encoder(self.max_result_bytes)(value)
            except InvalidScheduleError as exc:
                raise TaskResultError(
                    f"task {payload['task']} returned a value that cannot be stored: {exc} "
                    f"(OPTIONS['MAX_RESULT_BYTES'] is {self.max_result_bytes})"
                ) from exc
        except Exception as exc:
            error = {
                "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "traceback": traceback.format_exc()[-_MAX_TRACEBACK:],
            }
            with ctx.engine.begin() as conn:
                store.add_error(conn, ctx.schedule_id, ctx.tenant, error)
            handler = get_app().core.handler_for(self.type)
            if handler is None or is_last(ctx, handler, exc):
                self._finished(ctx, TaskResultStatus.FAILED)
            raise
        with ctx.transaction() as conn:
            store.save_return_value(conn, ctx.schedule_id, ctx.tenant, encoded)
        self._finished(ctx, TaskResultStatus.SUCCESSFUL)

    def _finished(self, ctx: Context, status: TaskResultStatus) -> None:
        """``task_finished`` with the result as it stands once the worker records it."""
        if not task_finished.has_listeners(type(self)):
            return
        result = self.get_result(str(ctx.schedule_id))
        object.__setattr__(result, "status", status)
        object.__setattr__(result, "finished_at", result.finished_at or timezone.now())
        task_finished.send(type(self), task_result=result)


def register_backends() -> None:
    """Make every configured duejobs backend, so its handler is registered in this process
    (a worker enqueues nothing, yet must run what the web processes enqueue)."""
    from django.conf import settings

    for alias, params in getattr(settings, "TASKS", {}).items():
        if params.get("BACKEND") == f"{__name__}.DuejobsBackend":
            task_backends[alias]
