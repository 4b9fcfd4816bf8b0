"""RQ's wire format, in one place: the one package that imports ``rq``.

duejobs writes RQ's Redis layout with Lua scripts of its own, so that RQ's tools (``rq info``,
``Job.fetch``, RQ's registries, rq-dashboard) read duejobs' jobs and workers as RQ's, from
RQ 2.0 to 3.0 (``tests/test_rq_api.py`` holds it to RQ's readers). What it holds, by module:

* :mod:`~duejobs.rq_wire.keys`: every key name and lifetime (a queue's list, registries and
  worker set; a job's hash and results; the worker's key), read off RQ's own classes;
* :mod:`~duejobs.rq_wire.job_hash`: a job's hash as a push writes it, its delivery as a take
  reads it back, and a run's result;
* :mod:`~duejobs.rq_wire.job_ids`: a delivery's deterministic job id, read back;
* :mod:`~duejobs.rq_wire.bands`: a queue's priority bands, each an RQ queue of its own;
* :mod:`~duejobs.rq_wire.scripts`: the push, presence check, promotion, put-back, removal,
  take-off, registry cleanup, take and finish, each one atomic script;
* :mod:`~duejobs.rq_wire.worker_side`: a worker's records — its key, its takes and finishes.

What it does not decide: which job goes where and when (the push policy, in
:mod:`duejobs.delivery`), nor whether a job runs (the worker's loop, which re-reads the row).
It imports nothing of duejobs' but the records it carries (:mod:`duejobs.models`) and the
defaults (:mod:`duejobs.config`): the delivery side and the worker are built on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from duejobs.lazy import lazy_exports

if TYPE_CHECKING:
    from duejobs.rq_wire.job_hash import JOB_FUNCTION, delivery_of
    from duejobs.rq_wire.job_ids import job_tenant, job_tenant_part, parse_job_id
    from duejobs.rq_wire.keys import QUEUES_KEY, SCHEDULED_PREFIX, WORKER_PREFIX, queue_keys
    from duejobs.rq_wire.scripts import LIST_SCAN_LIMIT, STUCK_AFTER
    from duejobs.rq_wire.worker_side import Finished, RqWire, Taken

_HOMES = {
    "JOB_FUNCTION": "duejobs.rq_wire.job_hash",
    "delivery_of": "duejobs.rq_wire.job_hash",
    "job_tenant": "duejobs.rq_wire.job_ids",
    "job_tenant_part": "duejobs.rq_wire.job_ids",
    "parse_job_id": "duejobs.rq_wire.job_ids",
    "QUEUES_KEY": "duejobs.rq_wire.keys",
    "SCHEDULED_PREFIX": "duejobs.rq_wire.keys",
    "WORKER_PREFIX": "duejobs.rq_wire.keys",
    "queue_keys": "duejobs.rq_wire.keys",
    "LIST_SCAN_LIMIT": "duejobs.rq_wire.scripts",
    "STUCK_AFTER": "duejobs.rq_wire.scripts",
    "Finished": "duejobs.rq_wire.worker_side",
    "RqWire": "duejobs.rq_wire.worker_side",
    "Taken": "duejobs.rq_wire.worker_side",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())

__all__ = [
    "JOB_FUNCTION",
    "LIST_SCAN_LIMIT",
    "QUEUES_KEY",
    "SCHEDULED_PREFIX",
    "STUCK_AFTER",
    "WORKER_PREFIX",
    "Finished",
    "RqWire",
    "Taken",
    "delivery_of",
    "job_tenant",
    "job_tenant_part",
    "parse_job_id",
    "queue_keys",
]
