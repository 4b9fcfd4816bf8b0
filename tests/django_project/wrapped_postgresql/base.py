"""A project's own database engine over PostgreSQL, as PostGIS and instrumentation wrappers
are: duejobs judges the backend by its vendor and accepts it."""

from django.db.backends.postgresql.base import DatabaseWrapper as PostgreSQLWrapper


class DatabaseWrapper(PostgreSQLWrapper):
    """PostgreSQL under another engine name."""
