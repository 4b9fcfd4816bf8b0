"""What every benchmark shares: the servers to run against and a scratch database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from duejobs.app import make_engine
from duejobs.config import DATABASE_ENV, REDIS_ENV, libpq_url, sqlalchemy_url
from duejobs.embedded import start_embedded
from duejobs.migrate import upgrade


@contextmanager
def scratch_database() -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL): a fresh, migrated database on the configured or embedded
    server, dropped afterwards."""
    server, redis_url = os.environ.get(DATABASE_ENV), os.environ.get(REDIS_ENV)
    embedded = None
    if not (server and redis_url):
        embedded = start_embedded(Path(".duejobs"))
        server, redis_url = embedded.database_url, embedded.redis_url
    server = libpq_url(server)
    name = f"duejobs_bench_{uuid.uuid4().hex[:8]}"
    head, _, query = server.partition("?")
    url = f"{head.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        engine = make_engine(sqlalchemy_url(url))
        upgrade(engine)
        engine.dispose()
        yield url, redis_url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if embedded is not None:
            embedded.stop()
