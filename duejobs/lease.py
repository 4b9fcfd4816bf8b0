"""The lease of a running attempt, and the limits on a handler's time.

:class:`Heartbeat` renews the lease of the attempt running now, so that the reconciler can
tell a slow handler from a dead worker — until the handler's timeout plus its grace has
passed; then it renews no more and calls the attempt's ``overrun`` (which closes the attempt
and ends the process). :func:`time_limit` raises :class:`~duejobs.errors.HandlerTimeoutError`
in the handler at its timeout, and again every second until it returns. Their statements give
up on a row lock after a second: the handler's own ``ctx.transaction()`` may hold it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from duejobs import store
from duejobs.core import Core
from duejobs.errors import HandlerTimeoutError

log = logging.getLogger("duejobs.worker")


@dataclass
class Watched:
    """The attempt running now, and what to do if its handler never returns."""

    schedule_id: uuid.UUID
    version: int
    attempt: int
    give_up_at: float  # monotonic: the handler's timeout plus the grace
    overrun: Callable[[], None]
    renewed_at: float = field(default_factory=time.monotonic)  # the claim set the lease
    fired: bool = False  # the heartbeat gave up on it: the process is ending


class Heartbeat:
    """One thread per worker that renews the lease of the attempt running now — until the
    handler's timeout plus ``timeout_grace`` has passed. Then it renews no more and calls the
    attempt's ``overrun`` (which closes the attempt and ends the process): a handler that
    swallows its timeout can neither keep its lease nor keep the worker."""

    def __init__(self, core: Core, every: timedelta, lease: timedelta) -> None:
        self._core = core
        self._every, self._lease = every, lease
        self._current: Watched | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duejobs-heartbeat", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watching(self, watched: Watched) -> Iterator[None]:
        with self._lock:
            self._current = watched
        self._wake.set()  # time the first renewal from this claim, not from the last beat
        try:
            yield
        finally:
            with self._lock:
                self._current = None
                fired = watched.fired
            if fired:  # the heartbeat is closing this attempt and ending the process
                threading.Event().wait()

    def _run(self) -> None:
        beat = self._every.total_seconds()
        while not self._stop.is_set():
            with self._lock:
                current = self._current
            wait = beat
            if current is not None:
                due = min(current.renewed_at + beat, current.give_up_at)
                wait = max(0.0, due - time.monotonic())
            self._wake.wait(wait)
            self._wake.clear()
            with self._lock:
                current = self._current
                now = time.monotonic()
                if self._stop.is_set() or current is None:
                    continue
                if now >= current.give_up_at:
                    current.fired = True
                elif now < current.renewed_at + beat:
                    continue
            if current.fired:
                current.overrun()
                return
            current.renewed_at = now
            try:
                with self._core.engine.begin() as conn:
                    # never hang behind the handler's own ctx.transaction()
                    store.bounded_locks(conn)
                    store.extend_lease(
                        conn,
                        current.schedule_id,
                        current.version,
                        current.attempt,
                        self._lease,
                    )
            except Exception:  # keep beating; the next beat may reach the database
                log.warning("could not renew the lease of %s", current.schedule_id, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()


@contextlib.contextmanager
def time_limit(limit: timedelta) -> Iterator[None]:
    """Raise :class:`HandlerTimeoutError` in the handler after ``limit``, and again every
    second until it returns (main thread only; the heartbeat's deadline covers the rest)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    armed = True

    def expire(signum: int, frame: Any) -> None:
        if armed:
            raise HandlerTimeoutError(
                f"handler ran past its timeout of {limit.total_seconds():g} s"
            )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit.total_seconds(), 1.0)
    try:
        yield
    finally:
        while True:  # a tick landing in here must not leave the timer armed
            try:
                armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                break
            except HandlerTimeoutError:
                continue
