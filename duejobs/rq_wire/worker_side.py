"""The worker's side of RQ's wire format, written by duejobs' own Lua scripts: what a worker
takes from RQ's queues, and what it writes so that RQ's own tools (``rq info``,
``Job.fetch(id)``, RQ's registries, rq-dashboard) read duejobs' workers and jobs as RQ's.

What it writes, in RQ's layout (the same from RQ 2.0 to 3.0, read through RQ's public names):

* **The worker.** ``rq:worker:<name>`` (birth, queues, pid, host, versions, ``state`` busy or
  idle, its job counts and working time, ``last_heartbeat``), kept alive by
  :meth:`RqWire.beat` (``WORKER_TTL``), listed in ``rq:workers`` and ``rq:workers:<queue>``,
  and marked dead (``death``) when the worker ends. The deliverer counts a ``started`` job as
  live only while this key lives.
* **A job taken** (:data:`~duejobs.rq_wire.scripts.TAKE`, one script for all the jobs taken
  together, and for the jobs finishing meanwhile): popped off its queue, its hash marked
  ``started`` by this worker, and entered into the queue's started registry as
  ``<job id>:<run id>`` (RQ 2.0+'s member form), its score refreshed while it runs
  (:meth:`RqWire.keep_started`).
* **A job finished** (the same script, for the jobs finishing together — at one slot with the
  take of the next job): its hash ``finished`` (or ``failed``) with its end, kept
  ``result_ttl`` (``DUEJOBS_RESULT_TTL``), out of the started registry and into the finished
  (failed) one scored with its expiry (the reconciler removes it then), and its result in
  RQ's results stream: the outcome (``succeeded``, ``skipped``...) as the job's return value,
  or the error.

What it does not write: RQ's per-run execution records (``rq:execution:*``), nor the
worker's ``current_job``: a worker's current jobs are those its started registries hold under
its name, and ``Worker.get_current_job_id()`` answers None for a duejobs worker. (RQ 2 reads
``current_job``, and rq-dashboard on RQ 2 then unpickles that job to show it — a JSON job
failed its whole workers page.) It listens to no RQ command (``rq`` stop-job and shutdown
requests are not heard: stop a worker with SIGTERM, a schedule by cancelling it).

What it costs (``INFO commandstats``, which counts a script's commands and the script call):
a no-op job taken and finished with others, about ten Redis commands (one ``HGET`` to read
it, an ``HSET`` and a ``ZADD`` to start it, six to finish it, the pop, the script calls and
the worker's own writes shared by the batch); a job alone at one slot, twelve — its finish
and the next job's take one script, the worker's key written once for both
(``python -m bench concurrency`` prints both).

Taking needs Redis 6.2 or later (``LPOP`` with a count; on 7.0 and later one ``LMPOP`` looks
through every band). Every call here may raise a Redis error: the worker's loop decides what
an outage means (:mod:`duejobs.worker.redis_waits`).
"""

from __future__ import annotations

import os
import platform
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import rq
from redis import Redis
from redis.cluster import RedisCluster
from redis.typing import EncodableT, FieldT

from duejobs.config import DEFAULT_RESULT_TTL
from duejobs.models import Delivery
from duejobs.rq_wire.bands import bands, take_order
from duejobs.rq_wire.job_hash import delivery_of, result_entry
from duejobs.rq_wire.keys import (
    STARTED_TTL,
    SUSPENDED_KEY,
    WORKER_PREFIX,
    WORKER_TTL,
    WORKERS_KEY,
    queue_keys,
    rq_name,
    stamp,
)
from duejobs.rq_wire.scripts import TAKE
from duejobs.rq_wire.watch import ANYWHERE, Watch

BANDS = 3  # RQ queues per queue (:func:`duejobs.rq_wire.bands.bands`)


@dataclass(frozen=True)
class Taken:
    """A job taken off a queue: its id, its queue, its RQ run id (its started-registry entry
    is ``<job_id>:<run>``), and its delivery — None when its hash was gone or cannot be
    read as a duejobs job (``unreadable`` says why)."""

    job_id: str
    queue: str
    run: str
    delivery: Delivery | None
    unreadable: str = ""


@dataclass(frozen=True)
class Finished:
    """What a job's run came to, for RQ: the outcome its result holds, or the error that
    failed it."""

    taken: Taken
    outcome: str | None
    error: str | None = None
    seconds: float = 0.0


