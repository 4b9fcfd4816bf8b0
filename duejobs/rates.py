"""Rate limits as callers write them: ``"N/s"``, ``"N/m"``, ``"N/h"``.

A :class:`Rate` of N per period means: in any window one period long, at most N attempts
start, plus one (the tolerance one start may have, so that starts a hair early by the
database clock are not turned back). The worker counts them as they start
(:mod:`duejobs.store.rate_limits`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from duejobs.errors import InvalidRateError

PERIODS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}
_UNIT = {period: unit for unit, period in PERIODS.items()}
# More starts a second than any worker fleet makes: a limit above it is a typo.
MOST_PER_SECOND = 1_000_000
MOST_PER_PERIOD = 2**31 - 1  # what the count's column holds
_RATE = re.compile(r"([0-9]{1,10})/([smh])")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any window of ``period`` (one more at its edge); one made
    otherwise than by :func:`parse_rate` is checked as it is made."""

    count: int
    period: timedelta

    def __post_init__(self) -> None:
        if self.period not in _UNIT:
            raise InvalidRateError(f"a rate's period is a second, a minute or an hour, got {self}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise InvalidRateError(f"a rate allows at least 1 start a period, got {self}")
        if self.count > MOST_PER_PERIOD:
            raise InvalidRateError(f"{self} is above {MOST_PER_PERIOD:,} starts a period")
        if self.count / self.period.total_seconds() > MOST_PER_SECOND:
            raise InvalidRateError(f"{self} is above {MOST_PER_SECOND:,} starts a second")

    def __str__(self) -> str:
        return f"{self.count}/{_UNIT.get(self.period, self.period)}"

    @property
    def every(self) -> timedelta:
        """The interval between starts at this rate, rounded up to the microsecond (rounded
        down, a window of one period could hold a start more than the limit allows)."""
        micros = self.period // timedelta(microseconds=1)
        return timedelta(microseconds=-(-micros // self.count))


def parse_rate(value: object, name: str = "rate") -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N a whole number from 1) as a :class:`Rate`; anything
    else raises :class:`~duejobs.errors.InvalidRateError` naming ``name`` and the value."""
    if isinstance(value, Rate):
        return value
    found = _RATE.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise InvalidRateError(
            f"{name} must be 'N/s', 'N/m' or 'N/h' with N a whole number >= 1, got {value!r}"
        )
    try:
        return Rate(int(found[1]), PERIODS[found[2]])
    except InvalidRateError as exc:
        raise InvalidRateError(f"{name} {value!r}: {exc}") from None
