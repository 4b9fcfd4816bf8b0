"""Pure time logic: DST rules for local wall times, durations, retry backoff."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duejobs.errors import NegativeDelayError, TimeSpecError
from duejobs.handlers import RetryPolicy
from duejobs.timespec import local_to_utc, parse_duration, spell_duration

ZONES = ["Europe/Berlin", "America/New_York", "America/Sao_Paulo", "Australia/Lord_Howe", "UTC"]


@settings(max_examples=300, deadline=None)
@given(
    wall=st.datetimes(min_value=datetime(2015, 1, 1), max_value=datetime(2030, 12, 31)),
    zone_name=st.sampled_from(ZONES),
)
def test_local_wall_time_maps_to_itself_or_to_the_end_of_its_gap(
    wall: datetime, zone_name: str
) -> None:
    tz = ZoneInfo(zone_name)
    instant = local_to_utc(wall, tz)
    local = instant.astimezone(tz).replace(tzinfo=None)
    if local == wall:
        # Exists: the earliest instant showing that wall time.
        assert not any(
            (instant - d).astimezone(tz).replace(tzinfo=None) == wall
            for d in (timedelta(minutes=30), timedelta(hours=1))
        )
    else:
        # In a gap: the first valid instant after it, which is later on the wall clock.
        assert local > wall
        assert (instant - timedelta(seconds=1)).astimezone(tz).utcoffset() != instant.astimezone(
            tz
        ).utcoffset()


def test_gap_in_berlin_runs_at_three() -> None:
    instant = local_to_utc(datetime(2026, 3, 29, 2, 30), ZoneInfo("Europe/Berlin"))
    assert instant == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_overlap_in_berlin_runs_at_the_first_half_past_two() -> None:
    instant = local_to_utc(datetime(2026, 10, 25, 2, 30), ZoneInfo("Europe/Berlin"))
    assert instant == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("45s", 45), ("30m", 1800), ("1h30m", 5400), ("2d", 172800), ("0.5s", 0.5)],
)
def test_durations_read_by_the_cli(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "m", "5x", "1h30", "-5m"])
def test_unreadable_durations_are_refused(text: str) -> None:
    with pytest.raises(TimeSpecError):
        parse_duration(text)


def test_negative_plain_seconds_are_refused_as_negative() -> None:
    with pytest.raises(NegativeDelayError):
        parse_duration("-5")


def test_backoff_is_full_jitter_under_an_exponential_ceiling() -> None:
    policy = RetryPolicy(
        max_attempts=10, backoff=timedelta(seconds=1), backoff_cap=timedelta(seconds=60)
    )
    rng = random.Random(7)
    for attempt, ceiling in [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (9, 60)]:
        waits = [policy.delay_before(attempt, rng) for _ in range(200)]
        assert all(timedelta(0) <= w <= timedelta(seconds=ceiling) for w in waits)
        assert max(waits) > timedelta(seconds=ceiling * 0.8)  # spread, not a constant
        assert min(waits) < timedelta(seconds=ceiling * 0.2)


@given(st.integers(min_value=0, max_value=10**14))
def test_a_spelled_duration_reads_back_as_itself(us: int) -> None:
    """To the microsecond: a sub-millisecond knob is passed on to supervised workers as
    given (seen failing with durations rounded to the millisecond)."""
    value = timedelta(microseconds=us)
    assert parse_duration(spell_duration(value)) == value
