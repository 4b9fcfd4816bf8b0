"""Handler registrations: which function runs a job type, and its retry policy."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from duejobs.errors import InvalidHandlerError
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
