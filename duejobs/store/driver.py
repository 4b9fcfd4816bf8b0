"""The first import of psycopg, before any module of the store uses it: psycopg installed
without a libpq (the plain ``psycopg`` requirement brings none) fails here with
:class:`~duejobs.errors.DriverMissingError`, whose message says how to get one, instead of
psycopg's own error from wherever it happened to be imported first."""

from __future__ import annotations

from duejobs.errors import DriverMissingError

try:
    import psycopg  # noqa: F401
except ImportError as missing:
    raise DriverMissingError.from_import(missing) from missing
