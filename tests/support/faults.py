"""Connections ended under the worker, as ``idle_session_timeout``, a pooler's restart, a
failover or an administrator end them: by PostgreSQL itself (``pg_terminate_backend``), at a
chosen step.

- :func:`end_idle_connections`: every other idle session on the test database ends now (a
  worker's connections parked between steps).
- :func:`end_session_in`: the session that runs a chosen change ends in the middle of that
  statement, once (its transaction never commits): a trigger that terminates its own backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import Connection, Engine, text

# Each ended session waited for (up to 5 s): the fault has happened when the caller goes on,
# however slowly a loaded machine's backends exit.
_END_IDLE = text(
    "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'idle'"
)


def end_idle_connections(conn: Connection) -> int:
    """End every other idle session on ``conn``'s database; how many were ended."""
    return int(conn.execute(_END_IDLE).scalar_one())


@contextlib.contextmanager
def end_session_in(engine: Engine, table: str, when: str) -> Iterator[None]:
    """While the block runs, the first session whose UPDATE of ``table`` changes a row so that
    ``when`` holds (a condition on OLD and NEW) is ended in that statement; later ones are
    not. ``table`` and ``when`` are the test's own text, never input."""
    with engine.begin() as conn:
        # A sequence counts the statements met: it is not rolled back with them.
        conn.execute(text("DROP SEQUENCE IF EXISTS test_ended"))
        conn.execute(text("CREATE SEQUENCE test_ended"))
        conn.execute(
            text(
                """
                CREATE OR REPLACE FUNCTION test_end_session() RETURNS trigger
                LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('test_ended') = 1 THEN
                        PERFORM pg_terminate_backend(pg_backend_pid());
                    END IF;
                    RETURN NEW;
                END $$
                """
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER test_end_session BEFORE UPDATE ON {table} FOR EACH ROW "
                f"WHEN ({when}) EXECUTE FUNCTION test_end_session()"
            )
        )
    try:
        yield
        with engine.connect() as conn:
            met = conn.execute(text("SELECT last_value, is_called FROM test_ended")).one()
        assert met.is_called, f"no UPDATE of {table} where {when}: nothing was ended"
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER IF EXISTS test_end_session ON {table}"))
