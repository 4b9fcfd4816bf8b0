"""The servers of a test session: the ones named by two variables (for a project's tests
``DUEJOBS_TEST_DATABASE_URL`` and ``DUEJOBS_TEST_REDIS_URL``; both, or neither), else the
embedded PostgreSQL and Valkey kept in a folder of the system's temporary directory, shared
by the sessions running at once and stopped by the last; and on the PostgreSQL, a database of
the session's own, created here and dropped by :meth:`TestServers.stop`.

The Redis database a session uses is flushed by its tests: under pytest-xdist, worker
``gwN`` takes the URL's database plus N + 1, so two workers never share one.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Self

from sqlalchemy import make_url

from duejobs import store
from duejobs.config import libpq_url
from duejobs.dev.embedded import EmbeddedServices, start_embedded
from duejobs.errors import ConfigurationError

TEST_DATABASE_ENV = "DUEJOBS_TEST_DATABASE_URL"
TEST_REDIS_ENV = "DUEJOBS_TEST_REDIS_URL"
DATA_DIR = Path(tempfile.gettempdir()) / f"duejobs-tests-{os.getuid()}"


class TestServers:
    """A PostgreSQL server with a database of this session's own, and a Redis database."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, server_url: str | None, redis_url: str | None) -> None:
        self.embedded: EmbeddedServices | None = None
        if not (server_url and redis_url):
            self.embedded = start_embedded(DATA_DIR)
            server_url, redis_url = self.embedded.database_url, self.embedded.redis_url
        self.server_url = libpq_url(server_url)
        self.redis_url = redis_of_this_worker(redis_url)
        self.database = f"duejobs_test_{uuid.uuid4().hex[:10]}"
        self.database_url = self.url_for(self.database)

    @classmethod
    def from_env(
        cls, database_env: str = TEST_DATABASE_ENV, redis_env: str = TEST_REDIS_ENV
    ) -> Self:
        """The servers the two variables name, or the embedded ones when neither is set;
        one without the other is refused, naming both."""
        server_url, redis_url = os.environ.get(database_env), os.environ.get(redis_env)
        if bool(server_url) != bool(redis_url):
            given, missing = (database_env, redis_env) if server_url else (redis_env, database_env)
            raise ConfigurationError(f"{given} is set but {missing} is not: set both, or neither")
        return cls(server_url, redis_url)

    def url_for(self, database: str) -> str:
        """The server URL pointing at another database."""
        url = make_url(self.server_url).set(database=database)
        return url.render_as_string(hide_password=False)

    def create_database(self, name: str) -> str:
        store.create_database(self.server_url, name)
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        store.drop_database(self.server_url, name)

    def describe(self) -> str:
        where = self.embedded.describe() if self.embedded else "configured servers"
        return f"{where}; test database {self.database}"

    def stop(self) -> None:
        self.drop_database(self.database)
        if self.embedded is not None:
            self.embedded.stop()


def redis_of_this_worker(url: str) -> str:
    """The Redis URL with a database of this test process's own (see the module)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return url
    head, _, query = url.partition("?")
    scheme, _, rest = head.partition("://")
    host, _, path = rest.partition("/")
    database = int(path or 0) + int(worker.removeprefix("gw")) + 1
    if database > 15:
        raise ConfigurationError(f"Redis database {database} for {worker}: use fewer workers")
    return f"{scheme}://{host}/{database}" + (f"?{query}" if query else "")
