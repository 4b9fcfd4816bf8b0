"""The worker's side of RQ: the worker class that hands duejobs' jobs to a performer, one at
a time or in slots (see :class:`DuejobsWorker`).

RQ's private state touched here, where RQ offers no public way (checked against RQ 2.0, 2.6
and 3.0): ``_state`` (the state in memory, set without telling Redis while slots work),
``_stop_requested`` (RQ's warm-stop flag, also set here), and ``_shutdown_requested_date``
(when the first stop came).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from redis.exceptions import RedisError
from rq import Queue
from rq.executions import Execution
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import WorkerStatus

from duejobs.delivery._rq_compat import MULTI_EXECUTIONS, create_execution
from duejobs.delivery.performer import Performer
from duejobs.delivery.rq_job import DeliveryJob, NoDeathPenalty, read_delivery
from duejobs.delivery.rq_redis import DeliveryQueue, WorkerRedis
from duejobs.delivery.rq_take import BEAT_EVERY, DEQUEUE_BACKOFF_CAP, TakingWorker

log = logging.getLogger("duejobs.delivery")

# How often a worker whose slots are all busy beats and looks for a stop request (seconds).
_SLOT_WAIT = 1.0
# Redis connections a worker holds beyond one per slot.
_REDIS_SPARE = 8


class DuejobsWorker(TakingWorker):
    """An RQ SimpleWorker (no fork per job: pooled database connections serve every job)
    with the JSON serializer.

    ``queues``: the RQ queues to take jobs from, in priority order (default: the performer's);
    schedules are routed to a queue by type (``App.handler(queue=)``) or one by one
    (``schedule(queue=)``), so a worker pool per queue keeps a slow type from starving a fast
    one. Each worker runs its jobs through its own performer (a job class of its own), so
    several workers in one process never share one.

    **Slots.** With the performer's ``concurrency`` N above 1, up to N deliveries run at once,
    each in a thread of the worker's pool; a job is taken from Redis only when a slot is free,
    so a worker never holds jobs another worker could run. RQ sees what it always sees — each
    job started, finished or failed through its registries, the worker's executions and
    heartbeats — with several executions at a time. With N = 1 the job runs in the main thread,
    exactly as a plain SimpleWorker runs it. When a job is taken and more slots are free, as
    many more jobs as are waiting (one per free slot, without blocking) are taken with it and
    claimed in one statement (``Performer.claim_ahead``) and started in RQ in one pipeline;
    they hold their slots and run next. A slot freed while others run waits, once per batch,
    for those taken from Redis together with its job, at most the performer's ``take_window``
    (10 ms by default; :mod:`duejobs.worker.slot_pool`), so that jobs are taken for several
    free slots at once rather than one by one: with short handlers this cuts the worker's CPU
    per job by a third. It delays a job by at most the window, and only while the worker is
    busy; a handler taken at another time is not waited for, so a long one costs the slots
    beside it one window at most.

    **Less Redis per job.** RQ beats three times per job and reads the ``rq suspend`` flag
    before each; here a plain beat and the suspension check reach Redis at most once a second
    (a suspension stops the worker taking jobs within a second). RQ's finish of a job WATCHes
    and reads its dependents set (a duejobs job has none: :class:`~.rq_redis.DeliveryQueue`)
    and beats the job once more; here the finish is one transaction, shared by the jobs of
    the slots that finish together (:class:`~.rq_redis.FinishPipeline`). With slots, jobs
    already waiting are taken for the free slots in two round trips whatever their number, the
    worker beats once for them, and Redis is told the worker is ``idle`` only once no slot is busy.

    **Shutdown.** The first SIGTERM/SIGINT stops taking jobs and lets the running ones finish
    (their handlers' timeouts bound the wait) — jobs taken with another and not started yet
    included — then exits; nothing taken is left unstarted. A
    slot whose handler was given up (it will not return) is not waited for: once the others
    are done the process exits with ``EXIT_WEDGED``. A second signal more than a second after
    the first (as RQ counts: a process group's copy of the same signal is not a second one) is
    a cold shutdown: the process ends at once, and the leases of the attempts it was running
    expire for the reconciler to rescue.

    A delivery that came too early is put back into the scheduled registry under its own id,
    once RQ has finished with it (so no other process can push a second job meanwhile).

    **RQ releases.** The same on RQ 2.0 to 3.0 (:mod:`duejobs.delivery._rq_compat` holds what
    differs). Two of RQ 2.x's worker behaviours are not kept: a Redis that answers a dequeue
    later than the socket timeout no longer ends the worker (it is waited out, backing off to
    ``DEQUEUE_BACKOFF_CAP``), and RQ's "stop job" command is ignored, as RQ 3's
    SimpleWorker ignores it (a job runs in the worker's own process; RQ 2.x would kill the
    worker's whole process group). Cancel a schedule to stop its handler at its next check.
    """

    _suspension_checked: datetime | None = None
    _told: str | None = None  # the state last written to Redis on its own (one slot)

    if not MULTI_EXECUTIONS:
        # RQ 2.x keeps the one running execution in ``worker.execution``, which its
        # ``perform_job`` reads and clears: each slot thread keeps its own.

        @property
        def execution(self) -> Execution | None:
            return getattr(self._per_thread(), "execution", None)

        @execution.setter
        def execution(self, execution: Execution | None) -> None:
            self._per_thread().execution = execution

        def _per_thread(self) -> threading.local:
            local = self.__dict__.get("_thread_state")
            if local is None:  # RQ sets the attribute in __init__, in the worker's own thread
                local = self.__dict__["_thread_state"] = threading.local()
            return local

    def __init__(self, performer: Performer, queues: Sequence[str] = (), **kwargs: Any):
        job_class = type("DeliveryJob", (DeliveryJob,), {"performer": performer, "registries": {}})
        # Before RQ's __init__, which sets the worker's state (:meth:`set_state` reads it).
        self._pool = performer.slots
        slots = self._pool.size if self._pool is not None else 1
        # One Redis connection per slot at most, the main loop's, RQ's pubsub and a few more
        # (redis-py's default pool of 100 would fail slots past that).
        names = list(queues) or [performer.default_queue]
        connection = WorkerRedis.from_url(
            performer.redis_url_for(names), max_connections=slots + _REDIS_SPARE
        )
        super().__init__(
            names,
            connection=connection,
            serializer=JSONSerializer,
            job_class=job_class,
            queue_class=DeliveryQueue,
            **kwargs,
        )
        self._performer = performer
        assert isinstance(connection, WorkerRedis)  # from_url is typed as a plain Redis
        self._client = connection
        if self._pool is not None:
            self.death_penalty_class = NoDeathPenalty
            self._pool.on_idle = self._all_slots_free
        # Jobs taken together and not handed out yet (each holds its slot), and the
        # executions of jobs started together (and those RQ's preparation was run for).
        self._taken: collections.deque[tuple[Job, Queue]] = collections.deque()
        self._started: dict[str, Execution] = {}
        self._prepared: dict[str, bool] = {}

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """RQ's loop; with slots, under the performer's switch interval (the interpreter's
        own is restored after): Python's 5 ms has the slots' threads, each waiting for the GIL
        between two short steps, hand it over more often than their work needs."""
        if self._pool is None:
            return bool(super().work(*args, **kwargs))
        previous = sys.getswitchinterval()
        sys.setswitchinterval(self._performer.switch_interval)
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            sys.setswitchinterval(previous)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        with self._noted():
            return self._take_for_slot(timeout, max_idle_time)

    def _take_for_slot(
        self, timeout: int | None, max_idle_time: int | None
    ) -> tuple[Job, Queue] | None:
        """Wait for a free slot (beating meanwhile), then take a job — and, with more slots
        free, as many more as are waiting, up to one per free slot, claimed together
        (:meth:`_begin`); those are handed out first. With jobs waiting they are taken
        without blocking (:meth:`_take_waiting`); otherwise as RQ takes one."""
        pool = self._pool
        if pool is None:
            return self._dequeue(timeout, max_idle_time)
        if self._taken:
            return self._taken.popleft()  # its slot was taken with it
        while not pool.acquire(_SLOT_WAIT):
            if self._stop_requested:
                return None
            self.heartbeat()
        try:
            pool.await_others(lambda: self._stop_requested)
            taken = None if self._stop_requested else self._take_waiting()
            if taken is not None:
                return taken
            # Idle before looking at the stop flag: a signal from here on raises StopRequested
            # (RQ's rule for an idle worker) instead of only setting the flag while this
            # process blocks on Redis for minutes.
            self.set_state(WorkerStatus.IDLE)
            taken = self._dequeue(timeout, max_idle_time)
        except BaseException:
            pool.release()
            raise
        if taken is None:
            pool.release()
            return None
        # Busy in memory at once: a stop signal from here on no longer raises into this
        # thread (RQ's rule for an idle worker), which would drop what was just taken.
        self._state = WorkerStatus.BUSY
        self._begin([taken, *self._take_more(0)])
        return taken

    def _take_waiting(self) -> tuple[Job, Queue] | None:
        """Jobs already waiting, one for the slot just freed and one per other free slot,
        taken at once (:meth:`_pop_waiting`) without RQ's blocking dequeue, which would cost
        two more round trips for the first; RQ's housekeeping of a dequeue (the beat, its
        maintenance tasks) still runs. None when none waits (or they could not be taken):
        the blocking dequeue follows. The worker stays busy in memory throughout, so a stop
        signal only sets the flag (RQ raises into an idle worker) and drops nothing taken."""
        if not self._pops_at_once():
            return None
        self._state = WorkerStatus.BUSY
        self.heartbeat()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()  # type: ignore[no-untyped-call]
        jobs = self._take_more(1)
        if not jobs:
            return None
        self._begin(jobs)
        return jobs[0]

    def _take_more(self, held: int) -> list[tuple[Job, Queue]]:
        """Take, without waiting, up to one waiting job per free slot — the ``held`` slots
        already acquired and every other one free now (never more: a worker does not hoard
        jobs another could run) — and release the slots left without a job, but for the
        ``held`` ones when none was taken."""
        assert self._pool is not None
        free = held + self._pool.acquire_free()
        try:
            more = self._pop_waiting(free) if free else []
        except RedisError as exc:  # a job taken already runs; the next dequeue waits
            log.warning("could not take more jobs at once (%s)", exc)
            more = []
        self._pool.release(free - max(len(more), held))
        version = self.get_redis_server_version()  # type: ignore[no-untyped-call]
        for job, _ in more:
            job.redis_server_version = version  # as RQ's dequeue sets it
        return more

    def _begin(self, jobs: list[tuple[Job, Queue]]) -> None:
        """Jobs taken together, the first handed out now: the rest wait in ``_taken``; all
        are started in RQ in one pipeline and have their deliveries claimed in one
        statement, which commits while the jobs are handed out."""
        assert self._pool is not None
        self._taken.extend(jobs[1:])
        self._pool.took([job.id for job, _ in jobs])
        self._start_all(jobs)
        deliveries = [d for d in (read_delivery(job) for job, _ in jobs) if d is not None]
        try:
            self._performer.claim_ahead(deliveries)
        except Exception:  # each slot claims its own delivery then, and meets the error
            log.exception("could not claim %d deliveries together", len(deliveries))

    def _start_all(self, jobs: list[tuple[Job, Queue]]) -> None:
        """RQ's start of jobs taken together — each one's execution, in the started registry
        and the worker's executions, then RQ's own preparation of each (job heartbeat, status
        ``started``, out of the intermediate list) — in one pipeline instead of two round
        trips each. The worker beats once for them all (RQ beats in each job's preparation)
        and its process title names the batch. On a Redis error each job is started and
        prepared alone when it runs."""
        pipe = self.connection.pipeline()
        remove = len(self.queues) == 1  # as RQ's perform_job asks it
        ttls = [self.get_heartbeat_ttl(job) for job, _ in jobs]
        try:
            executions = [
                (job, create_execution(job, ttl, pipe, self.name))
                for (job, _), ttl in zip(jobs, ttls, strict=True)
            ]
            with self._client.sharing(pipe):
                shared = self.connection.pipeline()
                self.heartbeat(max(ttls), pipeline=shared)
                self._starting = shared
                try:
                    for job, _ in jobs:
                        super().prepare_job_execution(job, remove)
                finally:
                    self._starting = None
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            pipe.execute()
        except RedisError as exc:
            log.warning("could not start %d jobs at once (%s)", len(jobs), exc)
            return
        finally:
            pipe.reset()
        job = jobs[0][0]
        what = job.func_name if len(jobs) == 1 else f"{len(jobs)} jobs"
        self.procline(f"Processing {what} from {job.origin} since {time.time()}")
        for job, execution in executions:
            if MULTI_EXECUTIONS:
                self.executions[execution.id] = execution
            self._started[job.id] = execution
            self._prepared[job.id] = True

    def procline(self, message: str) -> None:
        """RQ's process title, once for jobs started together (:meth:`_start_all`)."""
        if self._starting is None:
            super().procline(message)  # type: ignore[no-untyped-call]

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """RQ's preparation of a job about to run, unless it was prepared with the jobs taken
        together with it (:meth:`_start_all`)."""
        if self._prepared.pop(job.id, False):
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def execute_job(self, job: Job, queue: Queue) -> None:
        with self._noted():
            self._execute_job(job, queue)

    def _execute_job(self, job: Job, queue: Queue) -> None:
        pool = self._pool
        if pool is None:
            try:  # as RQ's SimpleWorker runs it, the job started in one pipeline, not two
                self._start_all([(job, queue)])
                self._perform(job, queue, self._execution_for(job))
                self.set_state(WorkerStatus.IDLE)
            except RedisError as exc:  # RQ would end the worker: the next dequeue waits
                log.warning(
                    "Redis failed around job %s (%s); the database holds what became of it "
                    "(a job that did not start is pushed again by the reconciler); the worker "
                    "goes on",
                    job.id,
                    exc,
                )
            return
        taken_at = pool.taken_at(job.id)
        execution = self._start_alone(job, time.monotonic() if taken_at is None else taken_at)
        if execution is None:
            pool.drop(job.id)
            return
        pool.run(job.id, lambda: self._perform(job, queue, execution))

    def _start_alone(self, job: Job, taken_at: float) -> Execution | None:
        """The job's execution: the one it was started with together with others, or RQ's own
        start of it alone when that failed — tried again while Redis fails (RQ would end the
        worker, and a warm stop the jobs after it), as the next dequeue would wait for Redis
        anyway, until the job's claim (made as it was taken, at ``taken_at``) has outlived
        its lease. None then: the worker goes on, and the reconciler rescues the claim (the
        attempt counts as abandoned) and pushes the job again. (A job started late within the
        lease has its claim renewed, or given up, before its handler runs: see the
        performer's ``deliver``.)"""
        give_up = taken_at + self._performer.lease
        wait = 0.5
        while True:
            known = set(self.executions) if MULTI_EXECUTIONS else set()
            try:
                return self._execution_for(job)
            except RedisError as exc:
                if MULTI_EXECUTIONS:  # RQ 3 lists an execution before it is written
                    for stale in set(self.executions) - known:
                        del self.executions[stale]
                else:
                    self.execution = None
                if time.monotonic() + wait > give_up:
                    log.error(
                        "Redis failed as job %s started (%s) past its claim's lease; the "
                        "reconciler rescues the claim and pushes the job again",
                        job.id,
                        exc,
                    )
                    delivery = read_delivery(job)
                    if delivery is not None:
                        self._performer.forget_ahead(delivery)
                    return None
                log.warning(
                    "Redis failed as job %s started (%s); again in %.1f s", job.id, exc, wait
                )
                time.sleep(wait)
                wait = min(wait * 2, DEQUEUE_BACKOFF_CAP)

    def _execution_for(self, job: Job) -> Execution:
        """The job's execution: the one it was started with, or RQ's own, made now."""
        started = self._started.pop(job.id, None)
        return started if started is not None else self.prepare_execution(job)

    def _perform(self, job: Job, queue: Queue, execution: Execution) -> None:
        """RQ's run of a started job, in this thread, with its execution."""
        if MULTI_EXECUTIONS:
            self.perform_job(job, queue, execution)
        else:
            self.execution = execution
            self.perform_job(job, queue)  # type: ignore[call-arg,unused-ignore]

    def _all_slots_free(self) -> None:
        """The last running slot freed (under the pool's lock: a job the main thread starts
        now is busy after this): Redis is told the worker is idle, if it is."""
        if self.get_state() == WorkerStatus.IDLE:
            try:
                super().set_state(WorkerStatus.IDLE)
            except RedisError as exc:
                log.warning("could not mark the worker idle (%s)", exc)

    def teardown(self) -> None:
        """Run the jobs taken together with another and not started yet (they hold a slot
        and their claim), let the running slots finish before RQ deregisters the worker —
        all but those given up, which will not return: then the process ends for its
        supervisor (:meth:`~duejobs.delivery.performer.Slots.close`)."""
        if self._pool is not None:
            while self._taken:
                self.execute_job(*self._taken.popleft())
            self._pool.close()
        super().teardown()  # type: ignore[no-untyped-call]

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """RQ's warm shutdown, with the request also kept as a flag: RQ raises
        ``StopRequested`` in an idle worker, and one that lands inside RQ's start-up code
        can be swallowed there, leaving the worker to block on Redis for good."""
        self._stop_requested = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        if self._pool is None:
            super().request_force_stop(signum, frame)
            return
        if (now() - self._shutdown_requested_date) < timedelta(seconds=1):  # type: ignore[operator]
            return  # the same stop reaching this process twice (its group, its supervisor)
        log.warning("cold shutdown: ending now; running attempts are rescued when their lease ends")
        os._exit(1)

    def kill_horse(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Nothing to kill: jobs run in this process. (RQ 2.x's version signals the process
        group of ``horse_pid``, which is 0 here: RQ's "stop job" command would kill the worker
        and every process in its group.)"""

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's ``rq suspend`` check, at most once a second (RQ reads a Redis key before every
        job): a suspension stops a worker from taking jobs within a second — once the jobs it
        took together with another have run."""
        if self._taken:  # jobs taken, claimed and started already: they run first
            return
        if self._suspension_checked is not None and now() - self._suspension_checked < BEAT_EVERY:
            return
        with self._noted():
            super().check_for_suspension(burst)
        self._suspension_checked = now()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's worker state; with slots, Redis is told ``idle`` only once no slot is busy
        (RQ sets it before each dequeue, while the other slots may be running jobs). The
        state in memory still turns idle: RQ's stop signal raises ``StopRequested`` into an
        idle worker's blocking dequeue."""
        if state == WorkerStatus.IDLE and self._pool is not None and self._pool.busy:
            self._state = state
            return
        if self._pool is None and pipeline is None and state == self._told:
            self._state = state  # RQ marks a one-slot worker idle after a job and again
            return  # before the next dequeue: Redis already has it
        super().set_state(state, pipeline)
        self._told = state if pipeline is None else None  # a pipeline may yet fail

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """The end of a job's run. RQ also beats the job here (a round trip of its own), to
        cover the job's success or failure callback; a duejobs delivery has none, and its
        finish, in the next step, writes the job's end and last beat."""
        if getattr(job, "delivered", None) is None:
            super().handle_execution_ended(job, queue, heartbeat_ttl)
            return
        job.ended_at = job.last_heartbeat = now()

    def handle_job_success(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> None:
        """RQ's finish of a job that ran, its writes in one transaction with those of the
        other slots finishing meanwhile (:class:`~.rq_redis.FinishPipeline`); then a delivery
        that came too early is put back into the scheduled registry."""
        ran = job if isinstance(job, DeliveryJob) and job.delivered is not None else None
        if ran is not None:
            ran.finishing = True
        try:
            with self._client.finishing():
                super().handle_job_success(job, queue, *args, **kwargs)
        finally:
            if ran is not None:
                ran.finishing = False
        delivered = getattr(job, "delivered", None)
        if delivered is None or delivered.put_back_at is None:
            return
        try:
            self._performer.deliverer().defer(job.id, delivered.put_back_at, job.origin)
        except RedisError:
            log.exception(
                "could not put %s back for %s; the reconciler will", job.id, delivered.put_back_at
            )
