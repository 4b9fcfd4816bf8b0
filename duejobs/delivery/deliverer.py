"""Pushing, promoting and removing duejobs' jobs on RQ's queues (see :mod:`duejobs.delivery`
for what it promises)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError, NoScriptError, TimeoutError

from duejobs.config import DEFAULT_RESULT_TTL
from duejobs.delivery.nodes import NODE_WAIT, Node
from duejobs.models import Delivery
from duejobs.redis_urls import redis_failures, refusal
from duejobs.rq_wire.bands import band_queue, bands, queue_of
from duejobs.rq_wire.job_hash import JOB_FIELDS, constant_fields, job_data
from duejobs.rq_wire.keys import (
    QUEUE_PREFIX,
    QUEUES_KEY,
    SCHEDULED_PREFIX,
    RqQueue,
    queue_keys,
    rq_name,
    rq_queue,
    stamp,
)

log = logging.getLogger("duejobs.delivery")
T = TypeVar("T")
# Indexes of a call's items by node (its id), and on each node by the queue a call names.
_Groups = dict[int, tuple[Node, dict[str, list[int]]]]

DEFAULT_QUEUE = "duejobs"


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
    """How to push one delivery (its ``due_at`` and ``job_id`` known): where, when, and what
    proves a job of it already there."""

    delivery: Delivery
    # Due now: onto the front of the queue rather than the back (RQ's at_front).
    front: bool = False
    # The row is overdue by more than STUCK_AFTER: only the queue list or the scheduled
    # registry proves the job is still there (see :data:`~duejobs.rq_wire.scripts.PRESENT`).
    stuck: bool = False
    # The row has no queue job (the scheduler's claim, a reconciler's first push): a job of
    # its id that a live worker started is one that worker turned back and is finishing, not
    # this row's (PRESENT).
    unpushed: bool = False
    # Onto its queue then, though due later (a slot under a rate limit: scheduler.pacing).
    at: datetime | None = None


@dataclass(frozen=True)
class Promotion:
    """What a promotion did: the jobs it moved onto their queues, and when the earliest job
    left in a scheduled registry falls due (database clock, seconds since the epoch; None
    when every registry is empty)."""

    moved: int
    next_due: float | None


@dataclass(frozen=True)
class PushResult:
    """What one push did: onto the queue now, into the scheduled registry, already there;
    and the ids of the jobs it created."""

    queued: int = 0
    deferred: int = 0
    present: int = 0
    created: frozenset[str] = frozenset()


class Deliverer:
    """Pushes, promotes and removes duejobs' RQ jobs, on a default queue and on any queue a
    schedule is routed to — each queue on its Redis node (``nodes``: queue → client; every
    other queue on ``connection``).

    With several nodes, one that fails does not stop the others: every call that spans nodes
    (a push, a promotion, a check of jobs, a count or a scan of waiting jobs) runs on each
    node in that node's own threads, waits for each at most ``NODE_WAIT`` (1 s), and goes on
    with the nodes that answered; a node that failed or did not answer is *down* and gets no
    call at all until a probe finds it back (:mod:`~duejobs.delivery.nodes`). So a node that
    is refused, or hangs, costs the others one wait of at most 1 s, once. A job for a node
    that is down counts as not live (no worker can take it), and a push of rows all bound for
    nodes that are down pushes nothing without failing: the scheduler marks those rows
    pushed and goes on to the next batch, and the reconciler pushes them again once their node
    answers. A call raises only when no node answered and the failure is the caller's: the
    only node failed, every node is down, or a node refused the call (an error that is not
    an outage).

    On a Redis Cluster (``connection`` a ``RedisCluster``; no ``nodes`` then: the cluster
    places the queues) each queue's keys and jobs carry its hash tag
    (:mod:`duejobs.rq_wire.keys`), every script call names one queue's keys, and the sets that
    list every queue are written apart from the scripts.
    """

    def __init__(
        self,
        connection: Redis | RedisCluster,
        queue_name: str = DEFAULT_QUEUE,
        nodes: Mapping[str, Redis] | None = None,
        result_ttl: int = DEFAULT_RESULT_TTL,
    ) -> None:
        self.cluster = isinstance(connection, RedisCluster)
        if self.cluster and nodes:
            raise ValueError("a Redis Cluster places the queues itself: give it no node mapping")
        # A cluster's client serves every command sent here (each script call names one
        # slot's keys), so it stands where the client of one node does.
        self.redis = cast(Redis, connection)
        # Seconds a finished or failed job stays (the job hash's result_ttl and failure_ttl,
        # as RQ's readers read them; the worker writes the expiry).
        self.result_ttl = result_ttl
        self.queue_name = queue_name
        # RQ's own object for the default queue, for RQ's readers (its name, counts...).
        self.queue: RqQueue = rq_queue(self._rq(queue_name), self.redis)
        self._templates: dict[str, list[Any]] = {}
        self._push_keys: dict[str, list[str]] = {}
        clients = {id(c): c for c in (self.redis, *(nodes or {}).values())}
        by_client = {key: Node(client, threads=len(clients) > 1) for key, client in clients.items()}
        self._default = by_client[id(self.redis)]
        self._homes = {queue: by_client[id(client)] for queue, client in (nodes or {}).items()}
        self._nodes = list(by_client.values())

    def close(self) -> None:
        """Close the connections to every node."""
        for node in self._nodes:
            node.close()

    def _node(self, queue: str | None) -> Node:
        """The node of ``queue`` (an RQ queue of its bands: its queue's node)."""
        return self._homes.get(queue_of(queue or self.queue_name), self._default)

    def _rq(self, queue: str) -> str:
        """The RQ queue of ``queue``'s default band (tagged on a cluster)."""
        return rq_name(queue, self.cluster)

    @property
    def scheduled_key(self) -> str:
        return queue_keys(self.queue.name).scheduled

    def _template(self, name: str) -> list[Any]:
        """The job-hash fields every job on the RQ queue ``name`` shares."""
        if name not in self._templates:
            queue = rq_queue(name, self._node(name).redis)
            self._templates[name] = constant_fields(queue, self.result_ttl)
        return self._templates[name]

    def _keys_of(self, name: str) -> list[str]:
        """The keys a push to queue ``name`` touches, spelled once per queue (on one node
        with the sets of every queue, which a cluster's push writes apart)."""
        if name not in self._push_keys:
            keys = queue_keys(name)
            listed = [keys.queue, keys.scheduled, keys.intermediate, keys.started]
            if not self.cluster:
                listed += [keys.all_queues, QUEUES_KEY]
            self._push_keys[name] = listed
        return self._push_keys[name]

    def _each(self, nodes: Iterable[Node], work: Callable[[Node], T]) -> list[T]:
        """``work`` on each node at once, going on past a node that fails or is down (see
        :mod:`~duejobs.delivery.nodes`); raises only when no node answered and none of the
        deliverer's nodes is up — with one node, when it failed."""
        started = [(node, node.start(work)) for node in nodes]
        deadline = time.monotonic() + NODE_WAIT
        done: list[T] = []
        failures: list[Exception] = []
        for node, future in started:
            try:
                done.append(node.finish(future, deadline))
            except redis_failures() as exc:
                failures.append(exc)
        if failures and not done and self._cannot_go_on(failures, len(started)):
            raise failures[0]
        return done

    def _cannot_go_on(self, failures: Sequence[Exception], called: int) -> bool:
        """Whether the failures of a call no node answered are the caller's to handle: the
        only node failed, every node is down, or every node refused the call (an error that
        is not an outage). A refusal by some of the nodes is logged and counted, and the
        caller goes on (its rows there are the reconciler's, as a node down's are)."""
        if len(self._nodes) == 1 or all(node.down for node in self._nodes):
            return True
        outages = all(isinstance(f, (ConnectionError, TimeoutError)) for f in failures)
        return not outages and called == len(self._nodes)

    def _queues_on(self, node: Node) -> list[str]:
        """The RQ queues on ``node``: every band of the queues it is configured for and of
        every queue duejobs has pushed to there (a queue moved away keeps its leftovers
        promoted and counted) — each band of a queue known, so that a band's jobs are
        promoted and counted even once the list of queues pushed to is lost."""
        known = {m.decode() if isinstance(m, bytes) else m for m in node.redis.smembers(QUEUES_KEY)}
        homed = {queue for queue, home in self._homes.items() if home is node}
        if self._node(self.queue_name) is node:
            homed.add(self.queue_name)
        queues = sorted({queue_of(name) for name in known | homed})
        return sorted(bands([self._rq(queue) for queue in queues]))

    def queues(self) -> list[str]:
        """The default queue and every queue duejobs has pushed to, on every node."""
        return sorted({name for node in self._nodes for name in self._queues_on(node)})

    def push(self, pushes: Sequence[Push], now: datetime) -> PushResult:
        """Push a batch, one round trip per RQ queue it names (a queue's band for each
        delivery's priority: :mod:`duejobs.rq_wire.bands`): due ones (``due_at <= now``) onto
        their queue, the rest into its scheduled registry; due ones marked ``front`` go to the
        front of the queue, in the batch's order. ``now`` is the database clock."""
        by_node: dict[int, tuple[Node, dict[str, list[Push]]]] = {}
        for p in pushes:
            name = band_queue(self._rq(p.delivery.queue or self.queue_name), p.delivery.priority)
            node = self._node(name)
            by_node.setdefault(id(node), (node, {}))[1].setdefault(name, []).append(p)
        now_stamp = stamp(datetime.now(UTC))  # RQ's own bookkeeping field, informative only

        def push_on(node: Node, by_queue: dict[str, list[Push]]) -> PushResult:
            queued = deferred = present = 0
            created: set[str] = set()
            for name, batch in by_queue.items():
                template, keys = self._template(name), queue_keys(name)
                args: list[Any] = [keys.job_prefix, now.timestamp(), now_stamp]
                args += [keys.worker_prefix]
                args += [len(template), *template, name]
                for p in batch:
                    d = p.delivery
                    args += [d.job_id, job_data(d), (p.at or d.when_due).timestamp()]
                    args += ["1" if p.front else "0", "1" if p.stuck else "0"]
                    args += ["1" if p.unpushed else "0"]
                if self.cluster:  # the sets of every queue, each in a slot of its own
                    with node.redis.pipeline(transaction=False) as pipe:
                        pipe.sadd(keys.all_queues, keys.queue)
                        pipe.sadd(QUEUES_KEY, name)
                        pipe.execute()
                q, d, pr, made = node.push(keys=self._keys_of(name), args=args)
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

    def promote(self, now: datetime, limit: int = 1000) -> Promotion:
        """Move jobs whose time has come (by ``now``, the database clock) onto their queues,
        up to ``limit`` per queue, on every node; and say when the next one left falls due
        (read in the same script, so it costs no round trip)."""
        now_stamp = stamp(datetime.now(UTC))

        def promote_on(node: Node) -> list[tuple[int, float | None]]:
            # Every queue's script in one round trip (a pipeline, not one script over every
            # queue's keys: each script touches one queue's, as a cluster's slots need).
            names = self._queues_on(node)

            def run() -> list[Any]:
                pipe = node.redis.pipeline(transaction=False)
                for keys in map(queue_keys, names):
                    node.promote(
                        keys=[keys.scheduled, keys.queue],
                        args=[keys.job_prefix, now.timestamp(), limit, now_stamp],
                        client=pipe,
                    )
                return pipe.execute()

            try:
                answers = run()
            except NoScriptError:  # a cluster's pipeline loads no script: a new or promoted
                node.redis.script_load(node.promote.script)  # master had none (every master)
                answers = run()
            return [(int(n), None if due is None else float(due)) for n, due in answers]

        answers = [a for node_answers in self._each(self._nodes, promote_on) for a in node_answers]
        dues = [due for _, due in answers if due is not None]
        return Promotion(sum(moved for moved, _ in answers), min(dues, default=None))

    def refusing(self) -> list[tuple[str, str]]:
        """The nodes that refuse this client, each with what it answered
        (:func:`~duejobs.redis_urls.refusal`): what no retry mends."""
        refused = ((node.label, refusal(node.redis)) for node in self._nodes)
        return [(where, answer) for where, answer in refused if answer is not None]

    def on_each_node(self, work: Callable[[Node, list[str]], T]) -> list[T]:
        """``work(node, its RQ queues)`` on every node at once, as every call spanning nodes
        goes (:meth:`_each`): what the nodes that answered returned."""
        return self._each(self._nodes, lambda node: work(node, self._queues_on(node)))

    def live(self, jobs: Sequence[tuple[Any, ...]]) -> list[bool]:
        """Whether Redis can still hand each job — (id, due at, overdue past ``STUCK_AFTER``
        [, its queue]) — to a worker, by the same test a push makes (one round trip per
        node, on a cluster per queue; a job without a queue is looked for on the default
        queue's node)."""
        answers: list[bool] = [False] * len(jobs)  # a node that fails hands out nothing
        queues = [job[3] if len(job) > 3 else None for job in jobs]
        groups = self._grouped((i, queue, self._node(queue)) for i, queue in enumerate(queues))

        def check_on(node: Node) -> None:
            for queue, indexes in groups[id(node)][1].items():
                keys = queue_keys(self._rq(queue))
                args: list[Any] = [keys.job_prefix, QUEUE_PREFIX, SCHEDULED_PREFIX]
                args += [keys.worker_prefix]
                for i in indexes:
                    job_id, due_at, stuck = jobs[i][:3]
                    args += [job_id, due_at.timestamp(), "1" if stuck else "0"]
                for i, ok in zip(indexes, node.live(keys=[keys.queue], args=args), strict=True):
                    answers[i] = bool(ok)

        self._each([node for node, _ in groups.values()], check_on)
        return answers

    def _grouped(self, homes: Iterable[tuple[int, str | None, Node]]) -> _Groups:
        """Indexes by node, and on each node by the queue whose keys a call names: on one
        node the default queue's for all, on a cluster each one's own."""
        groups: _Groups = {}
        for i, queue, node in homes:
            named = queue_of(queue) if self.cluster and queue else self.queue_name
            groups.setdefault(id(node), (node, {}))[1].setdefault(named, []).append(i)
        return groups

    def job_state(
        self, queue_job_id: str, due_at: datetime, stuck: bool, queue: str | None = None
    ) -> JobState:
        """One job as Redis holds it, and whether a worker can still take it (:meth:`live`)."""
        key = queue_keys(self._rq(queue_of(queue or self.queue_name))).job_prefix + queue_job_id
        fields = self._node(queue).call(lambda node: node.redis.hmget(key, *JOB_FIELDS))
        status, origin, worker = (v.decode() if isinstance(v, bytes) else v for v in fields)
        (live,) = self.live([(queue_job_id, due_at, stuck, queue)])
        return JobState(status, origin, worker or None, live)

    def depth(self) -> tuple[int, int]:
        """(jobs waiting on the queues, jobs in their scheduled registries), all queues of
        every node."""

        def count_on(node: Node) -> tuple[int, int]:
            names = self._queues_on(node)
            with node.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    keys = queue_keys(name)
                    pipe.llen(keys.queue)
                    pipe.zcard(keys.scheduled)
                counts = pipe.execute()
            return sum(counts[0::2]), sum(counts[1::2])

        counted = self._each(self._nodes, count_on)  # a node that fails counts for nothing
        return sum(c[0] for c in counted), sum(c[1] for c in counted)

    def workers_on(self, queue: str | None = None) -> int:
        """The workers registered in RQ for ``queue`` (the App's by default) on its node:
        those started and not yet retired (a killed one counts until its key expires)."""
        node, name = self._node(queue), self._rq(queue or self.queue_name)
        return int(node.redis.scard(queue_keys(name).workers))

    def waiting_job_ids(self, chunk: int = 1000, most: int | None = None) -> Iterator[list[str]]:
        """The ids of jobs waiting on the queues or in their scheduled registries, in chunks,
        node by node (a node that fails or is down is skipped; the error is raised when no
        node could be read). ``most``: the first that many of each queue's list and each
        registry only (those next to run), whatever the queue holds behind them."""
        failures: list[Exception] = []
        for node in self._nodes:
            try:
                yield from self._waiting_on(node, chunk, most)
            except redis_failures() as exc:
                failures.append(exc)
        if len(failures) == len(self._nodes):
            raise failures[0]

    def _waiting_on(self, node: Node, chunk: int, most: int | None) -> Iterator[list[str]]:
        for name in node.call(self._queues_on):
            yield from self._waiting_in(node, name, chunk, most)

    def _waiting_in(
        self, node: Node, name: str, chunk: int, most: int | None
    ) -> Iterator[list[str]]:
        """The ids waiting on queue ``name`` of ``node``: its list, then its registry."""
        keys = queue_keys(name)
        for key, read in ((keys.queue, node.redis.lrange), (keys.scheduled, node.redis.zrange)):
            start = 0
            while most is None or start < most:
                end = start + chunk if most is None else min(start + chunk, most)
                ids = node.call(_reading(read, key, start, end - 1))
                if not ids:
                    break
                yield [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
                start += chunk

    def home_of(self, queue: str) -> str:
        """Where ``queue`` lives now (its node's address, no password)."""
        return self._node(queue).label

    def moved_off(self, redis: Redis) -> list[str]:
        """The duejobs queues on the node ``redis`` that live on another node now, told by
        the servers themselves (run id and database), however their URLs are spelt. Raises
        when a queue's node does not answer: whether it is that same server cannot be told."""
        here = Node(redis, threads=False)
        this = _server_of(redis)
        homes: dict[int, tuple[str, int]] = {}
        moved = []
        for name in self._queues_on(here):
            home = self._node(name)
            if id(home) not in homes:
                homes[id(home)] = home.call(lambda node: _server_of(node.redis))
            if homes[id(home)] != this:
                moved.append(name)
        return moved

    def waiting_in(self, redis: Redis, queue: str, chunk: int = 1000) -> list[str]:
        """The ids waiting on ``queue`` of the node ``redis``: its list, then its registry."""
        here = Node(redis, threads=False)
        return [i for part in self._waiting_in(here, queue, chunk, None) for i in part]

    def defer(self, queue_job_id: str, due_at: datetime, queue: str | None = None) -> bool:
        """Put a job that just ran back into its queue's scheduled registry for ``due_at``.

        For a delivery that came too early: its job keeps its id (the row still names it), so
        nothing can push a second one. Called after RQ has finished with the job.
        """
        keys = queue_keys(queue or self.queue.name)
        args: list[Any] = [keys.job_prefix + queue_job_id, queue_job_id, due_at.timestamp()]
        deferred = self._node(queue).call(lambda n: n.defer(keys=[keys.scheduled], args=args))
        return bool(deferred)

    def remove(self, queue_job_id: str, queue: str | None = None) -> bool:
        """Delete a job that is still waiting (queued or scheduled), from whichever queue it
        is on — on ``queue``'s node, or, without one, on every node; a started one is left to
        the worker's own check. True when something was removed."""
        return self.remove_many([(queue_job_id, queue)])[0]

    def remove_many(self, jobs: Sequence[tuple[str, str | None]]) -> list[bool]:
        """:meth:`remove` of each (job id, queue or None), one script call per node (on a
        cluster per queue, a job without one looked for on every queue); for each, whether
        something was removed."""
        every = self._queues_on(self._default) if self.cluster else []
        known = sorted({queue_of(name) for name in every})
        homes: list[tuple[int, str | None, Node]] = []
        for i, (_, queue) in enumerate(jobs):
            if queue is not None:
                homes.append((i, queue, self._node(queue)))
            elif self.cluster:
                homes += [(i, name, self._default) for name in known]
            else:
                homes += [(i, None, node) for node in self._nodes]
        groups = self._grouped(homes)

        def work(node: Node) -> list[tuple[list[int], list[int]]]:
            done = []
            for queue, indexes in groups[id(node)][1].items():
                keys = queue_keys(self._rq(queue))
                args = [keys.job_prefix, QUEUE_PREFIX, SCHEDULED_PREFIX]
                args += [jobs[i][0] for i in indexes]
                done.append((indexes, node.remove(keys=[keys.queue], args=args)))
            return done

        removed = [False] * len(jobs)
        for answers in self._each([node for node, _ in groups.values()], work):
            for indexes, flags in answers:
                for i, flag in zip(indexes, flags, strict=True):
                    removed[i] = removed[i] or bool(flag)
        return removed


def _server_of(redis: Redis) -> tuple[str, int]:
    """Which server and database a client reaches: the server's run id, and the database."""
    return str(redis.info("server")["run_id"]), int(
        redis.connection_pool.connection_kwargs.get("db", 0)
    )


def _reading(
    read: Callable[[str, int, int], list[Any]], key: str, start: int, end: int
) -> Callable[[Node], list[Any]]:
    """A range read of ``key``, as a call to its node."""
    return lambda _node: read(key, start, end)
