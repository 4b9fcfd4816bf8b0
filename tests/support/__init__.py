"""What the tests share beyond the fixtures of ``tests/conftest.py``, one module a concern:
the session's servers, the test handlers (``apps``), the scheduler-and-worker ``System``,
processes, plans, deliveries, and servers of their own (a connection pooler, Sentinels, a
replica) started and stopped by the tests that need them. No test module imports another."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import REGISTRY


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.1 s until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def sample(name: str, **labels: str) -> float:
    """A metric's current value in this process, read as Prometheus would (0 if unset)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
