"""The ``duejobs`` group itself and what its commands share: the embedded servers, the
duration flags, one-line errors, the services' defaults read from their configs."""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from duejobs.config import DATABASE_ENV, REDIS_ENV
from duejobs.errors import DuejobsError, outage
from duejobs.timespec import parse_duration, spell_duration

if TYPE_CHECKING:  # the App and the servers are loaded by a command that runs, not by --help
    from duejobs.app.application import App
    from duejobs.dev.embedded import EmbeddedServices

F = TypeVar("F", bound=Callable[..., Any])


# What the commands need: both servers, or (``migrate`` and the other schema commands) the
# database alone.
BOTH = (DATABASE_ENV, REDIS_ENV)
DATABASE_ONLY = (DATABASE_ENV,)


@contextmanager
def services(
    data_dir: Path, *, embedded: bool = False, needs: tuple[str, ...] = BOTH
) -> Iterator[EmbeddedServices | None]:
    """The configured servers, or — with no URL set at all, for ``embedded`` commands
    (``duejobs demo``, ``dev``) or beside a ``duejobs dev`` running on this data folder — the
    embedded ones, started or joined for this command. Never a mix of a real server and an
    embedded one: a command whose URL is missing exits 2 naming the variable.

    The embedded servers' URLs are exported to the environment so that an ``App()`` built by
    user code (and any child process) finds the same servers.
    """
    missing = [name for name in needs if not os.environ.get(name)]
    if not missing:
        yield None
        return
    given = [name for name in BOTH if os.environ.get(name)]
    if not embedded and not given:
        from duejobs.dev.embedded import embedded_running

        embedded = embedded_running(data_dir)
    if not embedded or given:
        names = " and ".join(missing)
        hint = (
            f"{' and '.join(given)} is set: set {names} too (embedded servers are never "
            "mixed with configured ones)"
            if given
            else "`duejobs dev` and `duejobs demo` run on embedded servers of their own, "
            "which the commands run beside them (same --data-dir) join"
        )
        click.echo(f"error: {names} not set; {hint}", err=True)
        sys.exit(2)
    from duejobs.dev.embedded import start_embedded

    try:
        started = start_embedded(data_dir)
    except DuejobsError as exc:
        _fail(exc)
    say(f"duejobs: {started.describe()}")
    os.environ.setdefault(DATABASE_ENV, started.database_url)
    os.environ.setdefault(REDIS_ENV, started.redis_url)
    try:
        yield started
    finally:
        started.stop()


if TYPE_CHECKING:  # generic in click's stubs since 8.2; a plain class before at run time
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType


class Duration(_ParamType):
    """A duration flag: ``250ms``, ``45s``, ``30m``, ``1h30m``, ``2d`` or plain seconds — the
    one syntax of every duration the CLI takes."""

    name = "duration"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            duration = parse_duration(str(value))
        except DuejobsError as exc:
            self.fail(str(exc).removeprefix("duration: "), param, ctx)
        if self.positive and duration <= timedelta(0):
            self.fail(f"must be greater than zero, got {value!r}", param, ctx)
        return duration


class CpuList(_ParamType):
    """CPU numbers, comma-separated (``1``, ``0,1``), at least one, none twice."""

    name = "cpus"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        if not all(re.fullmatch(r"[0-9]{1,6}", part) for part in parts):
            self.fail(
                f"expected CPU numbers separated by commas (e.g. 1 or 0,1), got {value!r}",
                param,
                ctx,
            )
        cpus = tuple(int(part) for part in parts)
        if len(set(cpus)) != len(cpus):
            self.fail(f"a CPU is named twice in {value!r}", param, ctx)
        return cpus


DURATION = Duration()
POSITIVE = Duration(positive=True)


def duration_option(
    flag: str, default: timedelta, help: str, *, zero_ok: bool = False
) -> Callable[[F], F]:
    """A duration flag whose default is a config's, shown as the CLI spells durations."""
    kind = DURATION if zero_ok else POSITIVE
    default_text = spell_duration(default)
    return click.option(flag, type=kind, default=default_text, show_default=True, help=help)


