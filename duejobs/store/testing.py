"""Testing users' handlers (:mod:`duejobs.testing`): the schedules' clock moved forward, the
wait for the next one, and every table emptied between two tests."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from duejobs.store.execution import run, run_one
from duejobs.store.partitions import partitioning

if TYPE_CHECKING:
    from sqlalchemy import Connection


def advance_live(conn: Connection, by: timedelta) -> None:
    """Move every live schedule's times ``by`` earlier: for duejobs, the clock moving on."""
    run(conn, "advance_live", {"by": by})


def next_due_in(conn: Connection) -> timedelta | None:
    """How long until the next scheduled row is due (negative: overdue); None if none is."""
    row = run_one(conn, "next_due_in")
    return None if row is None else row.wait


def empty_tables(conn: Connection) -> None:
    """Every schedule, history, definition and quota gone (partitioned mode's settings and
    partitions kept)."""
    run(conn, "empty_tables")
    if partitioning(conn) is not None:
        run(conn, "empty_keys")
