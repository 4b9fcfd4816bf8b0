"""A worker's slots: how many deliveries run at once, and when jobs are taken for them.

:class:`SlotPool` knows nothing of RQ: what it runs is a callable, a job is a key (its id),
and a *take* is the keys taken from Redis in one go. The worker's loop
(:class:`~duejobs.worker.loop.Worker`) asks it for a free slot before it takes a job, for
every other free slot before it takes more, and hands it each job to run.

What it promises:

* **Never more than N at once.** A slot is held from before its job is taken until its run
  ends; a worker never holds a job no slot is free for (another worker could run it).
* **Takes stay together** (``take_window``, 10 ms by default, at most 1 s). A slot freed while
  others run waits, once per take, for the slots running the jobs taken with its own —
  handlers taken together tend to return together — until they are done or the window has
  passed, so that the jobs for the slots freed meanwhile are taken, claimed and started
  together: one round trip of each kind for the batch instead of one per job. A slot freed
  later takes at once; so a long handler costs the slots beside it one window at most, and a
  job waits at most the window, only while the worker is busy.
* **A warm stop drains.** :meth:`close` waits for every running slot but those given up
  (:meth:`give_up`: a handler past its timeout and grace that will not return); if any is
  left, the process exits with :data:`~duejobs.worker.config.EXIT_WEDGED` for its supervisor
  to start a fresh one.

What it does not do: interrupt a running handler (the time limits and the heartbeat do), or
claim anything (the runtime does).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from duejobs.worker.config import EXIT_WEDGED

log = logging.getLogger("duejobs.worker")

# How often a wait for slots wakes to look for a stop request (seconds).
SLOT_WAIT = 1.0


class _Take:
    """The keys taken from Redis in one go, and when (``time.monotonic()``)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


class SlotPool:
    """``size`` slots, each running one job at a time on a thread of the pool."""

    def __init__(self, size: int, take_window: float) -> None:
        self.size = size
        self._window = take_window
        self._free = threading.BoundedSemaphore(size)
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="duejobs-slot")
        self._lock = threading.Condition()
        # Under ``_lock``: the take each key taken and not yet run came with, the take each
        # running slot's job came with, the take of the job that first freed a slot since the
        # last take, the take the last wait was for, and the slots a take waits for.
        self._take_of: dict[str, _Take] = {}
        self._running: dict[object, _Take] = {}
        self._freed_take: _Take | None = None
        self._waited_take: _Take | None = None
        self._awaited: set[object] = set()
        self._wedged = 0

    @property
    def busy(self) -> int:
        """Slots running a job."""
        return len(self._running)

    @property
    def wedged(self) -> int:
        """Slots whose handler was given up and has not returned."""
        with self._lock:
            return self._wedged

    # -- slots -------------------------------------------------------------------------------

    def acquire(self, timeout: float = SLOT_WAIT) -> bool:
        """Hold a free slot, waiting up to ``timeout`` seconds for one."""
        return self._free.acquire(timeout=timeout)

    def acquire_free(self) -> int:
        """Hold every slot free now, without waiting; how many."""
        held = 0
        while self._free.acquire(blocking=False):
            held += 1
        return held

    def release(self, count: int = 1) -> None:
        """Give back slots held for jobs that were not taken."""
        for _ in range(count):
            self._free.release()

    # -- takes -------------------------------------------------------------------------------

    def took(self, keys: list[str]) -> None:
        """Keys taken from Redis together, each holding a slot: they run one by one
        (:meth:`run`), and the slots they free wait for each other (:meth:`await_others`)."""
        take = _Take(time.monotonic())
        with self._lock:
            for key in keys:
                self._take_of[key] = take

    def taken_at(self, key: str) -> float | None:
        """When the job of ``key`` was taken (``time.monotonic()``); None if not by a take."""
        with self._lock:
            take = self._take_of.get(key)
        return None if take is None else take.at

    def drop(self, key: str) -> None:
        """A job taken that will not run: its slot is free again."""
        with self._lock:
            self._take_of.pop(key, None)
        self._free.release()

    def await_others(self, stopping: Callable[[], bool]) -> None:
        """A slot is free and others still run: wait for those taken together with the job
        that first freed a slot since the last take, until they are done, the take window
        has passed, or ``stopping()`` says so (seen at the next wake, within the window)."""
        with self._lock:
            now, take, self._freed_take = time.monotonic(), self._freed_take, None
            if take is None or take is self._waited_take:
                return  # no slot freed since the last take, or its take had its wait
            self._waited_take = take
            self._awaited = {s for s, came in self._running.items() if came is take}
            try:
                while self._awaited and not stopping():
                    left = now + self._window - time.monotonic()
                    if left <= 0:
                        return
                    self._lock.wait(min(left, SLOT_WAIT))
            finally:
                self._awaited = set()

    # -- runs --------------------------------------------------------------------------------

    def run(self, key: str, work: Callable[[], None]) -> None:
        """Run ``work`` on a slot's thread; the slot held for ``key`` frees when it ends
        (``work`` handles its own errors: one that escapes is logged)."""
        slot = object()  # this run of a slot (one key can run twice at once)
        with self._lock:
            take = self._take_of.pop(key, None)
            self._running[slot] = take if take is not None else _Take(time.monotonic())
        try:
            self._threads.submit(self._run, slot, key, work)
        except BaseException:
            self._done(slot)
            raise

    def _run(self, slot: object, key: str, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException:
            log.exception("slot ended by an error outside the job %s", key)
        finally:
            self._done(slot)

    def _done(self, slot: object) -> None:
        with self._lock:
            take = self._running.pop(slot, None)
            if take is None:  # counted done already (its submission failed half-way)
                return
            if self._freed_take is None:
                self._freed_take = take
            # The slot is free before anyone waiting for it wakes (:meth:`await_others`).
            self._free.release()
            if slot in self._awaited:
                self._awaited.discard(slot)
                if not self._awaited:  # the last one the take waits for
                    self._lock.notify_all()
            if self.busy <= self._wedged:  # a warm stop waits for this
                self._lock.notify_all()

    # -- handlers given up -------------------------------------------------------------------

    def give_up(self) -> int:
        """A slot's handler will not return (past its timeout and grace): counted wedged;
        how many slots still work."""
        with self._lock:
            self._wedged += 1
            return self.size - self._wedged

    def returned(self) -> None:
        """A handler given up on returned after all: its slot works again."""
        with self._lock:
            self._wedged -= 1
            self._lock.notify_all()

    # -- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for every running slot but those given up; with any of them left the process
        exits with ``EXIT_WEDGED`` (they will not return)."""
        with self._lock:
            while self.busy > self._wedged:
                self._lock.wait(SLOT_WAIT)
            stuck = self.busy
        if stuck:
            log.critical(
                "%d slots hold handlers that will not return; the worker exits (status %d)",
                stuck,
                EXIT_WEDGED,
            )
            os._exit(EXIT_WEDGED)
        self._threads.shutdown(wait=True)
