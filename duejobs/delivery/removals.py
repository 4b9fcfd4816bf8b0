"""Superseded deliveries taken out of Redis off the caller's path.

A cancel or a reschedule commits its change in PostgreSQL, then the job of the version it
replaced, if it still waits in Redis, is only clutter: the worker that pops it re-reads the
row and skips it. Removing it in the caller's thread cost a Redis round trip and redis-py's
Python per change (about 0.2 ms of the caller's time, a third of a change). :class:`Removals`
takes those jobs on a queue and removes them from a thread of its own, every job that came in
meanwhile (up to ``BATCH_MOST``) in one script call per node
(:meth:`~duejobs.delivery.Deliverer.remove_many`).

What it promises: a job handed over is removed within a round trip or so of its change, unless
Redis fails — a failed batch is logged at warning, counted in
``duejobs_superseded_removals_failed_total`` and tried once more after ``RETRY_AFTER``; a job
still left (Redis down longer, or the process ended first) is the reconciler's to remove (its
orphan scan) and never runs (the worker's check). What waits is bounded: while
``MOST_WAITING`` jobs wait (a Redis outage while changes go on), a new one is left to the
reconciler at once, counted in ``duejobs_superseded_removals_left_total``, so an outage of
any length costs the process no memory. :meth:`flush` waits for what was handed over;
:meth:`close` flushes, then stops the thread. A process that forks starts a thread of its own
at its first removal (a thread does not survive a fork).

What it does not promise: that a job is gone when the change returns. Nothing needs that: the
row, not Redis, says what runs.

Knobs: ``BATCH_MOST`` (50 jobs per script call: a queued job's removal reads its queue's list
from the tail, so a batch is kept short enough never to hold Redis long), ``RETRY_AFTER``
(1 s), ``MOST_WAITING`` (10,000 jobs), ``IDLE_EXIT`` (10 s: an idle thread ends, and with it
its hold on the App's Core; the next change starts another).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

from duejobs.delivery.deliverer import Deliverer
from duejobs.models import QueueJob
from duejobs.redis_urls import redis_failures

log = logging.getLogger("duejobs.delivery")

BATCH_MOST = 50
RETRY_AFTER = 1.0
MOST_WAITING = 10_000
IDLE_EXIT = 10.0

FAILED = Counter(
    "duejobs_superseded_removals_failed_total",
    "Batches of superseded jobs that Redis failed to remove (left to the reconciler's orphan "
    "scan; the worker skips them meanwhile).",
)
LEFT = Counter(
    "duejobs_superseded_removals_left_total",
    "Superseded jobs not handed to the removals' thread because MOST_WAITING already waited "
    "(Redis slow or down): left to the reconciler's orphan scan.",
)


class Removals:
    """The removal of superseded jobs, in a thread of its own (see the module docstring)."""

    def __init__(self, deliverer: Callable[[], Deliverer]) -> None:
        self._deliverer = deliverer
        self._fresh()

    def _fresh(self) -> None:
        """Queue, lock and counts of this process's own (a forked child gets new ones: the
        parent's lock may have been held by a thread that does not exist in the child)."""
        self._jobs: queue.SimpleQueue[QueueJob | None] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._handed = self._done = 0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, job: QueueJob) -> None:
        """Hand over a superseded job, to be removed from Redis soon — or, while
        ``MOST_WAITING`` already wait (Redis slow or down), left to the reconciler at once."""
        if self._pid != os.getpid():
            self._fresh()
        with self._lock:
            if self._handed - self._done >= MOST_WAITING:
                LEFT.inc()
                return
            self._handed += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="duejobs-removals", daemon=True
                )
                self._thread.start()
            self._jobs.put(job)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every job handed over so far is dealt with; whether it was in time."""
        if self._pid != os.getpid():
            return True  # nothing was handed over in this process
        with self._lock:
            target = self._handed
            return self._lock.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Flush, then end the thread."""
        if self._pid != os.getpid():
            return
        self.flush(timeout)
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._jobs.put(None)
        thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                first = self._jobs.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._lock:  # idle: end, unless a job came meanwhile (add() holds it)
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if first is None:
                return
            batch = [first]
            while len(batch) < BATCH_MOST:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)  # ends the loop once this batch is done
                    break
                batch.append(more)
            self._remove(batch)
            with self._lock:
                self._done += len(batch)
                self._lock.notify_all()

    def _remove(self, batch: list[QueueJob]) -> None:
        jobs: list[tuple[str, str | None]] = [(job.id, job.queue) for job in batch]
        for attempt in (1, 2):
            try:
                self._deliverer().remove_many(jobs)
                return
            except redis_failures() as exc:  # the worker skips them; the reconciler removes them
                FAILED.inc()
                log.warning(
                    "could not remove %d superseded queue jobs (%s)%s",
                    len(jobs),
                    exc,
                    "; trying again" if attempt == 1 else "; left to the reconciler",
                )
                if attempt == 1:
                    time.sleep(RETRY_AFTER)
            except Exception:  # never end the thread: a later batch may go through
                log.exception("removal of %d superseded queue jobs failed", len(jobs))
                return
