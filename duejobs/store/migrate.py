"""Creating and upgrading duejobs' schema (``duejobs migrate``).

Promises: idempotent (running it at head changes nothing) and safe when several processes
run it at once — each upgrade runs in one transaction holding a transaction-scoped advisory
lock, so a second migrator waits, then finds the schema already at head. PostgreSQL's
transactional DDL means a failed upgrade leaves the previous revision intact.

Revisions live in ``migrations/`` (installed as ``duejobs.migrations``); the revision table is
``duejobs_alembic_version`` so it never meets the application's own Alembic history.
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from duejobs import store
from duejobs.store.partitions import Partitioning

if TYPE_CHECKING:
    from sqlalchemy import Engine

VERSION_TABLE = "duejobs_alembic_version"
# An arbitrary, fixed advisory-lock key shared by every duejobs migrator.
_LOCK_KEY = 0x6475656A6F6273  # "duejobs"


def alembic_config() -> Config:
    """An Alembic config pointing at the packaged revisions."""
    config = Config()
    config.set_main_option("script_location", str(files("duejobs.migrations")))
    return config


def head_revision() -> str | None:
    """The newest revision this version of duejobs knows."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _schema(engine: Engine) -> str:
    """The schema of duejobs' tables the engine was made for (``public`` by default)."""
    schema: str = engine.get_execution_options().get(store.SCHEMA_OPTION, "public")
    return schema


def _options(schema: str) -> dict[str, str | None]:
    """Alembic's options: its revision table beside duejobs' tables."""
    return {"version_table": VERSION_TABLE, "version_table_schema": _table_schema(schema)}


def _table_schema(schema: str) -> str | None:
    return None if schema == "public" else schema


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None when duejobs was never migrated there)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts=_options(_schema(engine)))
        return context.get_current_revision()


def upgrade(
    engine: Engine, revision: str = "head", *, partitioned: Partitioning | None = None
) -> tuple[str | None, str | None]:
    """Bring the schema to ``revision``; returns (revision before, revision after). Outside
    ``public``, the schema is created first and the revisions run with it first on the
    ``search_path``. With ``partitioned``, tables still empty are then made partitioned (see
    :mod:`duejobs.services.partition_maintenance`) in the same transaction; filled ones are left to
    :func:`duejobs.services.partition_maintenance.convert`."""
    config = alembic_config()
    schema = _schema(engine)
    with engine.begin() as conn:
        store.advisory_lock(conn, _LOCK_KEY)
        if schema != "public":
            store.use_schema(conn, schema)
        before = MigrationContext.configure(conn, opts=_options(schema)).get_current_revision()
        config.attributes["connection"] = conn
        config.attributes["version_table_schema"] = _table_schema(schema)
        command.upgrade(config, revision)
        if partitioned is not None and store.partitioning(conn) is None:
            store.make_partitioned(conn, partitioned, store.database_now(conn))
        after = MigrationContext.configure(conn, opts=_options(schema)).get_current_revision()
    return before, after
