"""How the worker's loop waits out a Redis that does not answer (:class:`RedisWaits`).

What it promises: every Redis call of the loop goes through :meth:`RedisWaits.call`, which
treats a refused or dropped connection, a timeout, a server still loading its data
(``LOADING``), a replica refusing writes (``READONLY``: a failover not followed yet), a
master that went down or is not known (``MASTERDOWN``, Sentinel's ``MasterNotFound``), a
master short of replicas (``NOREPLICAS``), a failed background save (``MISCONF``), a busy
script (``BUSY``), a blocking pop ended by the master turning replica (``UNBLOCKED``), a full
server, too many clients, and a cluster unreachable or with a slot unserved as an *outage*
(:func:`~duejobs.redis_urls.is_outage`): the call is tried
again after a capped backoff (0.1 s doubling to ``BACKOFF_CAP``), with one warning when an
outage starts and one line when Redis answers again — never an exit. A wrong password or ACL
is not an outage (it does not mend by waiting): it is raised.

What it does not promise: that a call ever returns while Redis stays away. A caller that
must not wait for good passes ``give_up`` (the loop's stop, for one) and gets None.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from duejobs.errors import redis_said
from duejobs.redis_urls import is_outage, redis_failures

log = logging.getLogger("duejobs.worker")

T = TypeVar("T")

# The longest wait between two tries of a Redis that does not answer (seconds): a node back
# from an outage, however long, is served again within it.
BACKOFF_CAP = 2.0
_FIRST_WAIT = 0.1


class RedisWaits:
    """The loop's calls to one Redis, each waited through an outage; one line per outage."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._since: float | None = None  # when the current outage began (monotonic)

    @property
    def out(self) -> bool:
        """Whether Redis is in an outage (its last call failed)."""
        return self._since is not None

    def call(
        self, what: str, call: Callable[[], T], give_up: Callable[[], bool] = lambda: False
    ) -> T | None:
        """``call()``'s answer, tried again through an outage; None once ``give_up()`` says
        so during one."""
        wait = _FIRST_WAIT
        while True:
            try:
                answer = call()
            except redis_failures() as exc:
                if not is_outage(exc):
                    raise
                self._failed(what, exc)
                if give_up():
                    return None
                time.sleep(wait)
                wait = min(wait * 2, BACKOFF_CAP)
                continue
            self._answered()
            return answer

    def _failed(self, what: str, exc: Exception) -> None:
        if self._since is None:
            self._since = time.monotonic()
            log.warning(
                "Redis at %s did not answer %s (%s); waiting for it, the jobs it holds wait "
                "too (the database keeps every schedule)",
                self._where,
                what,
                redis_said(exc),
            )

    def _answered(self) -> None:
        if self._since is not None:
            waited = time.monotonic() - self._since
            log.warning("Redis at %s answers again after %.1f s", self._where, waited)
            self._since = None
