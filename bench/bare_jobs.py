"""The bare RQ jobs of the worker-slot benchmarks, in a module that imports nothing heavy:
RQ's default worker imports a job's module in each forked work horse, so a heavy import
there would be counted against RQ."""

from __future__ import annotations

import time
from typing import Any

NAP_SECONDS = 0.05  # a network call


def noop(*args: Any) -> None:
    """Does nothing."""


def nap(*args: Any) -> None:
    """Waits as a network call would."""
    time.sleep(NAP_SECONDS)
