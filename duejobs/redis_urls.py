"""Redis URLs as duejobs reads them, and the clients it makes from them: a server's own
address (``redis://``, ``rediss://``, ``unix://``), a master found through Sentinel, or a
Redis Cluster.

The cluster form lists some of its nodes (the client finds the rest, and each slot's
master)::

    redis+cluster://[[user]:password@]host:7000[,host:7001...]

(``rediss+cluster://``: TLS). A cluster has one database, 0: a path naming another is
refused.

The Sentinel form lists the Sentinels, then the master's name and the database::

    redis+sentinel://[[user]:password@]host:26379,host2:26379/mymaster/0[?sentinel_password=...]

(``sentinel://`` and ``rediss+sentinel://``, TLS to the master, are read alike). The
userinfo is the master's password; Sentinel's own is ``sentinel_password``. Both are
redacted in every message (:func:`redacted_redis`).

What it promises: a client made from a Sentinel URL asks the Sentinels for the master on
each new connection, so a promoted replica is found without a restart; a connection to a
master that was demoted is dropped at its first ``READONLY`` (redis-py's Sentinel pool) and
the next one goes to the new master. Waits are bounded (``REDIS_TIMEOUT``) and a dropped
connection is tried once more at once; what an outage means is each caller's to decide.

What a failed call raises (:func:`redis_failures`): redis-py raises two families.
``RedisError`` is a server's reply or a connection to one. A cluster's client raises
``RedisClusterException`` as well, which is *not* a ``RedisError``: a cluster no node of which
answers (``RedisClusterUnreachableError``, raised too when the client is made while the cluster
is away) and a slot no node serves yet (``SlotNotCoveredError``, between a master's loss and
its replica's promotion). Every place that outlives an outage catches both, so a whole cluster
restarted is waited out as one server restarted is. :func:`is_outage` says which of them
waiting mends; :func:`refusal`, what a server answered that no retry mends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from duejobs.errors import ConfigurationError

if TYPE_CHECKING:  # redis-py is loaded by what reads or connects (a --help needs neither)
    from redis import Redis

# Seconds a call to Redis may take before it is tried once more and then fails: a server that
# hangs (paused, partitioned) fails a pass after about twice this, instead of holding it, and
# its neighbours' work, for good (redis-py alone retries ten times). A dropped connection is
# still replaced by the one retry, made at once: a wait before it (it was 100 ms) was paid by
# every call to a server that refuses connections, in the claim's and the reconciler's
# transactions, whose row locks held up the workers of every other node meanwhile
# (python -m bench.node_outage: 1.1-1.6x the other queues' lag p99, 0.96x without it).
REDIS_TIMEOUT = 10.0
# redis-py's own default pool size, kept as the least a shared client gets.
REDIS_POOL = 100
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel", "sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
# Where a queue lives when the App was given a ready client (``App(redis=...)``) rather than
# a URL: it names that client wherever a URL would name a server.
GIVEN_REDIS = "the App's Redis client"
_SECRET_QUERY = re.compile(r"\b((?:sentinel_)?password)=[^&]*", re.IGNORECASE)


@dataclass(frozen=True)
class SentinelUrl:
    """A Sentinel URL read: the Sentinels, the master's name and database, and the
    credentials (the master's; Sentinel's own)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None = field(repr=False)
    sentinel_password: str | None = field(repr=False)
    ssl: bool

    @property
    def identity(self) -> tuple[tuple[str, str], ...]:
        """What names the same master and database whatever the spelling."""
        where = ",".join(f"{h}:{p}" for h, p in sorted(self.sentinels))
        return (("db", str(self.db)), ("sentinel", f"{where}/{self.service}"))


def sentinel_url(url: str) -> SentinelUrl | None:
    """The Sentinel URL ``url`` is, or None when it is of another scheme; a malformed one is
    refused naming what is wrong (never its passwords)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SENTINEL_SCHEMES:
        return None
    parts = urlsplit(url)
    username, password, sentinels = _hosts(url, 26379, "a Sentinel URL lists a bad Sentinel")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"a Sentinel URL names the master after the Sentinels (…/mymaster/0): "
            f"{redacted_redis(url)}"
        )
    query = dict(parse_qsl(parts.query))
    return SentinelUrl(
        sentinels,
        path[0],
        int(path[1]) if len(path) == 2 else 0,
        username,
        password,
        query.get("sentinel_password"),
        scheme == "rediss+sentinel",
    )


@dataclass(frozen=True)
class ClusterUrl:
    """A cluster URL read: the nodes it lists and the credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None = field(repr=False)
    ssl: bool

    @property
    def identity(self) -> tuple[tuple[str, str], ...]:
        """What names the same cluster whatever the spelling (the nodes it lists)."""
        return (("cluster", ",".join(f"{h}:{p}" for h, p in sorted(self.nodes))),)


