"""Alembic environment for duejobs' own tables.

duejobs lives in the application's database, so its revision table is
``duejobs_alembic_version``: it never collides with the application's own Alembic history.
``duejobs migrate`` (see ``duejobs/store/migrate.py``) passes an open connection, inside a
transaction that holds an advisory lock; run standalone, the environment connects to
``DUEJOBS_DATABASE_URL``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, create_engine

VERSION_TABLE = "duejobs_alembic_version"


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=context.config.attributes.get("version_table_schema"),
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    if context.is_offline_mode():
        context.configure(url="postgresql://", literal_binds=True, version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from duejobs.config import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(os.environ["DUEJOBS_DATABASE_URL"]))
    with engine.begin() as conn:
        _run(conn)


main()
