"""What a failed Redis call raises, and which failures waiting mends.

redis-py raises two families. :class:`~redis.exceptions.RedisError` is a server's reply or a
connection to one. A cluster's client raises :class:`~redis.exceptions.RedisClusterException`
as well, which is *not* a ``RedisError``: a cluster no node of which answers
(``RedisClusterUnreachableError``, raised too when the client is made while the cluster is
away) and a slot no node serves yet (``SlotNotCoveredError``, between a master's loss and its
replica's promotion). Every place that outlives an outage catches :data:`REDIS_FAILURES`, so
a whole cluster restarted is waited out as one server restarted is.

:func:`is_outage` says which of them waiting mends: a refused or dropped connection, a
timeout, a server loading its data or turning replica, a cluster down, unreachable or with
slots moving; not a wrong password or ACL, nor a request the client itself refuses (keys of
several slots in one command: a defect, raised).
"""

from __future__ import annotations

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterError,
    ConnectionError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisClusterUnreachableError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException)

# Replies that mean a server passing through a failover or a restart (ResponseError's text).
_PASSING = (
    *("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS"),
    *("MISCONF", "BUSY"),  # a failed background save (a full disk), a long script
    "UNBLOCKED",  # a blocking pop ended by the server turning replica (a failover)
)


def is_outage(exc: BaseException) -> bool:
    """Whether a Redis failure is one that waiting mends."""
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return False
    if isinstance(exc, ConnectionError | TimeoutError | ReadOnlyError | MasterDownError):
        return True
    if isinstance(exc, TryAgainError | OutOfMemoryError | ClusterError):
        return True  # ClusterError: a cluster down, or its slots moving past the retries
    if isinstance(exc, RedisClusterUnreachableError | SlotNotCoveredError):
        return True  # no node answers, or none serves a slot yet (a failover under way)
    return isinstance(exc, ResponseError) and str(exc).startswith(_PASSING)