def cluster_url(url: str) -> ClusterUrl | None:
    """The cluster URL ``url`` is, or None when it is of another scheme; a malformed one is
    refused naming what is wrong (never its password)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in CLUSTER_SCHEMES:
        return None
    parts = urlsplit(url)
    username, password, nodes = _hosts(url, 6379, "a cluster URL lists a bad node")
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"a Redis Cluster has one database, 0: {redacted_redis(url)} names another"
        )
    return ClusterUrl(nodes, username, password, scheme[:6] == "rediss")


def _hosts(
    url: str, default_port: int, bad: str
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    """(user, password, (host, port) of each host listed) of a URL naming several hosts
    (Sentinels, a cluster's nodes); a host that is no ``host[:port]`` refused with ``bad``,
    the URL shown without its password."""
    userinfo, _, hosts = urlsplit(url).netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    listed = []
    for host in hosts.split(","):
        name, _, port = host.strip().rpartition(":") if ":" in host else (host.strip(), "", "")
        if not name or (port and not port.isdigit()):
            raise ConfigurationError(f"{bad}: {redacted_redis(url)}")
        listed.append((name.strip("[]"), int(port) if port else default_port))
    return unquote(username) or None, unquote(password) or None, tuple(listed)


def check_redis_url(url: str) -> str:
    """A Redis URL duejobs can use, refused here rather than after a database commit."""
    if url.split("://", 1)[-1].split("/", 1)[0].count("@") > 1:
        raise ConfigurationError(
            "the Redis URL has more than one '@' before its host: percent-encode the password"
        )
    if sentinel_url(url) is not None or cluster_url(url) is not None:
        return url
    try:
        from redis.connection import parse_url

        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        raise ConfigurationError(
            f"not a Redis URL: {redacted_redis(url)} (expected redis://host:6379/0, rediss://, "
            "unix://, redis+sentinel://host:26379,host:26380/mymaster/0 or "
            "redis+cluster://host:7000,host:7001)"
        ) from None
    return url


def same_redis(url: str) -> tuple[tuple[str, str], ...]:
    """What identifies the Redis server (or Sentinel master) and database a URL names,
    whatever its spelling (``redis://h`` and ``redis://h:6379/0`` are one node)."""
    if url == GIVEN_REDIS:
        return (("client", "given"),)
    named = sentinel_url(url) or cluster_url(url)
    if named is not None:
        return named.identity
    parsed: dict[str, object] = {"host": "localhost", "port": 6379, "db": 0}
    from redis.connection import parse_url

    parsed.update(parse_url(url))  # type: ignore[no-untyped-call]
    return tuple(sorted((k, str(v)) for k, v in parsed.items()))


def redacted_redis(url: str) -> str:
    """A Redis URL as a message may show it: its password and Sentinel's replaced by
    ``***``. Read on the raw text (a password may hold ``/``, ``?`` or ``#`` unencoded):
    everything between ``://`` and the last ``@`` but the user name."""
    if url == GIVEN_REDIS:
        return url
    if "://" not in url:
        return "(not a URL)"
    scheme, rest = url.split("://", 1)
    if "@" in rest:
        userinfo, rest = rest.rsplit("@", 1)
        user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
        rest = f"{user}:***@{rest}" if ":" in userinfo else f"***@{rest}"
    return f"{scheme}://" + _SECRET_QUERY.sub(r"\1=***", rest)


def redis_client(url: str, connections: int = REDIS_POOL, retries: int = 1) -> Redis:
    """A client of ``url``: bounded waits (``REDIS_TIMEOUT``) and ``retries`` tries more of a
    command whose connection dropped (0 for a caller that retries itself, and must know when
    a command it sent may have run); through Sentinel, the master found again on each new
    connection; of a cluster, each slot's master found again after a failover or a move
    (a ``RedisCluster``, which serves the commands duejobs sends where a client of one node
    does)."""
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    options: dict[str, Any] = {
        "max_connections": connections,
        "socket_timeout": REDIS_TIMEOUT,
        "socket_connect_timeout": REDIS_TIMEOUT,
        "retry": Retry(NoBackoff(), retries),
    }
    cluster = cluster_url(url)
    if cluster is not None:
        return _cluster_client(cluster, options)
    sentinel = sentinel_url(url)
    if sentinel is None:
        client: Redis = Redis.from_url(url, **options)
        return client
    asking: dict[str, Any] = {
        "socket_timeout": REDIS_TIMEOUT,
        "socket_connect_timeout": REDIS_TIMEOUT,
    }
    if sentinel.sentinel_password:
        asking["password"] = sentinel.sentinel_password
    sentinels = Sentinel(sentinel.sentinels, sentinel_kwargs=asking)
    master: Redis = sentinels.master_for(
        sentinel.service,
        db=sentinel.db,
        username=sentinel.username,
        password=sentinel.password,
        ssl=sentinel.ssl,
        **options,
    )
    return master


def _cluster_client(url: ClusterUrl, options: dict[str, Any]) -> Redis:
    """A client of the cluster ``url`` lists (its own pool per node, ``options`` each)."""
    from redis import Redis
    from redis.cluster import ClusterNode, RedisCluster

    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in url.nodes],  # type: ignore[no-untyped-call]
        username=url.username,
        password=url.password,
        ssl=url.ssl,
        **options,
    )
    return cast(Redis, client)


