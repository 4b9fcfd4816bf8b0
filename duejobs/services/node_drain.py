"""Draining a Redis node that queues moved off (``duejobs nodes drain URL``).

When ``DUEJOBS_REDIS_NODES`` moves a queue to another node, the jobs already waiting for it
on the old node (its list and its scheduled registry) stay there: nothing promotes or serves
a node the configuration no longer names. A :class:`NodeDrain` pass moves them: for each queue found
on the node at ``url`` that lives on another node now, it reads the waiting ids, pushes the
deliveries they still stand for onto the queue's node — under the same deterministic ids, so
a job already there is left alone — and only then takes the old copies off. A job whose
schedule has finished, been cancelled or changed since (an orphan) is taken off alone.

What it promises: nothing is taken off the old node before its delivery is on the new one
(a push that does not reach the new node stops the drain with an error, the old copies left
where they are); nothing runs twice — a worker still serving the old node that takes a job
meanwhile runs it, and the copy on the new node is skipped by the worker's claim (one attempt
per delivery); the queues that still live on that node are not touched, so a node that stays
configured for other queues can be drained of the ones that left it.

What it does not do: stop the old node's workers. A job they have started runs to its end
there; :class:`DrainResult` says how many, and those workers may stop once it is 0. Safe to
run again: a node with nothing left behind is reported empty.

A service of one pass (:meth:`NodeDrain.run_once`), not a loop: the operator runs it, and again
until it reports nothing left — no drain goes on behind a configuration that changes again.

Knobs (:class:`DrainConfig`, checked when built): ``url`` (the node, a Redis URL), ``chunk``
(1000 jobs read, pushed and taken off together).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis

from duejobs import store
from duejobs.core import Core, HasCore
from duejobs.delivery import Push
from duejobs.delivery.nodes import NodeDown, node_label
from duejobs.redis_urls import check_redis_url, redis_client
from duejobs.rq_wire.job_ids import parse_job_id
from duejobs.rq_wire.keys import queue_keys
from duejobs.rq_wire.scripts import STUCK_AFTER, TAKE_OFF_SCRIPT
from duejobs.validation import check_count


@dataclass(frozen=True)
class DrainConfig:
    """Node drain knobs."""

    url: str
    chunk: int = 1000

    def __post_init__(self) -> None:
        check_redis_url(self.url)
        check_count("chunk", self.chunk, 1, 100_000)


@dataclass(frozen=True)
class DrainResult:
    """What one drain did on one node."""

    node: str  # its address, without a password
    found: dict[str, int]  # jobs left behind, by queue
    moved: int  # deliveries pushed onto their queue's node (or found there already)
    dropped: int  # jobs whose schedule no longer needed them, taken off alone
    taken_off: int  # jobs taken off the old node (moved or dropped)
    started: int  # jobs workers on the old node have started and not finished


class NodeDrain:
    """Drains the node of its config (see the module docstring)."""

    def __init__(self, app: HasCore, config: DrainConfig) -> None:
        self.core = app.core
        self.config = config

    def run_once(self) -> DrainResult:
        """Move what queues that left the node left behind onto their nodes now."""
        deliverer = self.core.deliverer()
        chunk = self.config.chunk
        old = redis_client(self.config.url, connections=2)
        try:
            moved_off = deliverer.moved_off(old)
            found: dict[str, int] = {}
            moved = dropped = taken = 0
            for queue in moved_off:
                ids = deliverer.waiting_in(old, queue, chunk)
                if ids:
                    found[queue] = len(ids)
                for start in range(0, len(ids), chunk):
                    part = ids[start : start + chunk]
                    pushed = _push_home(self.core, part)
                    taken += _take_off(old, queue, part)
                    moved += pushed
                    dropped += len(part) - pushed
            started = _started_in(old, moved_off)
            return DrainResult(node_label(old), found, moved, dropped, taken, started)
        finally:
            old.close()


def _push_home(core: Core, job_ids: list[str]) -> int:
    """Push the deliveries ``job_ids`` still stand for onto their queues' nodes; how many.
    Raises when a node they go to is down: nothing may be taken off the old node then."""
    deliverer = core.deliverer()
    jobs: list[tuple[str, uuid.UUID]] = [
        (job, parsed[0]) for job in job_ids if (parsed := parse_job_id(job)) is not None
    ]
    with core.engine.connect() as conn:
        deliveries = store.pending_deliveries(conn, jobs)
        now = store.database_now(conn)
    stuck_since = now - STUCK_AFTER
    pushed = deliverer.push([Push(d, stuck=d.when_due < stuck_since) for d in deliveries], now)
    if pushed.queued + pushed.deferred + pushed.present < len(deliveries):
        homes = sorted({deliverer.home_of(d.queue) for d in deliveries})
        raise NodeDown(
            f"a push to {', '.join(homes)} did not go through: nothing taken off the old node "
            "in this batch; run the drain again once every node answers"
        )
    return len(deliveries)


def _take_off(redis: Redis, queue: str, job_ids: Sequence[str]) -> int:
    """Take the waiting jobs ``job_ids`` off ``queue`` on the node ``redis`` (a worker there
    that started one keeps it); how many were still waiting."""
    keys = queue_keys(queue)
    args = [keys.job_prefix, keys.queue, keys.scheduled, *job_ids]
    return int(redis.eval(TAKE_OFF_SCRIPT, 0, *args))


def _started_in(redis: Redis, queues: Sequence[str]) -> int:
    """Jobs of ``queues`` that live workers on the node ``redis`` have started and not
    finished (entries of a dead worker, past their expiry, left out)."""
    now = redis.time()[0]
    return sum(int(redis.zcount(queue_keys(name).started, now, "+inf")) for name in queues)
