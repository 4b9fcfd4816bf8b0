"""The lease of a running attempt, and the limits on a handler's time.

:class:`Heartbeat` renews the leases of the attempts running now — every slot's, in one
statement per beat on a connection of its own — so that the reconciler can tell a slow
handler from a dead worker, until a handler's timeout plus its grace has passed; then it
renews that lease no more and calls the attempt's ``overrun`` on a thread of its own (which
closes the attempt and may end the process). A row locked now (the handler's own
``ctx.transaction()``) is skipped for one beat, never waited for. :func:`time_limit` raises
:class:`~duejobs.errors.HandlerTimeoutError` in the handler at its timeout, and again every
second until it returns; in a worker's slots one thread watches every slot's limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection

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
    fired: bool = False  # the heartbeat gave up on it and called its overrun


class Heartbeat:
    """One thread per worker that renews the leases of the attempts running now — each until
    its handler's timeout plus ``timeout_grace`` has passed. Then it renews that one no more
    and calls its ``overrun`` (which closes the attempt and, unless other slots of the worker
    can still work, ends the process): a handler that swallows its timeout can neither keep
    its lease nor keep the worker."""

    def __init__(self, core: Core, every: timedelta, lease: timedelta) -> None:
        self._core = core
        self._every, self._lease = every, lease
        self._watched: dict[int, Watched] = {}
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duejobs-heartbeat", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watching(self, watched: Watched) -> Iterator[Watched]:
        """Renew ``watched``'s lease while the block runs; the heartbeat sets ``fired`` on it
        if it gave up on the attempt (its ``overrun`` ran)."""
        with self._lock:
            self._watched[id(watched)] = watched
        self._wake.set()  # time the first renewal from this claim, not from the last beat
        try:
            yield watched
        finally:
            with self._lock:
                self._watched.pop(id(watched), None)

    def _next_wait(self, beat: float) -> float:
        with self._lock:
            dues = [min(w.renewed_at + beat, w.give_up_at) for w in self._watched.values()]
        return max(0.0, min(dues) - time.monotonic()) if dues else beat

    def _run(self) -> None:
        beat = self._every.total_seconds()
        while not self._stop.is_set():
            self._wake.wait(self._next_wait(beat))
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            with self._lock:
                overrun = [w for w in self._watched.values() if now >= w.give_up_at]
                for watched in overrun:
                    watched.fired = True
                    del self._watched[id(watched)]
                due = [w for w in self._watched.values() if now >= w.renewed_at + beat]
            for watched in overrun:  # each on a thread of its own: the others' beats go on
                threading.Thread(target=watched.overrun, name="duejobs-overrun").start()
            for watched in due:
                watched.renewed_at = now
            if due:
                self._renew(due)

    def _renew(self, due: list[Watched]) -> None:
        """One statement for every lease due, on the heartbeat's own connection (never
        waiting for the App's pool, which the handlers use)."""
        try:
            if self._conn is None or self._conn.invalidated or self._conn.closed:
                self._conn = self._core.engine.connect().execution_options(
                    isolation_level="AUTOCOMMIT"
                )
            attempts = [(w.schedule_id, w.version, w.attempt) for w in due]
            store.extend_leases(self._conn, attempts, self._lease)
        except Exception:  # keep beating; the next beat may reach the database
            log.warning("could not renew %d leases", len(due), exc_info=True)
            self._close_connection()

    def _close_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
                self._conn.close()
            self._conn = None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        self._close_connection()


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
