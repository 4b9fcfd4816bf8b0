"""How the worker's RQ side takes jobs from Redis, and keeps RQ's loop alive while Redis
is away (:class:`TakingWorker`, the base of :class:`~duejobs.delivery.DuejobsWorker`).

What it promises: a Redis that answers a dequeue too late (paused, overloaded, failing over)
or not at all (restarting) is waited out, backing off to ``_DEQUEUE_BACKOFF_CAP``, where RQ
would end the worker; waiting jobs are taken for several free slots in two round trips
whatever their number (:meth:`TakingWorker._pop_waiting`), a job whose hash is gone or cannot
be read passed over; a plain heartbeat reaches Redis at most once a second and never ends the
worker; an error that ends RQ's loop is kept in ``failure``, so the worker's command
exits non-zero for its supervisor; and the thread that hears RQ's commands lets a warm stop
go within a second (:meth:`TakingWorker.subscribe`).

RQ's private state read here: ``_ordered_queues`` (the queues in priority order; RQ 2.0 to
3.0 keep it under that name, and offer no public accessor).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import AuthenticationError, AuthorizationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.utils import as_text, get_version, now

from duejobs.delivery._rq_compat import StopRequested

log = logging.getLogger("duejobs.delivery")

# How often a plain worker heartbeat, or a look for `rq suspend`, reaches Redis at most.
BEAT_EVERY = timedelta(seconds=1)
# The longest wait between two tries of a Redis that does not answer a dequeue (seconds): a
# node back from an outage, however long, is served again within it.
DEQUEUE_BACKOFF_CAP = 2.0
# How long the thread hearing RQ's commands waits between two reads (seconds): the most it
# can hold a warm stop.
COMMANDS_WAKE = 1.0


class TakingWorker(SimpleWorker):
    """RQ's SimpleWorker, its dequeue and heartbeat made to outlast Redis outages, with a
    way to take several waiting jobs at once."""

    max_connection_wait_time = DEQUEUE_BACKOFF_CAP  # RQ's own, inside its dequeue: 60 s
    # The error that ended RQ's loop, if one did: RQ logs it and returns as from a stop, and
    # the worker's command then exits non-zero for its supervisor (see ``_noted``).
    failure: Exception | None = None
    _beat_at: datetime | None = None  # the last plain heartbeat sent
    _starting: Any = None  # the pipeline starting jobs taken together, meanwhile
    _stop_requested: bool

    def subscribe(self) -> None:
        """RQ's, the command listener waking every ``COMMANDS_WAKE`` seconds (RQ 3.0: 60;
        2.0: 0.2). redis-py stops that thread by joining it with no time limit, and a thread
        that handled its unsubscription before it was told to stop waits out its whole sleep:
        with RQ 3.0's a warm stop could take a minute. The same three calls as RQ 2.0 to 3.0's
        ``subscribe`` (checked on each); ``_pubsub_exception_handler`` is RQ's own."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ: None
            sleep_time=COMMANDS_WAKE,
            daemon=True,
            exception_handler=self._pubsub_exception_handler,
        )

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
                wait = min(wait * 2, DEQUEUE_BACKOFF_CAP)
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

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat, sent at most once a second, which must not end the worker when
        Redis restarts.

        RQ beats three times per job (before and after each dequeue, after each job), three
        Redis round trips each, for a registration that lives ``worker_ttl`` (minutes): a
        plain beat within ``BEAT_EVERY`` of the last one is skipped. One with a ``timeout``
        or ``pipeline`` (a job's start, its monitoring) is always sent. RQ retries a dequeue
        that meets a dropped connection but quits on a heartbeat that does, so every worker
        between two jobs at that moment would stop: the next dequeue waits for Redis."""
        with self._noted():
            self._beat(timeout, pipeline)

    def _beat(self, timeout: int | None, pipeline: Any) -> None:
        if pipeline is not None and pipeline is self._starting:
            return  # beaten once for the jobs started together
        plain = timeout is None and pipeline is None
        if plain and self._beat_at is not None and now() - self._beat_at < BEAT_EVERY:
            return
        try:
            super().heartbeat(timeout, pipeline)
            if plain:
                self._beat_at = now()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            log.warning("worker heartbeat could not reach Redis (%s); going on", exc)