TENANT_OPTION = click.option("--tenant", default=None, help="Tenant name (default: 'default').")


class JSONText(_ParamType):
    """A flag holding JSON text (a payload), handed to the command decoded."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as exc:
            self.fail(f"not JSON: {exc}", param, ctx)
        except RecursionError:  # Python's decoder recurses: thousands of levels run it out
            from duejobs.validation import MAX_PAYLOAD_DEPTH

            self.fail(
                f"nested more than {MAX_PAYLOAD_DEPTH} levels deep (a payload is ids and a few "
                "fields, not a tree)",
                param,
                ctx,
            )


JSON_TEXT = JSONText()
LOG_LEVELS = click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False)


C = TypeVar("C")


def _checked(make: Callable[[], C]) -> C:
    """A service's config built from flags; its refusal names the flag (each config's
    messages start with the field's name)."""
    try:
        return make()
    except DuejobsError as exc:
        field = str(exc).split(" ", 1)[0]
        raise click.BadParameter(str(exc), param_hint=f"--{field.replace('_', '-')}") from exc


def _fail(exc: Exception) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2 if isinstance(exc, ValueError) else 1)


@contextmanager
def _app(
    ctx: click.Context,
    *,
    migrate: bool = False,
    embedded: bool = False,
    needs: tuple[str, ...] = BOTH,
    app_ref: str | None = None,
) -> Iterator[App]:
    """The App a command works on — ``App()`` from the environment, or the one ``app_ref``
    (``MODULE:APP``) names, with its handlers —, its errors as the CLI says them."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    from duejobs.app.application import App
    from duejobs.redis_urls import redis_failures

    data_dir: Path = ctx.obj["data_dir"]
    try:
        with services(data_dir, embedded=embedded, needs=needs):
            app = load_app(app_ref) if app_ref else App()
            try:
                if migrate:
                    app.migrate()
                yield app
            finally:
                app.close()
    except Exception as exc:
        if not isinstance(exc, (DuejobsError, *redis_failures(), OperationalError, InterfaceError)):
            raise
        said = outage(exc)  # an outage in one line, naming the service
        _fail(exc if said is None else ConnectionError(said))


def say(line: str) -> None:
    """A line for the operator: through the logs where a service set them up (in their
    format: JSON too), else on stderr."""
    from duejobs.observability import logs

    if logs.configured():
        logging.getLogger("duejobs").info("%s", line)
    else:
        click.echo(line, err=True)


def ready_to_serve(app: App) -> None:
    """At a service's start, what no retry mends ends it with exit 2, named: a Redis that
    refuses duejobs (:func:`refuse_unusable_redis`), tables this code cannot run on
    (:func:`refuse_unmigrated`). An outage of either is waited out by the service."""
    refuse_unusable_redis(app)
    refuse_unmigrated(app)


def say_serving(app: App, service: str, what: str) -> None:
    """The service's first line, through its logs (``--log-format json`` included): what it
    serves, and on which PostgreSQL and Redis (no password)."""
    from urllib.parse import urlsplit

    from duejobs.config import plain_url, redacted
    from duejobs.redis_urls import redacted_redis

    settings = app.settings
    url = settings.database_url
    if plain_url(url):  # read here, without SQLAlchemy (a worker starts without it)
        parts = urlsplit(url)
        database = f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"
    else:
        database = redacted(url)
    redis = redacted_redis(settings.redis_url) if settings.redis_url else "a client given"
    logging.getLogger(f"duejobs.{service}").info(
        "duejobs %s: %s; PostgreSQL %s (schema %r), Redis %s",
        service,
        what,
        database,
        settings.schema,
        redis,
    )


def refuse_unmigrated(app: App) -> None:
    """duejobs' tables missing from the database, or at a revision older than this code's:
    exit 2 naming ``duejobs migrate`` (each pass would fail on what it does not find). Tables
    newer than this code (a newer release migrated first, as a rolling deploy does) are said
    at warning: this code runs on them. A database that does not answer is an outage."""
    from duejobs import store
    from duejobs.config import redacted
    from duejobs.store import dbapi

    try:  # on a connection of its own: a worker starts without loading SQLAlchemy
        conn = app.core.connect_directly()
        try:
            at = store.schema_revision(conn)
        finally:
            conn.close()
    except (dbapi.OperationalError, dbapi.InterfaceError):
        return  # the service's loop waits the database out
    except dbapi.DBAPIError as exc:  # the role may not read the revision table: go on
        logging.getLogger("duejobs").warning(
            "could not read the schema's revision (%s); starting without checking it", exc.orig
        )
        return
    if at == store.SCHEMA_HEAD:
        return
    where = f"{redacted(app.settings.database_url)} (schema {app.settings.schema!r})"
    if at is not None and at > store.SCHEMA_HEAD:
        logging.getLogger("duejobs").warning(
            "the database %s is at schema revision %s, newer than this duejobs knows (%s)",
            where,
            at,
            store.SCHEMA_HEAD,
        )
        return
    said = (
        "has no duejobs tables"
        if at is None
        else f"is at schema revision {at}, and this duejobs needs {store.SCHEMA_HEAD}"
    )
    click.echo(f"error: the database {where} {said}: run `duejobs migrate`", err=True)
    sys.exit(2)


def refuse_unusable_redis(app: App) -> None:
    """At a service's start: a Redis that refuses duejobs' credentials (a wrong password, an
    ACL without the commands it runs; through Sentinel, a wrong Sentinel password or a master
    name no Sentinel knows) ends it with exit 2, naming it — no retry mends that. A
    Redis that does not answer is an outage, which the service waits out; so is the same
    refusal once it runs (a password being rotated). A cluster's client reads the cluster's
    map when made: a cluster away is an outage too, one refusing its password a refusal."""
    from duejobs.redis_urls import is_outage, redacted_redis, redis_failures

    try:
        refusals = app.core.deliverer().refusing()
    except redis_failures() as exc:
        if is_outage(exc):
            return  # the service's loop waits it out
        refusals = [(redacted_redis(app.settings.require_redis()), str(exc))]
    for where, answer in refusals:
        click.echo(f"error: Redis at {where} refuses duejobs: {answer}", err=True)
    if refusals:
        sys.exit(2)


def sync_declared(app: App) -> None:
    """Write the recurring definitions the App declares in code (``@app.task(cron=...)``),
    as a service loading it starts: unchanged ones stay as they are."""
    synced = app.sync_recurring()
    if synced:
        names = ", ".join(sorted(r.name for r in synced))
        logging.getLogger("duejobs").info("recurring definitions declared in code: %s", names)


def load_app(reference: str) -> App:
    """The App named by ``MODULE:ATTRIBUTE`` (the current directory is importable)."""
    from duejobs.app.application import App

    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected MODULE:APP, got {reference!r}", param_hint="--app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--app"
        ) from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise click.BadParameter(
            f"{reference!r} is not a duejobs.App (got {type(app).__name__})", param_hint="--app"
        )
    return app


def _operations(func: F) -> F:
    """Options every long-running command shares: logs and metrics."""
    func = click.option("--metrics-port", type=int, help="Serve Prometheus /metrics here.")(func)
    func = click.option(
        "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
    )(func)
    return click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)(func)


def _operate(log_level: str, log_format: str, metrics_port: int | None) -> None:
    from duejobs.observability import logs, metrics

    # Each of the service's connections named in pg_stat_activity ("duejobs worker"): libpq
    # reads PGAPPNAME where the URL sets no application_name. A name of the user's own is
    # kept; one of duejobs' (a parent's, an earlier command's in this process) is replaced.
    named = os.environ.get("PGAPPNAME", "")
    if not named or named.startswith("duejobs "):
        os.environ["PGAPPNAME"] = f"duejobs {click.get_current_context().info_name}"
    logs.configure(log_level, log_format)
    if metrics_port is not None:
        metrics.serve(metrics_port)
