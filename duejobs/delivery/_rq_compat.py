"""What differs, for duejobs' worker, between the RQ releases it supports (2.0 to 3.0).

The Redis layout duejobs writes (job hashes, queues, registries) reads the same in all of
them; what moved is inside RQ's worker:

* RQ 3.0 keeps a worker's running executions in ``worker.executions`` and passes each one to
  ``perform_job(job, queue, execution)``; RQ 2.x keeps one in ``worker.execution``, which its
  ``perform_job(job, queue)`` reads and clears. A worker with slots keeps that attribute per
  thread on 2.x (:data:`MULTI_EXECUTIONS` tells which).
* ``Execution.create`` records the worker's name only from RQ 2.11.
* ``StopRequested`` moved from ``rq.worker`` to ``rq.exceptions``.
* A job's timestamps read back from Redis are aware (UTC) datetimes in later releases and
  naive ones (UTC all the same) in earlier ones (:data:`NAIVE_TIMESTAMPS`).

Each is decided from RQ's own signatures, not its version string, so a patch release that
backports a change is read right.
"""

from __future__ import annotations

import inspect

from redis.client import Pipeline
from rq import SimpleWorker
from rq.executions import Execution
from rq.job import Job
from rq.utils import utcparse

try:  # where RQ keeps it: rq.exceptions from 2.x's later releases on, rq.worker before
    from rq.exceptions import StopRequested
except ImportError:  # pragma: no cover - RQ 2.0
    from rq.worker import StopRequested  # type: ignore[attr-defined,no-redef,unused-ignore]

__all__ = [
    "MULTI_EXECUTIONS",
    "NAIVE_TIMESTAMPS",
    "StopRequested",
    "create_execution",
]

MULTI_EXECUTIONS = "execution" in inspect.signature(SimpleWorker.perform_job).parameters
_CREATE_NAMES_WORKER = "worker_name" in inspect.signature(Execution.create).parameters
NAIVE_TIMESTAMPS = utcparse("2000-01-01T00:00:00.000000Z").tzinfo is None


def create_execution(job: Job, ttl: int, pipeline: Pipeline, worker_name: str) -> Execution:
    """RQ's record of one run of ``job`` by the worker ``worker_name``, written in ``pipeline``."""
    if _CREATE_NAMES_WORKER:
        return Execution.create(job, ttl, pipeline, worker_name=worker_name)
    return Execution.create(job, ttl, pipeline)  # type: ignore[call-arg,unused-ignore]
