"""What a connection of duejobs' gets when it is made, and how values cross on it.

Nothing here is a session setting: a pooler in transaction mode hands a server session to
whichever client comes next, so whatever one client sets on it is what the next one gets.
A connection is set up on the client side only:

- Durations cross as absolute time. psycopg sends ``timedelta(days=1)`` as PostgreSQL's
  ``1 day``, a calendar day in the session's time zone: 23 or 25 hours across a DST change
  when that zone observes one. :func:`absolute_durations` sends it as 24 hours, whatever the
  zone (a delay, a lease, a retry's backoff are spans of time, never of the calendar).
- Prepared statements as :class:`~duejobs.config.PreparedStatements` says. With ``auto``, a
  connection that reached a pooler prepares nothing: PostgreSQL reports its process id at
  the start of the session, and a pooler answers with an id of its own (PgBouncer, Pgpool,
  Odyssey, Supavisor, RDS Proxy), which the server's own ``pg_backend_pid()`` then differs
  from. One round trip per new connection; said once per engine in the log
  (``duejobs.store``).

  With ``on``, the same check runs and each connection that reached a pooler says so in a
  warning: a pooler in transaction mode that does not keep prepared statements (PgBouncer
  before 1.22, or without ``max_prepared_statements``) binds one client's parameters to
  another's statement.

What it does not detect: a pooler that forwards PostgreSQL's own process id (none known).
``DUEJOBS_PREPARED_STATEMENTS=off`` is the setting for one.
"""

from __future__ import annotations

import functools
import logging
import struct
import threading
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl

import psycopg
from psycopg import pq
from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.datetime import TimedeltaBinaryDumper, TimedeltaDumper

from duejobs.errors import ConfigurationError
from duejobs.store import dbapi
from duejobs.store.queries import QUERIES, SCHEMA_OPTION

log = logging.getLogger("duejobs.store")

# connect_timeout: an unreachable host fails in seconds, not after the kernel's TCP retries.
# No startup ``options``: a pooler refuses them (PgBouncer: "unsupported startup parameter"),
# and a session setting would outlive duejobs' transaction on a pooled server session. What a
# statement needs is set for its transaction alone (jit and the plan settings in the claim's
# query claim_plan, the worker's lock limit and commit durability in bookkeeping_settings);
# durations cross as absolute time (duejobs.store.adapters) and instants are read as UTC, so
# no statement depends on the session's time zone.
# Keepalives and a TCP user timeout: a server whose host is gone (a lost machine, a network
# partition; not a killed process, whose host answers at once) is noticed within half a
# minute, where the kernel alone retransmits for about fifteen, a worker's bookkeeping and its
# heartbeat waiting all that time. Each applies unless the URL gives its own.
CONNECT_ARGS: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}

_MICROSECONDS = 1_000_000
_INTERVAL = struct.Struct("!qii")  # PostgreSQL's binary interval: microseconds, days, months


def _microseconds(obj: timedelta) -> int:
    return (obj.days * 86_400 + obj.seconds) * _MICROSECONDS + obj.microseconds


class _AbsoluteDuration(TimedeltaDumper):
    """A timedelta as an interval of seconds only, in text."""

    def dump(self, obj: timedelta) -> bytes:
        micros = _microseconds(obj)
        sign = "-" if micros < 0 else ""
        whole, fraction = divmod(abs(micros), _MICROSECONDS)
        return f"{sign}{whole}.{fraction:06d} seconds".encode()


class _AbsoluteDurationBinary(TimedeltaBinaryDumper):
    """A timedelta as an interval of microseconds only (no days, no months), in binary."""

    def dump(self, obj: timedelta) -> bytes:
        return _INTERVAL.pack(_microseconds(obj), 0, 0)


def sends_absolute_durations(adapters: AdaptersMap) -> bool:
    """Whether ``adapters`` send a timedelta as :func:`absolute_durations` does (duejobs' own
    connections), or as psycopg does (a caller's)."""
    return adapters.get_dumper(timedelta, PyFormat.BINARY) is _AbsoluteDurationBinary


