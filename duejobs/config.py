"""Where duejobs finds PostgreSQL and Redis.

``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL`` name them; ``DUEJOBS_READ_DATABASE_URL``
optionally names a streaming replica for the operators' reads
(:mod:`duejobs.observability.replica`), and
``DUEJOBS_REDIS_NODES`` other Redis servers for some queues (:func:`parse_redis_nodes`). A
library :class:`~duejobs.App` never invents a database: without a URL it raises
:class:`ConfigurationError`. Only the CLI and the test suite fall back to the embedded servers
(:mod:`duejobs.dev.embedded`), and say so.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, cast

from duejobs.errors import ConfigurationError, DuejobsError
from duejobs.redis_urls import GIVEN_REDIS, check_redis_url, redacted_redis
from duejobs.validation import check_queue

if TYPE_CHECKING:  # loaded by what connects; a --help needs neither
    from redis import Redis
    from sqlalchemy.engine import URL

DATABASE_ENV = "DUEJOBS_DATABASE_URL"
READ_DATABASE_ENV = "DUEJOBS_READ_DATABASE_URL"
REDIS_NODES_ENV = "DUEJOBS_REDIS_NODES"
REDIS_ENV = "DUEJOBS_REDIS_URL"
SCHEMA_ENV = "DUEJOBS_SCHEMA"
PREPARED_STATEMENTS_ENV = "DUEJOBS_PREPARED_STATEMENTS"
RESULT_TTL_ENV = "DUEJOBS_RESULT_TTL"
# How long a finished or failed job's hash, its result and its registry entry stay in Redis:
# RQ's own default result_ttl (seconds).
DEFAULT_RESULT_TTL = 500
_MAX_RESULT_TTL = timedelta(days=365)
DEFAULT_SCHEMA = "public"
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def check_schema(name: object) -> str:
    """The PostgreSQL schema for duejobs' tables: a plain lower-case identifier (so that it
    never needs quoting), at most 63 characters."""
    if not isinstance(name, str) or not _SCHEMA.fullmatch(name) or name.startswith("pg_"):
        raise ConfigurationError(
            f"schema must be a lower-case identifier (a-z, 0-9, _; not pg_*), got {name!r}"
        )
    return name


class PreparedStatements(StrEnum):
    """Whether duejobs' connections keep prepared statements (``DUEJOBS_PREPARED_STATEMENTS``).

    A prepared statement lives in one server session. A pooler in transaction mode hands each
    transaction whichever server session is free (PgBouncer before 1.22, or without
    ``max_prepared_statements``): a statement prepared in one is missing, or is another
    client's statement of the same name, in the next. ``auto`` keeps them on a connection
    that reaches PostgreSQL itself and turns them off on one that reaches a pooler (told
    apart at connect: a pooler answers with a process id of its own); ``on`` keeps them
    everywhere (a pooler that keeps them: session mode, PgBouncer 1.22+ with
    ``max_prepared_statements``); ``off`` never prepares (the partitioned claim then plans
    its two statements at each batch: docs/deployment.md gives what that costs).
    """

    AUTO = "auto"
    ON = "on"
    OFF = "off"


def check_prepared_statements(value: object) -> PreparedStatements:
    """``prepared_statements`` as given, or a :class:`ConfigurationError` naming it."""
    if isinstance(value, PreparedStatements):
        return value
    try:
        return PreparedStatements(value.lower() if isinstance(value, str) else "")
    except ValueError:
        choices = ", ".join(p.value for p in PreparedStatements)
        raise ConfigurationError(
            f"prepared_statements ({PREPARED_STATEMENTS_ENV}) must be one of {choices}, "
            f"got {value!r}"
        ) from None


def check_result_ttl(value: object) -> int:
    """``result_ttl`` in whole seconds, from 1 s to a year: a number of seconds, a timedelta,
    or the CLI's duration text (``"500"``, ``"10m"``); anything else is a
    :class:`ConfigurationError` naming it."""
    bad = ConfigurationError(
        f"result_ttl ({RESULT_TTL_ENV}) must be whole seconds from 1s to 365d "
        f"(500, '10m'), got {value!r}"
    )
    if isinstance(value, str):
        from duejobs.timespec import parse_duration  # the CLI's one duration syntax

        try:
            value = parse_duration(value, "result_ttl")
        except DuejobsError:
            raise bad from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta) or not timedelta(seconds=1) <= value <= _MAX_RESULT_TTL:
        raise bad
    if value % timedelta(seconds=1):
        raise bad
    return value // timedelta(seconds=1)


_SECRET_PARAMETERS = ("password", "sslpassword", "passfile", "sslkey")
_REDIS_SCHEMES = ("redis", "rediss", "sentinel", "unix", "valkey")


def redacted(url: str) -> str:
    """The URL as it may appear in a message or a log: its password, and any query
    parameter that carries a secret, replaced by ``***``. A libpq connection string
    (``host=... password=...``) is shown as the URL it is read as."""
    if url == GIVEN_REDIS or url.split("://", 1)[0].lower().startswith(_REDIS_SCHEMES):
        return redacted_redis(url)
    try:
        parsed = _parsed(url)
    except Exception:  # not even a URL: show its scheme at most
        return url.split("://", 1)[0] + "://…" if "://" in url else "(not a URL)"
    query = {k: ("***" if k.lower() in _SECRET_PARAMETERS else v) for k, v in parsed.query.items()}
    return parsed.set(query=query).render_as_string(hide_password=True)


def _authority(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0]


def _parsed(url: str) -> URL:
    """The URL as SQLAlchemy reads it; one only libpq reads — several hosts each with its
    port (``postgresql://u@h1:5432,h2:5432/db``), or a ``key=value`` connection string —
    read by libpq itself and written as SQLAlchemy takes it: the hosts and ports, comma
    separated, as query parameters that reach libpq unchanged."""
    from sqlalchemy.engine import URL, make_url

    if "://" in url and "," not in _authority(url):  # several hosts: libpq's reading alone
        with contextlib.suppress(ValueError):
            return make_url(url)
    from duejobs.store.connecting import libpq_reading  # the store alone speaks to libpq

    scheme, _, rest = url.rpartition("://")
    base = scheme.split("+", 1)[0]  # libpq knows postgresql:// and postgres:// alone
    parts = libpq_reading(f"{base}://{rest}" if scheme else url)
    if not scheme and not parts:
        raise ValueError("an empty connection string")
    if not all(p.isdigit() for p in str(parts.get("port", "")).split(",") if p):
        raise ValueError("a port that is not a number")
    user, password, dbname = parts.pop("user", None), parts.pop("password", None), None
    dbname = parts.pop("dbname", None)
    return URL.create(
        scheme or "postgresql",
        username=str(user) if user else ("" if password else None),  # keeps a lone password
        password=str(password) if password else None,
        database=str(dbname) if dbname else None,
        query={k: str(v) for k, v in parts.items()},
    )


# A URL SQLAlchemy and libpq read alike: user and password of unreserved characters only (no
# percent-encoding, no "/", "?", "+" or space), one host name, a numeric port, a plain database
# name, and query parameters with plain names, each given once, and values of unreserved
# characters, "/" and percent-encoding (which both decode alike; not "+").
_PLAIN_URL = re.compile(
    r"postgres(?:ql)?(?:\+\w+)?://(?:[\w.~-]*(?::[\w.~-]*)?@)?[\w.-]*(?::\d+)?(?:/[\w.-]*)?"
    r"(?:\?[a-z_]+=(?:[\w.~/-]|%[0-9A-Fa-f]{2})*(?:&[a-z_]+=(?:[\w.~/-]|%[0-9A-Fa-f]{2})*)*)?",
    re.ASCII,
)


def plain_url(url: str) -> bool:
    """Whether ``url`` is read the same by SQLAlchemy and by libpq (:data:`_PLAIN_URL`, no
    parameter twice): such a URL is taken as given, and a worker's own connections
    (:meth:`~duejobs.core.Core.connect_directly`) reach the server its engine would."""
    if _PLAIN_URL.fullmatch(url) is None:
        return False
    keys = [pair.split("=", 1)[0] for pair in url.partition("?")[2].split("&") if pair]
    return len(keys) == len(set(keys)) and "prepare_threshold" not in keys


def _as_given(url: str) -> str | None:
    """A :func:`plain_url` that libpq reads, with psycopg's scheme and nothing else rewritten;
    None for any other (:func:`_parsed` reads those with SQLAlchemy). An App or a worker is
    then made without loading SQLAlchemy."""
    if not plain_url(url):
        return None
    from duejobs.store.connecting import libpq_reading  # the store alone speaks to libpq

    rest = url.partition("://")[2]
    try:
        libpq_reading(f"postgresql://{rest}")
    except Exception:  # a parameter libpq does not know
        return None
    return f"postgresql+psycopg://{rest}"


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL URL in the form SQLAlchemy needs to use psycopg 3. Any spelling
    SQLAlchemy reads as PostgreSQL is accepted (``postgres://``, ``postgresql://``,
    ``postgresql+psycopg2://``, ...), and every form libpq reads: several hosts
    (``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``), a service
    (``postgresql:///?service=name``), a ``key=value`` connection string. The password never
    appears in an error."""
    # read otherwise, part of the password becomes the host (a key=value string names each)
    if "://" in url and _authority(url).count("@") > 1:
        raise ConfigurationError(
            "the database URL has more than one '@' before its host: percent-encode the "
            "user name and password (@ is %40)"
        )
    plain = _as_given(url)
    if plain is not None:
        return plain
    try:
        parsed = _parsed(url)
    except Exception as exc:
        # libpq names a parameter it does not know (its other messages may quote the text)
        said = r'invalid (?:connection option|URI query parameter): ?"([a-z_]{1,63})"\s*'
        unknown = re.fullmatch(said, str(exc))
        if unknown:
            raise ConfigurationError(
                f"the database URL has parameters libpq does not know: {unknown[1]} "
                "(see libpq's connection parameters)"
            ) from None
        raise ConfigurationError(
            f"not a database URL: {redacted(url)} (expected postgresql://user:pass@host/db)"
        ) from None
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"not a PostgreSQL URL: {redacted(url)} (expected postgresql://user:pass@host/db)"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same URL as plain libpq (and psycopg.connect) understands it."""
    return "postgresql://" + sqlalchemy_url(url)[len("postgresql+psycopg://") :]


def _shown(text: str) -> str:
    """A piece of configuration as an error may show it: never what could be a password
    (anything before an ``@``, a URL's credentials)."""
    if "://" in text:
        return redacted(text)
    if "@" in text:
        return "…@" + text.rsplit("@", 1)[1]
    return text


def parse_redis_nodes(spec: str | Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Queues that live on a Redis of their own, as (queue, URL) pairs: from a mapping, or from
    ``DUEJOBS_REDIS_NODES``'s text, ``queue=url`` pairs separated by commas or spaces
    (``emails=redis://r2:6379/0, reports=redis://r3:6379/0``; a comma splits two pairs only
    before ``queue=``, so a Sentinel URL's list of Sentinels stays whole; percent-encode a
    space in a password). Every other queue lives on ``DUEJOBS_REDIS_URL``. A malformed pair,
    a queue name RQ would refuse, a bad URL or a queue named twice is refused, the error
    showing no password."""
    if not spec:
        return ()
    if isinstance(spec, str):
        pairs = []
        # a comma inside a Sentinel URL separates its Sentinels, not two pairs
        for item in re.split(r"[,\s]+(?=[^,\s:/@?=]+=)|\s+", spec.strip()):
            queue, sep, url = item.partition("=")
            if not sep or "://" in queue or "@" in queue:
                raise ConfigurationError(
                    f"{REDIS_NODES_ENV}: expected queue=url pairs, got {_shown(item)!r}"
                )
            pairs.append((queue, url))
    else:
        pairs = list(spec.items())
    seen: set[str] = set()
    for queue, url in pairs:
        try:
            check_queue(queue)
        except DuejobsError:
            raise ConfigurationError(
                f"redis nodes: not a queue name: {_shown(str(queue))!r}"
            ) from None
        if queue in seen:
            raise ConfigurationError(f"redis nodes: queue {queue!r} is given twice")
        seen.add(queue)
        check_redis_url(url)
    return tuple(pairs)


@contextlib.contextmanager
def named(variable: str, read_from: Collection[str]) -> Iterator[None]:
    """A configuration error raised inside, about a value read from ``variable`` (one of
    ``read_from``), names the variable: the user set it somewhere they must find again."""
    try:
        yield
    except ConfigurationError as exc:
        if variable not in read_from or variable in str(exc):
            raise
        raise ConfigurationError(f"{variable}: {exc}") from None


def _check_cluster_alone(
    url: str | None, client: object, nodes: tuple[tuple[str, str], ...]
) -> None:
    """A Redis Cluster places every queue itself: no node mapping beside it, nor a cluster
    as a queue's node."""
    from duejobs.redis_urls import cluster_url

    clustered = url is not None and cluster_url(url) is not None
    if client is not None:
        from redis.cluster import RedisCluster

        clustered = isinstance(client, RedisCluster)
    if clustered and nodes:
        raise ConfigurationError(
            f"{REDIS_NODES_ENV} is set beside a Redis Cluster, which places every queue "
            "itself: unset it (docs/scaling.md, moving from the node mapping)"
        )
    for queue, node in nodes:
        if cluster_url(node) is not None:
            raise ConfigurationError(
                f"{REDIS_NODES_ENV} puts queue {queue!r} on a Redis Cluster: point "
                f"{REDIS_ENV} at the cluster instead, which places every queue"
            )


@dataclass(frozen=True)
class Settings:
    """The two URLs duejobs needs. Writing schedules needs only the database; the scheduler,
    the workers and the reconciler need Redis too (:meth:`require_redis`). Optional: a replica
    that serves the operators' reads (:mod:`duejobs.observability.replica`), and queues that live
    on a Redis of their own (:func:`parse_redis_nodes`)."""

    database_url: str
    redis_url: str | None
    schema: str = DEFAULT_SCHEMA  # where duejobs' tables live (DUEJOBS_SCHEMA)
    read_database_url: str | None = None  # a streaming replica of database_url
    redis_nodes: tuple[tuple[str, str], ...] = ()  # (queue, URL): queues on another Redis
    prepared_statements: PreparedStatements = PreparedStatements.AUTO
    # Seconds a finished or failed job stays in Redis (DUEJOBS_RESULT_TTL).
    result_ttl: int = DEFAULT_RESULT_TTL
    # A ready client given instead of the URL (App(redis=...)): the default node.
    redis_client: Redis | None = field(default=None, repr=False, compare=False)
    # The variables a setting was read from (an error in its value names the variable).
    read_from: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def from_env(
        cls,
        database_url: str | None = None,
        redis_url: str | None = None,
        schema: str | None = None,
        read_database_url: str | None = None,
        redis_nodes: Mapping[str, str] | None = None,
        prepared_statements: str | None = None,
        redis_client: object = None,
        result_ttl: object = None,
    ) -> Settings:
        """Explicit arguments first, then the environment; no database URL is a clear error.
        A ready ``redis_client`` stands for the default Redis (the URL's variable is not
        read then); it and ``redis_url`` together are refused."""
        read_from = {
            variable
            for variable, given in (
                (DATABASE_ENV, database_url),
                (REDIS_ENV, redis_url or redis_client),
                (SCHEMA_ENV, schema),
                (READ_DATABASE_ENV, read_database_url),
            )
            if not given and os.environ.get(variable)
        }
        db = database_url or os.environ.get(DATABASE_ENV)
        if not db:
            raise ConfigurationError(
                f"{DATABASE_ENV} is not set: pass App(database_url=...) or set the variable "
                "(only the duejobs CLI and test suite start embedded servers when it is unset; "
                'beside a running `duejobs dev`, `eval "$(duejobs env)"` sets it)'
            )
        if redis_client is not None:
            from redis import Redis

            if redis_url:
                raise ConfigurationError("pass the App redis_url or redis, not both")
            from redis.cluster import RedisCluster

            if not isinstance(redis_client, (Redis, RedisCluster)):
                raise ConfigurationError(
                    "redis must be a redis.Redis client (Sentinel's master_for() makes one) "
                    f"or a redis.cluster.RedisCluster, got {type(redis_client).__name__}"
                )
        redis = None if redis_client is not None else redis_url or os.environ.get(REDIS_ENV)
        if redis:
            with named(REDIS_ENV, read_from):
                check_redis_url(redis)
        if schema is None:
            schema = os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
        with named(SCHEMA_ENV, read_from):
            where = check_schema(schema)
        read = read_database_url or os.environ.get(READ_DATABASE_ENV)
        with named(DATABASE_ENV, read_from):
            database = sqlalchemy_url(db)
        with named(READ_DATABASE_ENV, read_from):
            replica = sqlalchemy_url(read) if read else None
        prepared = (
            os.environ.get(PREPARED_STATEMENTS_ENV) or "auto"
            if prepared_statements is None
            else prepared_statements
        )
        nodes = parse_redis_nodes(
            redis_nodes if redis_nodes is not None else os.environ.get(REDIS_NODES_ENV)
        )
        _check_cluster_alone(redis, redis_client, nodes)
        return cls(
            database_url=database,
            redis_url=redis,
            schema=where,
            read_database_url=replica,
            redis_nodes=nodes,
            prepared_statements=check_prepared_statements(prepared),
            result_ttl=check_result_ttl(
                result_ttl
                if result_ttl is not None
                else os.environ.get(RESULT_TTL_ENV) or DEFAULT_RESULT_TTL
            ),
            # A RedisCluster stands where a client of one node does (see redis_urls).
            redis_client=cast("Redis | None", redis_client),
            read_from=frozenset(read_from),
        )

    def __repr__(self) -> str:
        """Every setting, each URL as a message may show it: no password (a repr reaches
        debuggers, error reports and ``%r`` in logs)."""
        shown: dict[str, object] = {}
        for knob in fields(self):
            value = getattr(self, knob.name)
            if not knob.repr:
                continue
            if knob.name.endswith("_url") and value is not None:
                value = redacted(value)
            elif knob.name == "redis_nodes":
                value = tuple((queue, redacted(url)) for queue, url in value)
            shown[knob.name] = value
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def has_redis(self) -> bool:
        """Whether a Redis is configured: a URL, or a client given to the App."""
        return bool(self.redis_url) or self.redis_client is not None

    def require_redis(self) -> str:
        """The Redis URL (:data:`~duejobs.redis_urls.GIVEN_REDIS` for a client given to the
        App), or :class:`ConfigurationError` naming the variable."""
        if self.redis_client is not None:
            return GIVEN_REDIS
        if not self.redis_url:
            raise ConfigurationError(
                f"{REDIS_ENV} is not set: pass App(redis_url=...) or set the variable"
            )
        return self.redis_url

    def redis_url_for(self, queue: str) -> str:
        """The URL of the Redis that ``queue`` lives on."""
        return dict(self.redis_nodes).get(queue) or self.require_redis()
