"""How a worker of several queues on a Redis Cluster waits for a job on any of them.

On one node a blocking take names every band list of every queue in one ``BLPOP``. On a
cluster a command names the keys of one slot, and each queue has a slot of its own: one
blocking command cannot wait on two queues. So, while the worker waits, a thread per band
list blocks on it with ``BLMOVE list list LEFT LEFT`` — Redis' move of a list's head onto
itself, which blocks while the list is empty and, once a job comes, answers its id and
leaves the list as it was. The first answer wakes the worker, whose take then takes the job
in its script as any take does.

What it promises: a job pushed onto any band of any queue the worker serves, while it waits,
wakes it within a round trip (``python -m bench cluster``: the start lag of a six-queue
worker). A watch pops nothing: one that answers after its wait ended, or whose answer is
lost with its connection, changes nothing in Redis, and no job waits on a worker that died
between two calls. The take that follows a wake takes first from the queue whose list
answered. A watch that fails (an outage, a slot moving) ends the wait with its error, which
the worker's loop handles as a take's: an outage waited out
(:mod:`duejobs.worker.redis_waits`); an ACL refusing ``BLMOVE`` ends the worker, naming it,
as a refused take does (duejobs' ACL needs ``BLMOVE`` on a cluster). An error of the client's
own is logged, and the take looks through every queue.

What it does not promise: that the job is this worker's (every worker watching the list
wakes; the first take gets it, the others find nothing and wait again). What it costs: a
thread per band list (three per queue) from the worker's first wait to its end, each with a
connection of the client's pool while it blocks, at most 1 s a call (half the client's socket
timeout, if shorter); idle, a worker of Q queues sends 3Q watches and Q take scripts a second.
``BLMOVE`` is a write (Redis refuses it at ``maxmemory``, as it refuses the pushes then). Needs
``BLMOVE`` (Redis 6.2).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from redis.cluster import RedisCluster

from duejobs.redis_urls import redis_failures

log = logging.getLogger("duejobs.worker")

# The shortest and the longest block a watch asks Redis for (seconds): a timeout of 0 would
# block for good, and a block as long as the client's socket timeout would fail as one.
_SHORTEST, _LONGEST = 0.01, 1.0
# A wait's answer when a watch failed for a reason of its own: the take looks everywhere.
ANYWHERE = -1


class Watch:
    """Threads blocked on ``keys`` (each a list) while :meth:`wait` waits."""

    def __init__(self, redis: RedisCluster, keys: Sequence[str]) -> None:
        self._redis, self._keys = redis, list(keys)
        timeout = redis.get_connection_kwargs().get("socket_timeout")  # type: ignore[no-untyped-call]
        self._longest = min(_LONGEST, timeout / 2) if timeout else _LONGEST
        self._changed = threading.Condition()
        self._until = 0.0  # when the wait under way ends (monotonic)
        self._answer: int | None = None  # the list a job came on during it
        self._failure: Exception | None = None  # or the Redis failure a watch met first
        self._closed = False
        self._threads: list[threading.Thread] = []

    def wait(self, seconds: float) -> int | None:
        """The index in ``keys`` of a list a job came onto within ``seconds`` (or
        :data:`ANYWHERE`), None when none came; a Redis failure a watch met first is raised.
        (A job a watch saw as the wait before this one ended may wake this one: the take that
        follows then finds nothing, and the worker waits again.)"""
        with self._changed:
            self._until = time.monotonic() + seconds
            self._answer, self._failure = None, None
            self._changed.notify_all()
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._watch, args=(i,), name="duejobs-watch", daemon=True)
                for i in range(len(self._keys))
            ]
            for thread in self._threads:
                thread.start()
        with self._changed:
            self._changed.wait_for(lambda: self._answer is not None, seconds)
            answer, failure = self._answer, self._failure
            self._until = 0.0  # over: the watches stop blocking
        if failure is not None:
            raise failure
        return answer

    def close(self) -> None:
        """End the threads (each within its blocking call's end, not waited for)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _block_for(self) -> float | None:
        """Seconds to block for once a wait is under way and no watch has answered it; None
        once closed."""
        with self._changed:
            while not self._closed:
                left = self._until - time.monotonic()
                if left > 0 and self._answer is None:
                    return min(max(left, _SHORTEST), self._longest)
                self._changed.wait()
            return None

    def _watch(self, index: int) -> None:
        key = self._keys[index]
        while (block := self._block_for()) is not None:
            answer, failure = index, None
            # A fraction of a second, as Redis takes it (redis-py's blmove types whole ones).
            command = ("BLMOVE", key, key, "LEFT", "LEFT", block)
            try:
                came = self._redis.execute_command(*command)  # type: ignore[no-untyped-call]
            except redis_failures() as exc:
                came, failure = True, exc
            except Exception:  # the client's own defect: this watch goes on, the take looks
                log.exception("a watch of %s failed", key)
                came, answer = True, ANYWHERE
            if came is not None:
                with self._changed:
                    # The first answer to a wait under way counts; none once it ended.
                    if self._until > time.monotonic() and self._answer is None:
                        self._answer, self._failure = answer, failure
                        self._changed.notify_all()
