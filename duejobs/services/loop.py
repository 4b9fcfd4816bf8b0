"""The loop every background service runs: the scheduler, the reconciler and the pruner.

Each service has a ``run_once()`` that does one pass and returns what it did (tests call it
directly), and a ``run()`` that hands it to :func:`run_forever`.

What the loop promises: a pass that raises — an outage of PostgreSQL or Redis, or a bug that
one tenant's data set off — never ends the loop. It is counted (the service's
``..._failed_passes_total``), logged (with its traceback unless it is an outage) and followed
by another pass after a wait that doubles from the service's interval up to its cap, however
long the outage lasts; the first pass that succeeds afterwards is logged as a recovery.
:meth:`Loop.stop` (SIGTERM/SIGINT in the CLI) ends the loop at its next wait, never in the
middle of a pass.

Passes keep their rate: the next pass starts the service's pause (which it says from what
the pass returned) after the previous one *started*, at once if that pass took longer — so a
bound stated as "within the lease plus ``--every``" holds however long a pass takes.

What it does not promise: passes that never overlap a slow one's time (a pass longer than
the pause is followed at once by the next, never run beside it).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from prometheus_client import Counter

from duejobs.errors import redis_said
from duejobs.redis_urls import redis_failures
from duejobs.store import dbapi

R = TypeVar("R")


def backoff(interval: timedelta, cap: timedelta, failures: int) -> float:
    """Seconds to wait after ``failures`` failed passes in a row: ``interval`` doubled per
    failure, never more than ``cap`` (the exponent is bounded, so no overflow)."""
    doubled = interval.total_seconds() * 2.0 ** min(failures, 32)
    return min(cap.total_seconds(), doubled)


class StopRequest:
    """A request to stop that a signal handler may make, and a wait that it ends.

    A ``threading.Event`` cannot be set from a signal handler: Python runs the handler in the
    main thread between two bytecodes, possibly while that thread is inside the event's own
    ``wait()`` holding the lock ``set()`` takes, and the process then hangs on SIGTERM for good.
    Making the request here takes no lock: a flag, and a token put on a ``SimpleQueue``, whose
    ``put()`` is reentrant by contract and wakes a ``get()`` under way.

    A signal can still land after the wait looked at the flag and before it blocks: Python
    then runs the handler only once the blocking call returns, so the wait is made of slices
    of at most ``WAIT_SLICE`` seconds, each of which looks at the flag again — a stop is seen
    within that, whatever instant it lands."""

    WAIT_SLICE = 0.5

    def __init__(self) -> None:
        self._asked = False
        self._nudged = False
        self._wakeup: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def set(self) -> None:
        self._asked = True
        self._wakeup.put(True)

    def is_set(self) -> bool:
        return self._asked

    def _drop_nudges(self) -> None:
        """Take the nudges' tokens off the queue (a stop's is put back), so they never pile
        up however many nudges come."""
        while True:
            try:
                stop = self._wakeup.get_nowait()
            except queue.Empty:
                return
            if stop:
                self._wakeup.put(True)
                return

    def nudge(self) -> None:
        """End the next (or current) wait made ``nudgeable``, without a stop; nudges made
        before it ends count as one. From one thread, not a signal handler."""
        if not self._nudged:
            self._nudged = True
            self._wakeup.put(False)

    def wait(self, seconds: float, nudgeable: bool = False) -> bool:
        """Wait up to ``seconds``, less if the request comes (or, ``nudgeable``, a nudge);
        whether the request has come."""
        deadline = time.monotonic() + seconds
        while not self._asked:
            if nudgeable and self._nudged:
                self._nudged = False
                self._drop_nudges()
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                stop = self._wakeup.get(timeout=min(left, self.WAIT_SLICE))
            except queue.Empty:
                continue
            if stop:
                self._wakeup.put(True)  # the request stays made for any other waiter
        return self._asked


class Loop:
    """A service's loop: its name, logger and failure counter, and the request that stops it
    (safe to make from a signal handler)."""

    def __init__(self, name: str, log: logging.Logger, failed: Counter) -> None:
        self.name, self.log, self.failed = name, log, failed
        self._stopping = StopRequest()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """End the loop at its next wait; a pass under way finishes. Safe in a signal handler."""
        self._stopping.set()

    def wait(self, seconds: float, nudgeable: bool = False) -> None:
        """Wait up to ``seconds``, less once stopped (or, ``nudgeable``, nudged)."""
        self._stopping.wait(seconds, nudgeable)

    def nudge(self) -> None:
        """Start the next pass now if the loop waits after a pass that succeeded (or once
        the pass under way ends); a wait after a failure keeps its backoff."""
        self._stopping.nudge()

    def run_forever(
        self,
        run_once: Callable[[], R],
        pause: Callable[[R], timedelta],
        interval: timedelta,
        cap: timedelta,
        report: Callable[[R], None] | None = None,
    ) -> None:
        """Pass after pass until :meth:`stop`: after a pass, ``report`` its result and wait
        until ``pause(result)`` after the pass started; after a failure (of the pass or of
        its report), wait :func:`backoff` of the failures in a row."""
        failures = 0
        while not self.stopping:
            started = time.monotonic()
            try:
                result = run_once()
                if report is not None:  # its figures may read Redis and PostgreSQL too
                    report(result)
            except Exception as exc:  # an outage, or a bug one row's data set off: go on
                self.failed.inc()
                failures += 1
                wait = backoff(interval, cap, failures)
                outage = isinstance(exc, (dbapi.SQLAlchemyError, *redis_failures()))
                self.log.warning(
                    "%s pass failed (%s); retrying in %.1f s",
                    self.name,
                    redis_said(exc) if isinstance(exc, redis_failures()) else exc,
                    wait,
                    exc_info=not outage,
                )
                self.wait(wait)
                continue
            if failures:
                self.log.info("%s recovered after %d failed passes", self.name, failures)
            failures = 0
            left = pause(result).total_seconds() - (time.monotonic() - started)
            self.wait(max(0.0, left), nudgeable=True)