def refusal(client: Redis) -> str | None:
    """What a Redis (or, through Sentinel, the Sentinels) answered duejobs that no retry
    mends, in one line: a wrong password, an ACL without the commands duejobs runs, a
    Sentinel refusing its password, no Sentinel knowing the master's name. None when it
    answers, and when it does not (an outage, waited out)."""
    from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

    sentinel = _sentinel_refusal(client)
    if sentinel is not None:
        return sentinel
    try:
        client.ping()
    except (AuthenticationError, AuthorizationError, NoPermissionError) as exc:
        return (
            f"{exc} (check the user and password of DUEJOBS_REDIS_URL, and that its ACL "
            "allows duejobs' commands)"
        )
    except redis_failures():
        pass
    return None


def _sentinel_refusal(client: Redis) -> str | None:
    """For a client of a master found through Sentinel, what no retry mends, in one line: a
    Sentinel that refuses duejobs' credentials (``sentinel_password``), or Sentinels that
    answer and know no master of the URL's name. None when one knows it, when none answers
    (an outage, waited out: the master's own state is the client's to find), or for a client
    of another kind."""
    from redis.exceptions import AuthenticationError, RedisError, ResponseError
    from redis.sentinel import SentinelConnectionPool

    pool = getattr(client, "connection_pool", None)  # a cluster's client has one per node
    if not isinstance(pool, SentinelConnectionPool):
        return None
    answered: list[str] = []
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 26379)}"
        try:
            masters = sentinel.sentinel_masters()
        except (AuthenticationError, ResponseError) as exc:
            if isinstance(exc, AuthenticationError) or "AUTH" in str(exc):
                return (
                    f"the Sentinel at {where} refuses duejobs: {exc} (check sentinel_password "
                    "in the URL's query)"
                )
            continue
        except RedisError:
            continue  # this one does not answer: another may
        if pool.service_name in masters:
            return None
        answered.append(where)
    if not answered:
        return None
    return (
        f"no Sentinel knows a master named {pool.service_name!r} (asked {', '.join(answered)}; "
        "check the name after the Sentinels in the URL: …/mymaster/0)"
    )


# Replies that mean a server passing through a failover or a restart (ResponseError's text).
_PASSING = (
    *("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS"),
    *("MISCONF", "BUSY"),  # a failed background save (a full disk), a long script
    "UNBLOCKED",  # a blocking pop ended by the server turning replica (a failover)
)
# What a cluster's client says of a cluster still forming or restarting without its map.
_FORMING = ("All slots are not covered",)


def redis_failures() -> tuple[type[Exception], ...]:
    """What a failed Redis call raises, both of redis-py's families (see the module
    docstring): ``except redis_failures() as exc``."""
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException)


def is_outage(exc: BaseException) -> bool:
    """Whether a Redis failure is one that waiting mends: a refused or dropped connection, a
    timeout, a server loading its data or turning replica, a cluster down, unreachable or with
    slots moving; not a wrong password or ACL, nor a request the client itself refuses (keys
    of several slots in one command: a defect)."""
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
        ResponseError,
        SlotNotCoveredError,
        TimeoutError,
        TryAgainError,
    )

    if isinstance(exc, AuthenticationError | AuthorizationError):
        return False
    if isinstance(exc, ConnectionError | TimeoutError | ReadOnlyError | MasterDownError):
        return True
    if isinstance(exc, TryAgainError | OutOfMemoryError | ClusterError):
        return True  # ClusterError: a cluster down, or its slots moving past the retries
    if isinstance(exc, RedisClusterUnreachableError | SlotNotCoveredError):
        return True  # no node answers, or none serves a slot yet (a failover under way)
    if type(exc) is RedisClusterException and str(exc).startswith(_FORMING):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(_PASSING)
