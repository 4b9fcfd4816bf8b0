"""What the App and every service share: settings, the engine, the delivery side, the handler
registry, and the boundary where database errors become duejobs' own.

An :class:`~duejobs.App` is a facade over one :class:`Core` (its tenant scopes share it); the
scheduler, the worker, the reconciler, the pruner and the figures take either and use the
Core alone, so none of them depends on the App's public API.

Promises: one engine per Core, made on first use, whose connections carry no session setting
(a pooler may hand their server sessions to anyone) and whose pooled connections are checked
for a server-side close without a round trip; connections outside it made the same way
(:meth:`Core.connect_directly`: a worker's bookkeeping, which thus loads no SQLAlchemy); one
Redis client, made on first use;
:meth:`Core.transaction` commits or rolls back as one, and an outage inside it surfaces as
:class:`~duejobs.errors.DatabaseUnavailableError`, a schema never migrated as
:class:`~duejobs.errors.SchemaMissingError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import select
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeAlias, cast

from redis import Redis

from duejobs import store
from duejobs.config import (
    DATABASE_ENV,
    DEFAULT_SCHEMA,
    READ_DATABASE_ENV,
    PreparedStatements,
    Settings,
    named,
    plain_url,
)
from duejobs.delivery import Deliverer, Removals
from duejobs.delivery.wakes import Wakes, wake_key
from duejobs.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    ReadTimeoutError,
    SchemaMissingError,
)
from duejobs.handlers import Handler
from duejobs.models import RecurringSpec
from duejobs.observability import replica, tracing
from duejobs.redis_urls import GIVEN_REDIS, REDIS_POOL, redis_client, same_redis
from duejobs.store import dbapi
from duejobs.validation import check_count, check_duration, check_queue

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

Conn: TypeAlias = "Connection | store.Driver"
"""What ``conn=`` takes: a SQLAlchemy connection or a plain psycopg one, in the caller's
transaction."""

# SQLAlchemy's default pool: 5 kept, 10 more lent at a peak.
POOL_SIZE, POOL_OVERFLOW = 5, 10
# How long one statement of an operator's read (a list, the figures) may run by default.
DEFAULT_READ_TIMEOUT = timedelta(seconds=10)


def make_engine(
    database_url: str,
    pool_size: int = POOL_SIZE,
    schema: str = DEFAULT_SCHEMA,
    prepared: PreparedStatements = PreparedStatements.AUTO,
) -> Engine:
    """An engine whose connections carry no session setting, notice being dropped before use,
    and keep prepared statements as ``prepared`` says; they reach duejobs' tables in
    ``schema``."""
    from sqlalchemy import create_engine, event

    url, connect_args, mode = store.driver_options(database_url, prepared)
    engine = create_engine(
        url,
        connect_args=connect_args,
        pool_size=pool_size,
        max_overflow=POOL_OVERFLOW,
        execution_options={store.SCHEMA_OPTION: schema},
    )
    event.listen(engine, "connect", store.Connected(mode).on_connect)
    event.listen(engine, "checkout", _discard_if_closed_by_server)
    return engine


def make_async_engine(
    database_url: str,
    pool_size: int = POOL_SIZE,
    schema: str = DEFAULT_SCHEMA,
    prepared: PreparedStatements = PreparedStatements.AUTO,
) -> AsyncEngine:
    """:func:`make_engine`'s engine on psycopg's async connections (for an event loop).
    SQLAlchemy's asyncio extension (and its ORM) is loaded here, by an AsyncApp alone."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    url, connect_args, mode = store.driver_options(database_url, prepared)
    engine = create_async_engine(
        url,
        connect_args=connect_args,
        pool_size=pool_size,
        max_overflow=POOL_OVERFLOW,
        execution_options={store.SCHEMA_OPTION: schema},
    )
    event.listen(engine.sync_engine, "connect", store.Connected(mode).on_connect)
    event.listen(engine.sync_engine, "checkout", _discard_if_closed_by_server)
    return engine


