"""The worker's Redis client and queue, which let RQ's per-job steps be written for several
jobs at once with no change to RQ's code: a pipeline shared by the steps of jobs started
together (:meth:`WorkerRedis.sharing`), and the finishes of jobs closing together in one
MULTI/EXEC (:class:`FinishPipeline`, :class:`DeliveryQueue`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import DataError, ResponseError
from rq import Queue
from rq.registry import StartedJobRegistry

from duejobs.batches import GroupCommit


class SharedPipeline:
    """One pipeline that several ``with connection.pipeline() as p: ...; p.execute()``
    blocks of RQ's write into: their ``execute`` and the end of their block do nothing, and
    its owner executes it once."""

    def __init__(self, pipe: Pipeline) -> None:
        self._pipe = pipe

    def __enter__(self) -> SharedPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


# The Redis commands of one job's finish, as a pipeline queues them: (arguments, options).
_Commands = list[tuple[Any, ...]]


class DeliveryQueue(Queue):
    """A queue as a :class:`DuejobsWorker` sees it. A duejobs job has no RQ dependents: the
    deliverer enqueues none, and a job made to depend on one (``depends_on`` with a delivery
    job's id) is not supported — it is never enqueued. So the worker's finish of a job
    (:class:`FinishPipeline`) reads no dependents, where RQ WATCHes each finishing job's
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
        if isinstance(kwargs.get("pipeline"), FinishPipeline):
            return None  # RQ 2.x's finish
        return super().enqueue_dependents(*args, **kwargs)

    def move_dependents_to_ready(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("pipeline"), FinishPipeline):
            return {}  # RQ 3's finish
        return super().move_dependents_to_ready(*args, **kwargs)


class FinishPipeline(SharedPipeline):
    """The pipeline RQ's finish of one job writes into (``handle_job_success``): its WATCH and
    MULTI stay here (there is nothing to watch: :class:`DeliveryQueue`), and its ``execute``
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


class WorkerRedis(Redis):
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
            return FinishPipeline(super().pipeline(transaction, shard_hint), self._finishes)
        return super().pipeline(transaction, shard_hint)

    @contextlib.contextmanager
    def sharing(self, pipe: Pipeline) -> Iterator[None]:
        self._shared.pipe = SharedPipeline(pipe)
        try:
            yield
        finally:
            self._shared.pipe = None

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """Within it, the calling thread's pipelines are :class:`FinishPipeline`: RQ's finish
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
