"""``duejobs.testing`` and its pytest plugin, as a project's own test suite uses them: a
sample project (an App, its tasks, its tests) run by pytest in a subprocess against this
session's servers.

Seen failing against builds broken on purpose: ``advance`` moving nothing (the reminder test
of the sample never ran it) → ``test_a_projects_tests_run_its_schedules_through_duejobs``;
the tables not emptied between two tests → the same test (its isolation test saw the schedule
of the one before); the project's root left off ``sys.path`` → the same test (its tests, in
``tests/``, could not import the project).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from duejobs import App, Status
from duejobs.testing import advance, drain, run_due
from tests.support.servers import Servers

pytest_plugins = ["pytester"]

PROJECT = """
from datetime import timedelta
from duejobs import App, Context

app = App()
calls = []

@app.task("reminders.send", max_attempts=3, backoff=timedelta(minutes=1))
def send_reminder(ctx: Context, payload: dict) -> None:
    calls.append(payload["user"])
    if payload.get("fail_first") and ctx.attempt == 1:
        raise ConnectionError("the mail server hung up")
"""

TESTS = """
from datetime import timedelta

from duejobs import Status
from duejobs.testing import advance, drain, run_due

from reminders import calls, send_reminder


def test_the_reminder_fires_after_30_minutes_not_before(duejobs_app):
    made = send_reminder.schedule({"user": 7}, delay=timedelta(minutes=30))
    assert run_due(duejobs_app) == 0
    advance(duejobs_app, minutes=29)
    assert run_due(duejobs_app) == 0
    advance(duejobs_app, minutes=1)
    assert run_due(duejobs_app) == 1
    assert duejobs_app.get(made.id).status is Status.SUCCEEDED and calls == [7]


def test_a_cancelled_reminder_never_runs(duejobs_app):
    made = send_reminder.schedule({"user": 8}, delay=0, key="user-8")
    duejobs_app.cancel(made.id)
    assert run_due(duejobs_app) == 0 and 8 not in calls


def test_a_failure_is_retried_after_its_backoff(duejobs_app):
    made = send_reminder.schedule({"user": 9, "fail_first": True}, delay=0)
    assert drain(duejobs_app) == 2
    assert duejobs_app.get(made.id).attempts == 2 and calls.count(9) == 2


def test_each_test_starts_with_no_schedules(duejobs_app):
    assert duejobs_app.list().schedules == []
"""


def test_a_projects_tests_run_its_schedules_through_duejobs(
    pytester: pytest.Pytester, servers: Servers, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUEJOBS_TEST_DATABASE_URL", servers.server_url)
    monkeypatch.setenv("DUEJOBS_TEST_REDIS_URL", redis_url)
    # the project's pytest is no xdist worker of this run: with this worker's name it would
    # take another worker's Redis database (its own URL's plus its index plus one)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("DUEJOBS_DATABASE_URL", raising=False)
    monkeypatch.delenv("DUEJOBS_REDIS_URL", raising=False)
    pytester.makepyfile(reminders=PROJECT)
    pytester.mkdir("tests")
    (pytester.path / "tests" / "test_reminders.py").write_text(TESTS)
    pytester.makeini("[pytest]\nduejobs_app = reminders:app\n")
    # pytest's own script, as a project runs it, nothing on PYTHONPATH (``python -m pytest``,
    # and pytester's runs, put the current folder on sys.path)
    script = str(Path(sys.executable).parent / "pytest")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [script, "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "4 passed" in done.stdout, done.stdout + done.stderr  # tests/ imports the project
    assert "duejobs: configured servers; test database" in done.stdout


def test_an_app_on_other_servers_than_the_sessions_is_refused_not_emptied(
    pytester: pytest.Pytester,
    servers: Servers,
    database_url: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An App made with its own URL (a developer's database) is never emptied by the
    fixture: the test errors, naming the database. Seen failing when the fixture truncated
    whatever database the App was on."""
    monkeypatch.setenv("DUEJOBS_TEST_DATABASE_URL", servers.server_url)
    monkeypatch.setenv("DUEJOBS_TEST_REDIS_URL", redis_url)
    # the project's pytest is no xdist worker of this run: with this worker's name it would
    # take another worker's Redis database (its own URL's plus its index plus one)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("ELSEWHERE", database_url)
    kept = App(database_url, redis_url).schedule("kept", {}, delay=3600)
    pytester.makepyfile(
        elsewhere="import os\nfrom duejobs import App\napp = App(os.environ['ELSEWHERE'])\n",
        test_elsewhere="def test_it(duejobs_app):\n    pass\n",
    )
    pytester.makeini("[pytest]\nduejobs_app = elsewhere:app\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert any("not the session's" in line for line in result.outlines)
    assert App(database_url, redis_url).get(kept.id) is not None


def test_a_project_without_the_setting_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not any(line.startswith("duejobs:") for line in result.outlines)


def test_advance_moves_only_forward(app: App) -> None:
    with pytest.raises(ValueError, match="forward only"):
        advance(app, minutes=-1)


def test_drain_stops_at_its_horizon(app: App) -> None:
    app.handler("later")(lambda ctx, payload: None)
    made = app.schedule("later", {}, delay=timedelta(days=2))
    assert drain(app, within=timedelta(days=1)) == 0
    assert app.get(made.id).status is Status.SCHEDULED  # type: ignore[union-attr]
    assert drain(app, within=timedelta(days=3)) == 1 and run_due(app) == 0
