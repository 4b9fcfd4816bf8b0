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
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from duejobs import App, Schedule
from duejobs.config import DATABASE_ENV, REDIS_ENV, sqlalchemy_url
from duejobs.core import make_engine
from duejobs.delivery import Push
from duejobs.migrate import upgrade
from duejobs.models import Delivery
from duejobs.scheduler import Scheduler, SchedulerConfig
from duejobs.store.partitions import Partitioning
from duejobs.testing.servers import TestServers
from duejobs.worker import Runtime, Worker, WorkerConfig
from tests.apps import EFFECTS_TABLE, RUNS_TABLE, register
from tests.support import wait_for

__all__ = ["wait_for"]  # re-exported: tests import it from here too

# The time zone of every session on the test database (see database_url).
SESSION_ZONE = "America/New_York"
# DUEJOBS_TEST_PARTITIONED=1: the whole suite on partitioned mode (daily partitions).
PARTITIONED = os.environ.get("DUEJOBS_TEST_PARTITIONED") == "1"
_TABLES = (
    "scheduled_jobs, scheduled_job_events, scheduled_job_attempts, scheduled_job_effects, "
    "scheduled_job_results, recurring_schedules, tenant_quotas, test_effects, test_runs"
    + (", scheduled_job_keys" if PARTITIONED else "")
)


class Servers(TestServers):
    """The servers of this test session (``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL``,
    both or neither: else the embedded ones) and the scratch database created on one."""

    def describe(self) -> str:
        mode = "partitioned mode" if PARTITIONED else "plain schema"
        return f"{super().describe()} ({mode})"


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


@pytest.fixture
def app(database_url: str, redis_url: str) -> Iterator[App]:
    """An App on empty tables."""
    application = App(database_url=database_url, redis_url=redis_url)
    with application.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {_TABLES}"))
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


class System:
    """One scheduler and one in-process RQ worker over the test App."""

    def __init__(self, app: App, scheduler: Scheduler, runtime: Runtime, redis_client: redis.Redis):
        self.app = app
        self.scheduler = scheduler
        self.runtime = runtime
        self.redis = redis_client

    def work(self) -> None:
        """An RQ worker (real RQ, this process) that drains the queue and returns."""
        Worker(self.runtime).work(burst=True)

    def run_until(self, done: Callable[[], bool], timeout: float = 20.0) -> None:
        """Scheduler pass, then worker drain, until ``done()`` or the deadline."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "deadline passed before the work was done"
            self.scheduler.run_once()
            self.work()
            time.sleep(0.02)

    def effects(self) -> list[tuple[str, int]]:
        with self.app.engine.connect() as conn:
            rows = conn.execute(text("SELECT effect_key, attempt FROM test_effects ORDER BY id"))
            return [(r.effect_key, r.attempt) for r in rows]

    def status(self, schedule_id: object) -> str:
        s = self.app.get(schedule_id)  # type: ignore[arg-type]
        assert s is not None
        return s.status.value


ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A duejobs command (or, with ``code``, a Python program) in its own process, its output
    in a file."""

    def __init__(
        self, args: list[str], env: dict[str, str], log: Path, code: str | None = None
    ) -> None:
        self.log = log
        argv = ["-c", code] if code is not None else ["-m", "duejobs", *args]
        with open(log, "w") as out:
            self.popen = subprocess.Popen(
                [sys.executable, *argv],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the cleanup ends its children too
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack, logged
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
            self.popen.kill()
            raise AssertionError(
                f"{self.popen.args} still running {timeout:g} s after signal {sig}:\n"
                + self.output()
            ) from None

    def output(self) -> str:
        return self.log.read_text()


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


def reads_index(plan: str, index: str) -> bool:
    """Whether an EXPLAIN output reads ``index`` (``scheduled_jobs_claim_idx``): on the table,
    or in partitioned mode on a partition (``scheduled_jobs_p202612010000_claim_idx``)."""
    table = next(t for t in ("scheduled_jobs", "scheduled_job_events") if index.startswith(t))
    suffix = re.escape(index.removeprefix(table))
    return re.search(rf"\b{table}(?:_p\d{{12}}|_default)?{suffix}\b", plan) is not None


def full_scans(plan: str, tables: str = "scheduled_jobs") -> list[str]:
    """The sequential scans of an EXPLAIN output, on the tables whose names start with
    ``tables`` (their partitions included), that read a page or more: an empty partition's
    (costed below one page read) is no scan of the table."""
    found = []
    for line in plan.splitlines():
        cost = re.search(rf"Seq Scan on {tables}\w* .*cost=[\d.]+\.\.([\d.]+) ", line)
        if cost is not None and float(cost[1]) >= 1.0:
            found.append(line.strip())
    return found


def job_id(tenant: str, schedule_id: uuid.UUID, version: int, attempt: int) -> str:
    """A delivery's RQ job id as the README documents it."""
    return f"dj-{tenant.replace('.', '_')}-{schedule_id.hex}-v{version}-a{attempt}"


def push_of(s: Schedule, version: int = 1, attempt: int = 1) -> Push:
    """A push of ``s`` at any version and attempt, as no claim would make it: a stray or
    second copy of a delivery."""
    spelled = job_id(s.tenant, s.id, version, attempt)
    return Push(Delivery(s.id, s.tenant, version, attempt, s.queue, s.due_at, spelled))


def sample(name: str, **labels: str) -> float:
    """A metric's current value in this process, read as Prometheus would (0 if unset)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
