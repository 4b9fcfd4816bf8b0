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

What it does not detect: a pooler that forwards PostgreSQL's own process id (none known).
``DUEJOBS_PREPARED_STATEMENTS=off`` is the setting for one.
"""

from __future__ import annotations

import logging
import struct
import threading
from datetime import timedelta
from typing import Any

from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.datetime import TimedeltaBinaryDumper, TimedeltaDumper

from duejobs.store.queries import QUERIES

log = logging.getLogger("duejobs.store")

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
