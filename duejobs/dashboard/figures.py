"""The overview's figures: read at most once per refresh whoever asks, and the start-lag
chart drawn as SVG markup."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from duejobs import App, store
from duejobs.errors import DuejobsError, describe, outage
from duejobs.redis_urls import redis_failures
from duejobs.services import stats
from duejobs.store import dbapi

log = logging.getLogger("duejobs.dashboard")


class Figures:
    """The overview's figures, read at most once per ``refresh`` seconds whoever asks: they
    count every live schedule, which on a big table takes longer than a page should.

    A page asking for figures older than ``refresh`` gets them at once while one thread reads
    them again; figures older than three times ``refresh`` (nobody looked for a while: the
    first view after a pause, often the moment of an incident) are read again before the
    page is answered, as the very first are — one read at a time, whoever asks: the others get
    the last figures at once, or, with none yet, what that one read. A read that failed is
    said on the page, with its error, beside the figures it could not replace; old figures are
    never shown as if reading them again were failing when it is not."""

    def __init__(self, app: App, refresh: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._app, self._refresh, self._clock = app, refresh, clock
        self._lock = threading.Lock()
        self._one_read = threading.Lock()  # held by the one read of the figures under way
        self._current: tuple[stats.Stats, LagChart] | None = None
        self._read_at = 0.0
        self._reading = False
        self._failed: str | None = None  # why the last read failed, until one succeeds

    def read(self) -> Reading:
        """The figures, their chart, how old they are and, if reading them again failed,
        why."""
        with self._lock:
            current, age = self._current, self._clock() - self._read_at
            wait = current is None or age > 3 * self._refresh
            start = not wait and age >= self._refresh and not self._reading
            if start:
                self._reading = True
        if wait:
            return self._read_now(current, age)
        assert current is not None
        if start:
            threading.Thread(target=self._refresh_in_background, daemon=True).start()
        return Reading(*current, age, self._failed)

    def _read_now(self, current: tuple[stats.Stats, LagChart] | None, age: float) -> Reading:
        """Figures read before the page answers, one read at a time: a page arriving while one
        is under way gets the last figures there are at once — with none yet, it waits for that
        read and shows what it read (ten first views made ten reads of a minute and more)."""
        if not self._one_read.acquire(blocking=current is None):
            assert current is not None
            return Reading(*current, age, self._failed)
        try:
            with self._lock:
                got, read_at = self._current, self._read_at
            if got is not None and self._clock() - read_at < self._refresh:  # read meanwhile
                return Reading(*got, self._clock() - read_at, self._failed)
            try:
                return Reading(*self._read(), 0.0, None)
            except Exception as exc:
                if not isinstance(exc, (DuejobsError, dbapi.SQLAlchemyError, *redis_failures())):
                    raise
                if current is None:
                    raise  # nothing to show: the page says what is unavailable
                return Reading(*current, age, self._failed)
        finally:
            self._one_read.release()

    def _refresh_in_background(self) -> None:
        if not self._one_read.acquire(blocking=False):  # a page's read is under way
            with self._lock:
                self._reading = False
            return
        try:
            self._read()
        except Exception as exc:  # kept and shown on the page (``_read``); the thread ends
            said = outage(exc)  # an outage is one line; anything else its traceback
            if said is not None:
                log.warning("reading the dashboard's figures failed: %s", said)
            else:
                log.warning("reading the dashboard's figures failed", exc_info=True)
        finally:
            self._one_read.release()

    def _read(self) -> tuple[stats.Stats, LagChart]:
        try:
            figures = stats.collect(self._app)
            chart = LagChart.of(stats.lag_over_time(self._app), figures.at, figures.since)
        except Exception as exc:
            with self._lock:
                self._failed = outage(exc) or describe(exc)  # an outage names its service
            raise
        finally:
            with self._lock:
                self._reading = False
        with self._lock:
            self._current, self._read_at, self._failed = (figures, chart), self._clock(), None
        return figures, chart


@dataclass(frozen=True)
class Reading:
    """The overview's figures as a page gets them."""

    figures: stats.Stats
    chart: LagChart
    age: float  # seconds since they were read
    failed: str | None  # why reading them again failed, if it did