class RqWire:
    """One worker's RQ records on one Redis (see the module docstring)."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        queues: Sequence[str],
        name: str,
        result_ttl: int = DEFAULT_RESULT_TTL,
    ) -> None:
        self.cluster = isinstance(redis, RedisCluster)
        # A cluster's client serves every command sent here (each script names one slot's
        # keys; the pipelines are not transactions there).
        self.redis = cast(Redis, redis)
        self.result_ttl = result_ttl  # seconds a finished or failed job stays
        # The RQ queues of each queue's priority bands, in order: three per queue.
        self.queues = bands([rq_name(q, self.cluster) for q in queues])
        self.name = name
        self.key = WORKER_PREFIX + name
        keys = [queue_keys(q) for q in self.queues]
        self._queue_keys = [k.queue for k in keys]
        self._started_keys = [k.started for k in keys]
        self._finished_keys = [k.finished for k in keys]
        self._failed_keys = [k.failed for k in keys]
        self._job_prefixes = [k.job_prefix for k in keys]
        self._results_prefixes = [k.results_prefix for k in keys]
        self._worker_sets = [k.workers for k in keys]
        # On a cluster, the worker's mark in each queue's slot (a started job's worker is
        # alive while it lives, :mod:`duejobs.rq_wire.keys`); on one node, RQ's worker key.
        self._marks = [k.worker_prefix + name for k in keys[::BANDS]]
        # On a cluster, several queues are waited on by a watch of each band list (a
        # command names one slot's keys); one queue's bands by one BLPOP, as on one node.
        several = self.cluster and len(self._marks) > 1
        self._watch = Watch(cast(RedisCluster, redis), self._queue_keys) if several else None
        self._takes = 0  # takes made, which sets each one's order (bands.take_order)
        self._script = redis.register_script(TAKE)
        self._lost: list[str] = []  # run-id bases of takes whose answers were lost
        # The worker's own figures, written whole with each finish (only it writes them).
        self.succeeded = 0
        self.failed = 0
        self.working_time = 0.0

    # -- the worker ---------------------------------------------------------------------------

    def register(self) -> bool:
        """The worker's key, as RQ's ``register_birth`` writes it, and its place in RQ's
        worker sets; whether ``rq suspend`` holds the workers."""
        now = stamp(datetime.now(UTC))
        fields: dict[FieldT, EncodableT] = {
            "birth": now,
            "last_heartbeat": now,
            "queues": ",".join(self.queues),
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "ip_address": _ip_address(),
            "version": rq.__version__,
            "python_version": platform.python_version(),
            "state": "idle",
            "successful_job_count": 0,
            "failed_job_count": 0,
            "total_working_time": 0,
        }
        with self.redis.pipeline(transaction=not self.cluster) as pipe:
            pipe.delete(self.key)
            pipe.hset(self.key, mapping=fields)
            pipe.expire(self.key, WORKER_TTL)
            pipe.sadd(WORKERS_KEY, self.key)
            for workers in self._worker_sets:
                pipe.sadd(workers, self.key)
            for mark in self._slot_marks():
                pipe.hset(mark, "state", "idle")
                pipe.expire(mark, WORKER_TTL)
            pipe.exists(SUSPENDED_KEY)
            return bool(pipe.execute()[-1])

    def _slot_marks(self) -> list[str]:
        """The worker's marks in its queues' slots, beside its key (a cluster's only)."""
        return self._marks if self.cluster else []

    def beat(self, stopping_since: datetime | None = None) -> bool:
        """The worker's heartbeat (with, once a warm stop began, RQ's
        ``shutdown_requested_date``); whether ``rq suspend`` holds the workers (RQ's
        suspension key), read in the same round trip."""
        pipe = self.redis.pipeline(transaction=False)
        fields: dict[FieldT, EncodableT] = {"last_heartbeat": stamp(datetime.now(UTC))}
        if stopping_since is not None:
            fields["shutdown_requested_date"] = stamp(stopping_since)
        pipe.hset(self.key, mapping=fields)
        pipe.expire(self.key, WORKER_TTL)
        for mark in self._slot_marks():
            pipe.expire(mark, WORKER_TTL)
        pipe.exists(SUSPENDED_KEY)
        created, _, *kept, suspended = pipe.execute()
        # The key, or a mark, was gone (Redis, or a shard, restarted empty): register again.
        if created == len(fields) or not all(kept):
            return self.register()
        return bool(suspended)

    def keep_started(self, running: Sequence[Taken]) -> None:
        """Push back the started-registry entries of jobs still running, so that RQ's
        cleanup of expired entries never counts a live run as abandoned."""
        if not running:
            return
        score = datetime.now(UTC).timestamp() + STARTED_TTL
        pipe = self.redis.pipeline(transaction=False)
        for taken in running:
            started = self._started_keys[self.queues.index(taken.queue)]
            pipe.zadd(started, {f"{taken.job_id}:{taken.run}": score}, xx=True)
        pipe.execute()

    def retire(self) -> None:
        """RQ's ``register_death``: out of the worker sets, the key marked dead, gone in a
        minute. The watches of a cluster's waits end."""
        if self._watch is not None:
            self._watch.close()
        with self.redis.pipeline(transaction=not self.cluster) as pipe:
            pipe.srem(WORKERS_KEY, self.key)
            for workers in self._worker_sets:
                pipe.srem(workers, self.key)
            for mark in self._slot_marks():
                pipe.delete(mark)
            pipe.hset(self.key, "death", stamp(datetime.now(UTC)))
            pipe.expire(self.key, 60)
            pipe.execute()

    # -- jobs ----------------------------------------------------------------------------------

    def take(
        self,
        most: int,
        wait: float,
        finishing: list[Finished] | None = None,
        state: str = "",
        may_block: Callable[[], bool] = lambda: True,
    ) -> list[Taken]:
        """Up to ``most`` waiting jobs, started in RQ in one script — the jobs of
        ``finishing`` finished in the same script first, the worker then ``state`` in RQ if
        none is taken; with none waiting, ``wait`` above zero and ``may_block()`` saying so
        (asked last), blocks up to ``wait`` seconds for one (then takes more with it; a
        popped id whose take then fails waits for the reconciler, as RQ's own dequeue loses
        one whose answer is lost).
        A job whose id was popped but whose hash is gone comes back unreadable, unstarted.

        A take whose answer was lost (the connection broke after Redis ran it) started jobs
        for this worker that it does not know of — and that the deliverer counts as live
        while the worker lives: the next take finds them by their run ids and hands them
        out first (:meth:`_recovered`) — or, none found, takes as usual —, its finishes written
        again on their own (a second entry in a job's results stream, the rest the same).

        ``finishing`` is emptied once written, with ``state``: the same call made again after
        an outage (the blocking wait's, say) does not write them, or a stale state, twice."""
        finishing = [] if finishing is None else finishing
        if self._lost:
            if finishing:
                self.finish(finishing, state)
                finishing.clear()
            found = self._recovered()
            if found:
                return found
        taken = self._run(most, "", ANYWHERE, finishing, state if finishing else "")
        finishing.clear()
        if taken or wait <= 0 or not may_block():
            return taken
        if self._watch is not None:
            came = self._watch.wait(wait)
            return [] if came is None else self._run(most, "", came, (), "")
        popped = self.redis.blpop(self._queue_keys, wait)
        if popped is None:
            return []
        key, job_id = (_text(part) for part in popped)
        return self._run(most, job_id, self._queue_keys.index(key), (), "")

    def finish(self, done: Sequence[Finished], state: str) -> None:
        """RQ's finish of jobs that ran (one script), the worker's figures and ``state``
        written with them."""
        self._run(0, "", ANYWHERE, done, state)

    def _run(
        self, most: int, first: str, index: int, finishing: Sequence[Finished], state: str
    ) -> list[Taken]:
        """The script: ``finishing`` finished, then ``first`` (an id popped already, from the
        RQ queue at ``index`` of :attr:`queues`) and as many more waiting jobs as make
        ``most`` started, looked for in this take's order of bands; the worker ``state`` if
        none is. On a cluster, one call per queue in that order — the queue of ``index``
        first (a popped id's, or the list a watch saw a job on; ``ANYWHERE``: none) —, each
        with its own jobs' finishes; the worker's key written apart, after them."""
        taking = bool(most or first)
        if taking:
            self._takes += 1
        order = take_order(self._takes, len(self.queues)) if taking else []
        base = uuid.uuid4().hex[:16]  # of the run ids of the jobs this take starts
        if taking:  # until every answer comes: a script may run and its answer be lost
            self._lost.append(base)
        before = self.succeeded, self.failed, self.working_time
        try:
            if self.cluster:
                taken = self._each_queue(base, order, most, first, index, finishing, state)
            else:
                taken = self._call(self.key, base, order, most, first, index, finishing, state)
        except BaseException:
            self.succeeded, self.failed, self.working_time = before  # written again, once
            raise
        if taking:
            self._lost.remove(base)
        return taken

    def _each_queue(
        self,
        base: str,
        order: list[int],
        most: int,
        first: str,
        index: int,
        finishing: Sequence[Finished],
        state: str,
    ) -> list[Taken]:
        """A cluster's take: one call per queue — the queue of ``index`` first (``first``'s,
        popped already, taken whatever the room), then the others in this take's order with
        the room left — and the worker's key written after them."""
        taken: list[Taken] = []
        calls = sorted(
            self._by_queue(order, finishing).items(),
            key=lambda call: index not in call[1][0],
        )
        for group, (bands_, done) in calls:
            here = first if index in bands_ else ""
            room = max(most - len(taken), 1 if here else 0)
            taken += self._call(self._marks[group], base, bands_, room, here, index, done, "")
        fields: dict[FieldT, EncodableT] = {}
        if taken or state:
            fields["state"] = "busy" if taken else state
        if finishing:
            fields["successful_job_count"], fields["failed_job_count"] = self.succeeded, self.failed
            fields["total_working_time"] = round(self.working_time, 6)
        if fields:
            self.redis.hset(self.key, mapping=fields)
        return taken

    def _by_queue(
        self, order: list[int], finishing: Sequence[Finished]
    ) -> dict[int, tuple[list[int], list[Finished]]]:
        """A cluster's take, by queue (its three bands share its slot): the bands in this
        take's order, and its jobs' finishes; the queues taken from first, in order."""
        calls: dict[int, tuple[list[int], list[Finished]]] = {}
        for i in order:
            calls.setdefault(i // BANDS, ([], []))[0].append(i)
        for item in finishing:
            calls.setdefault(self.queues.index(item.taken.queue) // BANDS, ([], []))[1].append(item)
        return calls

    def _call(
        self,
        mark: str,
        base: str,
        order: list[int],
        most: int,
        first: str,
        index: int,
        finishing: Sequence[Finished],
        state: str,
    ) -> list[Taken]:
        """One script call over the bands of ``order`` (:data:`~duejobs.rq_wire.scripts.TAKE`),
        the jobs it starts given run ids from ``base``, the worker's figures and ``state``
        written on ``mark``."""
        keys = [mark]
        for i in order:
            keys += [self._queue_keys[i], self._started_keys[i]]
        now = datetime.now(UTC)
        bands_of = order or [self.queues.index(item.taken.queue) for item in finishing] or [0]
        args: list[EncodableT] = [most, self._job_prefixes[bands_of[0]], stamp(now)]
        position = order.index(index) + 1 if first else 0
        args += [now.timestamp() + STARTED_TTL, self.name, base, first, position, state]
        figures = self._finishes(finishing, now, args)
        rows = self._script(keys=keys, args=args)
        self.succeeded, self.failed, self.working_time = figures
        return [self._taken(job, self.queues[order[int(at) - 1]], *rest) for job, at, *rest in rows]

    def _finishes(
        self, done: Sequence[Finished], now: datetime, args: list[EncodableT]
    ) -> tuple[int, int, float]:
        """The script's arguments for the jobs of ``done`` (added to ``args``), and the
        worker's figures once they are written (only it writes them)."""
        succeeded = self.succeeded + sum(item.error is None for item in done)
        failed = self.failed + sum(item.error is not None for item in done)
        working_time = self.working_time + sum(item.seconds for item in done)
        if not done:
            return succeeded, failed, working_time
        results = self._results_prefixes[self.queues.index(done[0].taken.queue)]
        args += [results, succeeded, failed, round(working_time, 6)]
        ttl = self.result_ttl
        for item in done:
            at = self.queues.index(item.taken.queue)
            if item.error is None:
                registry, status = self._finished_keys[at], "finished"
            else:
                registry, status = self._failed_keys[at], "failed"
            kind, field, value = result_entry(item.outcome, item.error)
            args += [item.taken.job_id, self._started_keys[at], item.taken.run, registry]
            args += [now.timestamp() + ttl, ttl, status, kind, field, value]
        return succeeded, failed, working_time

    @property
    def lost(self) -> bool:
        """Whether takes whose answers were lost may have started jobs for this worker."""
        return bool(self._lost)

    def _recovered(self) -> list[Taken]:
        """The jobs started by takes whose answers were lost, found in the started
        registries by their run ids (``<job id>:<base><n>``)."""
        found: list[Taken] = []
        for base in self._lost:
            for queue, started in zip(self.queues, self._started_keys, strict=True):
                for member, _score in self.redis.zscan_iter(started, match=f"*:{base}*"):
                    job_id, run = _text(member).rsplit(":", 1)
                    prefix = self._job_prefixes[self.queues.index(queue)]
                    data = self.redis.hget(prefix + job_id, "data")
                    found.append(self._taken(job_id, queue, data or "", run))
        self._lost.clear()
        return found

    def _taken(self, job_id: Any, queue: str, data: Any, run: Any) -> Taken:
        job = _text(job_id)
        if not data:
            return Taken(job, queue, "", None, "its hash is gone")
        try:
            return Taken(job, queue, _text(run), delivery_of(data, queue))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            return Taken(job, queue, _text(run), None, f"not a duejobs job ({exc})")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ip_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""
