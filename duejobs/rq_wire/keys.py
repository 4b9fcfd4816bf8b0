"""RQ's key names and lifetimes, each spelled once, read off RQ's own classes.

Every key duejobs writes in Redis is named here: a queue's list, its in-between list, its
registries and its worker set (:class:`QueueKeys`); a job's hash and results stream; a
worker's key and the worker sets; and duejobs' own set of the queues it has pushed to. A
change of layout (a Redis Cluster's hash tag, say) is a change of this module alone.

What it promises: the names RQ 2.0 to 3.0 read (``tests/test_rq_api.py`` holds them to RQ's
readers). What it does not: create anything — these are names; the scripts write the keys.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

from redis import Redis
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.suspension import WORKERS_SUSPENDED
from rq.utils import utcformat
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

JOB_PREFIX: str = Job.redis_job_namespace_prefix  # a job's hash is this + its id
QUEUE_PREFIX: str = Queue.redis_queue_namespace_prefix  # a queue's list is this + its name
SCHEDULED_PREFIX = "rq:scheduled:"  # RQ's ScheduledJobRegistry key is this + the queue name
WORKER_PREFIX: str = Worker.redis_worker_namespace_prefix  # a live worker's key (it expires)
RESULTS_PREFIX: str = Result.get_key("")  # type: ignore[no-untyped-call]  # + a job's id
WORKERS_KEY: str = REDIS_WORKER_KEYS  # every live worker's key
SUSPENDED_KEY: str = WORKERS_SUSPENDED  # set by ``rq suspend``
# Every queue duejobs has pushed to, so that promotion, the orphan scan and the figures cover
# jobs routed to other queues than the default.
QUEUES_KEY = "duejobs:queues"

# Seconds a worker's key lives without a beat (RQ's default worker_ttl, 420, plus RQ's 60).
WORKER_TTL = 480
# Seconds a started-registry entry lives without being refreshed (as the worker's key).
STARTED_TTL = WORKER_TTL

# RQ's classes name their keys on an instance, which wants a client: one never connected.
_UNCONNECTED = Redis()


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one RQ queue (a band of a duejobs queue is an RQ queue of its own)."""

    name: str
    queue: str  # its list of waiting ids
    intermediate: str  # ids between RQ's lists (RQ 2.x's dequeue moves them through it)
    scheduled: str  # waiting for their time, scored in seconds
    started: str  # ``<id>:<run>`` of jobs a worker runs, scored with the entry's expiry
    finished: str  # scored with the finished job's expiry
    failed: str  # the same, for failed jobs
    workers: str  # the workers that take from it
    all_queues: str  # RQ's set of every queue's key


@functools.lru_cache(maxsize=1024)
def queue_keys(name: str) -> QueueKeys:
    """The keys of the RQ queue called ``name``."""
    queue = Queue(name, connection=_UNCONNECTED)
    return QueueKeys(
        name=name,
        queue=queue.key,
        intermediate=queue.intermediate_queue_key,
        scheduled=SCHEDULED_PREFIX + name,
        started=StartedJobRegistry(name, connection=_UNCONNECTED).key,
        finished=FinishedJobRegistry(name, connection=_UNCONNECTED).key,
        failed=FailedJobRegistry(name, connection=_UNCONNECTED).key,
        workers=WORKERS_BY_QUEUE_KEY % name,
        all_queues=queue.redis_queues_keys,
    )


# RQ's queue object, named for the modules that hold one without importing RQ themselves.
RqQueue: TypeAlias = Queue


def rq_queue(name: str, redis: Redis) -> RqQueue:
    """RQ's own object for the queue ``name`` on ``redis``, reading JSON (never pickle): for
    RQ's readers (counts, registries, ``fetch_job``) and the job template."""
    return Queue(name, connection=redis, serializer=JSONSerializer)


def stamp(at: datetime) -> str:
    """A moment as RQ writes one in its hashes (informative bookkeeping fields)."""
    return utcformat(at)
