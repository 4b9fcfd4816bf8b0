"""The limits on a handler's time.

:func:`time_limit` raises :class:`~duejobs.errors.HandlerTimeoutError` in the handler at its
timeout, and again every second until it returns. In the main thread a ``SIGALRM`` timer
does it; in a worker's slots one thread watches every slot's limit and sets the timeout as
the slot thread's pending exception.

What it does not promise: interrupting a blocking C call in a slot thread (a ``time.sleep``,
a socket read without a timeout) — the exception is raised when that call returns, and the
heartbeat's deadline (the handler's timeout plus ``timeout_grace``) covers the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from duejobs.errors import HandlerTimeoutError


@contextlib.contextmanager
def time_limit(limit: timedelta) -> Iterator[None]:
    """Raise :class:`HandlerTimeoutError` in the handler after ``limit``, and again every
    second until it returns.

    In the main thread a ``SIGALRM`` timer raises it, interrupting even a blocking call. In a
    worker slot (another thread) it is set as the thread's pending exception, which Python
    raises at the handler's next bytecode: a handler blocked inside one long C call (a
    ``time.sleep``, a socket read without a timeout) sees it only when that call returns, and
    the heartbeat's deadline covers the rest."""
    message = f"handler ran past its timeout of {limit.total_seconds():g} s"
    if threading.current_thread() is threading.main_thread():
        with _alarm(limit, message):
            yield
    else:
        with _pending_exception(limit, message):
            yield


@contextlib.contextmanager
def _alarm(limit: timedelta, message: str) -> Iterator[None]:
    armed = True

    def expire(signum: int, frame: Any) -> None:
        if armed:
            raise HandlerTimeoutError(message)

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


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Make ``exc`` the thread's pending exception (None: clear one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class _Limit:
    """One slot's time limit: the thread to interrupt and the message to raise there."""

    def __init__(self, target: int, message: str) -> None:
        self.target, self.message = target, message
        self.lock = threading.Lock()
        self.armed = True

    def fire(self) -> bool:
        """Make the timeout the target thread's pending exception, while armed (whether it
        still is: then it is raised again a second later)."""
        with self.lock:
            if self.armed:
                message = self.message
                # Python raises a pending exception by calling its class without arguments.
                timed_out = type(
                    "HandlerTimeoutError",
                    (HandlerTimeoutError,),
                    {"__init__": lambda self: HandlerTimeoutError.__init__(self, message)},
                )
                _set_async_exc(self.target, timed_out)
            return self.armed


class _Deadlines:
    """One thread watching the time limits of every slot of the process (a thread per
    handler would cost its start and its end on each job): a heap of deadlines, the next
    one waited for. A disarmed limit stays in the heap until the heap is compacted, once
    more than half of it is disarmed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Limit]] = []
        self._order = itertools.count()
        self._disarmed = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, limit: _Limit, seconds: float) -> None:
        with self._changed:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._order), limit))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="duejobs-time-limits", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is limit:
                self._changed.notify()

    def disarmed(self) -> None:
        with self._changed:
            self._disarmed += 1
            if self._disarmed > 64 and 2 * self._disarmed > len(self._heap):
                self._heap = [entry for entry in self._heap if entry[2].armed]
                heapq.heapify(self._heap)
                self._disarmed = 0

    def _watch(self) -> None:
        with self._changed:
            while True:
                if not self._heap:
                    self._changed.wait()
                    continue
                at, _, limit = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0 and limit.armed:
                    self._changed.wait(wait)
                    continue
                heapq.heappop(self._heap)
                if not limit.armed:
                    self._disarmed = max(0, self._disarmed - 1)
                elif limit.fire():
                    heapq.heappush(self._heap, (time.monotonic() + 1.0, next(self._order), limit))


_DEADLINES = _Deadlines()


@contextlib.contextmanager
def _pending_exception(limit: timedelta, message: str) -> Iterator[None]:
    watched = _Limit(threading.get_ident(), message)
    _DEADLINES.arm(watched, limit.total_seconds())
    try:
        yield
    finally:
        while True:  # an exception landing in here must not leave another pending
            try:
                with watched.lock:
                    if watched.armed:
                        watched.armed = False
                        _set_async_exc(watched.target, None)
                break
            except HandlerTimeoutError:
                continue
        _DEADLINES.disarmed()
