"""The worker's side of RQ: the worker class that runs duejobs' jobs through a performer,
one at a time or in slots (see :class:`DuejobsWorker`)."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType
from typing import Any, ClassVar, Protocol, TypeVar

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    DataError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, FieldT
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.registry import BaseRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import BaseDeathPenalty
from rq.utils import as_text, get_version, now, str_to_date, utcformat
from rq.worker import WorkerStatus

from duejobs.batches import GroupCommit
from duejobs.delivery._rq_compat import (
    MULTI_EXECUTIONS,
    NAIVE_TIMESTAMPS,
    StopRequested,
    create_execution,
)
from duejobs.delivery.deliverer import Deliverer

log = logging.getLogger("duejobs.delivery")
# The exit status of a worker that ended itself because handlers would not return.
EXIT_WEDGED = 70

# How often a worker whose slots are all busy beats and looks for a stop request (seconds).
_SLOT_WAIT = 1.0
# Redis connections a worker holds beyond one per slot.
_REDIS_SPARE = 8
# How often a plain worker heartbeat, or a look for `rq suspend`, reaches Redis at most.
_BEAT_EVERY = timedelta(seconds=1)
# The longest wait between two tries of a Redis that does not answer a dequeue (seconds): a
# node back from an outage, however long, is served again within it.
_DEQUEUE_BACKOFF_CAP = 2.0


@dataclass(frozen=True)
class Delivered:
    """What handling one delivery came to: the outcome (the RQ job's result), and when to
    put the job back into its scheduled registry (None: it is done)."""

    outcome: str
    put_back_at: datetime | None = None


class Performer(Protocol):
    """What runs deliveries for a :class:`DuejobsWorker` (the worker's ``Runtime``)."""

    def redis_url_for(self, queues: Sequence[str]) -> str:
        """The Redis node the queues live on (refused when they live on several)."""
        ...

    @property
    def default_queue(self) -> str: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def take_window(self) -> float:
        """Seconds a slot freed while others run waits for them before jobs are taken."""
        ...

    @property
    def switch_interval(self) -> float:
        """The interpreter's switch interval (seconds) while slots work."""
        ...

    @property
    def wedged(self) -> int:
        """Slots whose handler was given up past its timeout and grace and still runs."""
        ...

    @property
    def lease(self) -> float:
        """Seconds a claim holds its row before the reconciler may rescue it."""
        ...

    def forget_ahead(self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str) -> None:
        """Drop the claim made ahead of a delivery no slot will run."""
        ...

    def deliverer(self) -> Deliverer: ...

    def claim_ahead(self, deliveries: Sequence[tuple[uuid.UUID, int, int, str]]) -> None:
        """Claim together deliveries taken together, before their slots run them."""
        ...

    def deliver(
        self, schedule_id: uuid.UUID, version: int, attempt: int, tenant: str
    ) -> Delivered: ...


_Registry = TypeVar("_Registry", bound=BaseRegistry)


class _DeliveryJob(Job):
    """A duejobs job as a :class:`DuejobsWorker` runs it: its arguments go to the worker's
    performer (never through an import of the function the job names), and what came of it
    stays on the job for :meth:`DuejobsWorker.handle_job_success`.

    Some of RQ's per-job costs are cut without changing what RQ reads or writes: a job's
    registries (RQ builds one, checking its serializer, at each use) are shared by the
    worker's jobs of one queue, which have one connection and one serializer; the worker's
    own serializer is not checked again for each job read; a job's timestamps are read with
    the standard library's ISO parser instead of ``strptime`` (the same values); and its
    finish writes the fields of the job's hash that its run changed, where RQ writes the whole
    hash again (its data serialized and compressed anew, unchanged). A hash that vanished
    while its job ran (evicted, or deleted by hand) is therefore left holding those fields
    alone until its result's time to live ends, where RQ would write it whole again: duejobs
    counts such a job as absent (its row, not the hash, says what became of the delivery)."""

    performer: ClassVar[Performer]
    registries: ClassVar[dict[tuple[type[BaseRegistry], str], BaseRegistry]]
    delivered: Delivered | None = None
    finishing: bool = False  # within the worker's finish of a job that ran

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ) -> None:
        # RQ checks the serializer of each job it makes (a slow Protocol isinstance on Python
        # 3.11); the worker's own was checked when the worker started.
        if serializer is not JSONSerializer:
            super().__init__(id, connection=connection, serializer=serializer)
            return
        super().__init__(id, connection=connection)
        self.serializer = serializer

    def restore(self, raw_data: dict[Any, Any]) -> Any:
        """RQ's restore, its timestamps parsed by :func:`_timestamp`."""
        rest, stamps = {}, {}
        for field, value in raw_data.items():
            name = as_text(field)
            if name in _TIMESTAMPS and value:
                stamps[name] = value
            else:
                rest[field] = value
        restored = super().restore(rest)
        for name, value in stamps.items():
            setattr(self, name, _timestamp(value))
        return restored

    def _execute(self) -> Any:
        self.delivered = self.performer.deliver(*_delivery_args(self))
        return self.delivered.outcome

    def _shared(self, kind: type[_Registry]) -> _Registry:
        key = (kind, self.origin)
        found = self.registries.get(key)
        if found is None:
            found = kind(
                self.origin,
                connection=self.connection,
                job_class=type(self),
                serializer=self.serializer,
            )
            self.registries[key] = found
        assert isinstance(found, kind)
        return found

    @property
    def started_job_registry(self) -> StartedJobRegistry:
        return self._shared(StartedJobRegistry)

    @property
    def finished_job_registry(self) -> FinishedJobRegistry:
        return self._shared(FinishedJobRegistry)

    @property
    def failed_job_registry(self) -> FailedJobRegistry:
        return self._shared(FailedJobRegistry)

    def save(
        self,
        pipeline: Pipeline | None = None,
        include_meta: bool = True,
        include_result: bool = True,
    ) -> None:
        """RQ's save; in the finish of a job that ran, only the fields its run changed."""
        if not self.finishing or include_meta or (include_result and self._result is not None):
            super().save(pipeline, include_meta, include_result)
            return
        values = {
            "status": self._status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "last_heartbeat": self.last_heartbeat,
            "worker_name": self.worker_name,
        }
        mapping: dict[FieldT, EncodableT] = {
            name: utcformat(value) if isinstance(value, datetime) else (value or "")
            for name, value in values.items()
        }
        (pipeline if pipeline is not None else self.connection).hset(self.key, mapping=mapping)


# The fields of a job's hash RQ writes with ``utcformat`` and reads back with ``strptime``.
_TIMESTAMPS = frozenset({"created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat"})


def _timestamp(value: bytes | str) -> datetime:
    """A timestamp RQ wrote (``2026-12-03T12:02:46.584293Z``, or without the fraction), read
    as this RQ reads it (UTC, aware or naive) in a fortieth of the time; anything else as RQ
    reads it."""
    text = as_text(value)
    if text.endswith("Z"):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(text)  # "Z" is read as UTC since Python 3.11
            return parsed.replace(tzinfo=None) if NAIVE_TIMESTAMPS else parsed
    as_rq_reads: datetime = str_to_date(text.encode())  # RQ 2.0's takes bytes alone
    return as_rq_reads


def _delivery_args(job: Job) -> tuple[uuid.UUID, int, int, str]:
    """A duejobs job's delivery: schedule id, version, attempt, tenant."""
    schedule_id, version, attempt, tenant = job.args
    return uuid.UUID(str(schedule_id)), int(version), int(attempt), str(tenant)


def _delivery(job: Job) -> tuple[uuid.UUID, int, int, str] | None:
    """The delivery of a job taken; None for a job that is not one, or whose arguments cannot
    be read (its run says so)."""
    try:
        return _delivery_args(job)
    except Exception:
        return None


class _NoDeathPenalty(BaseDeathPenalty):
    """RQ's job timeout, off in a concurrent worker's slots: RQ's default arms ``SIGALRM``,
    which only the main thread may; the delivery enforces its handler's own timeout."""

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


class _SharedPipeline:
    """One pipeline that several ``with connection.pipeline() as p: ...; p.execute()``
    blocks of RQ's write into: their ``execute`` and the end of their block do nothing, and
    its owner executes it once."""

    def __init__(self, pipe: Pipeline) -> None:
        self._pipe = pipe

    def __enter__(self) -> _SharedPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


# The Redis commands of one job's finish, as a pipeline queues them: (arguments, options).
_Commands = list[tuple[Any, ...]]


class _DeliveryQueue(Queue):
    """A queue as a :class:`DuejobsWorker` sees it. A duejobs job has no RQ dependents: the
    deliverer enqueues none, and a job made to depend on one (``depends_on`` with a delivery
    job's id) is not supported — it is never enqueued. So the worker's finish of a job
    (:class:`_FinishPipeline`) reads no dependents, where RQ WATCHes each finishing job's
    dependents set and reads it (two round trips a job): that is what lets the finishes of
    several jobs share one transaction. Everywhere else, RQ's own."""

    @property
    def started_job_registry(self) -> StartedJobRegistry:
        """RQ's, made once (RQ makes one for each job a worker runs)."""
        registry: StartedJobRegistry | None = self.__dict__.get("_started_registry")
        if registry is None:
            registry = self.__dict__["_started_registry"] = super().started_job_registry
        return registry

    def enqueue_dependents(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("pipeline"), _FinishPipeline):
            return None  # RQ 2.x's finish
        return super().enqueue_dependents(*args, **kwargs)

    def move_dependents_to_ready(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("pipeline"), _FinishPipeline):
            return {}  # RQ 3's finish
        return super().move_dependents_to_ready(*args, **kwargs)


class _FinishPipeline(_SharedPipeline):
    """The pipeline RQ's finish of one job writes into (``handle_job_success``): its WATCH and
    MULTI stay here (there is nothing to watch: :class:`_DeliveryQueue`), and its ``execute``
    hands the queued commands to the worker's group commit, which runs the finishes of the jobs
    closing together in one MULTI/EXEC. It returns once that transaction has run, with this
    job's answers (or raising its first error), as RQ's own ``execute`` would."""

    def __init__(self, pipe: Pipeline, group: GroupCommit[_Commands, list[Any]]) -> None:
        super().__init__(pipe)
        self._group = group

    def __exit__(self, *exc: object) -> None:
        self._pipe.reset()

    def watch(self, *names: Any) -> None:
        return None

    def multi(self) -> None:
        return None

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands = list(self._pipe.command_stack)
        self._pipe.reset()
        answers = self._group.submit(commands)
        errors = [a for a in answers if isinstance(a, Exception)]
        if raise_on_error and errors:
            raise errors[0]
        return answers


class _WorkerRedis(Redis):
    """The worker's Redis client. Within :meth:`sharing`, every pipeline the calling thread
    asks for is one shared pipeline (other threads get their own as usual): RQ's per-job
    steps written for several jobs at once, with no change to RQ's code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shared = threading.local()
        self._finishes: GroupCommit[_Commands, list[Any]] = GroupCommit(
            "redis_finish", self._finish_together
        )

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        shared = getattr(self._shared, "pipe", None)
        if shared is not None:
            return shared
        if getattr(self._shared, "finishing", False):
            return _FinishPipeline(super().pipeline(transaction, shard_hint), self._finishes)
        return super().pipeline(transaction, shard_hint)

    @contextlib.contextmanager
    def sharing(self, pipe: Pipeline) -> Iterator[None]:
        self._shared.pipe = _SharedPipeline(pipe)
        try:
            yield
        finally:
            self._shared.pipe = None

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """Within it, the calling thread's pipelines are :class:`_FinishPipeline`: RQ's finish
        of a job, grouped with those of the other slots."""
        self._shared.finishing = True
        try:
            yield
        finally:
            self._shared.finishing = False

    def _finish_together(self, finishes: Sequence[_Commands]) -> list[list[Any]]:
        """Run the finishes of several jobs in one MULTI/EXEC; each job's answers, its errors
        among them. A transaction Redis refuses whole (a command it rejects when queued) is
        run again one finish at a time, so one job's bad command fails that job alone."""
        pipe = Redis.pipeline(self)  # a plain one, whatever this thread's context
        try:
            for commands in finishes:
                pipe.command_stack.extend(commands)
            answers = pipe.execute(raise_on_error=False)
        except (ResponseError, DataError):  # refused as queued, or not sent: nothing ran
            if len(finishes) == 1:
                raise
            return [self._finish_alone(commands) for commands in finishes]
        finally:
            pipe.reset()
        split, at = [], 0
        for commands in finishes:
            split.append(answers[at : at + len(commands)])
            at += len(commands)
        return split

    def _finish_alone(self, commands: _Commands) -> list[Any]:
        try:
            return self._finish_together([commands])[0]
        except (ResponseError, DataError) as exc:
            return [exc]


class DuejobsWorker(SimpleWorker):
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
    (10 ms by default), so that jobs are taken for several free slots at once rather than one
    by one: with short handlers this cuts the worker's CPU per job by a third. It delays a job
    by at most the window, and only while the worker is busy; a handler taken at another time
    is not waited for, so a long one costs the slots beside it one window at most.

    **Less Redis per job.** RQ beats three times per job and reads the ``rq suspend`` flag
    before each; here a plain beat and the suspension check reach Redis at most once a second
    (a suspension stops the worker taking jobs within a second). RQ's finish of a job WATCHes
    and reads its dependents set (a duejobs job has none: :class:`_DeliveryQueue`) and beats
    the job once more; here the finish is one transaction, shared by the jobs of the slots
    that finish together (:class:`_FinishPipeline`). With slots, jobs already waiting are
    taken for the free slots in two round trips whatever their number, the worker beats once
    for them, and Redis is told the worker is ``idle`` only once no slot is busy.

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
    ``_DEQUEUE_BACKOFF_CAP``), and RQ's "stop job" command is ignored, as RQ 3's
    SimpleWorker ignores it (a job runs in the worker's own process; RQ 2.x would kill the
    worker's whole process group). Cancel a schedule to stop its handler at its next check.
    """

    max_connection_wait_time = _DEQUEUE_BACKOFF_CAP  # RQ's own, inside its dequeue: 60 s
    # The error that ended RQ's loop, if one did: RQ logs it and returns as from a stop, and
    # the worker's command then exits non-zero for its supervisor (see ``_noted``).
    failure: Exception | None = None
    _suspension_checked: datetime | None = None
    _beat_at: datetime | None = None  # the last plain heartbeat sent
    _starting: Any = None  # the pipeline starting jobs taken together, meanwhile
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
        job_class = type("DeliveryJob", (_DeliveryJob,), {"performer": performer, "registries": {}})
        slots = performer.concurrency
        # One Redis connection per slot at most, the main loop's, RQ's pubsub and a few more
        # (redis-py's default pool of 100 would fail slots past that).
        names = list(queues) or [performer.default_queue]
        connection = _WorkerRedis.from_url(
            performer.redis_url_for(names), max_connections=slots + _REDIS_SPARE
        )
        super().__init__(
            names,
            connection=connection,
            serializer=JSONSerializer,
            job_class=job_class,
            queue_class=_DeliveryQueue,
            **kwargs,
        )
        self._performer = performer
        assert isinstance(connection, _WorkerRedis)  # from_url is typed as a plain Redis
        self._client = connection
        if slots > 1:
            self.death_penalty_class = _NoDeathPenalty
        self._slots = threading.BoundedSemaphore(slots)
        self._pool = (
            ThreadPoolExecutor(slots, thread_name_prefix="duejobs-slot") if slots > 1 else None
        )
        self._busy_lock = threading.Condition()
        # The take each job taken and not yet handed out came with; under ``_busy_lock``
        # (:meth:`_await_others`): the take each running slot's job came with, the take of the
        # job that first freed a slot since the last take, the take the last wait was for,
        # and the slots a take waits for.
        self._take_of: dict[str, object] = {}
        self._taken_at: dict[str, float] = {}  # when each of them was taken (monotonic)
        self._running: dict[object, object] = {}
        self._freed_take: object | None = None
        self._waited_take: object | None = None
        self._awaited: set[object] = set()
        self._taken: collections.deque[tuple[Job, Queue]] = collections.deque()
        self._started: dict[str, Execution] = {}  # executions of jobs taken together
        self._prepared: dict[str, bool] = {}  # those of them RQ's preparation was run for

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

    @contextlib.contextmanager
    def _noted(self) -> Iterator[None]:
        """An error out of a step of RQ's loop is kept in ``failure``: RQ's loop ends on it
        ("found an unhandled exception, quitting"), and a worker that quit that way must not
        look, to its supervisor, like one that was stopped."""
        try:
            yield
        except StopRequested:
            raise
        except Exception as exc:
            self.failure = exc
            raise

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
        if self._pool is None:
            return self._dequeue(timeout, max_idle_time)
        if self._taken:
            return self._taken.popleft()  # its slot was taken with it
        while not self._slots.acquire(timeout=_SLOT_WAIT):
            if self._stop_requested:
                return None
            self.heartbeat()
        try:
            self._await_others()
            taken = None if self._stop_requested else self._take_waiting()
            if taken is not None:
                return taken
            # Idle before looking at the stop flag: a signal from here on raises StopRequested
            # (RQ's rule for an idle worker) instead of only setting the flag while this
            # process blocks on Redis for minutes.
            self.set_state(WorkerStatus.IDLE)
            taken = self._dequeue(timeout, max_idle_time)
        except BaseException:
            self._slots.release()
            raise
        if taken is None:
            self._slots.release()
            return None
        # Busy in memory at once: a stop signal from here on no longer raises into this
        # thread (RQ's rule for an idle worker), which would drop what was just taken.
        self._state = WorkerStatus.BUSY
        self._begin([taken, *self._take_more(0)])
        return taken

    def _await_others(self) -> None:
        """A slot is free and others still run: wait for those started together with the job
        that first freed a slot since the last take (taken from Redis in the same take) —
        handlers taken together tend to return together — until they are done or the
        performer's take window has passed, so that the jobs for the slots freed meanwhile are
        taken, claimed and started together: one round trip of each kind for the batch instead
        of one per job. Jobs taken together are waited for once: their slots that free later
        take at once. So a long handler (a slow call, a handler given up), or handlers whose
        times spread wider than the window, cost the slots beside them one window at most. A
        stop request is seen at the next wake, within the window."""
        window = self._performer.take_window
        with self._busy_lock:
            now, take, self._freed_take = time.monotonic(), self._freed_take, None
            if take is None or take is self._waited_take:
                return  # no slot freed since the last take, or its take had its wait
            self._waited_take = take
            self._awaited = {s for s, came in self._running.items() if came is take}
            try:
                while self._awaited and not self._stop_requested:
                    left = now + window - time.monotonic()
                    if left <= 0:
                        return
                    self._busy_lock.wait(min(left, _SLOT_WAIT))
            finally:
                self._awaited = set()

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
        free = held
        while self._slots.acquire(blocking=False):
            free += 1
        try:
            more = self._pop_waiting(free) if free else []
        except RedisError as exc:  # a job taken already runs; the next dequeue waits
            log.warning("could not take more jobs at once (%s)", exc)
            more = []
        for _ in range(free - max(len(more), held)):
            self._slots.release()
        version = self.get_redis_server_version()  # type: ignore[no-untyped-call]
        for job, _ in more:
            job.redis_server_version = version  # as RQ's dequeue sets it
        return more

    def _begin(self, jobs: list[tuple[Job, Queue]]) -> None:
        """Jobs taken together, the first handed out now: the rest wait in ``_taken``; all
        are started in RQ in one pipeline and have their deliveries claimed in one
        statement, which commits while the jobs are handed out."""
        self._taken.extend(jobs[1:])
        take, taken_at = object(), time.monotonic()
        for job, _ in jobs:
            self._take_of[job.id] = take
            self._taken_at[job.id] = taken_at
        self._start_all(jobs)
        deliveries = [d for d in (_delivery(job) for job, _ in jobs) if d is not None]
        try:
            self._performer.claim_ahead(deliveries)
        except Exception:  # each slot claims its own delivery then, and meets the error
            log.exception("could not claim %d deliveries together", len(deliveries))

    def _dequeue(self, timeout: int | None, max_idle_time: int | None) -> tuple[Job, Queue] | None:
        """RQ's blocking dequeue, which waits out a Redis that answers too late (paused,
        overloaded, failing over) or not at all (restarting) instead of ending the worker:
        RQ retries a dropped connection inside its wait but quits on a timeout, or on a
        refused connection when it marks the worker idle first, so every idle worker would
        stop at that moment. None once a stop is requested."""
        wait = 1.0
        while not self._stop_requested:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except (RedisTimeoutError, RedisConnectionError) as exc:
                if isinstance(exc, AuthenticationError | AuthorizationError):
                    raise  # a wrong password or ACL does not mend by waiting
                log.warning("Redis did not answer a dequeue (%s); retrying in %.0f s", exc, wait)
                time.sleep(wait)
                wait = min(wait * 2, _DEQUEUE_BACKOFF_CAP)
        return None

    def _pop_waiting(self, most: int) -> list[tuple[Job, Queue]]:
        """Up to ``most`` waiting jobs, without blocking, taken as RQ's own dequeue takes
        them. From one queue (on Redis 6.2 or later) in two round trips, whatever their
        number: each id moved to the queue's intermediate list as ``LMOVE`` does it, then
        every job's hash read in one pipeline; an id whose hash is gone is passed over, as RQ
        passes it over. From several queues, one dequeue each, which keeps their priority.

        As RQ's own dequeue can lose the one job whose move reached Redis and whose answer
        did not, a connection lost in the middle can leave the ids of this batch in the
        intermediate list, where no worker takes them: their rows are overdue for the
        reconciler, which pushes them again (``stuck_after``)."""
        if not self._pops_at_once():
            return self._dequeue_each(most)
        queue = self._ordered_queues[0]
        moving = IntermediateQueue(queue.key, self.connection).key
        pipe = self.connection.pipeline(transaction=False)
        for _ in range(most):
            pipe.lmove(queue.key, moving)
        ids = [as_text(job_id) for job_id in pipe.execute() if job_id is not None]
        if not ids:
            return []
        try:
            hashes = self._read_hashes(ids)
        except RedisError:
            self._put_back(queue, moving, ids)
            raise
        return [(job, queue) for job in self._restored(ids, hashes)]

    def _read_hashes(self, ids: list[str]) -> list[dict[Any, Any]]:
        pipe = self.connection.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.job_class.key_for(job_id))
        hashes: list[dict[Any, Any]] = pipe.execute()
        return hashes

    def _restored(self, ids: list[str], hashes: list[dict[Any, Any]]) -> Iterator[Job]:
        """The jobs of the hashes read, each on its own: one whose hash is gone, or cannot be
        read — a hash left without its ``data`` by a write cut short (a FLUSHDB as the job
        finished or was put back), a field RQ cannot parse — is passed over, as RQ's own
        dequeue passes over a missing one, and the jobs taken with it run. Its schedule's row,
        not the hash, is the truth: overdue, the reconciler pushes it again."""
        for job_id, raw in zip(ids, hashes, strict=True):
            if not raw:
                continue
            job = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
            try:
                job.restore(raw)
            except Exception as exc:
                log.warning("job %s cannot be read (%s); passed over", job_id, exc)
                continue
            yield job

    def _pops_at_once(self) -> bool:
        """Whether waiting jobs can be taken in one round trip: from one queue, on a Redis
        that has ``LMOVE`` (6.2)."""
        return len(self._ordered_queues) == 1 and get_version(self.connection) >= (6, 2, 0)

    def _put_back(self, queue: Queue, moving: str, ids: list[str]) -> None:
        """Return ids taken off ``queue`` whose jobs could not be read to its front, in
        their order; what cannot be returned either waits in the intermediate list for the
        reconciler, which pushes the overdue rows of jobs no worker can take again."""
        try:
            with self.connection.pipeline() as pipe:
                for job_id in ids:
                    pipe.lrem(moving, 1, job_id)
                pipe.lpush(queue.key, *reversed(ids))
                pipe.execute()
        except RedisError as exc:
            log.warning("could not put back %d jobs taken at once (%s)", len(ids), exc)

    def _dequeue_each(self, most: int) -> list[tuple[Job, Queue]]:
        taken: list[tuple[Job, Queue]] = []
        while len(taken) < most:
            more = self.queue_class.dequeue_any(
                self._ordered_queues,
                None,
                connection=self.connection,
                job_class=self.job_class,
                serializer=self.serializer,
                death_penalty_class=self.death_penalty_class,
            )
            if more is None:
                break
            taken.append(more)
        return taken

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
        if self._pool is None:
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
        slot = object()  # this run of a slot (one job id can run twice at once)
        take = self._take_of.pop(job.id, None) or object()
        taken_at = self._taken_at.pop(job.id, None)
        execution = self._start_alone(job, time.monotonic() if taken_at is None else taken_at)
        if execution is None:
            self._slots.release()  # the slot taken for it
            return
        with self._busy_lock:
            self._running[slot] = take
        try:
            self._pool.submit(self._run_slot, slot, job, queue, execution)
        except BaseException:  # the job stays in RQ's intermediate list for the re-push
            self._slot_done(slot)
            raise

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
                    delivery = _delivery(job)
                    if delivery is not None:
                        self._performer.forget_ahead(*delivery)
                    return None
                log.warning(
                    "Redis failed as job %s started (%s); again in %.1f s", job.id, exc, wait
                )
                time.sleep(wait)
                wait = min(wait * 2, _DEQUEUE_BACKOFF_CAP)

    @property
    def _busy(self) -> int:
        """Slots running a job (RQ may set the worker's state before ``__init__`` ends)."""
        return len(self.__dict__.get("_running", ()))

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

    def _run_slot(self, slot: object, job: Job, queue: Queue, execution: Execution) -> None:
        try:
            self._perform(job, queue, execution)
        except BaseException:  # perform_job records failures itself; this is a last resort
            log.exception("slot ended by an error outside the job %s", job.id)
        finally:
            self._slot_done(slot)

    def _slot_done(self, slot: object) -> None:
        with self._busy_lock:
            take = self._running.pop(slot, None)
            if take is None:  # counted done already (its submission failed half-way)
                return
            if self._freed_take is None:
                self._freed_take = take
            # The slot is free before anyone waiting for it wakes (:meth:`_await_others`).
            self._slots.release()
            if slot in self._awaited:
                self._awaited.discard(slot)
                if not self._awaited:  # the last one the take waits for
                    self._busy_lock.notify_all()
            if self._busy <= max(0, self._performer.wedged):  # a warm stop waits for this
                self._busy_lock.notify_all()
            if not self._busy and self.get_state() == WorkerStatus.IDLE:
                try:  # under the lock: a job the main thread starts now is busy after this
                    super().set_state(WorkerStatus.IDLE)
                except RedisError as exc:
                    log.warning("could not mark the worker idle (%s)", exc)

    def teardown(self) -> None:
        """Run the jobs taken together with another and not started yet (they hold a slot
        and their claim), let the running slots finish before RQ deregisters the worker —
        all but those given up, which will not return: then the process ends for its
        supervisor."""
        if self._pool is not None:
            while self._taken:
                self.execute_job(*self._taken.popleft())
            with self._busy_lock:
                while self._busy > max(0, self._performer.wedged):
                    self._busy_lock.wait(_SLOT_WAIT)
                stuck = self._busy
            if stuck:
                log.critical(
                    "%d slots hold handlers that will not return; the worker exits (status %d)",
                    stuck,
                    EXIT_WEDGED,
                )
                os._exit(EXIT_WEDGED)
            self._pool.shutdown(wait=True)
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

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat, sent at most once a second, which must not end the worker when
        Redis restarts.

        RQ beats three times per job (before and after each dequeue, after each job), three
        Redis round trips each, for a registration that lives ``worker_ttl`` (minutes): a
        plain beat within ``_BEAT_EVERY`` of the last one is skipped. One with a ``timeout``
        or ``pipeline`` (a job's start, its monitoring) is always sent. RQ retries a dequeue
        that meets a dropped connection but quits on a heartbeat that does, so every worker
        between two jobs at that moment would stop: the next dequeue waits for Redis."""
        with self._noted():
            self._beat(timeout, pipeline)

    def _beat(self, timeout: int | None, pipeline: Any) -> None:
        if pipeline is not None and pipeline is self._starting:
            return  # beaten once for the jobs started together
        plain = timeout is None and pipeline is None
        if plain and self._beat_at is not None and now() - self._beat_at < _BEAT_EVERY:
            return
        try:
            super().heartbeat(timeout, pipeline)
            if plain:
                self._beat_at = now()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            log.warning("worker heartbeat could not reach Redis (%s); going on", exc)

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's ``rq suspend`` check, at most once a second (RQ reads a Redis key before every
        job): a suspension stops a worker from taking jobs within a second — once the jobs it
        took together with another have run."""
        if self._taken:  # jobs taken, claimed and started already: they run first
            return
        if self._suspension_checked is not None and now() - self._suspension_checked < _BEAT_EVERY:
            return
        with self._noted():
            super().check_for_suspension(burst)
        self._suspension_checked = now()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's worker state; with slots, Redis is told ``idle`` only once no slot is busy
        (RQ sets it before each dequeue, while the other slots may be running jobs). The
        state in memory still turns idle: RQ's stop signal raises ``StopRequested`` into an
        idle worker's blocking dequeue."""
        if state == WorkerStatus.IDLE and self._busy:
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
        other slots finishing meanwhile (:class:`_FinishPipeline`); then a delivery that came
        too early is put back into the scheduled registry."""
        ran = job if isinstance(job, _DeliveryJob) and job.delivered is not None else None
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
