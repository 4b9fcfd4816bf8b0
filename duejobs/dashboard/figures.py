"""The overview's figures: read at most once per refresh whoever asks, and the start-lag
chart drawn as SVG markup."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from duejobs import App, stats, store


class Figures:
    """The overview's figures, read at most once per ``refresh`` seconds whoever asks: they
    count every live schedule, which on a big table takes longer than a page should. A page
    asking for figures older than that gets them at once (they say when they were read) while
    one thread reads them again; only the very first page waits."""

    def __init__(self, app: App, refresh: int) -> None:
        self._app, self._refresh = app, refresh
        self._lock = threading.Lock()
        self._current: tuple[stats.Stats, LagChart] | None = None
        self._read_at = 0.0
        self._reading = False

    def read(self) -> tuple[stats.Stats, LagChart, float]:
        """The figures, their chart, and how many seconds ago they were read."""
        with self._lock:
            current, stale = self._current, time.monotonic() - self._read_at >= self._refresh
            start = current is not None and stale and not self._reading
            if start:
                self._reading = True
        if current is None:
            return (*self._read(), 0.0)
        if start:
            threading.Thread(target=self._read, name="duejobs-dashboard", daemon=True).start()
        return (*current, time.monotonic() - self._read_at)

    def _read(self) -> tuple[stats.Stats, LagChart]:
        try:
            figures = stats.collect(self._app)
            chart = LagChart.of(stats.lag_over_time(self._app), figures.at, figures.since)
            with self._lock:
                self._current, self._read_at = (figures, chart), time.monotonic()
            return figures, chart
        finally:
            with self._lock:
                self._reading = False


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
