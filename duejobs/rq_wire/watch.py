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
between two calls. A watch that fails (an outage, a slot moving, an ACL without ``BLMOVE``)
ends the wait with its error, which the worker's loop handles as a take's: an outage waited
out (:mod:`duejobs.worker.redis_waits`), another error logged and tried again after a pause.

What it does not promise: that the job is this worker's (another worker's take may be
first; this one then waits again). What it costs: one thread and, while the worker waits,
one connection per band list (three per queue), each blocking call as long as the take's
wait; idle, a worker of Q queues sends 3Q watches and Q take scripts a wait (one a second).
Needs ``BLMOVE`` (Redis 6.2).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from redis import Redis

from duejobs.redis_urls import redis_failures

# The shortest and the longest block a watch asks Redis for (seconds): a timeout of 0 would
# block for good, and a block longer than a client's socket timeout would fail as a timeout.
_SHORTEST, _LONGEST = 0.01, 1.0


class Watch:
    """Threads blocked on ``keys`` (each a list) while :meth:`wait` waits."""

    def __init__(self, redis: Redis, keys: Sequence[str]) -> None:
        self._redis, self._keys = redis, list(keys)
        self._changed = threading.Condition()
        self._until = 0.0  # when the wait under way ends (monotonic)
        self._seen = False  # whether a watch answered during it
        self._failure: Exception | None = None  # a watch's error, raised by the wait
        self._closed = False
        self._threads: list[threading.Thread] = []

    def wait(self, seconds: float) -> bool:
        """Whether a job came onto one of the lists within ``seconds``; a watch's error is
        raised. (A job a watch saw as the wait before this one ended may wake this one: the
        take that follows then finds nothing, and the worker waits again.)"""
        with self._changed:
            self._until = time.monotonic() + seconds
            self._seen, self._failure = False, None
            self._changed.notify_all()
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._watch, args=(key,), name="duejobs-watch", daemon=True)
                for key in self._keys
            ]
            for thread in self._threads:
                thread.start()
        with self._changed:
            self._changed.wait_for(lambda: self._seen, seconds)
            seen, failure = self._seen, self._failure
            self._until = 0.0  # over: the watches stop blocking
        if failure is not None:
            raise failure
        return seen

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
                if left > 0 and not self._seen:
                    return min(max(left, _SHORTEST), _LONGEST)
                self._changed.wait()
            return None

    def _watch(self, key: str) -> None:
        while (block := self._block_for()) is not None:
            failure: Exception | None = None
            # A fraction of a second, as Redis takes it (redis-py's blmove types whole ones).
            command = ("BLMOVE", key, key, "LEFT", "LEFT", block)
            try:
                came = self._redis.execute_command(*command)  # type: ignore[no-untyped-call]
            except redis_failures() as exc:
                came, failure = True, exc
            if came is not None:
                with self._changed:
                    if self._until > time.monotonic():  # a wait under way, else nobody asks
                        self._seen, self._failure = True, self._failure or failure
                        self._changed.notify_all()
