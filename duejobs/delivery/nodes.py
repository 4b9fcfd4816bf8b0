"""Redis nodes as the deliverer sees them: each server with the scripts registered on it,
whether it answers, and — with several nodes — threads of its own, so that one node that
fails or hangs never holds up the work meant for another.

What it promises, with several nodes (``DUEJOBS_REDIS_NODES``):

* **A bounded wait.** A call to a node runs in that node's threads and its caller waits for it
  at most ``NODE_WAIT`` (1 s). A call that fails, or that has not answered by then, marks the
  node *down*: logged once at warning, ``duejobs_redis_node_up{node}`` set to 0.
* **No call to a node that is down.** Every later call to it fails at once, with no I/O and no
  wait (counted in ``duejobs_redis_node_errors_total{node}``, as a failed call is), until a
  probe — a ``PING`` in the node's own threads, never on a caller's time — finds it answering:
  first ``PROBE_FIRST`` (0.25 s) after it went down, then doubling up to ``PROBE_MAX`` (2 s).
  Then it is logged back up and used again.
* Calls to nodes that answer go on in parallel, each node's in its own threads.

What it does not promise: a call given up after ``NODE_WAIT`` may still complete on the node
later. Every write the deliverer sends is idempotent under a deterministic job id, so a late
push is a job that was wanted anyway; the caller only does not count it. What a caller does
about a node that is down is the deliverer's rule (see :class:`~duejobs.delivery.Deliverer`).

With a single node none of this applies: calls run on the caller's thread, an outage fails
the caller at once (after the client's own timeout for a hang), and its loop backs off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from prometheus_client import Counter, Gauge
from redis import Redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from duejobs.redis_urls import redis_failures
from duejobs.rq_wire.scripts import (
    CLEAN_SCRIPT,
    DEFER_SCRIPT,
    LIVE_SCRIPT,
    PROMOTE_SCRIPT,
    PUSH_SCRIPT,
    REMOVE_SCRIPT,
)

log = logging.getLogger("duejobs.delivery")
T = TypeVar("T")

NODE_ERRORS = Counter(
    "duejobs_redis_node_errors",
    "Calls to one Redis node that failed, or were not made because it was down, while other "
    "nodes went on.",
    ["node"],
)
NODE_UP = Gauge(
    "duejobs_redis_node_up",
    "1 while a Redis node answers, 0 from its first failed call until a probe finds it back.",
    ["node"],
)

# How long a caller waits for one node before calling it down (several nodes only).
NODE_WAIT = 1.0
# When a node that is down is first probed, and the longest gap between probes.
PROBE_FIRST = 0.25
PROBE_MAX = 2.0
# Calls to one node in flight at once: the scheduler's claim loops, a promotion, a reconciler.
NODE_THREADS = 4


def node_label(redis: Redis) -> str:
    """Where a Redis client connects, without its password (for logs, metrics, messages); a
    cluster's client, the nodes it was given."""
    if isinstance(redis, RedisCluster):
        return "cluster " + ",".join(sorted(redis.nodes_manager.startup_nodes))
    kwargs = redis.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"{kwargs['path']}/{kwargs.get('db', 0)}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


class NodeDown(RedisConnectionError):
    """A call not made, or given up: the node is down (see the module docstring)."""


class Node:
    """One Redis server, with the scripts registered on it; with ``threads``, calls go to
    threads of its own and a node that fails is skipped until a probe finds it back."""

    def __init__(self, redis: Redis, threads: bool) -> None:
        self.redis = redis
        self.push: Script = redis.register_script(PUSH_SCRIPT)
        self.live: Script = redis.register_script(LIVE_SCRIPT)
        self.promote: Script = redis.register_script(PROMOTE_SCRIPT)
        self.remove: Script = redis.register_script(REMOVE_SCRIPT)
        self.defer: Script = redis.register_script(DEFER_SCRIPT)
        self.clean: Script = redis.register_script(CLEAN_SCRIPT)
        self._lane = ThreadPoolExecutor(NODE_THREADS, "duejobs-node") if threads else None
        self._lock = threading.Lock()
        self._down = False
        self._failures = 0  # in a row, since it went down
        self._probe_at = 0.0
        self._probing = False
        self._closed = False
        if threads:
            NODE_UP.labels(self.label).set(1)

    @property
    def label(self) -> str:
        """Where the node is, without its password (for logs and metrics)."""
        return node_label(self.redis)

    @property
    def down(self) -> bool:
        return self._down

    def start(self, work: Callable[[Node], T]) -> Future[T]:
        """``work`` under way on this node (done already with a single node); a node that
        is down gets no call: the future holds :class:`NodeDown`."""
        future: Future[T] = Future()
        if self._lane is None:
            try:
                future.set_result(work(self))
            except redis_failures() as exc:
                NODE_ERRORS.labels(self.label).inc()
                future.set_exception(exc)
            return future
        if self._down:
            self._probe_if_due()
            NODE_ERRORS.labels(self.label).inc()
            future.set_exception(NodeDown(f"Redis node {self.label} is down"))
            return future
        try:
            return self._lane.submit(work, self)
        except RuntimeError:  # closed: no call is made any more
            future.set_exception(NodeDown(f"Redis node {self.label}: its client is closed"))
            return future

    def finish(self, future: Future[T], deadline: float) -> T:
        """The answer of a call :meth:`start` made, waited for until ``deadline`` (a
        monotonic time); a failure or a call unanswered by then marks the node down."""
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except NodeDown:
            raise
        except FutureTimeout:
            future.cancel()  # not started yet (behind a hung call): never sent
            error = NodeDown(f"Redis node {self.label} did not answer within {NODE_WAIT:g} s")
            self._went_down(error)
            raise error from None
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self._went_down(exc)
            raise
        except RedisError as exc:  # refused, not an outage: the caller's to handle
            if self._lane is not None:
                NODE_ERRORS.labels(self.label).inc()
                log.warning("Redis node %s refused a call: %s", self.label, exc)
            raise

    def call(self, work: Callable[[Node], T]) -> T:
        """``work`` on this node, waited for at most ``NODE_WAIT``."""
        return self.finish(self.start(work), time.monotonic() + NODE_WAIT)

    def close(self) -> None:
        """Close the client; calls still under way on a node that hangs are not waited for."""
        self._closed = True
        if self._lane is not None:
            self._lane.shutdown(wait=False, cancel_futures=True)
        self.redis.close()

    def _went_down(self, exc: BaseException) -> None:
        if self._lane is None or self._closed:
            return  # a single node: the caller's failure says it; closed: nobody asks
        NODE_ERRORS.labels(self.label).inc()
        with self._lock:
            first = not self._down
            self._down = True
            self._failures += 1
            self._probe_at = time.monotonic() + min(
                PROBE_FIRST * 2 ** (self._failures - 1), PROBE_MAX
            )
        if first:
            NODE_UP.labels(self.label).set(0)
            log.warning(
                "Redis node %s is down (%s): its queues wait, the other nodes go on",
                self.label,
                exc,
            )

    def _probe_if_due(self) -> None:
        with self._lock:
            if self._probing or time.monotonic() < self._probe_at or self._lane is None:
                return
            self._probing = True
        try:
            self._lane.submit(self._probe)
        except RuntimeError:  # closed meanwhile
            self._probing = False

    def _probe(self) -> None:
        try:
            self.redis.ping()
        except RedisError as exc:
            self._probing = False
            self._went_down(exc)
            return
        with self._lock:
            self._down, self._failures, self._probing = False, 0, False
        NODE_UP.labels(self.label).set(1)
        log.warning("Redis node %s answers again", self.label)
