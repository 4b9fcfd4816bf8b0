"""The scheduler woken for a schedule due sooner than its next poll.

A scheduler claims new rows at its poll's pace (100 ms by default): a job scheduled to run
now would otherwise wait up to a poll before it is pushed. An App that commits a schedule due
within ``SOON`` of its write (:meth:`Wakes.wake`) pushes one entry onto the list of its
queue's name (:func:`wake_key`, as RQ's queues are named per deployment) on its default Redis,
and a scheduler of that App blocked on that list (:class:`WakeWatch`) starts a pass of claims
at once, ``WAKE_GAP`` at least after its last one. Redis, not PostgreSQL's
``NOTIFY``, carries it: a transaction-mode pooler does not pass a ``LISTEN`` on, and a row
written on a primary is never heard of on a replica.

What it promises: the call that wakes does not wait for Redis — the entry is sent from a
thread of the App's own, every wake made while one is on its way folded into the next — so a
Redis that is slow or down costs a schedule nothing. The list holds at most one entry and
expires ``WAKE_TTL`` after the last wake: nothing is left behind when no scheduler runs.

What it does not promise: a wake at all. A lost one (Redis down, the process ended first, a
scheduler restarting) costs that schedule at most a poll, as before; a failed send is logged
at warning once per ``QUIET_FOR`` and counted in ``duejobs_scheduler_wakes_failed_total``. A
wake that reaches one of several schedulers wakes that one only, which claims for all.

Knobs: ``SOON`` (1 s), ``WAKE_GAP`` (10 ms: a steady flow of schedules due now makes at most
a hundred passes a second, each claiming what came meanwhile), ``WAKE_TTL`` (60 s),
``IDLE_EXIT`` (10 s: an idle sender thread ends; the next wake starts another).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter
from redis import Redis

from duejobs.errors import redis_said
from duejobs.redis_urls import redis_failures

log = logging.getLogger("duejobs.delivery")

SOON = 1.0
WAKE_GAP = 0.010
WAKE_TTL = 60
IDLE_EXIT = 10.0
QUIET_FOR = 30.0
# How long a watch blocks on the list before it looks for a stop (seconds): an idle
# scheduler's one Redis command more every 5 s.
WATCH_BLOCK = 5

FAILED = Counter(
    "duejobs_scheduler_wakes_failed_total",
    "Wakes of the scheduler for a schedule due soon that Redis did not take (the schedule "
    "waits for the scheduler's next poll instead).",
)


def wake_key(queue: str) -> str:
    """The wake list of the Apps and schedulers whose queue is ``queue``."""
    return f"duejobs:wake:{queue}"


def send_wake(redis: Redis, key: str) -> None:
    """One entry on the wake list, the list cut to it and set to expire (one transaction)."""
    with redis.pipeline(transaction=True) as pipe:
        pipe.lpush(key, 1)
        pipe.ltrim(key, 0, 0)
        pipe.expire(key, WAKE_TTL)
        pipe.execute()


class Wakes:
    """The App's side: wakes sent from a thread of its own (see the module docstring)."""

    def __init__(self, redis: Callable[[], Redis], key: str) -> None:
        self._redis, self._key = redis, key
        self._fresh()

    def _fresh(self) -> None:
        """State of this process's own (a forked child's parent lock may be held by a thread
        the child does not have)."""
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failed_at = -QUIET_FOR
        self._closed = False
        self._pid = os.getpid()

    def close(self) -> None:
        """Send no more wakes (the App's connections are closing); a wake asked is dropped."""
        self._closed = True
        self._wanted.set()  # an idle thread ends now

    def wake(self) -> None:
        """Have a scheduler start its claims now; returns at once."""
        if self._pid != os.getpid():
            self._fresh()
        if self._closed:
            return
        with self._lock:
            self._wanted.set()
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name="duejobs-wakes", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: the poll finds the row
                    self._failed(exc)
                    return
                self._thread = thread

    def _run(self) -> None:
        while True:
            if not self._wanted.wait(IDLE_EXIT):
                with self._lock:  # idle: end, unless a wake came meanwhile (wake() holds it)
                    if not self._wanted.is_set():
                        self._thread = None
                        return
                continue
            self._wanted.clear()  # a wake made from here on is sent after this one
            if self._closed:
                return
            try:
                send_wake(self._redis(), self._key)
            except redis_failures() as exc:  # the schedule waits for the next poll
                self._failed(exc)
            except Exception:  # never end the thread: the next wake may go through
                log.exception("waking the scheduler failed")

    def _failed(self, exc: BaseException) -> None:
        """A wake not sent: counted, and said once per ``QUIET_FOR``."""
        FAILED.inc()
        if time.monotonic() - self._failed_at >= QUIET_FOR:
            self._failed_at = time.monotonic()
            log.warning(
                "could not wake the scheduler (%s): schedules due now wait for its next poll",
                redis_said(exc),
            )


class WakeWatch:
    """The scheduler's side: a thread blocked on the wake list that calls ``woken()``, at
    most every ``WAKE_GAP``, for each entry it takes; Redis failing, it tries again after
    ``backoff(failures)`` seconds, saying so once per outage. ``redis`` gives the client at
    each call (a cluster's is made once the cluster answers)."""

    def __init__(
        self,
        redis: Callable[[], Redis],
        key: str,
        woken: Callable[[], None],
        stopping: Callable[[], bool],
        backoff: Callable[[int], float],
    ) -> None:
        self._redis, self._key, self._woken = redis, key, woken
        self._stopping, self._backoff = stopping, backoff
        self._thread = threading.Thread(target=self._run, name="duejobs-wake-watch", daemon=True)

    def start(self) -> None:
        """Start the thread; it ends by itself within ``WATCH_BLOCK`` of the stop (or of its
        Redis call's timeout), not waited for: a wake it takes once stopping is put back."""
        self._thread.start()

    def _pause(self, seconds: float) -> None:
        """Sleep, a stop seen within a tenth of a second."""
        until = time.monotonic() + seconds
        while not self._stopping() and time.monotonic() < until:
            time.sleep(min(0.1, max(0.0, until - time.monotonic())))

    def _run(self) -> None:
        failures = 0
        last = 0.0
        while not self._stopping():
            try:
                taken = self._redis().blpop([self._key], timeout=WATCH_BLOCK)
            except Exception as exc:  # the poll goes on meanwhile; this thread never ends
                failures += 1
                if failures == 1:
                    log.warning(
                        "the scheduler's wake list is out of reach (%s); polling",
                        redis_said(exc),
                        exc_info=not isinstance(exc, redis_failures()),
                    )
                self._pause(self._backoff(failures))
                continue
            if failures:
                log.info("the scheduler's wake list answers again")
                failures = 0
            if taken is None:
                continue
            if self._stopping():  # for a scheduler that still runs, if any
                with contextlib.suppress(*redis_failures()):
                    send_wake(self._redis(), self._key)
                return
            self._pause(last + WAKE_GAP - time.monotonic())
            last = time.monotonic()
            self._woken()
