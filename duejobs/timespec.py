"""Turning what a caller says about *when* into an instant, with DST handled on purpose.

Rules (documented in the README, relied upon by tests):

* ``delay`` is relative to the **database's** ``now()``; this module only validates it.
* An aware ``run_at`` is that instant; it is stored in UTC. If ``timezone`` is also given it is
  kept as the schedule's original zone, but the instant is not reinterpreted.
* A naive ``run_at`` needs ``timezone``: it is a wall time in that zone.

  - **Gap** (spring forward, the wall time does not exist): the schedule runs at the first
    valid instant after the gap, i.e. the moment the clocks jump (02:30 in a 02:00→03:00 gap
    runs at 03:00 local).
  - **Overlap** (fall back, the wall time happens twice): the schedule runs once, at the
    first occurrence (``fold=0``, the earlier instant).
* An aware ``run_at`` whose ``tzinfo`` is a ``ZoneInfo`` keeps that zone and its wall time as
  the original intent, as ``timezone=`` does.
* ``jitter`` delays a schedule past ``run_at`` by a fixed share of it drawn from the schedule's
  own id (:func:`jitter_offset`): never before the intended instant, and the same on every
  re-push, reconcile or reschedule.

One rule for range: every instant lies in ``[EARLIEST, LATEST)`` and every duration (delay,
jitter, expiry, grace, backoff, timeout) is at most ``MAX_DURATION``, so every time derived
from them — ``due_at`` with jitter, a retry's backoff, an expiry, the reconciler's paging —
stays inside what Python and PostgreSQL represent. Anything else is a
:class:`~duejobs.errors.TimeSpecError` naming the field.
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from duejobs.errors import (
    NaiveDatetimeError,
    NegativeDelayError,
    TimeSpecError,
    UnknownTimezoneError,
)
from duejobs.ids import random_share

EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
MAX_DURATION = timedelta(days=36_500)  # 100 years
_MAX_SECONDS = MAX_DURATION.total_seconds()


class When(NamedTuple):
    """A validated time request: a delay from the database clock, or an absolute instant.

    Immutable, and cheap to build (one per row of a bulk insert)."""

    delay: timedelta | None
    run_at: datetime | None
    timezone: str | None
    local_run_at: datetime | None


def zone(name: object) -> ZoneInfo:
    """The ``ZoneInfo`` for an IANA name, or :class:`UnknownTimezoneError`."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise UnknownTimezoneError(
            f"timezone must be an IANA name like 'Europe/Berlin', got {name!r}"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise UnknownTimezoneError(f"unknown timezone {name!r}") from exc


def as_delay(delay: object, name: str = "delay") -> timedelta:
    """A non-negative ``timedelta`` from a timedelta or a number of seconds."""
    if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
        raise TimeSpecError(f"{name} must be a timedelta or seconds, got {type(delay).__name__}")
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise NegativeDelayError(f"{name} must be a finite number of seconds, got {delay!r}")
    if seconds < 0:
        raise NegativeDelayError(f"{name} must not be negative, got {seconds} seconds")
    if seconds > _MAX_SECONDS:
        raise TimeSpecError(f"{name} must be at most 100 years, got {seconds:g} seconds")
    return delay if isinstance(delay, timedelta) else timedelta(seconds=seconds)


def _in_range(instant: datetime, name: str) -> datetime:
    if not EARLIEST <= instant < LATEST:
        raise TimeSpecError(
            f"{name} must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC), "
            f"got {instant.isoformat()}"
        )
    return instant


def local_to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of a naive wall time in ``tz``, applying the module's DST rules."""
    early = wall.replace(tzinfo=tz, fold=0)
    utc = early.astimezone(UTC)
    if utc.astimezone(tz).replace(tzinfo=None) == wall:
        return utc  # exists (fold=0 is the first occurrence when it exists twice)
    # In a gap: fold=0 reads the wall time with the offset before the jump, fold=1 with the
    # offset after it, so the jump lies between the two instants. Transitions fall on whole
    # seconds in the tz database: bisect over seconds for the first one with the new offset.
    low = int(wall.replace(tzinfo=tz, fold=1).timestamp())
    high = int(utc.timestamp())
    low, high = min(low, high), max(low, high)
    after = datetime.fromtimestamp(high, tz).utcoffset()
    while high - low > 1:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == after:
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, UTC)


def parse_when(*, delay: object = None, run_at: object = None, timezone: object = None) -> When:
    """Validate a caller's ``delay`` / ``run_at`` / ``timezone`` into a :class:`When`."""
    if (delay is None) == (run_at is None):
        raise TimeSpecError("give exactly one of delay= or run_at=")
    tz_name = None
    tz = None
    if timezone is not None:
        tz = zone(timezone)
        tz_name = str(timezone)
    if delay is not None:
        return When(as_delay(delay), None, tz_name, None)
    if not isinstance(run_at, datetime):
        raise TimeSpecError(f"run_at must be a datetime, got {type(run_at).__name__}")
    if run_at.tzinfo is not None and run_at.utcoffset() is not None:
        try:
            instant = _in_range(run_at.astimezone(UTC), "run_at")
        except OverflowError:
            raise TimeSpecError(f"run_at {run_at.isoformat()} is out of range") from None
        own = run_at.tzinfo.key if isinstance(run_at.tzinfo, ZoneInfo) else None
        if own is not None and tz_name in (None, own):  # the zone came with the datetime
            return When(None, instant, own, run_at.replace(tzinfo=None, fold=0))
        return When(None, instant, tz_name, None)
    if tz is None:
        raise NaiveDatetimeError(
            f"run_at {run_at.isoformat()} is naive: pass an aware datetime or timezone='Area/City'"
        )
    _in_range(run_at.replace(tzinfo=UTC), "run_at")  # a wall time: a day's margin each side
    return When(None, local_to_utc(run_at, tz), tz_name, run_at)


_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|d|h|m|s))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")


def parse_duration(text: str, name: str = "duration") -> timedelta:
    """``"90"`` (seconds), ``"250ms"``, ``"45s"``, ``"30m"``, ``"1h30m"``, ``"2d"`` →
    timedelta: the one syntax of every duration flag of the CLI."""
    spec = text.strip().lower()
    if not spec:
        raise TimeSpecError(f"{name}: empty duration")
    if re.fullmatch(r"[-+]?\d+(?:\.\d+)?", spec):
        return as_delay(float(spec), name)
    if not _DURATION.fullmatch(spec):
        raise TimeSpecError(
            f"{name}: cannot read duration {text!r}: use e.g. 250ms, 45s, 30m, 1h30m, 2d"
        )
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(spec))
    return as_delay(seconds, name)


def spell_duration(value: timedelta) -> str:
    """A duration as :func:`parse_duration` reads it back (``15m``, ``1h30m``, ``100ms``,
    ``0.25ms``): how the CLI shows the defaults it takes from the services' configs, and
    passes a worker's knobs on to the processes it supervises."""
    us = value // timedelta(microseconds=1)
    if us == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000)):
        count, us = divmod(us, size)
        if count:
            parts.append(f"{count}{unit}")
    seconds, us = divmod(us, 1_000_000)
    if seconds:
        parts.append(f"{seconds}s")
    if us:
        parts.append(f"{us / 1000:f}".rstrip("0").rstrip(".") + "ms")
    return "".join(parts)


def jitter_offset(schedule_id: uuid.UUID, jitter: timedelta) -> timedelta:
    """How far past ``run_at`` a schedule with ``jitter`` is due: a fixed share of it drawn
    from the schedule's own id, spread over ``[0, jitter)``."""
    return jitter * random_share(schedule_id) if jitter else jitter
