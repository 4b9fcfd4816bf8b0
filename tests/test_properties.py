"""The public API over its whole input space: a duejobs error, or a schedule that is stored,
reads back equal through ``get()`` and can be delivered.

Seen failing against a build without the range and text rules of ``timespec`` and
``validation`` (``OverflowError`` from a float delay, ``UnicodeEncodeError`` from a lone
surrogate, ``DataError`` from an expiry past PostgreSQL's calendar).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from duejobs import App, ScheduleRequest, Status
from duejobs.errors import DuejobsError
from duejobs.worker import Outcome
from tests.support.system import System

_ZONES = ["UTC", "Europe/Berlin", "America/Sao_Paulo", "Asia/Kathmandu", "Pacific/Kiritimati"]
_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=8)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=12,
)
_durations = st.one_of(
    st.timedeltas(),
    st.floats(),
    st.integers(min_value=-(10**12), max_value=10**400),
)
_instants = st.datetimes(
    timezones=st.one_of(
        st.none(),
        st.sampled_from([ZoneInfo(z) for z in _ZONES]),
        st.builds(
            timezone, st.timedeltas(min_value=-timedelta(hours=23), max_value=timedelta(hours=23))
        ),
    )
)
_when = st.one_of(
    st.fixed_dictionaries({"delay": _durations}),
    st.fixed_dictionaries(
        {"run_at": _instants},
        optional={"timezone": st.sampled_from([*_ZONES, "Mars/Olympus", ""])},
    ),
)
_extras = st.fixed_dictionaries(
    {},
    optional={
        "jitter": _durations,
        "expires_after": _durations,
        "key": st.one_of(st.none(), _text),
    },
)
_PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _number(value: Any) -> Any:
    """JSON numbers are decimals: jsonb gives 1e20 back as 100000000000000000000."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return {k: _number(v) for k, v in value.items()}


def _expected_instant(when: dict[str, Any]) -> datetime | None:
    run_at = when.get("run_at")
    if run_at is None or run_at.utcoffset() is None:
        return None  # a delay (the database's clock) or a wall time (the DST rules' answer)
    return run_at.astimezone(UTC)


@_PROPERTY
@given(payload=_json, when=_when, extras=_extras)
def test_any_schedule_call_is_refused_or_stored_equal_and_deliverable(
    system: System, payload: Any, when: dict[str, Any], extras: dict[str, Any]
) -> None:
    app: App = system.app
    try:
        s = app.schedule("record", payload, **when, **extras)
    except DuejobsError as exc:
        assert isinstance(exc, ValueError), exc
        event(f"refused: {type(exc).__name__}")
        return
    event("stored")
    stored = app.get(s.id)
    assert stored is not None and stored.status is Status.SCHEDULED
    assert _number(stored.payload) == _number(payload)
    assert stored.key == extras.get("key")
    expected = _expected_instant(when)
    if expected is not None:
        assert stored.run_at == expected
    if stored.timezone is not None:
        assert stored.run_at_local.utcoffset() is not None
    system.scheduler.run_once()  # the push of any stored row goes through
    outcome = system.runtime.handle(s.id, stored.version, 1, stored.tenant)
    if stored.due_at <= app.now():
        assert outcome in (Outcome.SUCCEEDED, Outcome.SKIPPED)  # skipped: expired
    else:
        assert outcome is Outcome.DEFERRED
    app.cancel(s.id)


@_PROPERTY
@given(payload=_json, when=_when, extras=_extras)
def test_schedule_many_accepts_and_refuses_exactly_what_schedule_does(
    app: App, payload: Any, when: dict[str, Any], extras: dict[str, Any]
) -> None:
    try:
        one = app.schedule("record", payload, **when, **extras)
    except DuejobsError as exc:
        single: str | None = type(exc).__name__
    else:
        single = None
        app.cancel(one.id)
    try:
        (many,) = app.schedule_many([ScheduleRequest("record", payload, **when, **extras)])
    except DuejobsError as exc:
        assert type(exc).__name__ == single
    else:
        assert single is None
        app.cancel(many)


def test_floats_come_back_as_the_same_json_number(app: App) -> None:
    payload = {"big": 1.7e308, "small": 5e-324, "exact": 0.1, "negative_zero": -0.0}
    stored = app.get(app.schedule("record", payload, delay=60).id)
    assert stored is not None
    assert all(
        math.isclose(float(stored.payload[k]), v, rel_tol=0, abs_tol=0) for k, v in payload.items()
    )
