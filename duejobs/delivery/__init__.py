"""Delivery: the push policy — which jobs go onto RQ's queues and registries, where and when,
and what is there. RQ's layout itself (keys, job hashes, scripts, bands, ids) is
:mod:`duejobs.rq_wire`'s.

What it promises:

* **Deterministic ids.** A delivery of (tenant, schedule, version, attempt) always has the
  same RQ job id, ``dj-<tenant>-<schedule hex>-v<version>-a<attempt>`` (RQ allows only
  ``[A-Za-z0-9_-]``; a ``.`` in a tenant becomes ``_``, the schedule id keeps it unique).
  The store builds it (in the statements that claim and re-push the row) and
  every push carries it from there (read back by :mod:`duejobs.rq_wire.job_ids`).
* **A re-push never creates a second live job.** Pushing checks and writes atomically (one
  Lua script per batch): an id Redis can still hand to a worker is left alone; RQ's own
  ``enqueue`` would overwrite it and run it twice.
* **A job hash is not proof.** A job counts as present only if its id is on its queue (or
  between RQ's lists, in ``<queue>:intermediate``), or in its scheduled registry no later than
  its time, or ``started`` by a worker whose RQ key still lives. A row overdue by more than
  ``STUCK_AFTER`` trusts only the queue list and the registry. Anything else — a hash left
  ``queued`` after its id was popped by a worker that died, an entry trimmed from a list or a
  registry — is missing, and its stale hash is replaced under the same id. The check reads
  each queue list once per script call, and trusts a ``queued`` hash on a queue longer than
  ``LIST_SCAN_LIMIT`` (10,000: in-flight quotas keep queues far shorter, and a queue that long
  is a backlog the overdue re-push still covers once its list shrinks);
  :meth:`Deliverer.live` gives ``stats`` the same answer.
* **Nothing is promoted early.** Rows due now go straight onto the queue; rows due later in
  the window go to RQ's scheduled registry with a millisecond score (RQ truncates its own to
  whole seconds, so it can fire up to 1 s early). :meth:`Deliverer.promote` moves them onto
  the queue when the *database* clock, passed in by the scheduler, reaches them — the worker's
  check against the database clock stays the guarantee.
* **Fair order.** Jobs the scheduler marks ``front`` (the first job of a tenant with fewer
  than two jobs waiting) go to the front of the queue, like RQ's ``at_front``.
* **One round trip per batch**, not per job; **JSON only** — a job carries ids and the
  version, never the payload, and a Redis writer cannot get code executed by unpickling.

* **Queues on several nodes.** ``DUEJOBS_REDIS_NODES`` puts queues on Redis servers of their
  own; every operation goes to the node of the job's queue, and one node that fails holds up
  no other (see :class:`Deliverer`).

What it does not do: decide anything. Whether a job runs is the database's call (the
worker re-reads the row).

* **On a Redis Cluster** (``redis+cluster://``, or an App given a ``RedisCluster``) each
  queue's keys and jobs carry its hash tag (:mod:`duejobs.rq_wire.keys`), so queues spread
  over the shards; every script call names one queue's keys, and the sets of every queue are
  written apart. A cluster takes no node mapping: it places the queues itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from duejobs.lazy import lazy_exports

if TYPE_CHECKING:
    from duejobs.delivery.deliverer import (
        DEFAULT_QUEUE,
        Deliverer,
        JobState,
        Push,
        PushResult,
    )
    from duejobs.delivery.removals import Removals

_HOMES = {
    "DEFAULT_QUEUE": "duejobs.delivery.deliverer",
    "Deliverer": "duejobs.delivery.deliverer",
    "JobState": "duejobs.delivery.deliverer",
    "Push": "duejobs.delivery.deliverer",
    "PushResult": "duejobs.delivery.deliverer",
    "Removals": "duejobs.delivery.removals",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())

__all__ = [
    "DEFAULT_QUEUE",
    "Deliverer",
    "JobState",
    "Push",
    "PushResult",
    "Removals",
]