def closed_by_server(dbapi_connection: Any) -> bool:
    """Whether an idle connection was ended by the server, told without a round trip.

    An idle connection has nothing to read; when the server ends it (a restart, an
    administrator, an idle timeout, a pooler's restart) its socket turns readable. Checking
    that costs a system call, where a ``SELECT 1`` before every use would cost a round trip
    per ``schedule()``. A silently lost network path is not seen here; its first statement
    fails instead."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)  # async: adapted
    if driver.closed:
        return True
    readable, _, _ = select.select([driver.pgconn.socket], [], [], 0)
    return bool(readable)


def connection_ended(conn: Connection) -> bool:
    """Whether a connection kept idle outside the pool (a worker's own) can no longer serve:
    invalidated, closed, or ended by the server (:func:`closed_by_server`)."""
    if conn.invalidated or conn.closed:
        return True
    return closed_by_server(conn.connection.dbapi_connection)


def _discard_if_closed_by_server(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Replace a pooled connection the server closed (:func:`closed_by_server`)."""
    if closed_by_server(dbapi_connection):
        raise dbapi.DisconnectionError("the server closed this connection")


_DELIVERER_LOCK = threading.Lock()
_ENGINE_LOCK = threading.Lock()


def check_strict_types(name: str, value: object) -> bool | None:
    """``strict_types`` as given: True, False or None (decided by the handlers)."""
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True, False or None, got {value!r}")
    return value


@dataclass
class Core:
    """The shared parts of one App (see the module docstring)."""

    settings: Settings
    max_payload_bytes: int
    queue: str
    handlers: dict[str, Handler] = field(default_factory=dict)
    # How a run's span relates to the trace of the request that scheduled it
    # (duejobs.observability.tracing): "link" (the default) or "child".
    trace_runs: str = "link"
    # tenant → (monotonic time read, its live quota): one query saved per schedule()
    quotas: dict[str, tuple[float, int | None]] = field(default_factory=dict)
    # The replica the operators' reads go to (duejobs.observability.replica), and how far behind it
    # may be.
    # read_engine's, made on first use (an engine's repr shows its URL's query: not here)
    _read_engine: Engine | None = field(default=None, repr=False)
    read_max_lag: timedelta = replica.DEFAULT_MAX_LAG
    # The recurring definitions declared in code, by (tenant, name): App.sync_recurring.
    declared_recurring: dict[tuple[str, str], RecurringSpec] = field(default_factory=dict)
    # Whether a type without a handler here is refused at schedule time (None: when this
    # App has handlers).
    strict_types: bool | None = None
    # How long one statement of an operator's read may run (reading()); None: unbounded.
    read_timeout: timedelta | None = DEFAULT_READ_TIMEOUT
    _deliverer: Deliverer | None = None
    # Superseded jobs taken out of Redis off the caller's path, made on first use.
    _removals: Removals | None = field(default=None, repr=False)
    _wakes: Wakes | None = field(default=None, repr=False)
    _redis_connections = 0  # what ensure_pool asked of the deliverer's Redis pool
    # The engine, made on first use (see engine), and the pool it is made with.
    _engine: Engine | None = field(default=None, repr=False)
    _pool_size: int = POOL_SIZE
    # connect_directly's, made on first use (it holds the URL: never in a repr)
    _connector: store.Connector | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        max_payload_bytes: int,
        queue: str,
        trace_runs: str,
        read_max_lag: timedelta,
        read_timeout: timedelta | None = DEFAULT_READ_TIMEOUT,
    ) -> Self:
        """The one way an App's Core is made (the App, Django's, and through
        :meth:`with_engines` the AsyncApp's): its options checked."""
        if trace_runs not in tracing.TRACE_RUNS:
            raise ConfigurationError(
                f"trace_runs must be one of {', '.join(tracing.TRACE_RUNS)}, got {trace_runs!r}"
            )
        check_duration("read_max_lag", read_max_lag)
        if read_timeout is not None:
            check_duration("read_timeout", read_timeout)
        check_count("max_payload_bytes", max_payload_bytes, 1, 2**31 - 1)
        for url, variable in (
            (settings.database_url, DATABASE_ENV),
            (settings.read_database_url, READ_DATABASE_ENV),
        ):
            if url is not None:  # a bad prepare_threshold refused now, not at the first query
                with named(variable, settings.read_from):
                    store.driver_options(url, settings.prepared_statements)
        return cls(
            settings,
            max_payload_bytes,
            check_queue(queue),
            trace_runs=trace_runs,
            read_max_lag=read_max_lag,
            read_timeout=read_timeout,
        )

    def with_engines(self, engine: Engine, read_engine: Engine | None) -> Core:
        """This Core on other engines (the AsyncApp's, whose sync faces they are): the same
        settings, options, handlers and quota cache; a deliverer of its own."""
        return dataclasses.replace(
            self,
            _engine=engine,
            _read_engine=read_engine,
            _deliverer=None,
            _removals=None,
            _wakes=None,
        )

    @property
    def read_engine(self) -> Engine | None:
        """The engine of the read replica the operators' reads go to, if one is configured
        (``read_database_url``); made on first use, as :attr:`engine` is."""
        url = self.settings.read_database_url
        with _ENGINE_LOCK:
            if self._read_engine is None and url is not None:
                prepared = self.settings.prepared_statements
                self._read_engine = make_engine(url, schema=self.settings.schema, prepared=prepared)
            return self._read_engine

    @property
    def engine(self) -> Engine:
        """The engine of this Core's own transactions, made on first use: a worker's claims
        and outcomes run on connections of its own (:mod:`duejobs.store.direct`), so one
        whose handlers open no transaction never loads SQLAlchemy."""
        with _ENGINE_LOCK:
            if self._engine is None:
                self._engine = make_engine(
                    self.settings.database_url,
                    self._pool_size,
                    self.settings.schema,
                    self.settings.prepared_statements,
                )
            return self._engine

    def connect_directly(self) -> Connection:
        """A connection of the caller's own outside the engine, in autocommit (a worker's
        bookkeeping and heartbeat: :class:`~duejobs.store.connecting.Direct`); the caller
        closes it. A URL libpq might read otherwise than SQLAlchemy (not a
        :func:`~duejobs.config.plain_url`: several hosts, percent-encoded characters) gets a
        connection of the engine instead, in autocommit, so both reach the same server."""
        if not plain_url(self.settings.database_url):
            return self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        with _ENGINE_LOCK:
            if self._connector is None:
                settings = self.settings
                self._connector = store.Connector(
                    settings.database_url, settings.schema, settings.prepared_statements
                )
        return cast("Connection", self._connector.connect())

    @property
    def core(self) -> Core:
        """Itself, so that a service can be given a Core or an App alike."""
        return self

    def deliverer(self) -> Deliverer:
        """The delivery side (RQ on Redis), created on first use (once, whichever of a
        worker's slots asks first)."""
        with _DELIVERER_LOCK:
            if self._deliverer is None:
                size = max(REDIS_POOL, self._redis_connections)
                default = self.settings.require_redis()
                clients: dict[tuple[tuple[str, str], ...], Redis] = {}
                for url in (default, *(url for _, url in self.settings.redis_nodes)):
                    server = same_redis(url)
                    if server in clients:  # one client per server, however spelt
                        continue
                    given = self.settings.redis_client if url == GIVEN_REDIS else None
                    clients[server] = given or redis_client(url, size)
                nodes = {q: clients[same_redis(url)] for q, url in self.settings.redis_nodes}
                self._deliverer = Deliverer(
                    clients[same_redis(default)], self.queue, nodes, self.settings.result_ttl
                )
        return self._deliverer

    def removals(self) -> Removals:
        """Where a superseded job goes to be taken out of Redis (:mod:`~duejobs.delivery.
        removals`), created on first use."""
        with _DELIVERER_LOCK:
            if self._removals is None:
                self._removals = Removals(self.deliverer)
        return self._removals

    def wakes(self) -> Wakes:
        """How a schedule due before the scheduler's next poll wakes it
        (:mod:`~duejobs.delivery.wakes`), created on first use."""
        with _DELIVERER_LOCK:
            if self._wakes is None:
                self._wakes = Wakes(lambda: self.deliverer().redis, wake_key(self.queue))
        return self._wakes

    def ensure_pool(self, connections: int) -> None:
        """Let the engine lend ``connections`` at once without waiting (a worker's slots may
        each run a bookkeeping step and a ``ctx.transaction()``): an engine whose pool is
        smaller is replaced by a larger one, the old one closed. The deliverer's Redis pool,
        made on first use, holds as many."""
        self._redis_connections = max(self._redis_connections, connections)
        if connections <= self._pool_size + POOL_OVERFLOW:
            return
        with _ENGINE_LOCK:
            self._pool_size, old, self._engine = connections, self._engine, None
        if old is not None:
            old.dispose()

    def refuses_unknown_types(self) -> bool:
        """Whether scheduling a type with no handler registered here is refused: as asked
        (``strict_types``), else when this App knows its handlers (it has some)."""
        return bool(self.handlers) if self.strict_types is None else self.strict_types

    def handler_for(self, job_type: str) -> Handler | None:
        """The registration for ``job_type`` (no copy: the worker asks once per job)."""
        return self.handlers.get(job_type)

    def close(self) -> None:
        """Close pooled database and Redis connections (after the superseded jobs handed over
        are removed)."""
        if self._removals is not None:
            self._removals.close()
        if self._wakes is not None:
            self._wakes.close()
            self._wakes = None  # an App used again wakes afresh
        if self._engine is not None:
            self._engine.dispose()
        if self._read_engine is not None:
            self._read_engine.dispose()
        if self._deliverer is not None:
            self._deliverer.close()

    @contextlib.contextmanager
    def database(self, which: str = "PostgreSQL") -> Iterator[None]:
        """Database errors as duejobs' own: an outage (of ``which``), a schema never
        migrated."""
        try:
            yield
        except (dbapi.OperationalError, dbapi.InterfaceError) as exc:
            raise DatabaseUnavailableError(f"{which} is unavailable: {exc.orig}") from exc
        except dbapi.PoolTimeoutError as exc:  # every connection of the pool busy for its wait
            raise DatabaseUnavailableError(
                f"{which} is unavailable here: no connection of this process's pool came free "
                f"in time ({exc.args[0].split(' (Background')[0]})"
            ) from exc
        except dbapi.ProgrammingError as exc:
            if store.is_missing_table(exc.orig):
                raise SchemaMissingError(
                    f"duejobs' tables are missing ({exc.orig}): run `duejobs migrate` first"
                ) from exc
            raise
        except dbapi.DBAPIError as exc:
            if exc.connection_invalidated:
                raise DatabaseUnavailableError(
                    f"{which} dropped the connection: {exc.orig}"
                ) from exc
            raise

    @contextlib.contextmanager
    def reading(self, *, current: bool = False) -> Iterator[tuple[Connection, replica.Freshness]]:
        """A connection for an operator's read (figures, lists; with ``current``, one
        schedule's row, history or attempts, always on the primary), and how current it is: on
        the read replica when there is one (see :mod:`duejobs.observability.replica`), else the
        primary. Each statement is stopped past ``read_timeout`` (:class:`ReadTimeoutError`),
        a wait for a lock included: an operator's page never holds a connection and a backend
        for minutes."""
        try:
            if self.read_engine is None or current:
                with self.transaction() as conn, self._bounded(conn):
                    yield conn, replica.CURRENT
                return
            with self.database(), self.engine.connect() as primary:
                lsn = store.wal_position(primary)
            try:
                replica_read = self.read_engine.connect
                with self.database("the read replica"), replica_read() as conn, self._bounded(conn):
                    yield conn, replica.measure(conn, lsn, self.read_max_lag)
            except DatabaseUnavailableError as exc:
                cause = getattr(exc.__cause__, "orig", None)
                if not (store.is_statement_timeout(cause) or store.is_lock_timeout(cause)):
                    replica.unanswered()  # a read stopped by its own limit: the replica answered
                raise
        except DatabaseUnavailableError as exc:
            cause = getattr(exc.__cause__, "orig", None)
            if store.is_lock_timeout(cause):
                raise ReadTimeoutError(
                    f"this read waited for a lock another transaction holds on a table it "
                    f"reads (a migration, VACUUM FULL, a long transaction: pg_locks names it) "
                    f"past its limit (read_timeout, {self.read_timeout}) and was stopped"
                ) from exc
            if store.is_statement_timeout(cause):
                raise ReadTimeoutError(
                    f"this read ran past its limit of {self.read_timeout} (read_timeout) and was "
                    "stopped: narrow it (a tenant, a status, a due range) or raise the limit"
                ) from exc
            raise

    @contextlib.contextmanager
    def _bounded(self, conn: Connection) -> Iterator[None]:
        """``read_timeout`` on the read's statements, and the transaction's own limit given
        back after them (a Django read may run inside a caller's ``atomic()``, whose later
        statements must not inherit it; after an error the savepoint's rollback does it)."""
        if self.read_timeout is None:
            yield
            return
        before = store.bound_statements(conn, self.read_timeout)
        yield
        store.restore_statement_timeout(conn, before)

    @contextlib.contextmanager
    def transaction(self, conn: Conn | None = None) -> Iterator[Connection]:
        """The caller's transaction (``conn``: the caller commits or rolls back), or one of
        its own that commits at the end of the block and rolls back on an error."""
        if conn is not None:
            yield store.lent(conn, schema=self.settings.schema)
            return
        with self.database(), self.engine.begin() as c:
            yield c

    @contextlib.contextmanager
    def statement(self, conn: Conn | None = None) -> Iterator[Connection]:
        """For a change made by one statement (a cancel, a reschedule: each a single
        statement with its history event): the caller's transaction, or PostgreSQL's implicit
        transaction around that one statement — autocommit, one round trip where ``BEGIN``,
        the statement and ``COMMIT`` are three, with the same atomicity and durability.
        Reads that only explain a refusal may follow; a second change may not (it would
        commit apart)."""
        if conn is not None:
            yield store.lent(conn, schema=self.settings.schema)
            return
        with self.database(), self.engine.connect() as c:
            yield c.execution_options(isolation_level="AUTOCOMMIT")

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the change just made is committed for good: now, as this
        Core's own transactions have committed when their block ends (a host framework's
        Core waits for its outermost transaction, and drops ``action`` on a rollback)."""
        action()


class HasCore(Protocol):
    """Anything built on a Core: an App, or the Core itself."""

    @property
    def core(self) -> Core: ...
