"""Pushing, promoting and removing duejobs' jobs on RQ's queues (see :mod:`duejobs.delivery`
for what it promises)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from prometheus_client import Counter
from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import utcformat

from duejobs.delivery.scripts import (
    DEFER_SCRIPT,
    LIVE_SCRIPT,
    PROMOTE_SCRIPT,
    PUSH_SCRIPT,
    REMOVE_SCRIPT,
)
from duejobs.models import Delivery

log = logging.getLogger("duejobs.delivery")
T = TypeVar("T")

NODE_ERRORS = Counter(
    "duejobs_redis_node_errors",
    "Calls to one Redis node that failed while other nodes went on.",
    ["node"],
)

DEFAULT_QUEUE = "duejobs"
JOB_FUNCTION = "duejobs.worker.perform"
# A queue job that raised (the database was unreachable, say) stays visible this long.
FAILURE_TTL = 24 * 3600
# Finished queue jobs linger briefly for inspection. (0 would make RQ delete each job on the
# spot, which costs it about 1 ms per job more than letting the key expire.)
RESULT_TTL = 60


@dataclass(frozen=True)
class JobState:
    """A queue job as Redis holds it: RQ's status (None: no job hash), its queue, the worker
    that started it, and whether a worker can still take it."""

    status: str | None
    origin: str | None
    worker: str | None
    live: bool


@dataclass(frozen=True)
class Push:
    """How to push one delivery (its ``due_at`` and ``job_id`` known): to the front of its
    queue or not, and whether only the queue list or the scheduled registry proves a job of
    it already there."""

    delivery: Delivery
    # Due now: onto the front of the queue rather than the back (RQ's at_front).
    front: bool = False
    # The row is overdue by more than STUCK_AFTER: only the queue list or the scheduled
    # registry proves the job is still there (see :data:`~duejobs.delivery.scripts.PRESENT`).
    stuck: bool = False


@dataclass(frozen=True)
class PushResult:
    """What one push did: onto the queue now, into the scheduled registry, already there;
    and the ids of the jobs it created."""

    queued: int = 0
    deferred: int = 0
    present: int = 0
    created: frozenset[str] = frozenset()


# Every queue duejobs has pushed to, so that promotion, the orphan scan and the figures cover
# jobs routed to other queues than the default.
QUEUES_KEY = "duejobs:queues"
SCHEDULED_PREFIX = "rq:scheduled:"  # RQ's ScheduledJobRegistry key is this + the queue name
WORKER_PREFIX = "rq:worker:"  # a live RQ worker's key (it expires when the worker stops beating)
# A row overdue by more than this whose job is not on its queue or in its scheduled registry is
# missing, whatever its job hash says: no live worker waits that long between taking a job
# from Redis and claiming its row (the claim's lock wait is bounded, an early delivery waits at
# most a second). A worker merely slow there meets a second delivery, which it skips.
STUCK_AFTER = timedelta(seconds=15)


@dataclass(frozen=True)
class _Node:
    """One Redis server, with the scripts registered on it."""

    redis: Redis
    push: Script
    live: Script
    promote: Script
    remove: Script
    defer: Script

    @classmethod
    def on(cls, redis: Redis) -> _Node:
        scripts = (PUSH_SCRIPT, LIVE_SCRIPT, PROMOTE_SCRIPT, REMOVE_SCRIPT, DEFER_SCRIPT)
        return cls(redis, *(redis.register_script(script) for script in scripts))

    @property
    def label(self) -> str:
        """Where the node is, without its password (for logs and metrics)."""
        kwargs = self.redis.connection_pool.connection_kwargs
        if "path" in kwargs:
            return str(kwargs["path"])
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


class Deliverer:
    """Pushes, promotes and removes duejobs' RQ jobs, on a default queue and on any queue a
    schedule is routed to — each queue on its Redis node (``nodes``: queue → client; every
    other queue on ``connection``).

    With several nodes, one that fails does not stop the others: a push, a promotion, a
    check of jobs, a count or a scan of waiting jobs goes on with the nodes that answer, logs
    the one that did not and counts it in ``duejobs_redis_node_errors_total{node}``, and
    raises only when every node it needed failed (a job on a failed node counts as not
    live: no worker can take it). A job that could not be pushed is found missing by the
    reconciler, which pushes it again once its node answers. A node that refuses connections
    fails at once; one that hangs, after twice the clients' socket timeout (``REDIS_TIMEOUT``
    of :mod:`duejobs.core`, 10 s, and one retry) — until then it delays the pass it is in."""

    def __init__(
        self,
        connection: Redis,
        queue_name: str = DEFAULT_QUEUE,
        nodes: Mapping[str, Redis] | None = None,
    ) -> None:
        self.redis = connection
        self.queue = Queue(queue_name, connection=connection, serializer=JSONSerializer)
        self._queues: dict[str, tuple[Queue, list[Any]]] = {}
        self._push_keys: dict[str, list[str]] = {}
        self._prefix = Job.redis_job_namespace_prefix
        self._default = _Node.on(connection)
        by_client = {id(connection): self._default}
        self._homes = {
            queue: by_client.setdefault(id(client), _Node.on(client))
            for queue, client in (nodes or {}).items()
        }
        self._nodes = list(by_client.values())

    def close(self) -> None:
        """Close the connections to every node."""
        for node in self._nodes:
            node.redis.close()

    def _node(self, queue: str | None) -> _Node:
        return self._homes.get(queue or self.queue.name, self._default)

    @property
    def scheduled_key(self) -> str:
        return SCHEDULED_PREFIX + self.queue.name

    def _routed(self, name: str) -> tuple[Queue, list[Any]]:
        """The RQ queue called ``name`` and the job-hash fields every job on it shares."""
        if name not in self._queues:
            queue = Queue(name, connection=self._node(name).redis, serializer=JSONSerializer)
            self._queues[name] = (queue, self._constant_fields(queue))
        return self._queues[name]

    def _keys_of(self, name: str, queue: Queue) -> list[str]:
        """The keys a push to queue ``name`` touches, spelled once per queue."""
        if name not in self._push_keys:
            self._push_keys[name] = [
                queue.key,
                SCHEDULED_PREFIX + name,
                queue.redis_queues_keys,
                QUEUES_KEY,
                queue.intermediate_queue_key,
                queue.started_job_registry.key,
            ]
        return self._push_keys[name]

    def _each(self, nodes: Iterable[_Node], work: Callable[[_Node], T]) -> list[T]:
        """``work`` on each node, going on past a node that fails (logged and counted);
        raises the error when every node failed."""
        done: list[T] = []
        failures: list[RedisError] = []
        for node in nodes:
            try:
                done.append(work(node))
            except RedisError as exc:
                failures.append(exc)
                NODE_ERRORS.labels(node.label).inc()
                log.warning("Redis node %s failed (%s); the other nodes go on", node.label, exc)
        if failures and not done:
            raise failures[0]
        return done

    @staticmethod
    def _constant_fields(queue: Queue) -> list[Any]:
        """The job-hash fields RQ writes that are the same for every duejobs job."""
        job = queue.create_job(
            JOB_FUNCTION,
            args=["-", 0, 0, "-"],
            timeout=-1,
            result_ttl=RESULT_TTL,
            failure_ttl=FAILURE_TTL,
        )
        job.origin = queue.name
        fields = job.to_dict()
        for varying in ("data", "description", "created_at", "status", "enqueued_at"):
            fields.pop(varying, None)
        flat: list[Any] = []
        for name, value in fields.items():
            if value != "":  # RQ reads a missing field exactly like an empty one
                flat += [name, value]
        return flat

    @staticmethod
    def _data(delivery: Delivery) -> str:
        """RQ's job data: the JSON of (function, instance, args, kwargs). RQ reads it
        uncompressed as well as zlib-compressed; skipping zlib saves most of the cost.
        Formatted directly: a UUID, two ints and a tenant (``[A-Za-z0-9_.-]``, checked on
        the way in) need no JSON escaping."""
        return (
            f'["{JOB_FUNCTION}",null,["{delivery.schedule_id}",{delivery.version},'
            f'{delivery.attempt},"{delivery.tenant}"],{{}}]'
        )

    def _queues_on(self, node: _Node) -> list[str]:
        """The queues on ``node``: those it is configured for, and every queue duejobs has
        pushed to there (a queue moved away keeps its leftovers promoted and counted)."""
        known = {m.decode() if isinstance(m, bytes) else m for m in node.redis.smembers(QUEUES_KEY)}
        homed = {queue for queue, home in self._homes.items() if home is node}
        if self._node(self.queue.name) is node:
            homed.add(self.queue.name)
        return sorted(known | homed)

    def queues(self) -> list[str]:
        """The default queue and every queue duejobs has pushed to, on every node."""
        return sorted({name for node in self._nodes for name in self._queues_on(node)})

    def push(self, pushes: Sequence[Push], now: datetime) -> PushResult:
        """Push a batch, one round trip per queue it names: due ones (``due_at <= now``) onto
        their queue, the rest into its scheduled registry; due ones marked ``front`` go to the
        front of the queue, in the batch's order. ``now`` is the database clock."""
        by_node: dict[int, tuple[_Node, dict[str, list[Push]]]] = {}
        for p in pushes:
            name = p.delivery.queue or self.queue.name
            node = self._node(name)
            by_node.setdefault(id(node), (node, {}))[1].setdefault(name, []).append(p)
        stamp = utcformat(datetime.now(UTC))  # RQ's own bookkeeping field, informative only

        def push_on(node: _Node, by_queue: dict[str, list[Push]]) -> PushResult:
            queued = deferred = present = 0
            created: set[str] = set()
            for name, batch in by_queue.items():
                queue, template = self._routed(name)
                args: list[Any] = [self._prefix, now.timestamp(), stamp, WORKER_PREFIX]
                args += [len(template), *template, name]
                for p in batch:
                    d = p.delivery
                    args += [d.job_id, self._data(d), d.when_due.timestamp()]
                    args += ["1" if p.front else "0", "1" if p.stuck else "0"]
                q, d, pr, made = node.push(keys=self._keys_of(name, queue), args=args)
                queued, deferred, present = queued + int(q), deferred + int(d), present + int(pr)
                created.update(i.decode() if isinstance(i, bytes) else i for i in made)
            return PushResult(queued, deferred, present, frozenset(created))

        results = self._each(
            [node for node, _ in by_node.values()], lambda node: push_on(*by_node[id(node)])
        )
        return PushResult(
            sum(r.queued for r in results),
            sum(r.deferred for r in results),
            sum(r.present for r in results),
            frozenset().union(*(r.created for r in results)),
        )

    def promote(self, now: datetime, limit: int = 1000) -> int:
        """Move jobs whose time has come (by ``now``, the database clock) onto their queues,
        up to ``limit`` per queue, on every node."""
        stamp = utcformat(datetime.now(UTC))

        def promote_on(node: _Node) -> int:
            moved = 0
            for name in self._queues_on(node):
                queue, _ = self._routed(name)
                moved += int(
                    node.promote(
                        keys=[SCHEDULED_PREFIX + name, queue.key],
                        args=[self._prefix, now.timestamp(), limit, stamp],
                    )
                )
            return moved

        return sum(self._each(self._nodes, promote_on))

    def live(self, jobs: Sequence[tuple[Any, ...]]) -> list[bool]:
        """Whether Redis can still hand each job — (id, due at, overdue past ``STUCK_AFTER``
        [, its queue]) — to a worker, by the same test a push makes (one round trip per
        node; a job without a queue is looked for on the default queue's node)."""
        answers: list[bool] = [False] * len(jobs)  # a node that fails hands out nothing
        by_node: dict[int, tuple[_Node, list[int]]] = {}
        for i, job in enumerate(jobs):
            node = self._node(job[3] if len(job) > 3 else None)
            by_node.setdefault(id(node), (node, []))[1].append(i)

        def check_on(node: _Node) -> None:
            indexes = by_node[id(node)][1]
            args: list[Any] = [
                self._prefix,
                Queue.redis_queue_namespace_prefix,
                SCHEDULED_PREFIX,
                WORKER_PREFIX,
            ]
            for i in indexes:
                job_id, due_at, stuck = jobs[i][:3]
                args += [job_id, due_at.timestamp(), "1" if stuck else "0"]
            for i, ok in zip(indexes, node.live(keys=[], args=args), strict=True):
                answers[i] = bool(ok)

        self._each([node for node, _ in by_node.values()], check_on)
        return answers

    def job_state(
        self, queue_job_id: str, due_at: datetime, stuck: bool, queue: str | None = None
    ) -> JobState:
        """One job as Redis holds it, and whether a worker can still take it (:meth:`live`)."""
        redis = self._node(queue).redis
        fields = redis.hmget(self._prefix + queue_job_id, "status", "origin", "worker_name")
        status, origin, worker = (v.decode() if isinstance(v, bytes) else v for v in fields)
        (live,) = self.live([(queue_job_id, due_at, stuck, queue)])
        return JobState(status, origin, worker or None, live)

    def depth(self) -> tuple[int, int]:
        """(jobs waiting on the queues, jobs in their scheduled registries), all queues of
        every node."""

        def count_on(node: _Node) -> tuple[int, int]:
            names = self._queues_on(node)
            with node.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.llen(self._routed(name)[0].key)
                    pipe.zcard(SCHEDULED_PREFIX + name)
                counts = pipe.execute()
            return sum(counts[0::2]), sum(counts[1::2])

        counted = self._each(self._nodes, count_on)  # a node that fails counts for nothing
        return sum(c[0] for c in counted), sum(c[1] for c in counted)

    def waiting_job_ids(self, chunk: int = 1000) -> Iterator[list[str]]:
        """The ids of jobs waiting on the queues or in their scheduled registries, in chunks,
        node by node (a node that fails is skipped, logged and counted; the error is raised
        when every node failed)."""
        failures: list[RedisError] = []
        for node in self._nodes:
            try:
                yield from self._waiting_on(node, chunk)
            except RedisError as exc:
                failures.append(exc)
                NODE_ERRORS.labels(node.label).inc()
                log.warning("Redis node %s failed (%s); its waiting jobs skipped", node.label, exc)
        if len(failures) == len(self._nodes):
            raise failures[0]

    def _waiting_on(self, node: _Node, chunk: int) -> Iterator[list[str]]:
        for name in self._queues_on(node):
            for key, read in (
                (self._routed(name)[0].key, node.redis.lrange),
                (SCHEDULED_PREFIX + name, node.redis.zrange),
            ):
                start = 0
                while True:
                    ids = read(key, start, start + chunk - 1)
                    if not ids:
                        break
                    yield [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
                    start += chunk

    def defer(self, queue_job_id: str, due_at: datetime, queue: str | None = None) -> bool:
        """Put a job that just ran back into its queue's scheduled registry for ``due_at``.

        For a delivery that came too early: its job keeps its id (the row still names it), so
        nothing can push a second one. Called after RQ has finished with the job.
        """
        deferred = self._node(queue).defer(
            keys=[SCHEDULED_PREFIX + (queue or self.queue.name)],
            args=[self._prefix + queue_job_id, queue_job_id, due_at.timestamp()],
        )
        return bool(deferred)

    def remove(self, queue_job_id: str, queue: str | None = None) -> bool:
        """Delete a job that is still waiting (queued or scheduled), from whichever queue it
        is on — on ``queue``'s node, or, without one, on every node; a started one is left to
        the worker's own check. True when something was removed."""
        args = [
            self._prefix + queue_job_id,
            queue_job_id,
            Queue.redis_queue_namespace_prefix,
            SCHEDULED_PREFIX,
        ]
        nodes = [self._node(queue)] if queue is not None else self._nodes
        return any(self._each(nodes, lambda node: bool(node.remove(keys=[], args=args))))
