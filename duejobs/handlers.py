"""Handler registrations: which function runs a job type, and its retry policy.

Which failures are retried: by default every exception a handler raises, and a timeout, until
``max_attempts``. ``retry_on`` narrows that to the exception classes it names (a timeout is
:class:`~duejobs.errors.HandlerTimeoutError`: name it to have timeouts retried);
``never_retry`` names classes that fail the schedule at once, and so does
:class:`~duejobs.errors.Permanent` raised by the handler, whatever the two say.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from duejobs.errors import InvalidHandlerError, Permanent
from duejobs.timespec import MAX_DURATION


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing attempt is retried: exponential backoff with full jitter, capped.

    A retry is another attempt of the same (schedule, version); it never moves ``run_at``.
    """

    max_attempts: int = 5
    backoff: timedelta = timedelta(seconds=1)
    backoff_cap: timedelta = timedelta(minutes=10)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise InvalidHandlerError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise InvalidHandlerError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.backoff <= timedelta(0) or self.backoff_cap < self.backoff:
            raise InvalidHandlerError("backoff must be positive and backoff_cap >= backoff")
        if self.backoff_cap > MAX_DURATION:
            raise InvalidHandlerError(
                f"backoff_cap must be at most 100 years, got {self.backoff_cap}"
            )

    def delay_before(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Wait before attempt number ``attempt + 1``, uniformly drawn in [0, ceiling]."""
        ceiling = min(self.backoff_cap, self.backoff * (1 << max(attempt - 1, 0)))
        fraction: float = (rng or random).random()
        return ceiling * fraction


@dataclass(frozen=True)
class Handler:
    """A registered handler: ``func(ctx, payload)`` for schedules of ``type``."""

    type: str
    func: Callable[..., Any]
    retry: RetryPolicy
    timeout: timedelta
    jitter: timedelta = timedelta(0)
    queue: str | None = None  # None: the App's queue
    # The exception classes retried (None: every one), and those never retried.
    retry_on: tuple[builtins.type[BaseException], ...] | None = None
    never_retry: tuple[builtins.type[BaseException], ...] = ()
    priority: int = 0  # its schedules' unless a call gives its own

    def retries(self, error: BaseException) -> bool:
        """Whether an attempt that failed with ``error`` may be retried (attempts left
        permitting): see the module docstring."""
        if self.refuses(error):
            return False
        return self.retry_on is None or isinstance(error, self.retry_on)

    def refuses(self, error: BaseException) -> bool:
        """Whether ``error`` fails the schedule at once, whatever else happened
        (``Permanent``, ``never_retry``): not even a broken connection retries it."""
        return isinstance(error, (Permanent, *self.never_retry))


def exception_classes(name: str, value: object) -> tuple[type[BaseException], ...]:
    """``retry_on``/``never_retry`` as given (one class or several), checked."""
    classes = value if isinstance(value, tuple | list) else (value,)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise InvalidHandlerError(f"{name} takes exception classes, got {cls!r}")
    return tuple(classes)
