"""Task objects (``@app.task``) and the refusal of unknown types (``strict_types``).

Seen failing against builds broken on purpose: the type check of ``registration`` removed
(a typo'd type accepted and written) → the three ``refuses`` tests; a Task scheduling under
its function's name when given one → ``test_a_task_schedules_its_own_type...``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from duejobs import App, Context, ScheduleRequest, Task
from duejobs.errors import (
    ConfigurationError,
    InvalidCronError,
    InvalidHandlerError,
    UnknownTypeError,
)
from tests.support.cli import run
from tests.support.system import System


def test_a_task_schedules_its_own_type_with_its_handlers_options(app: App) -> None:
    @app.task("reminders.send", max_attempts=2, queue="emails")
    def send(ctx: Context, payload: dict[str, Any]) -> None: ...

    assert isinstance(send, Task) and send.type == "reminders.send"
    made = send.schedule({"user": 7}, delay=timedelta(minutes=30), key="user-7")
    assert (made.type, made.payload, made.key, made.queue) == (
        "reminders.send",
        {"user": 7},
        "user-7",
        "emails",
    )
    handler = app.handler_for("reminders.send")
    assert handler is not None and handler.retry.max_attempts == 2
    assert send.schedule({"user": 7}, delay=60, key="user-7").id == made.id  # the key holds


def test_a_task_without_a_name_is_its_module_and_function(app: App) -> None:
    @app.task
    def follow_up(ctx: Context, payload: dict[str, Any]) -> str:
        return "done"

    @app.task()
    def expire(ctx: Context, payload: dict[str, Any]) -> None: ...

    local = "test_a_task_without_a_name_is_its_module_and_function.<locals>"
    assert follow_up.type == f"tests.test_tasks.{local}.follow_up"
    assert expire.type == f"tests.test_tasks.{local}.expire"
    assert follow_up.schedule({}, delay=0).type == follow_up.type


def test_calling_a_task_runs_its_function(app: App) -> None:
    @app.task("double")
    def double(ctx: Context, payload: int) -> int:
        return payload * 2

    assert double(None, 21) == 42  # type: ignore[arg-type]  # no context needed here


def test_a_tasks_schedule_many_writes_one_schedule_per_payload(app: App) -> None:
    @app.task("notify")
    def notify(ctx: Context, payload: dict[str, int]) -> None: ...

    ids = notify.schedule_many([{"n": i} for i in range(3)], delay=timedelta(hours=1))
    listed = {s.id: s for s in app.list(type="notify").schedules}
    assert set(ids) == set(listed)
    assert sorted(s.payload["n"] for s in listed.values()) == [0, 1, 2]
    keyed = app.schedule_many([notify.request({"n": 9}, delay=5, key="nine")])
    assert app.get(keyed[0]).key == "nine"  # type: ignore[union-attr]


def test_a_task_with_a_bad_option_is_refused_as_a_handler_is(app: App) -> None:
    with pytest.raises(InvalidHandlerError, match="max_attempts"):

        @app.task("broken", max_attempts=0)
        def broken(ctx: Context, payload: None) -> None: ...


def test_a_task_runs_through_the_worker(system: System) -> None:
    seen: list[Any] = []

    @system.app.task("tasks.record")
    def record(ctx: Context, payload: dict[str, Any]) -> None:
        seen.append((ctx.schedule_id, payload))

    made = record.schedule({"x": 1}, delay=0)
    system.run_until(lambda: system.status(made.id) == "succeeded")
    assert seen == [(made.id, {"x": 1})]


@pytest.mark.parametrize(
    "write",
    [
        lambda app: app.schedule("remind.sned", {}, delay=60),
        lambda app: app.schedule_many([_request("remind.sned")]),
        lambda app: app.recurring("nightly", cron="0 3 * * *", type="remind.sned"),
    ],
    ids=["schedule", "schedule_many", "recurring"],
)
def test_an_app_with_handlers_refuses_a_type_it_has_no_handler_for(
    app: App, count: Callable[..., int], write: Callable[[App], Any]
) -> None:
    app.handler("remind.send")(lambda ctx, payload: None)
    with pytest.raises(UnknownTypeError, match=r"'remind.sned'.*remind\.send.*strict_types"):
        write(app)
    assert count("scheduled_jobs") == 0 and count("recurring_schedules") == 0


def test_an_app_with_no_handlers_schedules_any_type(app: App) -> None:
    assert app.schedule("another.service.type", {}, delay=60).type == "another.service.type"


def test_a_producer_with_strict_types_off_schedules_other_services_types(
    database_url: str, redis_url: str
) -> None:
    producer = App(database_url, redis_url, strict_types=False)
    try:
        producer.handler("mine")(lambda ctx, payload: None)
        assert producer.schedule("theirs", {}, delay=60).type == "theirs"
    finally:
        producer.close()


def test_strict_types_on_refuses_every_type_before_any_handler_is_registered(
    database_url: str, redis_url: str
) -> None:
    strict = App(database_url, redis_url, strict_types=True)
    try:
        with pytest.raises(UnknownTypeError, match="its types: none"):
            strict.tenant("acme").schedule("anything", {}, delay=60)  # scopes share it
    finally:
        strict.close()


def test_strict_types_must_be_true_false_or_none(database_url: str, redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="strict_types"):
        App(database_url, redis_url, strict_types="yes")  # type: ignore[arg-type]


def _request(job_type: str) -> ScheduleRequest:
    return ScheduleRequest(job_type, {}, delay=60)


def test_a_task_with_a_cron_declares_a_definition_that_sync_recurring_writes(app: App) -> None:
    @app.task("digest.daily", cron="0 9 * * *", timezone="Europe/Lisbon")
    def digest(ctx: Context, payload: dict[str, Any]) -> None: ...

    assert app.get_recurring("digest.daily") is None  # declared in code, written on sync
    [written] = app.sync_recurring()
    assert (written.name, written.cron, written.type, written.timezone) == (
        "digest.daily",
        "0 9 * * *",
        "digest.daily",
        "Europe/Lisbon",
    )
    [again] = app.sync_recurring()
    assert again.version == written.version  # the same declaration changes nothing
    app.pause_recurring("digest.daily")  # an operator's pause outlives the services' starts
    [kept] = app.sync_recurring()
    assert (kept.status.value, kept.version) == (
        "paused",
        app.get_recurring("digest.daily").version,
    )  # type: ignore[union-attr]


def test_a_task_with_a_bad_cron_fails_where_it_is_declared(app: App) -> None:
    with pytest.raises(InvalidCronError):

        @app.task("digest.broken", cron="0 25 * * *")
        def broken(ctx: Context, payload: None) -> None: ...


def test_a_worker_started_with_the_app_writes_its_declared_definitions(
    env: dict[str, str], app: App
) -> None:
    for _ in range(2):  # twice: the second start changes nothing
        done = run("worker", "--app", "tests.cron_app:app", "--burst", env=env)
        assert done.returncode == 0, done.stderr
    written = app.get_recurring("digest.daily")
    assert written is not None and written.timezone == "Europe/Lisbon" and written.version == 1
