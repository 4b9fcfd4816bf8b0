"""The rate limits' figures in ``duejobs stats`` and the gauges: rows waiting on a limit, and
each limit's use.

* **waiting**: rows a limit turned back that wait for the time it gave them — overall, per
  queue and per tenant — and how long the one waiting longest has been due
  (:func:`duejobs.store.waiting_on_limits`);
* **use**: each limit's starts over the last period against its N — the queues', the
  tenants' own, and the count of each tenant that follows the default
  (:func:`duejobs.store.rate_limits`, estimated from two fixed windows the claim keeps).

Gauges: ``duejobs_rate_limit_waiting{scope,name}``, ``duejobs_rate_limit_oldest_wait_seconds``
and ``duejobs_rate_limit_use_ratio{scope,name}``. Tenants are named up to a limit — those
with the most waiting, the busiest — the rest go to ``other`` (summed for the waiting rows;
the busiest of them for the use, so that a saturated tenant among them still shows). A series
whose queue or tenant has nothing to show any more is removed, not left at its last value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from prometheus_client import Gauge

from duejobs import store
from duejobs.observability import metrics
from duejobs.terminal import printable


def waiting_lines(waiting: Sequence[store.Waiting], longest: float) -> list[str]:
    """Rows waiting on a rate limit, when any does: overall, then each queue and tenant."""
    if not waiting:
        return []
    of = [
        f"queue {w.queue} {w.waiting}" if w.queue is not None else f"tenant {w.tenant} {w.waiting}"
        for w in waiting
        if w.queue != w.tenant
    ]
    total = sum(w.waiting for w in waiting if w.queue == w.tenant)
    return [
        f"  waiting on a rate limit {total:>6}   longest "
        f"{longest:,.1f} s   ({printable(', '.join(of))})"
    ]


def use_lines(limits: Sequence[store.RateLimit]) -> list[str]:
    """Each limit's use over the last period, when any limit is set."""
    if not limits:
        return []
    rows = []
    for r in limits:
        name = printable(r.name) + (" (default)" if r.follows_default else "")
        if r.recent_starts is None:
            use = "each tenant counts its own"
        else:
            use = f"{r.recent_starts} of {r.rate.count} ({r.use:.0%})"
        rows.append(f"    {r.scope} {name}: at most {r.rate}, {use}")
    return ["  rate limits, starts over the last period:", *rows]


def as_dicts(limits: Sequence[store.RateLimit]) -> list[dict[str, object]]:
    """The limits and their use, JSON-ready (``duejobs stats --json``)."""
    return [
        {
            "scope": r.scope,
            "name": r.name,
            "rate": str(r.rate),
            "max_starts": r.rate.count,
            "period_seconds": r.rate.period.total_seconds(),
            "follows_default": r.follows_default,
            "recent_starts": r.recent_starts,
            "use": r.use,
        }
        for r in limits
    ]


class _Shown:
    """The label sets a gauge was given at the last snapshot: those missing from the next
    one are removed."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge, self._labels = gauge, set[tuple[str, str]]()

    def show(self, values: dict[tuple[str, str], float]) -> None:
        for labels, value in values.items():
            self._gauge.labels(*labels).set(value)
        for labels in self._labels - values.keys():
            with contextlib.suppress(KeyError):
                self._gauge.remove(*labels)
        self._labels = set(values)


_waiting = _Shown(metrics.RATE_WAITING)
_use = _Shown(metrics.RATE_USE)


def observe(
    waiting: Sequence[store.Waiting],
    longest: float,
    limits: Sequence[store.RateLimit] | None,
    named: int,
) -> None:
    """Set the rate limits' gauges from one snapshot, ``named`` tenants at most by name."""
    values: dict[tuple[str, str], float] = {("all", metrics.ALL): 0.0}
    tenants = sorted(
        (w for w in waiting if w.tenant is not None and w.queue is None),
        key=lambda w: (-w.waiting, w.tenant),
    )
    for w in waiting:
        if w.queue is None and w.tenant is None:
            values["all", metrics.ALL] = w.waiting
        elif w.queue is not None:
            values["queue", w.queue] = w.waiting
    for rank, w in enumerate(tenants):
        assert w.tenant is not None
        name = metrics.spelled(w.tenant) if rank < named else metrics.OTHER
        values["tenant", name] = values.get(("tenant", name), 0.0) + w.waiting
    _waiting.show(values)
    metrics.RATE_OLDEST_WAIT.set(longest)
    if limits is not None:
        _use.show(_use_values(limits, named))


def _use_values(limits: Sequence[store.RateLimit], named: int) -> dict[tuple[str, str], float]:
    used = [r for r in limits if r.use is not None]
    values = {("queue", r.name): float(r.use or 0) for r in used if r.scope == "queue"}
    tenants = sorted(
        (r for r in used if r.scope == "tenant"), key=lambda r: (-(r.use or 0), r.name)
    )
    for rank, r in enumerate(tenants):
        name = metrics.spelled(r.name) if rank < named else metrics.OTHER
        values["tenant", name] = max(values.get(("tenant", name), 0.0), float(r.use or 0))
    return values
