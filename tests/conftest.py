"""Fixtures: a real PostgreSQL and a real Redis for every test that needs them.

With ``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL`` set, those servers are used; otherwise
the embedded ones are started (or joined) in a fixed folder under the system's temporary
directory, so a run killed with SIGKILL leaves servers that the next run adopts and stops.

Each session creates its own database on the server (the URL's role needs CREATEDB) and drops
it at the end. The Redis database named by the URL is flushed before each test that uses it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from sqlalchemy import Engine, text

from duejobs import App
from duejobs.config import DATABASE_ENV, REDIS_ENV, sqlalchemy_url
from duejobs.core import make_engine
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.store.migrate import upgrade
from duejobs.store.partitions import Partitioning
from duejobs.worker import Runtime, WorkerConfig
from tests.support.apps import EFFECTS_TABLE, RUNS_TABLE, register
from tests.support.cluster import Cluster, cluster
from tests.support.processes import ROOT, Proc
from tests.support.servers import PARTITIONED, SESSION_ZONE, TABLES, Servers
from tests.support.system import System
from tests.support.valkey import server_binary


def pytest_configure(config: pytest.Config) -> None:
    servers = Servers.from_env(DATABASE_ENV, REDIS_ENV)
    servers.create_database(servers.database)
    config.stash[_SERVERS] = servers


def pytest_unconfigure(config: pytest.Config) -> None:
    servers = config.stash.get(_SERVERS, None)
    if servers is not None:
        servers.stop()


def pytest_report_header(config: pytest.Config) -> str:
    return config.stash[_SERVERS].describe()


_SERVERS = pytest.StashKey[Servers]()


@pytest.fixture(scope="session")
def servers(pytestconfig: pytest.Config) -> Servers:
    return pytestconfig.stash[_SERVERS]


@pytest.fixture(scope="session")
def database_url(servers: Servers) -> str:
    """The session's scratch database, migrated to head."""
    engine = make_engine(sqlalchemy_url(servers.database_url))
    upgrade(engine, partitioned=Partitioning(timedelta(days=1), 2) if PARTITIONED else None)
    with engine.begin() as conn:
        conn.execute(text(EFFECTS_TABLE))
        conn.execute(text(RUNS_TABLE))
        # Sessions in a zone with summer time, as on a server whose postgresql.conf names
        # the local zone: duejobs sets none of its own, so no promise may depend on it.
        conn.execute(text(f"ALTER DATABASE {servers.database} SET TimeZone = '{SESSION_ZONE}'"))
    engine.dispose()
    return sqlalchemy_url(servers.database_url)


@pytest.fixture(scope="session")
def redis_url(servers: Servers) -> str:
    return servers.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Redis Cluster of three masters and three replicas (:mod:`tests.support.cluster`),
    one per test module that asks."""
    with cluster(server_binary(), tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.fixture
def cluster_client(redis_cluster: Cluster) -> RedisCluster:
    """A client of that cluster, every master emptied."""
    client = redis_cluster.client()
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    return client


@pytest.fixture
def app(database_url: str, redis_url: str) -> Iterator[App]:
    """An App on empty tables."""
    application = App(database_url=database_url, redis_url=redis_url)
    with application.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES}"))
    yield application
    application.close()


@pytest.fixture
def producer(app: App, database_url: str, redis_url: str) -> Iterator[App]:
    """An App on the same tables that schedules types it has no handler for, as a service
    producing work for another's workers does (``strict_types=False``)."""
    other = App(database_url, redis_url, strict_types=False)
    yield other
    other.close()


@pytest.fixture
def engine(app: App) -> Engine:
    return app.engine


@pytest.fixture
def count(engine: Engine) -> Callable[..., int]:
    """Rows in one of duejobs' tables (used to prove that nothing was written)."""

    def rows(table: str = "scheduled_jobs") -> int:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())

    return rows


@pytest.fixture
def env(app: App, database_url: str, redis_url: str) -> dict[str, str]:
    """The environment of a ``duejobs`` command on the test App's servers."""
    return {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}


@pytest.fixture
def system(app: App, redis_client: redis.Redis) -> Iterator[System]:
    """The App with the test handlers, an empty Redis, a scheduler and a worker runtime."""
    register(app)
    runtime = Runtime(app, WorkerConfig(heartbeat=timedelta(milliseconds=200)))
    yield System(
        app,
        Scheduler(app, SchedulerConfig(poll_interval=timedelta(milliseconds=50))),
        runtime,
        redis_client,
    )
    runtime.close()


@pytest.fixture
def spawn(
    tmp_path: Path, database_url: str, redis_url: str, redis_client: redis.Redis
) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def start(*args: str, extra_env: dict[str, str] | None = None, code: str | None = None) -> Proc:
        env = {
            **os.environ,
            "DUEJOBS_DATABASE_URL": database_url,
            "DUEJOBS_REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
            "PYTHONFAULTHANDLER": "1",  # a process stuck at its stop shows where (see Proc.stop)
            **(extra_env or {}),
        }
        proc = Proc(list(args), env, tmp_path / f"proc-{len(procs)}.log", code)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()
