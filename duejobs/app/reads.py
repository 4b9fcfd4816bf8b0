"""The App's reads: a schedule, its history and attempts, pages of schedules by filter, and
the database's clock. Each runs in the caller's transaction (``conn=``) or one of its own,
each statement then stopped past the App's ``read_timeout``; the lists, without ``conn=``, on
the read replica when there is one (:mod:`duejobs.observability.replica`), saying how
current they are."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.app.scope import ScheduleId, Scoped, schedule_id_of
from duejobs.core import Conn
from duejobs.errors import InvalidListError, ScheduleNotFoundError
from duejobs.models import Attempt, Event, Page, Schedule, Status
from duejobs.observability import replica
from duejobs.observability.replica import Freshness
from duejobs.validation import (
    DEFAULT_TENANT,
    check_due_range,
    check_key,
    check_list_limit,
    check_queue,
    check_statuses,
    check_type,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection


def _position(cursor: object) -> store.Position:
    """Where a list resumes: the cursor a page handed out."""
    try:
        if not isinstance(cursor, str):
            raise TypeError(cursor)
        return store.Position.decode(cursor)
    except (TypeError, ValueError, OverflowError):
        raise InvalidListError(
            f"after must be a cursor from a page's next_cursor, got {cursor!r}"
        ) from None


# The most events ``history(id)`` returns whole; a longer history is read a page at a time.
MAX_WHOLE_HISTORY = 10_000


class ReadAPI(Scoped):
    """What the App reads."""

    def get(self, schedule_id: ScheduleId, *, conn: Conn | None = None) -> Schedule | None:
        """The schedule as stored now, or None (also for another tenant's id)."""
        sid = schedule_id_of(schedule_id)
        with self._reading(conn, current=True) as (c, _):
            return store.get_schedule(c, sid, self._tenant)

    def history(
        self,
        schedule_id: ScheduleId,
        *,
        newest: int | None = None,
        before: int | None = None,
        conn: Conn | None = None,
    ) -> list[Event]:
        """The schedule's events, oldest first — at most :data:`MAX_WHOLE_HISTORY` of them: a
        longer history is refused (:class:`~duejobs.errors.InvalidListError`) rather than read
        whole. With ``newest``: a page of that many of the latest, newest first, before the
        event id ``before`` (the last id of the page before): a long history read a page at a
        time."""
        sid = schedule_id_of(schedule_id)
        size = None if newest is None else check_list_limit(newest)
        if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
            raise InvalidListError(f"before must be an event id (an int), got {before!r}")
        with self._reading(conn, current=True) as (c, _):
            if size is not None:
                return store.history(c, sid, self._tenant, size, before)
            latest = store.history(c, sid, self._tenant, MAX_WHOLE_HISTORY + 1, before)
        if len(latest) > MAX_WHOLE_HISTORY:
            raise InvalidListError(
                f"schedule {sid} has more than {MAX_WHOLE_HISTORY:,} events: read them a page "
                "at a time (history(id, newest=1000), then before= the last id of each page)"
            )
        return latest[::-1]

    def list(
        self,
        *,
        status: Status | str | Iterable[Status | str] | None = None,
        type: str | None = None,
        tenant: str | None = None,
        key: str | None = None,
        queue: str | None = None,
        due_from: datetime | None = None,
        due_before: datetime | None = None,
        recurring: str | None = None,
        limit: int = 50,
        after: str | None = None,
        latest_first: bool = False,
        conn: Conn | None = None,
    ) -> Page:
        """A page of schedules that every filter given keeps, in ``(due_at, id)`` order
        (``latest_first``: the reverse), starting after the cursor ``after`` (a page's
        ``next_cursor``).

        Filters: ``status`` (one or several), ``type``, ``key`` (finished schedules too; of
        the default tenant when the unscoped App names none, as :meth:`get_by_key`),
        ``queue``, ``due_from`` ≤ due_at < ``due_before``, ``recurring`` (the occurrences of
        the recurring definition of that name). ``tenant``: a scoped App lists its own tenant
        only; the unscoped App lists every tenant unless one is named. Each filter is served
        by an index (migrations 0007 and 0011), so a page costs about its own size on any table.
        Refused with :class:`~duejobs.errors.InvalidListError` (or the check of the field
        named): a limit outside 1 to 1000, an unknown status, a naive or reversed range, a cursor
        this method did not hand out."""
        owner = self._read_tenant(tenant)
        if key is not None and owner is None:  # keys are per tenant, as in get_by_key
            owner = DEFAULT_TENANT
        kept = store.ListFilter(
            tenant=owner,
            statuses=check_statuses(status),
            type=None if type is None else check_type(type),
            key=None if key is None else check_key(key),
            queue=None if queue is None else check_queue(queue),
            due_from=due_from,
            due_before=due_before,
            recurring=None if recurring is None else check_type(recurring),
        )
        check_due_range(due_from, due_before)
        size = check_list_limit(limit)
        start = None if after is None else _position(after)
        with self._reading(conn) as (c, fresh):
            rows = store.list_schedules(c, kept, start, size + 1, latest_first)
        more = len(rows) > size
        page = rows[:size]
        last = page[-1] if more else None
        cursor = None if last is None else store.Position(last.due_at, last.id).encode()
        return Page(page, cursor, fresh)

    @contextlib.contextmanager
    def _reading(
        self, conn: Conn | None, *, current: bool = False
    ) -> Iterator[tuple[Connection, Freshness]]:
        """An operator's read: on the caller's connection (as current as it is), else where
        :meth:`Core.reading` sends it — the read replica, when there is one, unless
        ``current`` (one schedule's row, history or attempts: the primary, under
        ``read_timeout``, so that a lock a migration holds stops it, saying so)."""
        if conn is not None:
            with self._core.transaction(conn) as c:
                yield c, replica.CURRENT
        else:
            with self._core.reading(current=current) as read:
                yield read

    def attempts(
        self, schedule_id: ScheduleId, *, newest: int | None = None, conn: Conn | None = None
    ) -> builtins.list[Attempt]:
        """The schedule's attempts (every version's), oldest first: who ran each, how it
        ended, its error. With ``newest``: that many of the latest, newest first."""
        sid = schedule_id_of(schedule_id)
        size = None if newest is None else check_list_limit(newest)
        with self._reading(conn, current=True) as (c, _):
            return store.attempts(c, sid, self._tenant, size)

    def is_past_deadline(self, schedule_id: ScheduleId, *, conn: Conn | None = None) -> bool:
        """Whether the database clock has reached the schedule's ``run_at``.

        For endpoints that must enforce a deadline themselves (an auction close, a
        reservation expiry) instead of trusting that a job ran on time.
        """
        sid = schedule_id_of(schedule_id)
        with self._core.transaction(conn) as c:
            past = store.is_past_run_at(c, sid, self._tenant)
        if past is None:
            raise ScheduleNotFoundError(f"no schedule {sid}")
        return past

    def now(self) -> datetime:
        """The database's current time (UTC)."""
        with self._core.transaction(None) as c:
            return store.database_now(c)
