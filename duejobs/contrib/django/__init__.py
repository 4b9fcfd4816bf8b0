"""duejobs in a Django project: settings, Django's own transactions, handlers found in the
installed applications, management commands and a Tasks backend.

Setup::

    INSTALLED_APPS = [..., "duejobs.contrib.django"]
    DUEJOBS = {"REDIS_URL": "redis://localhost:6379/0"}  # the other keys below are optional

Keys of ``DUEJOBS``: ``REDIS_URL``; ``DATABASE`` (the alias in ``DATABASES`` whose connection
duejobs shares, default ``"default"``; it must be PostgreSQL on psycopg 3); ``DATABASE_URL``
(default: built from that alias's settings); ``READ_DATABASE_URL`` and ``READ_MAX_LAG`` (a
streaming replica for the operators' reads and the lag, a ``timedelta``, past which they say
they are stale: :mod:`duejobs.observability.replica`); ``READ_TIMEOUT`` (how long a statement
of an operator's read may run, a ``timedelta``, default 10 s); ``REDIS_NODES`` (queue → Redis
URL, for queues on a Redis of their own); ``SCHEMA`` (of duejobs' tables, default ``public``);
``QUEUE`` (the RQ queue, default ``duejobs``); ``MAX_PAYLOAD_BYTES``; ``TRACE_RUNS``
(``"link"`` or ``"child"``: :mod:`duejobs.observability.tracing`); ``STRICT_TYPES`` (``False``
for a project that schedules another service's types: see ``App(strict_types=)``);
``PREPARED_STATEMENTS`` (``"auto"``, ``"on"`` or ``"off"``: see ``App(prepared_statements=)``);
``REDIS`` (a ready ``redis.Redis`` or ``RedisCluster`` client instead of ``REDIS_URL``: see
``App(redis=)``); ``RESULT_TTL`` (seconds a finished or failed job stays in Redis: see
``App(result_ttl=)``). An unknown key or a database that is not PostgreSQL on psycopg 3 is
:class:`~django.core.exceptions.ImproperlyConfigured`.

Promises:

* ``from duejobs.contrib.django import app`` is the one App of the process, built on first use
  from the settings.
* Its writes and reads run on Django's own connection, inside ``transaction.atomic()``: in a
  view's atomic block a schedule commits or rolls back with the view's work (no ``conn=``);
  outside one, each call is an atomic block of its own. A cancel or reschedule removes the
  superseded job from Redis only once the outermost block commits (``on_commit``): a
  rolled-back change leaves its job in place. ``conn=`` still takes any other connection.
* Handlers live in each installed application's ``jobs.py`` (imported at startup); a sync
  handler runs between two ``close_old_connections()``, as a request does, so a worker never
  reuses a Django connection that broke or outlived ``CONN_MAX_AGE``.
* ``with fenced(ctx):`` is ``ctx.transaction()`` on Django's connection: ORM writes inside it
  commit exactly once, together with the schedule's success.

The services run as management commands (``duejobs_migrate``, ``duejobs_scheduler``,
``duejobs_worker``, ``duejobs_reconcile``), which take the CLI's options; Django's Tasks
framework runs through :class:`duejobs.contrib.django.tasks.DuejobsBackend`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django import db
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections, transaction
from sqlalchemy import URL, Connection

from duejobs import store
from duejobs.app.application import App
from duejobs.config import (
    Settings,
    check_prepared_statements,
    check_result_ttl,
    check_schema,
    parse_redis_nodes,
    sqlalchemy_url,
)
from duejobs.core import DEFAULT_READ_TIMEOUT, Conn, Core, check_strict_types
from duejobs.delivery import DEFAULT_QUEUE
from duejobs.errors import ConfigurationError, DatabaseUnavailableError, DuejobsError
from duejobs.observability.replica import DEFAULT_MAX_LAG
from duejobs.observability.tracing import LINK, TRACE_RUNS
from duejobs.redis_urls import check_redis_url
from duejobs.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_count, check_duration, check_queue
from duejobs.worker.context import Context

__all__ = ["DjangoApp", "fenced", "get_app", "settings_urls"]

F = TypeVar("F", bound=Callable[..., Any])
_KEYS = {
    *("REDIS_URL", "REDIS_NODES", "DATABASE", "DATABASE_URL", "SCHEMA", "QUEUE"),
    *("READ_DATABASE_URL", "READ_MAX_LAG", "READ_TIMEOUT", "MAX_PAYLOAD_BYTES", "TRACE_RUNS"),
    *("STRICT_TYPES", "PREPARED_STATEMENTS", "REDIS", "RESULT_TTL"),
}


def _config() -> dict[str, Any]:
    """``DUEJOBS``, every key known and every value given checked: a fault is one
    ``ImproperlyConfigured`` naming the key as it is set (the system check ``duejobs.E001``
    reports it), not a traceback from every command."""
    config: dict[str, Any] = dict(getattr(settings, "DUEJOBS", {}))
    unknown = set(config) - _KEYS
    if unknown:
        raise ImproperlyConfigured(
            f"DUEJOBS has unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}"
        )
    for key, check in _CHECKS.items():
        if config.get(key) is not None:
            try:
                check(config[key])
            except DuejobsError as exc:
                raise ImproperlyConfigured(f"DUEJOBS[{key!r}]: {exc}") from None
    return config


def _read_timeout(value: object) -> None:
    check_duration("read_timeout", value)


def _max_payload_bytes(value: object) -> None:
    check_count("max_payload_bytes", value, 1, 2**31 - 1)


def _trace_runs(value: object) -> None:
    if value not in TRACE_RUNS:
        raise ConfigurationError(f"must be one of {', '.join(TRACE_RUNS)}, got {value!r}")


# Each value of DUEJOBS checked as the App would, before anything is built from it.
_CHECKS: dict[str, Callable[[Any], object]] = {
    "DATABASE_URL": sqlalchemy_url,
    "READ_DATABASE_URL": sqlalchemy_url,
    "REDIS_URL": check_redis_url,
    "REDIS_NODES": parse_redis_nodes,
    "SCHEMA": check_schema,
    "QUEUE": check_queue,
    "PREPARED_STATEMENTS": check_prepared_statements,
    "RESULT_TTL": check_result_ttl,
    "READ_MAX_LAG": lambda value: check_duration("read_max_lag", value),
    "READ_TIMEOUT": _read_timeout,
    "MAX_PAYLOAD_BYTES": _max_payload_bytes,
    "TRACE_RUNS": _trace_runs,
    "STRICT_TYPES": lambda value: check_strict_types("strict_types", value),
}


def settings_urls() -> tuple[str, str | None, str]:
    """The database URL, the Redis URL and the database alias the settings give duejobs."""
    config = _config()
    alias = config.get("DATABASE", "default")
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(f"DUEJOBS['DATABASE'] names {alias!r}, not in DATABASES")
    database = settings.DATABASES[alias]
    # By the backend's vendor, not its name: PostGIS and wrapped PostgreSQL engines are
    # PostgreSQL too.
    if connections[alias].vendor != "postgresql":
        raise ImproperlyConfigured(
            f"duejobs needs PostgreSQL: DATABASES[{alias!r}] uses {database.get('ENGINE')!r}"
        )
    return config.get("DATABASE_URL") or _url(database), config.get("REDIS_URL"), alias


def _url(database: dict[str, Any]) -> str:
    """A SQLAlchemy URL for one entry of ``DATABASES`` (a Unix socket folder as ``HOST`` is
    passed as libpq's ``host`` parameter). ``OPTIONS`` are not carried over: give
    ``DUEJOBS['DATABASE_URL']`` when they matter (TLS, say)."""
    host = database.get("HOST") or None
    socket_folder = host is not None and host.startswith("/")
    return URL.create(
        "postgresql+psycopg",
        username=database.get("USER") or None,
        password=database.get("PASSWORD") or None,
        host=None if socket_folder else host,
        port=int(database["PORT"]) if database.get("PORT") else None,
        database=database.get("NAME") or None,
        query={"host": host} if socket_folder and host else {},
    ).render_as_string(hide_password=False)


class _DjangoCore(Core):
    """A Core whose own transactions are Django's atomic blocks on its connection."""

    alias: str = "default"

    @contextlib.contextmanager
    def database(self, which: str = "PostgreSQL") -> Iterator[None]:
        """:meth:`Core.database`, with Django's own errors for a database out of reach (its
        connection's, its ``atomic()``'s) as duejobs' outage too: a page says 503, a command
        one line."""
        try:
            with super().database(which):
                yield
        except (db.OperationalError, db.InterfaceError) as exc:
            raise DatabaseUnavailableError(f"{which} is unavailable: {exc}") from exc

    @contextlib.contextmanager
    def transaction(self, conn: Conn | None = None) -> Iterator[Connection]:
        if conn is not None:
            with super().transaction(conn) as given:
                yield given
            return
        django_connection = connections[self.alias]
        with self.database(), transaction.atomic(using=self.alias):
            django_connection.ensure_connection()
            driver = django_connection.connection
            if type(driver).__module__.split(".")[0] != "psycopg":
                raise ImproperlyConfigured(
                    "duejobs shares Django's connection, which must be psycopg 3 "
                    f"(DATABASES[{self.alias!r}] runs on {type(driver).__module__})"
                )
            yield store.lent(driver, schema=self.settings.schema)

    @contextlib.contextmanager
    def statement(self, conn: Conn | None = None) -> Iterator[Connection]:
        """In the project's transaction, as every change (its ``atomic()`` decides)."""
        with self.transaction(conn) as given:
            yield given

    def after_commit(self, action: Callable[[], None]) -> None:
        """Once the project's outermost ``atomic()`` commits (now, outside one); never if it
        rolls back: a job removed from Redis for a change that did not happen would leave
        its row waiting for the reconciler."""
        transaction.on_commit(action, using=self.alias)


class DjangoApp(App):
    """The App of a Django project (see the module docstring); build it with :func:`get_app`.

    Made from settings duejobs cannot use (not PostgreSQL, a mistyped key), it is made all
    the same, unconfigured: a module that imports it at start-up (a view) leaves the fault to
    the system check ``duejobs.E001``, and any use of it raises the check's own
    ``ImproperlyConfigured``."""

    def __init__(self) -> None:
        try:
            database_url, redis_url, alias = settings_urls()
        except ImproperlyConfigured as exc:
            self._unconfigured = exc
            return
        config = _config()
        resolved = Settings.from_env(
            database_url,
            redis_url,
            config.get("SCHEMA"),
            config.get("READ_DATABASE_URL"),
            config.get("REDIS_NODES"),
            config.get("PREPARED_STATEMENTS"),
            redis_client=config.get("REDIS"),
            result_ttl=config.get("RESULT_TTL"),
        )
        read_max_lag = config.get("READ_MAX_LAG", DEFAULT_MAX_LAG)
        check_duration("DUEJOBS['READ_MAX_LAG']", read_max_lag)  # named as it is set
        core = _DjangoCore.build(
            resolved,
            max_payload_bytes=config.get("MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES),
            queue=config.get("QUEUE", DEFAULT_QUEUE),
            trace_runs=config.get("TRACE_RUNS", LINK),
            read_max_lag=read_max_lag,
            read_timeout=config.get("READ_TIMEOUT", DEFAULT_READ_TIMEOUT),
        )
        core.alias = alias
        core.strict_types = check_strict_types(
            "DUEJOBS['STRICT_TYPES']", config.get("STRICT_TYPES")
        )
        self._core = core
        self._tenant = None
        self.alias = alias

    @property
    def configured(self) -> bool:
        return "_unconfigured" not in vars(self)

    def __getattr__(self, name: str) -> Any:
        """Only for what an unconfigured App lacks (its Core, its alias): the settings' fault."""
        unconfigured = vars(self).get("_unconfigured")
        if unconfigured is not None:
            raise ImproperlyConfigured(
                f"duejobs cannot run on these settings: {unconfigured} (duejobs.E001)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def handler(self, job_type: str, **options: Any) -> Callable[[F], F]:
        """:meth:`App.handler`; a sync handler runs between two ``close_old_connections()``."""
        register = super().handler(job_type, **options)

        def wrap(func: F) -> F:
            if inspect.iscoroutinefunction(func):
                register(func)
                return func

            @functools.wraps(func)
            def between_fresh_connections(ctx: Context, payload: Any) -> Any:
                close_old_connections()
                try:
                    return func(ctx, payload)
                finally:
                    close_old_connections()

            register(between_fresh_connections)
            return func

        return wrap


_APP: DjangoApp | None = None
_LOCK = threading.Lock()


def get_app() -> DjangoApp:
    """The process's App, built from the settings on first use (an unconfigured one is not
    kept: settings fixed meanwhile are read again)."""
    global _APP
    with _LOCK:
        if _APP is not None:
            return _APP
        built = DjangoApp()
        if built.configured:
            _APP = built
        return built


def __getattr__(name: str) -> Any:
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def fenced(ctx: Context) -> Iterator[None]:
    """``ctx.transaction()`` on Django's connection: the ORM writes in the block commit
    exactly once, with the schedule's success, or not at all (see :mod:`duejobs.context`)."""
    alias = get_app().alias
    with transaction.atomic(using=alias):
        connection = connections[alias]
        connection.ensure_connection()
        with ctx.transaction(conn=connection.connection):
            yield
