"""RQ's key names and lifetimes, each spelled once, read off RQ's own classes.

Every key duejobs writes in Redis is named here: a queue's list, its in-between list, its
registries and its worker set (:class:`QueueKeys`); a job's hash and results stream; a
worker's key and the worker sets; and duejobs' own set of the queues it has pushed to.

**On a Redis Cluster** every key one script touches must sit in one hash slot. There a
queue's RQ name is its name as a hash tag, ``{<queue>}`` (:func:`rq_name`; its bands
``{<queue>}+high`` and ``{<queue>}+low``), so its lists and registries share one slot, and
its jobs' hashes and results carry the same tag: ``rq:job:{<queue>}<job id>``,
``rq:results:{<queue>}<job id>`` (:attr:`QueueKeys.job_prefix`). Queues spread over the
shards, each on one. A started job's worker is known alive by a key of the worker's in the
queue's slot (:attr:`QueueKeys.worker_prefix`) rather than by RQ's worker key, which lives
in a slot of its own. RQ's queue and registry readers read the tagged names; RQ's job
readers (``Job.fetch``) look for a job's hash under its id alone and do not find these. On
one node, every name is RQ's own.

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
    job_prefix: str  # a job's hash is this + its id
    results_prefix: str  # a job's results stream is this + its id
    # A live worker's mark, this + its name: RQ's worker key on one node; on a cluster a key
    # of the worker's own in the queue's slot, which a script there can read.
    worker_prefix: str


def rq_name(queue: str, cluster: bool) -> str:
    """The RQ queue of ``queue``'s default band: ``queue`` on one node, ``{queue}`` on a
    Redis Cluster (a queue's name never holds a brace: :func:`duejobs.validation.check_queue`)."""
    return f"{{{queue}}}" if cluster else queue


def _tag(name: str) -> str:
    """The hash tag an RQ queue's name starts with (``{queue}``), or none."""
    return name[: name.index("}") + 1] if name.startswith("{") and "}" in name else ""


@functools.lru_cache(maxsize=1024)
def queue_keys(name: str) -> QueueKeys:
    """The keys of the RQ queue called ``name`` (tagged on a cluster: :func:`rq_name`)."""
    queue = Queue(name, connection=_UNCONNECTED)
    tag = _tag(name)
    return QueueKeys(
        job_prefix=JOB_PREFIX + tag,
        results_prefix=RESULTS_PREFIX + tag,
        worker_prefix=f"duejobs:worker:{tag}:" if tag else WORKER_PREFIX,
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