def absolute_durations(adapters: AdaptersMap) -> None:
    """Send every timedelta on ``adapters`` (a connection's, or a cursor's on a caller's
    connection) as absolute time; COPY's ``interval`` columns included."""
    adapters.register_dumper(timedelta, _AbsoluteDuration)
    adapters.register_dumper(timedelta, _AbsoluteDurationBinary)


def libpq_reading(conninfo: str) -> dict[str, str]:
    """A connection string or URL as libpq itself reads it, keyword by keyword (several
    hosts, a service, ``key=value``); a ``psycopg.ProgrammingError`` if libpq cannot."""
    return {k: str(v) for k, v in conninfo_to_dict(conninfo).items()}


@functools.cache
def libpq_parameters() -> frozenset[str]:
    """The connection parameters the libpq in use knows (its version's own list)."""
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def behind_pooler(dbapi_connection: Any) -> bool:
    """Whether this new connection reached a pooler rather than PostgreSQL itself (see the
    module doc). Runs one statement and leaves no transaction open."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(QUERIES["backend_pid"].driver_sql)
        (server_pid,) = cursor.fetchone()
    finally:
        cursor.close()
        dbapi_connection.rollback()
    return int(server_pid) != int(driver.info.backend_pid)


class Connected:
    """An engine's ``connect`` listener: sets up each new connection (see the module doc)."""

    def __init__(self, prepared: str) -> None:
        """``prepared``: a :class:`~duejobs.config.PreparedStatements` value."""
        self._prepared = prepared
        self._said = threading.Event()  # the pooler named once per engine, not per connection

    def on_connect(self, dbapi_connection: Any, record: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        absolute_durations(driver.adapters)
        if self._prepared == "off":
            driver.prepare_threshold = None
        elif self._prepared == "on" and behind_pooler(dbapi_connection):
            log.warning(
                "prepared statements are on (DUEJOBS_PREPARED_STATEMENTS=on) and this "
                "connection to %s:%s reached a connection pooler: unless the pooler keeps "
                "prepared statements (session mode, PgBouncer 1.22+ with "
                "max_prepared_statements), statements bind to other clients' parameters; "
                "auto is the value for it",
                driver.info.host,
                driver.info.port,
            )
        elif self._prepared == "auto" and behind_pooler(dbapi_connection):
            driver.prepare_threshold = None
            if not self._said.is_set():
                self._said.set()
                log.info(
                    "PostgreSQL at %s:%s is reached through a connection pooler: prepared "
                    "statements off (DUEJOBS_PREPARED_STATEMENTS=on keeps them where the "
                    "pooler does: session mode, PgBouncer 1.22+ with max_prepared_statements)",
                    driver.info.host,
                    driver.info.port,
                )


def driver_options(database_url: str, prepared: str) -> tuple[str, dict[str, Any], str]:
    """The URL, psycopg's arguments and the prepared-statement mode (a
    :class:`~duejobs.config.PreparedStatements` value) for connections to ``database_url``
    (as :func:`~duejobs.config.sqlalchemy_url` writes it). psycopg's own ``prepare_threshold``
    in the URL is honoured: ``None`` (or empty) turns preparing off as
    ``prepared_statements="off"`` does, a count is psycopg's threshold (SQLAlchemy would hand
    either to psycopg as text, which it refuses; libpq refuses the parameter)."""
    head, _, query = database_url.partition("?")
    pairs = [
        (pair, *parse_qsl(pair, keep_blank_values=True)[0]) for pair in query.split("&") if pair
    ]
    unknown = sorted({key for _, key, _ in pairs} - libpq_parameters() - {"prepare_threshold"})
    if unknown:
        raise ConfigurationError(
            f"the database URL has parameters libpq does not know: {', '.join(unknown)} "
            "(see libpq's connection parameters)"
        )
    args = {k: v for k, v in CONNECT_ARGS.items() if k not in {key for _, key, _ in pairs}}
    thresholds = [value for _, key, value in pairs if key == "prepare_threshold"]
    if not thresholds:
        return database_url, args, prepared
    kept = [pair for pair, key, _ in pairs if key != "prepare_threshold"]
    text = thresholds[-1].strip()
    if text.lower() in ("", "none", "null"):
        prepared = "off"
    elif text.isdigit():
        args["prepare_threshold"] = int(text)
    else:
        raise ConfigurationError(
            f"prepare_threshold in the database URL must be a count or None, got {text!r}"
        )
    return head + ("?" + "&".join(kept) if kept else ""), args, prepared


class Direct:
    """A connection duejobs makes on psycopg itself, outside SQLAlchemy's engine, offering
    what the store calls on SQLAlchemy's ``Connection`` (:mod:`duejobs.store.execution`).

    A worker's claims, outcomes and lease renewals are single statements in autocommit on
    connections it keeps for itself (:mod:`duejobs.worker.bookkeeping`): they need no pool and
    no transaction of SQLAlchemy's, and a worker that runs them on these starts without
    loading it. Made by :class:`Connector` as the engine makes its own — the same libpq
    options, the same set-up, in autocommit — and failing the same way: the store's errors
    are SQLAlchemy's classes (:mod:`duejobs.store.dbapi`), and one that breaks the connection
    invalidates it. It is not a pool (its owner keeps its connections) and holds no
    transaction."""

    def __init__(self, driver: psycopg.Connection[Any], schema: str) -> None:
        self.driver_connection = self.dbapi_connection = driver
        self.invalidated = False
        self._options: dict[str, Any] = {SCHEMA_OPTION: schema}

    @property
    def connection(self) -> Direct:
        return self

    @property
    def closed(self) -> bool:
        return self.driver_connection.closed

    def in_transaction(self) -> bool:
        return False  # autocommit: each statement commits as it ends

    def get_execution_options(self) -> dict[str, Any]:
        return dict(self._options)

    def execution_options(self, **options: Any) -> Direct:
        """Options as SQLAlchemy's connection keeps them; the isolation level can only be
        ``AUTOCOMMIT``, which it is."""
        level = options.pop("isolation_level", "AUTOCOMMIT")
        if level != "AUTOCOMMIT":
            raise ValueError(f"a direct connection is in autocommit, not {level}")
        self._options.update(options)
        return self

    def invalidate(self, exc: BaseException | None = None) -> None:
        """Close it for good: it broke, or is not trusted with another statement."""
        self.invalidated = True
        self.driver_connection.close()

    def close(self) -> None:
        self.driver_connection.close()


class Connector:
    """Makes :class:`Direct` connections to one database, each set up as an engine sets up its
    own (:class:`Connected`: the pooler named once per connector)."""

    def __init__(self, database_url: str, schema: str, prepared: str) -> None:
        url, self._args, prepared = driver_options(database_url, prepared)
        self._conninfo = "postgresql://" + url.split("://", 1)[1]
        self._connected = Connected(prepared)
        self._schema = schema

    def connect(self) -> Direct:
        """A new connection, in autocommit; a failure to connect or to set it up surfaces as
        SQLAlchemy's ``OperationalError`` (or its kin), as an engine's would."""
        try:
            driver = psycopg.connect(self._conninfo, **self._args)
        except psycopg.Error as exc:
            raise dbapi.DBAPIError.instance(None, None, exc, psycopg.Error) from exc
        try:
            self._connected.on_connect(driver, None)
            driver.autocommit = True
        except psycopg.Error as exc:
            # Marked broken as a statement's error would be (the server gone, not a setting
            # it refused), so a refusal is not reported as a dropped connection.
            broken = driver.closed or isinstance(exc, psycopg.OperationalError)
            driver.close()
            raise dbapi.DBAPIError.instance(
                None, None, exc, psycopg.Error, connection_invalidated=broken
            ) from exc
        return Direct(driver, self._schema)