@dataclass(frozen=True)
class LagChart:
    """The start lag over the last hour as SVG (p50 and p99 lines, a dot per minute): drawn
    by the browser from the page's markup, no script."""

    p50: list[tuple[float, float]]
    p99: list[tuple[float, float]]
    top_ms: float
    starts: int
    width: int = 720
    height: int = 160

    @classmethod
    def of(cls, points: list[store.LagPoint], now: datetime, span: timedelta) -> LagChart:
        top = max([p.p99_ms for p in points] + [1.0])
        start = now - span

        def line(value: Callable[[store.LagPoint], float]) -> list[tuple[float, float]]:
            return [
                (
                    round((p.at - start) / span * cls.width, 1),
                    round(cls.height - 4 - value(p) / top * (cls.height - 8), 1),  # 4 px margin
                )
                for p in points
            ]

        return cls(
            line(lambda p: p.p50_ms), line(lambda p: p.p99_ms), top, sum(p.starts for p in points)
        )


# Rows of each of the overview's tables per page: with 20,000 tenants the page stays small.
ROWS = 25
# Recurring definitions on the recurring page: the first ones by tenant and name, the page
# saying so beyond (``?tenant=`` narrows to one tenant's).
RECURRING_ROWS = 500


@dataclass(frozen=True)
class Shown:
    """What the overview's tables show of the figures: the types and the tenants that need
    an operator first (late, overdue, failing), one page of them, those matching a search."""

    live_types: list[store.LiveFigures]
    live_tenants: list[store.LiveFigures]
    recent_types: list[store.Activity]
    recent_tenants: list[store.Activity]
    types: int  # the types there are, shown or not
    tenants: int  # the tenants the search kept, over every page
    page: int
    pages: int
    # The rate limits set, then the busiest tenants under the default, ``ROWS`` at most, each
    # with the rows waiting on it (None for the default itself); and how many were left out.
    rate_limits: list[tuple[store.RateLimit, int | None]] = field(default_factory=list)
    rate_limits_left: int = 0

    @classmethod
    def of(cls, figures: stats.Stats, search: str, page: int) -> Shown:
        live = [f for f in figures.live if f.type is None and f.tenant and search in f.tenant]
        recent = [a for a in figures.activity if a.type is None and a.tenant]
        recent = [a for a in recent if search in (a.tenant or "")]
        live.sort(key=lambda f: (-f.late, -f.overdue, -f.in_flight, -f.scheduled, f.tenant))
        recent.sort(key=_trouble)
        tenants = len({f.tenant for f in live} | {a.tenant for a in recent})
        pages = max(1, -(-max(len(live), len(recent)) // ROWS))
        page = min(max(page, 1), pages)
        start = (page - 1) * ROWS
        live_types = [f for f in figures.live if f.tenant is None and f.type is not None]
        live_types.sort(key=lambda f: (-f.late, -f.overdue, -f.scheduled, f.type or ""))
        recent_types = [a for a in figures.activity if a.tenant is None and a.type is not None]
        recent_types.sort(key=_trouble)
        types = len({f.type for f in live_types} | {a.type for a in recent_types})
        limits = _busiest_limits(figures)
        return cls(
            live_types[:ROWS],
            live[start : start + ROWS],
            recent_types[:ROWS],
            recent[start : start + ROWS],
            types,
            tenants,
            page,
            pages,
            limits[:ROWS],
            max(0, len(limits) - ROWS),
        )


def _busiest_limits(figures: stats.Stats) -> list[tuple[store.RateLimit, int | None]]:
    """The limits set, then the tenants under the default, busiest first; each with the rows
    of its queue or tenant waiting on a limit."""
    waiting: dict[tuple[str, str], int] = {}
    for w in figures.waiting_on_limits:
        if w.queue is not None:
            waiting["queue", w.queue] = w.waiting
        elif w.tenant is not None:
            waiting["tenant", w.tenant] = w.waiting
    limits = figures.rate_limits or []
    followers = sorted((r for r in limits if r.follows_default), key=lambda r: -(r.use or 0))
    return [
        (r, None if r.recent_starts is None else waiting.get((r.scope, r.name), 0))
        for r in [*(r for r in limits if not r.follows_default), *followers]
    ]


def _trouble(a: store.Activity) -> tuple[float, ...]:
    """Failures first, then retries, then the slowest to start."""
    return (
        -a.counts.get("failed", 0),
        -a.counts.get("retried", 0),
        -(a.lag_ms.get("p99") or 0.0),
        -a.counts.get("started", 0),
    )
