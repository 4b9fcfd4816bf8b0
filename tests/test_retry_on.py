"""Which failures are retried (``App.handler(retry_on=, never_retry=)``, ``duejobs.Permanent``):
by default every exception until ``max_attempts``; ``retry_on`` only the classes it names;
``never_retry`` and ``Permanent`` fail the schedule at once, whatever attempts are left.

Seen failing against a worker that retried every failure (the policy's classes ignored)."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable
from typing import Any

import pytest

from duejobs import Permanent, Status
from duejobs.errors import InvalidHandlerError
from duejobs.worker import Outcome
from tests.support.slots import slots as slots
from tests.support.system import System

_TYPES = itertools.count()


class Flaky(ConnectionError):
    """A network failure of the handler's own kind."""


def _failing_once(system: System, raised: BaseException, **options: Any) -> tuple[Outcome, Any]:
    """A schedule of a new type whose handler raises ``raised``, run once: the outcome, and
    the row after it."""
    job_type = f"raises-{next(_TYPES)}"

    @system.app.handler(job_type, max_attempts=3, **options)
    def raises(ctx: Any, payload: Any) -> None:
        raise raised

    s = system.app.schedule(job_type, {}, delay=0)
    outcome = system.runtime.handle(s.id, 1, 1, "default")
    return outcome, system.app.get(s.id)


def test_every_failure_is_retried_by_default(system: System) -> None:
    outcome, stored = _failing_once(system, ValueError("bad"))
    assert outcome is Outcome.RETRYING and stored.status is Status.SCHEDULED


def test_a_failure_of_a_class_retry_on_names_is_retried(system: System) -> None:
    outcome, stored = _failing_once(system, Flaky("reset"), retry_on=(ConnectionError,))
    assert outcome is Outcome.RETRYING and stored.status is Status.SCHEDULED


def test_a_failure_retry_on_does_not_name_fails_at_once(system: System) -> None:
    outcome, stored = _failing_once(system, ValueError("bad input"), retry_on=ConnectionError)
    assert outcome is Outcome.FAILED and stored.status is Status.FAILED
    assert stored.last_error == "ValueError: bad input" and stored.attempts == 1


def test_a_failure_never_retry_names_fails_at_once(system: System) -> None:
    outcome, stored = _failing_once(system, KeyError("gone"), never_retry=(KeyError,))
    assert outcome is Outcome.FAILED and stored.status is Status.FAILED


def test_permanent_fails_at_once_whatever_retry_on_says(system: System) -> None:
    outcome, stored = _failing_once(system, Permanent("card refused"), retry_on=(Exception,))
    assert outcome is Outcome.FAILED and stored.status is Status.FAILED
    assert stored.last_error == "Permanent: card refused"


@pytest.mark.parametrize(
    "raised",
    [SystemExit(3), KeyboardInterrupt("handler's own"), asyncio.CancelledError("awaited")],
    ids=type,
)
def test_a_handler_raising_a_base_exception_follows_its_retry_rules(
    system: System, raised: BaseException
) -> None:
    """``sys.exit()``, a ``KeyboardInterrupt`` or a ``CancelledError`` out of a handler fail
    its attempt as any other error would, named in ``last_error``. Seen failing with them
    raised out of the worker, the row left running until its lease expired."""
    outcome, stored = _failing_once(system, raised)
    assert outcome is Outcome.RETRYING and stored.status is Status.SCHEDULED
    assert stored.last_error == f"{type(raised).__name__}: {raised}" and stored.attempts == 1


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_worker_goes_on_after_a_handler_calls_sys_exit(
    system: System, slots: Callable[[int], None], concurrency: int
) -> None:
    """The worker outlives a handler's ``sys.exit()``, at one slot and at several: the job
    after it runs. Seen failing with the worker ended by it."""
    system.app.handler("exits", max_attempts=1)(lambda ctx, payload: sys.exit(1))
    exits = system.app.schedule("exits", {}, delay=0)
    after = system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    slots(concurrency)
    assert (system.status(exits.id), system.status(after.id)) == ("failed", "succeeded")


@pytest.mark.parametrize(
    ("name", "value"), [("retry_on", "ValueError"), ("never_retry", (KeyError, 3))]
)
def test_a_policy_naming_something_other_than_an_exception_class_is_refused(
    system: System, name: str, value: object
) -> None:
    with pytest.raises(InvalidHandlerError, match=name):
        system.app.handler("never-registered", **{name: value})
    assert system.app.handler_for("never-registered") is None


class Unprintable(ValueError):
    """An exception whose text cannot be made: its ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_exception_whose_str_raises_closes_the_attempt_by_the_retry_policy(
    system: System,
) -> None:
    outcome, stored = _failing_once(system, Unprintable())
    assert outcome is Outcome.RETRYING and stored.status is Status.SCHEDULED
    assert stored.last_error.startswith("Unprintable: <its str() raised RuntimeError>")
    outcome, stored = _failing_once(system, Unprintable(), never_retry=(Unprintable,))
    assert outcome is Outcome.FAILED and stored.status is Status.FAILED
