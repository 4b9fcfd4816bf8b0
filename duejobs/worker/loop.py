"""The worker's loop, top to bottom: take → claim → run → close (:class:`Worker`).

One pass of :meth:`Worker.work`: wait for a free slot; take from Redis as many waiting jobs as
slots are free (started in RQ in one script: :mod:`duejobs.rq_wire.worker_side`), blocking up
to a second when none waits; claim their deliveries in the database together (:mod:`.claims`);
run each on its slot (:mod:`.slot_pool`; with one slot, in this thread) through the runtime —
claim, handler under its time limit while the heartbeat renews its lease, outcome
(:mod:`.runtime`); then finish the job in RQ — in the script of the loop's next take, which
comes at once as the job's slot is free (while the loop waits on an empty queue, the slot
writes it itself, with the slots ending beside it) — and put an early delivery back into the
scheduled registry.

What it promises:

* **Redis never ends it.** Every Redis call of the loop — the take, the finish, the put-back,
  the worker's registration and heartbeat — waits out an outage of any length
  (:mod:`.redis_waits`: capped backoff, one line per outage), at any slot count. Jobs taken
  are run and finished; a finish that meets an outage is tried again until Redis answers (the
  outcome is in the database already). A wrong password or ACL is not waited for.
* **Nothing taken is dropped.** A job is taken only for a free slot, and every job taken
  runs, a stop notwithstanding. A job whose hash is gone or is not a duejobs job is passed
  over (logged): its schedule's row, overdue, is pushed again by the reconciler.
* **Stops.** The first SIGTERM/SIGINT stops taking jobs (within a second); the running ones
  finish, then the worker retires from RQ's worker sets and returns. A slot whose handler was
  given up (it will not return) is not waited for: the process exits with ``EXIT_WEDGED``. A
  second signal more than a second after the first ends the process at once (status 1): the
  leases of the attempts it ran expire for the reconciler to rescue. ``rq suspend`` holds the
  loop (no job taken) until ``rq resume``; in a burst it ends the burst.

What it does not do: decide whether a job runs (the database does, in the claim), or hear
RQ's worker commands (see :mod:`duejobs.rq_wire.worker_side`).

Knobs: the runtime's (:class:`~duejobs.worker.config.WorkerConfig`); ``burst`` (return once
no job waits) and ``max_idle`` (return after that many seconds without a job).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from types import FrameType

from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

from duejobs.config import redacted
from duejobs.errors import InvalidQueueError
from duejobs.redis_urls import GIVEN_REDIS, is_outage, redis_client, redis_failures
from duejobs.rq_wire.worker_side import BANDS, Finished, RqWire, Taken
from duejobs.services.loop import StopRequest
from duejobs.validation import check_queue
from duejobs.worker.group_commit import GroupCommit
from duejobs.worker.redis_waits import BACKOFF_CAP, RedisWaits
from duejobs.worker.runtime import Runtime
from duejobs.worker.slot_pool import SLOT_WAIT

log = logging.getLogger("duejobs.worker")

# Seconds between two heartbeats of the worker's key (and two looks at ``rq suspend``).
BEAT_EVERY = 1.0
# Seconds between two refreshes of the started-registry entries of running jobs.
KEEP_EVERY = 60.0
# The longest a take blocks on an empty queue (seconds): the most a stop waits for it.
TAKE_WAIT = 1.0
# Seconds a warm stop waits for Redis to finish the jobs that ran, during an outage.
FINISH_GRACE = 10.0
# Redis connections a worker holds beyond one per slot.
_REDIS_SPARE = 8


class Worker:
    """Runs one App's deliveries from RQ's queues ``queues`` (in priority order; default:
    the App's queue), through ``runtime``. Made by
    :func:`duejobs.worker.build_worker`, or directly in tests."""

    def __init__(self, runtime: Runtime, queues: Sequence[str] = ()) -> None:
        self.runtime = runtime
        if isinstance(queues, str):
            raise InvalidQueueError(f"queues must be a list of queue names, got {queues!r}")
        # A band's RQ queue (``mail+high``) is no queue: its worker would listen to its bands.
        names = [check_queue(queue) for queue in queues] or [runtime.default_queue]
        url = runtime.redis_url_for(names)
        self.name = runtime.name
        given = runtime.core.settings.redis_client if url == GIVEN_REDIS else None
        self._names, self._given, self._url = names, given, url
        self._wire: RqWire | None = None
        self.waits = RedisWaits(redacted(url))
        self._pool = runtime.slots
        # Made from a signal handler: a request that takes no lock (a ``threading.Event``'s
        # set() waits for the lock its own wait() may hold in the very thread it interrupts).
        self._stop = StopRequest()
        self._stopped_at: float | None = None
        self._stop_date: datetime | None = None  # for RQ's shutdown_requested_date
        self._ended = threading.Event()
        # A beat wanted now (RQ's shutdown_requested_date, the end): put() is reentrant, so a
        # stop made from a signal handler may ask for one.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], Taken] = {}  # by (job id, run id)
        # Jobs run whose finish in RQ goes with the loop's next take: at one slot, all (the
        # loop is the slot); at many, those ending while ``_folding`` — the loop neither
        # blocked on an empty queue nor ended —, so a busy worker writes no finish apart.
        self._unfinished: list[Finished] = []
        self._folding = True
        self._suspended = False
        self._finishes: GroupCommit[Finished, bool] = GroupCommit(
            "redis_finish", self._finish_together
        )

    @property
    def wire(self) -> RqWire:
        """RQ's side of the worker, made on first use: a cluster's client reads the
        cluster's map when it is made, so a worker started while its cluster is away waits
        for it (its registration, waited through the outage) instead of ending."""
        if self._wire is None:
            # No retry inside redis-py: the loop retries (redis_waits), knowing a take it
            # sent may have run (the wire's lost takes); a client given to the App keeps its
            # own.
            # A connection per slot, the spare, and on a cluster one per band list watched.
            most = self.runtime.config.concurrency + _REDIS_SPARE + BANDS * len(self._names)
            client = self._given or redis_client(self._url, most, 0)
            ttl = self.runtime.core.settings.result_ttl
            self._wire = RqWire(client, self._names, self.name, ttl)
        return self._wire

    # -- the loop ------------------------------------------------------------------------------

    def work(self, burst: bool = False, max_idle: float | None = None) -> None:
        """Take and run jobs until stopped (:meth:`stop`, SIGTERM, SIGINT) — or, with
        ``burst``, until none waits; with ``max_idle``, until none came for that long."""
        with self.signals():
            suspended = self.waits.call(
                "the worker's registration", lambda: self.wire.register(), self._stopping
            )
            if suspended is None:  # stopped before Redis answered: nothing written, nothing taken
                self._ended.set()
                return
            self._suspended = suspended
            beating = threading.Thread(target=self._beating, name="duejobs-beat", daemon=True)
            beating.start()
            previous = sys.getswitchinterval()
            if self._pool is not None:
                sys.setswitchinterval(self.runtime.switch_interval)
            try:
                self._loop(burst, max_idle)
            finally:
                with self._lock:
                    self._folding = False  # the slots still running finish their own
                self._finish_apart()
                if self._pool is not None:
                    self._pool.close()
                sys.setswitchinterval(previous)
                self._ended.set()
                self._wake.put(None)
                beating.join()
                self.waits.call("the worker's retirement", lambda: self.wire.retire(), lambda: True)

    def stop(self) -> None:
        """A warm stop: take no more jobs, let the running ones finish. Safe in a signal
        handler (it takes no lock)."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
            self._stop_date = datetime.now(UTC)
            self._wake.put(None)  # RQ's shutdown_requested_date written at once
        self._stop.set()

    def _loop(self, burst: bool, max_idle: float | None) -> None:
        idle_since = time.monotonic()
        while not self._stop.is_set():
            if self._suspended:
                with self._lock:
                    self._folding = False  # no take comes: the slots finish their own
                self._finish_apart()
                if burst:
                    return
                self._stop.wait(BEAT_EVERY)
                continue
            free = self._free_slots()
            if not free:
                continue
            wait = 0.0 if burst else TAKE_WAIT
            if max_idle is not None:
                wait = min(wait, max(0.0, idle_since + max_idle - time.monotonic()))
            taken = self._take(free, wait)
            if self._pool is not None:
                self._hold(len(taken) - free)
            if taken:
                self._start(taken)
                idle_since = time.monotonic()
            elif burst or (max_idle is not None and time.monotonic() - idle_since >= max_idle):
                return

    def _free_slots(self) -> int:
        """Hold every free slot — at least one, waiting for it — and say how many; 0 once a
        stop came meanwhile. With one slot (no pool) always 1: the job runs in this thread."""
        pool = self._pool
        if pool is None:
            return 1
        while not pool.acquire(SLOT_WAIT):
            if self._stop.is_set():
                return 0
        pool.await_others(self._stop.is_set)
        if self._stop.is_set():
            pool.release()
            return 0
        return 1 + pool.acquire_free()

    def _hold(self, more: int) -> None:
        """Give back the slots held for jobs not taken (``more`` below zero), or hold as
        many more as jobs came beyond them (a take whose answer was lost, found again with
        the one after it), waiting for them: every job taken runs on a slot of its own."""
        assert self._pool is not None
        if more < 0:
            self._pool.release(-more)
        while more > 0:
            if self._pool.acquire(SLOT_WAIT):
                more -= 1

    def _take(self, most: int, wait: float) -> list[Taken]:
        """Up to ``most`` jobs, waited for up to ``wait`` seconds, the jobs run meanwhile at
        one slot finished in RQ in the same script; none once a stop comes during an outage.
        An error that is not an outage (a key of the wrong type, say) is logged and the take
        tried again after a pause: the loop outlives it. The finishes a take did not write
        are written on their own (one Redis refuses failing that job's alone), and the take
        made again without them at once."""
        with self._lock:
            finishing, self._unfinished = self._unfinished, []
        state = self._state_after(finishing) if finishing else ""
        try:
            taken = self.waits.call(
                "a take",
                lambda: self.wire.take(most, wait, finishing, state, self._may_block),
                self._may_leave,
            )
        except redis_failures() as exc:
            self._finish_apart(finishing)  # those it did not write (it empties the list)
            if not _mends(exc):
                raise
            if finishing:  # what Redis refused may be a finish's key: the take alone, now
                return self._take(most, wait)
            log.exception("a take failed; again in %.0f s", BACKOFF_CAP)
            with self._lock:
                self._folding = False  # no take for a while: the slots finish their own
            self._finish_apart()
            self._stop.wait(BACKOFF_CAP)
            return []
        finally:
            with self._lock:
                self._folding = not self._stop.is_set()
        if taken is None:
            self._finish_apart(finishing)
        return taken or []

    def _may_block(self) -> bool:
        """Whether the take may block on an empty queue: not while finishes wait for it
        (the loop takes again at once, carrying them); while it blocks, the slots that end
        write their own."""
        with self._lock:
            if self._unfinished:
                return False
            self._folding = False
            return True

    def _start(self, taken: list[Taken]) -> None:
        """Hand the jobs taken to their slots (with one slot, run the one in this thread);
        their deliveries claimed together first. Unreadable ones are passed over."""
        readable = [t for t in taken if t.delivery is not None]
        for t in taken:
            if t.delivery is None:
                log.warning("job %s passed over: %s", t.job_id, t.unreadable)
                if t.run:  # started in RQ: finished there as failed
                    self._finish([Finished(t, None, error=t.unreadable)])
        if self._pool is not None:
            self._pool.release(len(taken) - len(readable))
        if not readable:
            return
        with self._lock:
            self._running.update({(t.job_id, t.run): t for t in readable})
        if self._pool is None:  # one, or those of a take whose answer was lost
            for t in readable:
                self._run(t)
            return
        if len(readable) > 1:
            try:
                self.runtime.claim_ahead([t.delivery for t in readable if t.delivery])
            except Exception:  # each slot claims its own delivery then, and meets the error
                log.exception("could not claim %d deliveries together", len(readable))
        self._pool.took([t.job_id for t in readable])
        for t in readable:
            self._pool.run(t.job_id, lambda t=t: self._run(t))  # type: ignore[misc]

    def _run(self, taken: Taken) -> None:
        """One job: its delivery through the runtime, then its finish in RQ, then, for an
        early delivery, its put-back."""
        assert taken.delivery is not None
        began = time.monotonic()
        put_back_at = None
        try:
            delivered = self.runtime.deliver(taken.delivery)
            finished = Finished(taken, delivered.outcome, seconds=time.monotonic() - began)
            put_back_at = delivered.put_back_at
        except Exception as exc:  # outside the handler (the database away for its claim)
            log.exception("delivery of job %s failed; its row is as it was", taken.job_id)
            error = "".join(traceback.format_exception(exc))
            finished = Finished(taken, None, error=error, seconds=time.monotonic() - began)
        if put_back_at is None and self._fold(finished):
            return
        self._finish([finished])
        if put_back_at is not None:
            try:  # the deliverer made in the call: a cluster's, once the cluster answers
                self.waits.call(
                    "a put-back",
                    lambda: self.runtime.deliverer().defer(taken.job_id, put_back_at, taken.queue),
                    self._past_finish_grace,
                )
            except redis_failures() as exc:  # the row is due then: the reconciler pushes it
                log.error("could not put job %s back (%s); the reconciler will", taken.job_id, exc)

    def _fold(self, finished: Finished) -> bool:
        """Leave ``finished``'s finish in RQ to the loop's next take, which comes at once (the
        slot this job held is free now), if the loop is folding (``_folding``)."""
        with self._lock:
            if self._pool is None or self._folding:
                self._unfinished.append(finished)
                return True
            return False

    def _finish(self, finished: Sequence[Finished]) -> None:
        """The jobs' finish in RQ, with those of the slots ending meanwhile; waited through
        an outage (during a warm stop, ``FINISH_GRACE`` at most, for all of them at once). One
        Redis refuses (a key of the wrong type) is logged: the outcome is in the database,
        RQ's record of it is not."""
        jobs = ", ".join(item.taken.job_id for item in finished)
        try:
            done = self.waits.call(
                "a finish", lambda: self._finishes.submit_all(finished), self._past_finish_grace
            )
        except redis_failures() as exc:
            log.error("could not finish job %s in RQ (%s)", jobs, exc)
            return
        if done is None and self._past_finish_grace():
            log.warning("job %s left started in RQ: Redis is away and the worker stops", jobs)

    def _finish_apart(self, items: Sequence[Finished] | None = None) -> None:
        """Finishes in RQ written without a take: ``items``, or those left for the next take
        (at one slot) when the loop pauses or ends."""
        if items is None:
            with self._lock:
                items, self._unfinished = self._unfinished, []
        if items:
            self._finish(items)

    def _state_after(self, finished: Sequence[Finished]) -> str:
        """The worker's state in RQ once ``finished`` are: idle once none of its jobs runs."""
        with self._lock:
            for item in finished:
                self._running.pop((item.taken.job_id, item.taken.run), None)
            return "busy" if self._running else "idle"

    def _finish_together(self, batch: Sequence[Finished]) -> list[bool]:
        """The finishes of the slots that ended together, in one script; the worker is idle
        in RQ once none of its jobs runs. A batch Redis refuses for a reason other than an
        outage is finished again job by job, so that one job's bad key fails it alone."""
        state = self._state_after(batch)
        try:
            self.wire.finish(batch, state)
        except redis_failures() as exc:
            if len(batch) == 1 or is_outage(exc):
                raise
            return [self._finish_alone(item, state) for item in batch]
        return [True] * len(batch)

    def _finish_alone(self, item: Finished, state: str) -> bool:
        try:
            self.wire.finish([item], state)
        except redis_failures() as exc:
            if is_outage(exc):
                raise
            log.error("could not finish job %s in RQ (%s)", item.taken.job_id, exc)
            return False
        return True

    # -- around the loop -----------------------------------------------------------------------

    def _beating(self) -> None:
        """The worker's heartbeat (and its look at ``rq suspend``) every ``BEAT_EVERY``, and
        the running jobs' started entries every ``KEEP_EVERY``, on a thread of its own so
        that a long handler in a one-slot worker does not silence it."""
        kept = time.monotonic()
        while True:
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=BEAT_EVERY)
            while not self._wake.empty():  # the requests made meanwhile: one beat for all
                self._wake.get_nowait()
            if self._ended.is_set():
                return
            try:
                suspended = self.waits.call(
                    "the worker's heartbeat", lambda: self.wire.beat(self._stop_date), lambda: True
                )
            except Exception:  # a refusal that is not an outage: the next beat tries again
                log.exception("the worker's heartbeat failed")
                continue
            if suspended is not None:
                if suspended != self._suspended:
                    log.warning("rq suspend: %s", "holding" if suspended else "resumed")
                self._suspended = suspended
            if time.monotonic() - kept >= KEEP_EVERY:
                with contextlib.suppress(*redis_failures()):  # tried again at the next round
                    self.waits.call("the started entries", self._keep_started, lambda: True)
                kept = time.monotonic()

    def _keep_started(self) -> None:
        with self._lock:
            running = list(self._running.values())
        self.wire.keep_started(running)

    def _stopping(self) -> bool:
        return self._stop.is_set()

    def _may_leave(self) -> bool:
        """Whether a take may be given up during an outage: once stopping, unless a take
        whose answer was lost started jobs for this worker (then up to ``FINISH_GRACE``)."""
        return self._stopping() and (not self.wire.lost or self._past_finish_grace())

    def _past_finish_grace(self) -> bool:
        return self._stopped_at is not None and time.monotonic() - self._stopped_at > FINISH_GRACE

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT handled as the module docstring says while in it, in the main
        thread; the handlers before it restored after. :meth:`work` enters it; a service enters
        it before saying it serves, so a stop sent once that line shows is the warm one."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in before:
            signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopped_at is None:
            self.stop()  # first: the log line below may fail inside a signal handler
            log.warning("warm shutdown: taking no more jobs; the running ones finish")
        elif time.monotonic() - self._stopped_at > 1:  # not a process group's copy of it
            log.warning("cold shutdown: ending now; running attempts are rescued after their lease")
            os._exit(1)


def _mends(exc: Exception) -> bool:
    """A Redis error the loop outlives: any but a refused password or ACL."""
    return not isinstance(exc, AuthenticationError | AuthorizationError | NoPermissionError)
