"""Where duejobs finds PostgreSQL and Redis.

``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL`` name them. A library :class:`~duejobs.App`
never invents a database: without a URL it raises :class:`ConfigurationError`. Only the CLI
and the test suite fall back to the embedded servers (:mod:`duejobs.embedded`), and say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from duejobs.errors import ConfigurationError

DATABASE_ENV = "DUEJOBS_DATABASE_URL"
REDIS_ENV = "DUEJOBS_REDIS_URL"


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL URL in the form SQLAlchemy needs to use psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ConfigurationError(f"not a PostgreSQL URL (postgresql://...): {url!r}")


def libpq_url(url: str) -> str:
    """The same URL as plain libpq (and psycopg.connect) understands it."""
    return "postgresql://" + sqlalchemy_url(url)[len("postgresql+psycopg://") :]


@dataclass(frozen=True)
class Settings:
    """The two URLs duejobs needs. Writing schedules needs only the database; the scheduler,
    the workers and the reconciler need Redis too (:meth:`require_redis`)."""

    database_url: str
    redis_url: str | None

    @classmethod
    def from_env(cls, database_url: str | None = None, redis_url: str | None = None) -> Settings:
        """Explicit arguments first, then the environment; no database URL is a clear error."""
        db = database_url or os.environ.get(DATABASE_ENV)
        if not db:
            raise ConfigurationError(
                f"{DATABASE_ENV} is not set: pass App(database_url=...) or set the variable "
                "(only the duejobs CLI and test suite start embedded servers when it is unset)"
            )
        return cls(
            database_url=sqlalchemy_url(db), redis_url=redis_url or os.environ.get(REDIS_ENV)
        )

    def require_redis(self) -> str:
        """The Redis URL, or :class:`ConfigurationError` naming the variable."""
        if not self.redis_url:
            raise ConfigurationError(
                f"{REDIS_ENV} is not set: pass App(redis_url=...) or set the variable"
            )
        return self.redis_url
