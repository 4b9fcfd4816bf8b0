"""Every refused input raises a ValueError subclass naming the problem, and writes nothing."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from duejobs import App, ScheduleRequest
from duejobs.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    EmptyTypeError,
    InvalidHandlerError,
    InvalidKeyError,
    InvalidScheduleError,
    InvalidScheduleIdError,
    InvalidTenantError,
    NaiveDatetimeError,
    NegativeDelayError,
    PayloadNotJSONError,
    PayloadTooLargeError,
    TenantMismatchError,
    TimeSpecError,
    UnknownTimezoneError,
)
from duejobs.scheduler.loop import SchedulerConfig
from duejobs.services.node_drain import DrainConfig
from duejobs.services.pruner import PruneConfig
from duejobs.services.reconciler import ReconcileConfig
from duejobs.worker import WorkerConfig


@pytest.fixture
def nothing_written(app: App, count: Callable[..., int]) -> Iterator[None]:
    yield
    assert count() == 0
    assert count("scheduled_job_events") == 0


pytestmark = pytest.mark.usefixtures("nothing_written")


def test_naive_run_at_without_timezone_is_refused(app: App) -> None:
    with pytest.raises(NaiveDatetimeError, match="naive") as info:
        app.schedule("x", {}, run_at=datetime(2026, 10, 30, 9, 0))
    assert isinstance(info.value, ValueError)


def test_unknown_timezone_is_refused(app: App) -> None:
    with pytest.raises(UnknownTimezoneError, match="Mars/Olympus"):
        app.schedule("x", {}, run_at=datetime(2026, 10, 30, 9, 0), timezone="Mars/Olympus")


def test_timezone_that_is_not_a_name_is_refused(app: App) -> None:
    with pytest.raises(UnknownTimezoneError):
        app.schedule("x", {}, delay=1, timezone="")


def test_negative_delay_is_refused(app: App) -> None:
    with pytest.raises(NegativeDelayError, match="negative"):
        app.schedule("x", {}, delay=timedelta(seconds=-1))


def test_negative_delay_in_seconds_is_refused(app: App) -> None:
    with pytest.raises(NegativeDelayError):
        app.schedule("x", {}, delay=-5)


def test_infinite_delay_is_refused(app: App) -> None:
    with pytest.raises(NegativeDelayError, match="finite"):
        app.schedule("x", {}, delay=float("inf"))


def test_both_delay_and_run_at_are_refused(app: App) -> None:
    with pytest.raises(TimeSpecError, match="exactly one of delay= or run_at="):
        app.schedule("x", {}, delay=1, run_at=app.now())


def test_neither_delay_nor_run_at_is_refused(app: App) -> None:
    with pytest.raises(TimeSpecError, match="exactly one"):
        app.schedule("x", {})


def test_run_at_that_is_not_a_datetime_is_refused(app: App) -> None:
    with pytest.raises(TimeSpecError, match="run_at must be a datetime"):
        app.schedule("x", {}, run_at="2026-10-30T09:00:00Z")  # type: ignore[arg-type]


def test_boolean_delay_is_refused(app: App) -> None:
    with pytest.raises(TimeSpecError, match="delay must be a timedelta or seconds"):
        app.schedule("x", {}, delay=True)


def test_oversized_payload_is_refused(app: App) -> None:
    with pytest.raises(PayloadTooLargeError, match="over the limit of 65536"):
        app.schedule("x", {"blob": "a" * 70_000}, delay=1)


def test_payload_limit_is_configurable(database_url: str, app: App) -> None:
    small = App(database_url=database_url, max_payload_bytes=100)
    try:
        with pytest.raises(PayloadTooLargeError, match="over the limit of 100"):
            small.schedule("x", {"blob": "a" * 200}, delay=1)
    finally:
        small.close()


def test_non_json_payload_is_refused(app: App) -> None:
    with pytest.raises(PayloadNotJSONError, match="not JSON"):
        app.schedule("x", {"when": datetime(2026, 1, 1)}, delay=1)


def test_nan_in_payload_is_refused(app: App) -> None:
    with pytest.raises(PayloadNotJSONError):
        app.schedule("x", {"score": float("nan")}, delay=1)


def test_nul_character_in_payload_is_refused(app: App) -> None:
    with pytest.raises(PayloadNotJSONError, match="NUL"):
        app.schedule("x", {"text": "a\x00b"}, delay=1)


def test_empty_type_is_refused(app: App) -> None:
    with pytest.raises(EmptyTypeError, match="job type"):
        app.schedule("", {}, delay=1)


def test_blank_type_is_refused(app: App) -> None:
    with pytest.raises(EmptyTypeError):
        app.schedule("   ", {}, delay=1)


def test_invalid_tenant_is_refused(app: App) -> None:
    with pytest.raises(InvalidTenantError, match="tenant must match"):
        app.schedule("x", {}, delay=1, tenant="acme corp/../")


def test_empty_key_is_refused(app: App) -> None:
    with pytest.raises(InvalidKeyError, match="key must be"):
        app.schedule("x", {}, delay=1, key="")


def test_scoped_app_refuses_to_write_for_another_tenant(app: App) -> None:
    with pytest.raises(TenantMismatchError, match="scoped to tenant 'acme'"):
        app.tenant("acme").schedule("x", {}, delay=1, tenant="globex")


def test_malformed_schedule_id_is_refused(app: App) -> None:
    with pytest.raises(InvalidScheduleIdError, match="must be a UUID"):
        app.cancel("not-a-uuid")


def test_non_integer_expected_version_is_refused(app: App) -> None:
    with pytest.raises(ValueError, match="expected_version"):
        app.reschedule(uuid.uuid4(), delay=1, expected_version="1")  # type: ignore[arg-type]


def test_handler_with_zero_attempts_is_refused(app: App) -> None:
    with pytest.raises(InvalidHandlerError, match="max_attempts"):
        app.handler("x", max_attempts=0)


def test_handler_with_non_positive_timeout_is_refused(app: App) -> None:
    with pytest.raises(InvalidHandlerError, match="timeout"):
        app.handler("x", timeout=timedelta(0))


def test_app_without_database_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUEJOBS_DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="DUEJOBS_DATABASE_URL"):
        App()


def test_unreachable_database_raises_a_clear_error() -> None:
    down = App(database_url="postgresql://nobody@127.0.0.1:9/none?connect_timeout=2")
    try:
        with pytest.raises(DatabaseUnavailableError, match="PostgreSQL is unavailable"):
            down.schedule("x", {}, delay=1)
    finally:
        down.close()


# -- one rule for range and text: what the API accepts, the system can carry ------------------

_EDGES: list[tuple[dict[str, Any], str]] = [
    ({"delay": 1e300}, "delay must be at most 100 years"),
    ({"delay": 10**400}, "finite number"),
    ({"delay": timedelta(days=3_000_000)}, "delay must be at most 100 years"),
    ({"delay": 0, "jitter": timedelta(days=999_999_999)}, "jitter must be at most"),
    ({"delay": 0, "expires_after": timedelta(days=999_999_999)}, "expires_after must be at"),
    ({"run_at": datetime(9999, 12, 31, 23, tzinfo=UTC)}, "run_at must lie between"),
    ({"run_at": datetime(1, 1, 1, tzinfo=UTC)}, "run_at must lie between"),
    ({"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))}, "run_at"),
    ({"run_at": datetime(9999, 12, 31, 23), "timezone": "America/New_York"}, "run_at must"),
    ({"delay": 0, "key": "a\x00b"}, "key contains a NUL"),
    ({"delay": 0, "key": "\ud800"}, "key contains a lone surrogate"),
    ({"delay": 0, "payload": {"text": "\ud800"}}, "lone surrogate"),
    ({"delay": 0, "payload": {"\udfff": 1}}, "lone surrogate"),
    ({"delay": 0, "payload": functools.reduce(lambda d, _: [d], range(5000), [])}, "deeper"),
    ({"delay": 0, "payload": functools.reduce(lambda d, _: {"a": d}, range(65), {})}, "deeper"),
]


@pytest.mark.parametrize(("when", "message"), _EDGES)
def test_values_the_system_cannot_carry_are_refused_naming_the_field(
    app: App, when: dict[str, Any], message: str
) -> None:
    args = {"payload": {}, **when}
    with pytest.raises(InvalidScheduleError, match=message):
        app.schedule("x", args.pop("payload"), **args)


@pytest.mark.parametrize(("when", "message"), _EDGES)
def test_schedule_many_refuses_exactly_what_schedule_refuses(
    app: App, when: dict[str, Any], message: str
) -> None:
    args = {"payload": {}, **when}
    good = ScheduleRequest("x", {}, delay=60)
    with pytest.raises(InvalidScheduleError, match=f"request 1: .*{message}"):
        app.schedule_many([good, ScheduleRequest("x", **args)])


def test_a_type_with_a_nul_is_refused(app: App) -> None:
    with pytest.raises(InvalidScheduleError, match="NUL"):
        app.schedule("x\x00y", {}, delay=0)


def test_a_payload_that_only_spells_a_nul_escape_is_accepted(app: App, count: Any) -> None:
    s = app.schedule("x", {"text": "\\u0000", "other": "\\\\u0000"}, delay=0)
    stored = app.get(s.id)
    assert stored is not None and stored.payload == {"text": "\\u0000", "other": "\\\\u0000"}
    with app.engine.begin() as conn:  # the module's "nothing written" check is for refusals
        conn.exec_driver_sql("DELETE FROM scheduled_jobs; DELETE FROM scheduled_job_events")


def test_a_queue_name_that_collides_with_rq_keys_is_refused(app: App) -> None:
    with pytest.raises(InvalidScheduleError, match="no ':'"):
        app.schedule("x", {}, delay=0, queue="reports:intermediate")


def test_handler_durations_may_be_given_in_seconds(app: App) -> None:
    app.handler("seconds", timeout=30, backoff=0.5, backoff_cap=10)(lambda ctx, payload: None)
    registered = app.handler_for("seconds")
    assert registered is not None and registered.timeout == timedelta(seconds=30)
    assert registered.retry.backoff_cap == timedelta(seconds=10)
    with pytest.raises(ValueError, match="timeout"):
        app.handler("words", timeout="soon")(lambda ctx, payload: None)  # type: ignore[arg-type]


_SECOND = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("config", "knobs", "named"),
    [
        (SchedulerConfig, {"batch_size": 0}, "batch_size must be 1..10000, got 0"),
        (SchedulerConfig, {"batch_size": True}, "batch_size must be 1..10000, got True"),
        (SchedulerConfig, {"concurrency": 17}, "concurrency must be 1..16"),
        (SchedulerConfig, {"window": -_SECOND}, "window must be >= 0"),
        (SchedulerConfig, {"poll_interval": timedelta(0)}, "poll_interval must be > 0"),
        (SchedulerConfig, {"throttled_poll_interval": 0.1}, "throttled_poll_interval must be a"),
        (SchedulerConfig, {"max_backoff": -_SECOND}, "max_backoff must be > 0"),
        (ReconcileConfig, {"batch_size": 100_001}, "batch_size must be 1..100000"),
        (ReconcileConfig, {"stuck_after": timedelta(0)}, "stuck_after must be > 0"),
        (PruneConfig, {"older_than": "30d"}, "older_than must be a timedelta"),
        (
            functools.partial(DrainConfig, "redis://old:6379/0"),
            {"chunk": 0},
            "chunk must be 1..100000",
        ),
        (DrainConfig, {"url": "http://old:6379/0"}, "not a Redis URL: http://old"),
        (WorkerConfig, {"claim_lock_timeout": timedelta(0)}, "claim_lock_timeout must be > 0"),
        (
            WorkerConfig,
            {"lease": 20 * _SECOND, "heartbeat": 10 * _SECOND},
            "heartbeat .* must be at most a third of the lease",
        ),
        (WorkerConfig, {"max_early_wait": -_SECOND}, "max_early_wait must be >= 0"),
        (WorkerConfig, {"max_early_wait": 61 * _SECOND}, "max_early_wait must be at most"),
        (WorkerConfig, {"take_window": -_SECOND}, "take_window must be >= 0"),
        (WorkerConfig, {"take_window": 2 * _SECOND}, "take_window must be at most"),
        (WorkerConfig, {"take_window": 0.01}, "take_window must be a timedelta"),
        (WorkerConfig, {"switch_interval": timedelta(0)}, "switch_interval must be > 0"),
        (WorkerConfig, {"switch_interval": 2 * _SECOND}, "switch_interval must be at most"),
    ],
)
def test_every_service_config_refuses_a_knob_that_cannot_work_naming_it(
    config: Callable[..., object], knobs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        config(**knobs)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DUEJOBS_DATABASE_URL", "mysql://host/db"),
        ("DUEJOBS_DATABASE_URL", "postgresql://host/db?foo=bar"),
        ("DUEJOBS_DATABASE_URL", "postgresql://host/db?prepare_threshold=often"),
        ("DUEJOBS_READ_DATABASE_URL", "postgresql://host/db?foo=bar"),
        ("DUEJOBS_REDIS_URL", "http://host"),
        ("DUEJOBS_SCHEMA", "Bad-Schema"),
        ("DUEJOBS_REDIS_NODES", "garbage"),
        ("DUEJOBS_PREPARED_STATEMENTS", "sometimes"),
        ("DUEJOBS_RESULT_TTL", "fast"),
    ],
)
def test_a_bad_value_in_an_environment_variable_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("DUEJOBS_DATABASE_URL", "postgresql://host/db")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=variable):
        App()
