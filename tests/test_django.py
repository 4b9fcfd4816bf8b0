"""``duejobs.contrib.django`` in a small Django project (``tests/django_project``): settings,
Django's own transactions, handlers found in ``jobs.py``, management commands and the Tasks
backend, on real PostgreSQL and Redis, with workers started by ``manage.py``.

Seen failing against a build broken on purpose: the App's own transactions on duejobs'
engine instead of Django's connection →
``test_a_schedule_in_a_views_atomic_block_commits_with_it`` and
``test_a_schedule_in_a_rolled_back_atomic_block_never_existed``; ``fenced()`` committing the
ORM write outside the fence →
``test_an_orm_write_in_a_fence_is_undone_when_the_schedule_was_cancelled_meanwhile``; the return
value not saved → ``test_a_task_enqueued_through_django_tasks_runs_and_returns_its_value``;
errors not recorded → ``test_a_failing_task_fails_after_its_attempts_with_each_traceback``;
the dashboard's views open to any signed-in user, or left to Django's CSRF check (which
refuses the dashboard's own forms) →
``test_the_dashboard_in_the_projects_urls_serves_signed_in_staff_only``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import django
import psycopg
import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test.utils import override_settings

from duejobs import App, Status, store
from duejobs.config import libpq_url
from duejobs.scheduler.loop import Scheduler
from tests.support.processes import ROOT
from tests.support.servers import Servers

try:  # Django 6 and later, as the backend does
    from django.tasks import TaskResult, TaskResultStatus
except ImportError:
    from django_tasks import TaskResult, TaskResultStatus
from duejobs.contrib.django.tasks import InvalidTaskError, TaskResultDoesNotExist

SETTINGS = "tests.django_project.settings"


@pytest.fixture(scope="session")
def project(database_url: str, redis_url: str) -> Iterator[dict[str, str]]:
    """Django set up in this process on the session's scratch database; the environment a
    ``manage.py`` process needs."""
    env = {
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DUEJOBS_TEST_DATABASE_URL": database_url,
        "DUEJOBS_TEST_REDIS_URL": redis_url,
    }
    os.environ.update(env)
    django.setup()
    call_command("migrate", verbosity=0)
    yield {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    connection.close()


@pytest.fixture
def shop(project: dict[str, str], app: App, redis_client: redis.Redis) -> Iterator[Shop]:
    from tests.django_project.shop.models import Order

    Order.objects.all().delete()
    yield Shop(project, app)
    connection.close()


class Shop:
    """The project, and what drives it: a scheduler pass, a worker started by manage.py."""

    def __init__(self, env: dict[str, str], app: App) -> None:
        from duejobs.contrib.django import get_app

        self.env, self.app, self.django_app = env, app, get_app()

    def manage(self, *args: str, settings: str = SETTINGS) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", *args, "--settings", settings],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def work(self) -> None:
        """One scheduler pass, then a worker from manage.py until the queues are empty."""
        Scheduler(self.django_app).run_once()
        done = self.manage("duejobs_worker", "--burst", "--queue", "duejobs", "--queue", "reports")
        assert done.returncode == 0, done.stdout + done.stderr

    def work_until(self, finished: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not finished():
            assert time.monotonic() < deadline, "deadline passed before the work was done"
            self.work()


def test_the_settings_build_one_app_on_the_databases_entry(shop: Shop) -> None:
    from duejobs.contrib.django import app, get_app, settings_urls

    assert app is get_app() is shop.django_app
    assert shop.django_app.now() is not None  # the URL built from DATABASES reaches it
    assert settings_urls()[2] == "default"
    with (
        override_settings(DUEJOBS={"REDIS_ULR": "typo"}),
        pytest.raises(ImproperlyConfigured, match=r"unknown keys \['REDIS_ULR'\]"),
    ):
        settings_urls()
    with (
        override_settings(DUEJOBS={"DATABASE": "other"}),
        pytest.raises(ImproperlyConfigured, match="'other', not in DATABASES"),
    ):
        settings_urls()


def test_the_settings_name_redis_nodes_and_the_replicas_lag_bound(shop: Shop) -> None:
    from django.conf import settings

    from duejobs.contrib.django import DjangoApp

    nodes = {"b": "redis://127.0.0.1:1/0"}
    lag = timedelta(seconds=3)
    with override_settings(DUEJOBS={**settings.DUEJOBS, "REDIS_NODES": nodes, "READ_MAX_LAG": lag}):
        built = DjangoApp()
        try:
            assert built.core.settings.redis_nodes == (("b", "redis://127.0.0.1:1/0"),)
            assert built.core.read_max_lag == lag
        finally:
            built.close()
    with override_settings(DUEJOBS={**settings.DUEJOBS, "READ_MAX_LAG": 3}):
        refused = DjangoApp()  # made unconfigured: its use says why, naming the key
        with pytest.raises(ImproperlyConfigured, match=r"DUEJOBS\['READ_MAX_LAG'\]"):
            refused.core  # noqa: B018


def test_handlers_in_the_installed_apps_jobs_modules_are_registered(shop: Shop) -> None:
    assert shop.django_app.handler_for("shop.remind") is not None
    assert shop.django_app.handler_for("django.task.default") is not None


def test_a_schedule_in_a_views_atomic_block_commits_with_it(shop: Shop) -> None:
    from tests.django_project.shop.models import Order

    with transaction.atomic():
        order = Order.objects.create(customer="ana")
        s = shop.django_app.schedule("shop.remind", {"order_id": order.id}, delay=60)
        assert shop.app.get(s.id) is None  # not committed: invisible outside the view
    assert shop.app.get(s.id) is not None and Order.objects.filter(id=order.id).exists()


def test_a_schedule_in_a_rolled_back_atomic_block_never_existed(
    shop: Shop, count: Callable[..., int]
) -> None:
    from tests.django_project.shop.models import Order

    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(customer="bo")
        shop.django_app.schedule("shop.remind", {"order_id": order.id}, delay=60)
        raise RuntimeError("the view failed")
    assert count() == 0 and count("scheduled_job_events") == 0
    assert not Order.objects.exists()


def test_outside_an_atomic_block_each_call_commits_on_its_own(shop: Shop) -> None:
    s = shop.django_app.schedule("shop.remind", {"order_id": 1}, delay=60)
    assert shop.app.get(s.id) is not None
    assert shop.django_app.cancel(s.id) and shop.app.get(s.id).status is Status.CANCELLED  # type: ignore[union-attr]


def test_a_worker_from_manage_py_runs_a_handler_that_writes_through_the_orm_once(
    shop: Shop,
) -> None:
    from tests.django_project.shop.models import Order

    order = Order.objects.create(customer="cy")
    s = shop.django_app.schedule("shop.remind", {"order_id": order.id}, delay=0)
    shop.work_until(lambda: shop.app.get(s.id).status is Status.SUCCEEDED)  # type: ignore[union-attr]
    order.refresh_from_db()
    assert order.reminded == 1
    with shop.app.engine.connect() as conn:
        from sqlalchemy import text

        keys = conn.execute(text("SELECT effect_key FROM scheduled_job_effects")).scalars().all()
    assert keys == [f"shop.remind:{s.id}:1"]


def test_an_orm_write_in_a_fence_is_undone_when_the_schedule_was_cancelled_meanwhile(
    shop: Shop,
) -> None:
    from tests.django_project.shop.models import Order

    order = Order.objects.create(customer="di")
    s = shop.django_app.schedule("shop.cancelled-meanwhile", {"order_id": order.id}, delay=0)
    shop.work_until(lambda: shop.app.get(s.id).status is Status.CANCELLED)  # type: ignore[union-attr]
    order.refresh_from_db()
    assert order.reminded == 0
    assert [e.kind.value for e in shop.app.history(s.id)][-1] == "skipped"


def test_a_task_enqueued_through_django_tasks_runs_and_returns_its_value(shop: Shop) -> None:
    from tests.django_project.shop.tasks import add, report

    added, reported = add.enqueue(2, 3), report.enqueue("sales")
    assert added.status == TaskResultStatus.READY and added.args == [2, 3]
    assert shop.app.get(added.id).queue == "duejobs"  # type: ignore[union-attr]
    assert shop.app.get(reported.id).queue == "reports"  # type: ignore[union-attr]
    shop.work_until(lambda: add.get_result(added.id).is_finished)
    shop.work_until(lambda: report.get_result(reported.id).is_finished)
    added.refresh()
    assert added.status == TaskResultStatus.SUCCESSFUL and added.return_value == 5
    assert len(added.worker_ids) == 1 and added.started_at and added.finished_at
    assert report.get_result(reported.id).return_value == {"report": "sales", "rows": [1, 2, 3]}


def test_the_task_backend_sends_djangos_task_signals(shop: Shop) -> None:
    """``task_enqueued``, ``task_started`` at each attempt, ``task_finished`` after the last,
    as Django's own backends send them (a worker in this process, to hear them). Seen
    failing when the backend sent none."""
    try:  # the framework's own signals, whoever imports them
        from django.tasks import signals
    except ImportError:
        from django_tasks import signals  # type: ignore[no-redef]
    from duejobs.worker import Runtime, Worker
    from tests.django_project.shop.tasks import add, explode

    heard: list[tuple[str, str, str]] = []

    def hear(name: str) -> Callable[..., None]:
        def receive(sender: object, task_result: TaskResult, **kwargs: object) -> None:
            heard.append((name, task_result.id, task_result.status.value))

        return receive

    receivers = {name: hear(name) for name in ("enqueued", "started", "finished")}
    for name, receiver in receivers.items():
        getattr(signals, f"task_{name}").connect(receiver, weak=False)
    runtime = Runtime(shop.django_app)
    try:
        added, failed = add.enqueue(2, 3), explode.enqueue()
        deadline = time.monotonic() + 60
        while not explode.get_result(failed.id).is_finished:
            assert time.monotonic() < deadline, heard
            Scheduler(shop.django_app).run_once()
            Worker(runtime, ["duejobs"]).work(burst=True)
            time.sleep(0.1)
    finally:
        runtime.close()
        for name, receiver in receivers.items():
            getattr(signals, f"task_{name}").disconnect(receiver)
    of_added = [(name, status) for name, rid, status in heard if rid == added.id]
    assert of_added == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ], heard
    of_failed = [(name, status) for name, rid, status in heard if rid == failed.id]
    assert of_failed == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("started", "RUNNING"),
        ("finished", "FAILED"),
    ], heard


def test_an_enqueue_in_a_rolled_back_atomic_block_leaves_no_task(
    shop: Shop, count: Callable[..., int]
) -> None:
    from tests.django_project.shop.tasks import add

    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(1, 1)
        raise RuntimeError("the view failed")
    assert count() == 0


def test_task_enqueued_is_sent_once_the_enqueue_commits_and_never_for_one_rolled_back(
    shop: Shop,
) -> None:
    """Seen failing with the signal sent at the enqueue, inside the block rolled back."""
    try:
        from django.tasks import signals
    except ImportError:
        from django_tasks import signals  # type: ignore[no-redef]
    from tests.django_project.shop.tasks import add

    heard: list[str] = []

    def receive(sender: object, task_result: TaskResult, **kwargs: object) -> None:
        heard.append(task_result.id)

    signals.task_enqueued.connect(receive, weak=False)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            add.enqueue(1, 1)
            raise RuntimeError("the view failed")
        assert heard == []
        with transaction.atomic():
            kept = add.enqueue(2, 2)
            assert heard == []  # not before the commit
        assert heard == [kept.id]
    finally:
        signals.task_enqueued.disconnect(receive)


def test_a_deferred_task_waits_for_run_after(shop: Shop) -> None:
    from django.utils import timezone

    from tests.django_project.shop.tasks import add

    later = timezone.now() + timedelta(hours=1)
    result = add.using(run_after=later).enqueue(1, 2)
    assert shop.app.get(result.id).run_at == later  # type: ignore[union-attr]
    shop.work()
    assert add.get_result(result.id).status == TaskResultStatus.READY


def test_a_failing_task_fails_after_its_attempts_with_each_traceback(shop: Shop) -> None:
    from tests.django_project.shop.tasks import explode

    result = explode.enqueue()
    shop.work_until(lambda: explode.get_result(result.id).is_finished)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and len(result.worker_ids) == 2
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "the task failed on purpose" in result.errors[-1].traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - Django raises for a failed task's value


def test_a_return_value_that_cannot_be_stored_fails_the_task_saying_why(shop: Shop) -> None:
    from tests.django_project.shop.tasks import too_big

    result = too_big.enqueue()
    shop.work_until(lambda: too_big.get_result(result.id).is_finished)
    result.refresh()
    assert result.errors[-1].exception_class_path.endswith("TaskResultError")
    assert "MAX_RESULT_BYTES" in result.errors[-1].traceback


def test_context_taking_and_async_tasks_run(shop: Shop) -> None:
    from tests.django_project.shop.tasks import add_later, which_attempt

    attempt, later = which_attempt.enqueue(), add_later.enqueue(4, 5)
    shop.work_until(lambda: add_later.get_result(later.id).is_finished)
    shop.work_until(lambda: which_attempt.get_result(attempt.id).is_finished)
    assert which_attempt.get_result(attempt.id).return_value == 1
    assert add_later.get_result(later.id).return_value == 9


def test_a_tasks_priority_is_its_schedules(shop: Shop) -> None:
    """django.tasks' ``priority`` (its range, higher first) is the schedule's; out of the
    range, Django refuses it. Seen failing while the backend refused every priority."""
    from tests.django_project.shop.tasks import add

    urgent = add.using(priority=50).enqueue(1, 2)
    stored = shop.app.get(urgent.id)
    assert stored is not None and stored.priority == 50
    with pytest.raises(InvalidTaskError, match="priority"):
        add.using(priority=101)


def test_what_the_backend_refuses_or_cannot_find(shop: Shop) -> None:
    from tests.django_project.shop.tasks import add

    with pytest.raises(InvalidTaskError, match="Queue 'nowhere'"):
        add.using(queue_name="nowhere")
    other = shop.app.schedule("shop.remind", {"order_id": 1}, delay=60)
    for unknown in ("not-a-uuid", str(uuid.uuid4()), str(other.id)):
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(unknown)


def test_management_commands_run_the_cli_with_the_settings(shop: Shop) -> None:
    call_command("duejobs_migrate")  # from code: already at head, nothing to do
    migrated = shop.manage("duejobs_migrate")
    assert migrated.returncode == 0, migrated.stderr
    reconciled = shop.manage("duejobs_reconcile", "--json")
    assert reconciled.returncode == 0 and reconciled.stdout.startswith("{"), reconciled.stderr


def test_call_command_takes_the_clis_options(
    shop: Shop, capsys: pytest.CaptureFixture[str]
) -> None:
    """From code as from manage.py: ``call_command("duejobs_worker", "--burst", ...)`` runs a
    burst worker, and ``call_command("duejobs_reconcile", "--json")`` prints its JSON. Seen
    failing with Django's parser refusing the CLI's options ("unrecognized arguments")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # the commands set up the process's logs
    try:
        call_command("duejobs_reconcile", "--json")
        assert json.loads(capsys.readouterr().out)["checked"] >= 0
        call_command("duejobs_worker", "--burst", "--queue", "duejobs")
    finally:
        root.handlers[:], root.level = handlers, level


def test_rate_limits_and_quotas_are_set_and_read_through_management_commands(
    shop: Shop, capsys: pytest.CaptureFixture[str]
) -> None:
    """``manage.py duejobs_rate_limit QUEUE RATE`` and ``duejobs_quota TENANT --max-rate``
    set them; without arguments they list them; a bad rate is a ``CommandError``, nothing
    written. Seen failing without the commands (call_command: KeyError)."""
    call_command("duejobs_rate_limit", "sms", "10/s")
    call_command("duejobs_quota", "acme", "--max-rate", "60/m")
    capsys.readouterr()
    call_command("duejobs_rate_limit")
    assert capsys.readouterr().out.splitlines() == [
        "queue sms: 10/s (0 starts over the last period; last grant 0 of 0)",
        "tenant acme: 60/m (0 starts over the last period; last grant 0 of 0)",
    ]
    with pytest.raises(CommandError, match="status 2"):
        call_command("duejobs_rate_limit", "sms", "fast")
    assert "'fast'" in capsys.readouterr().err
    assert [str(r.rate) for r in shop.app.rate_limits()] == ["10/s", "60/m"]


def test_call_command_takes_the_clis_options_as_a_list_and_writes_to_its_stdout(
    shop: Shop, capsys: pytest.CaptureFixture[str]
) -> None:
    """``call_command("duejobs_reconcile", options=["--json"], stdout=buffer)``: the options
    as the keyword its parser names them by, the output where Django's commands write it.
    Seen failing with ValueError, and with the JSON on the process's stdout instead."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    try:
        call_command("duejobs_reconcile", options=["--json"], stdout=buffer)
    finally:
        root.handlers[:], root.level = handlers, level
    assert json.loads(buffer.getvalue())["checked"] >= 0
    assert capsys.readouterr().out == ""


def test_the_dashboard_sends_a_stranger_to_a_sign_in_page_the_project_has(shop: Shop) -> None:
    """A new project routes the admin, not Django's default ``LOGIN_URL``
    (``/accounts/login/``): the dashboard sends a visitor not signed in to the admin's sign-in
    page. Seen failing with a redirect to a page the project answers 404 for."""
    from django.test import Client, override_settings

    with override_settings(ROOT_URLCONF="tests.django_project.admin_urls"):
        went = Client().get("/jobs/")
    assert went.status_code == 302 and went["Location"].startswith("/admin/login/?next=")


def test_the_dashboards_urls_without_its_extra_say_which_extra() -> None:
    """A project's urls.py importing the dashboard's URLs where the extra is not installed
    (starlette missing here): Django's own ImproperlyConfigured naming the extra, not a bare
    ModuleNotFoundError out of ``manage.py check``."""
    code = (
        "import sys; sys.modules['starlette'] = None\n"
        "from django.core.exceptions import ImproperlyConfigured\n"
        "try:\n"
        "    import duejobs.contrib.django.dashboard\n"
        "except ImproperlyConfigured as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "needs the dashboard extra" in done.stdout, done.stdout + done.stderr


def test_the_dashboard_in_the_projects_urls_serves_signed_in_staff_only(shop: Shop) -> None:
    import re

    from django.contrib.auth.models import User
    from django.test import Client

    s = shop.django_app.schedule("shop.remind", {"order_id": 1}, delay=timedelta(hours=1))
    name = uuid.uuid4().hex[:12]
    clerk = User.objects.create_user(f"clerk-{name}", password="x")
    staff = User.objects.create_user(f"staff-{name}", password="x", is_staff=True)
    browser = Client(enforce_csrf_checks=True)  # Django's CSRF check on: the views opt out
    assert browser.get("/jobs/").status_code == 302  # to the login page
    browser.force_login(clerk)
    assert browser.get("/jobs/schedules").status_code == 403  # signed in, not staff
    browser.force_login(staff)
    listed = browser.get("/jobs/schedules")
    assert listed.status_code == 200
    assert f'href="/jobs/schedules/{s.id}"'.encode() in listed.content
    page = browser.get(f"/jobs/schedules/{s.id}").content.decode()
    token = re.search(r'name="csrf" value="([0-9a-f.]+)"', page)
    assert token is not None
    cancel, form = f"/jobs/schedules/{s.id}/cancel", "application/x-www-form-urlencoded"
    assert browser.post(cancel, "csrf=0", content_type=form).status_code == 403
    done = browser.post(cancel, f"csrf={token[1]}", content_type=form)
    assert done.status_code == 303 and done["Location"].startswith(f"/jobs/schedules/{s.id}?")
    assert shop.app.get(s.id).status is Status.CANCELLED  # type: ignore[union-attr]
    assert browser.get("/jobs/dashboard.css").status_code == 200
    assert browser.get("/jobs/schedules", HTTP_HOST="[::1]:8000").status_code == 200


_PAGES_WITH_JOBS_DOWN = """
import re, uuid
import django
django.setup()
from django.contrib.auth.models import User
from django.test import Client
browser = Client()
browser.force_login(User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True))
for path in ("/jobs/", "/jobs/schedules", "/jobs/recurring"):
    page = browser.get(path)
    said = re.search(r"PostgreSQL[^<]*unavailable", page.content.decode())
    print(path, page.status_code, bool(said))
"""


def test_the_dashboard_on_a_database_alias_of_its_own_answers_503_while_it_is_down(
    shop: Shop,
) -> None:
    """duejobs on the alias ``jobs`` (``DUEJOBS['DATABASE']``), whose server is down, the
    project's own database up: each dashboard page answers 503 naming PostgreSQL, as the
    standalone dashboard does. Seen failing with Django's own OperationalError a 500."""
    done = subprocess.run(
        [sys.executable, "-c", _PAGES_WITH_JOBS_DOWN],
        env={**shop.env, "DJANGO_SETTINGS_MODULE": "tests.django_project.jobs_db_down_settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "/jobs/ 503 True",
        "/jobs/schedules 503 True",
        "/jobs/recurring 503 True",
    ], done.stdout + done.stderr


@pytest.mark.parametrize("change", ["cancel", "reschedule", "delete_recurring"])
def test_a_change_rolled_back_with_its_atomic_block_leaves_the_queued_job(
    shop: Shop, redis_client: redis.Redis, change: str
) -> None:
    """Cancel, reschedule or a recurring definition's removal inside ``atomic()`` that rolls
    back: the row is as it was, and so is its job in Redis (removed only once Django
    commits). Seen failing when the job was removed at once: the row back to ``scheduled``
    with its job gone until a reconciler pass."""
    from django.db import transaction

    app = shop.django_app
    if change == "delete_recurring":
        name = f"digest-{uuid.uuid4().hex[:8]}"
        app.recurring(name, cron="* * * * *", type="shop.remind", payload={"order_id": 3})
        Scheduler(app).recurring.run_once()  # the next occurrence made
        s = app.list(recurring=name).schedules[0]
    else:
        s = app.schedule("shop.remind", {"order_id": 3}, delay=timedelta(seconds=30))
    Scheduler(app).run_once()
    pushed = app.get(s.id)
    assert pushed is not None and pushed.queue_job_id is not None
    job_key = f"rq:job:{pushed.queue_job_id}"
    assert redis_client.exists(job_key)

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        if change == "cancel":
            app.cancel(s.id)
        elif change == "reschedule":
            app.reschedule(s.id, delay=timedelta(hours=1))
        else:
            app.delete_recurring(name)
        raise Rollback
    assert app.core.removals().flush()
    after = app.get(s.id)
    assert after is not None and (after.status, after.version) == (Status.SCHEDULED, 1)
    assert redis_client.exists(job_key), "the job was removed though nothing committed"
    with transaction.atomic():
        app.cancel(s.id)
        assert redis_client.exists(job_key)  # not before the commit
    assert app.core.removals().flush()
    assert not redis_client.exists(job_key)  # removed once committed


def test_manage_py_migrate_makes_duejobs_tables(shop: Shop, servers: Servers) -> None:
    """On a new database, ``manage.py migrate`` alone makes duejobs' tables (its migration
    runs duejobs' own to the newest revision); again, it has nothing to do; on tables of the
    release before, it brings them to this release's revision. Seen failing when only
    ``manage.py duejobs_migrate`` made them, and with 0014 (then 0015, 0016, 0017) left to
    ``duejobs migrate``."""
    name = f"duejobs_django_{uuid.uuid4().hex[:10]}"
    url = servers.create_database(name)
    try:
        env = {**shop.env, "DUEJOBS_TEST_DATABASE_URL": url}

        def migrate() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "django", "migrate", "--settings", SETTINGS],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=180,
            )

        first = migrate()
        assert first.returncode == 0, first.stdout + first.stderr
        assert "Applying duejobs.0001_schema... OK" in first.stdout, first.stdout
        with psycopg.connect(libpq_url(url)) as conn:
            made = conn.execute("SELECT to_regclass('scheduled_jobs') IS NOT NULL").fetchone()
        assert made == (True,)
        again = migrate()
        assert again.returncode == 0 and "No migrations to apply" in again.stdout, again.stdout
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:  # as a release ago
            conn.execute("ALTER TABLE rate_limits DROP COLUMN paced_until")
            conn.execute("DROP INDEX scheduled_jobs_claim_queue_idx")
            conn.execute("DROP INDEX scheduled_jobs_claim_urgent_idx")
            conn.execute("UPDATE duejobs_alembic_version SET version_num = '0016'")
            conn.execute("DELETE FROM django_migrations WHERE name = '0005_upgrade_0017'")
        upgraded = migrate()
        assert "Applying duejobs.0005_upgrade_0017... OK" in upgraded.stdout, upgraded.stdout
        with psycopg.connect(libpq_url(url)) as conn:
            at = conn.execute("SELECT version_num FROM duejobs_alembic_version").fetchone()
        assert at == (store.SCHEMA_HEAD,)
    finally:
        servers.drop_database(name)


def test_management_commands_speak_as_manage_py_and_take_djangos_options(shop: Shop) -> None:
    """``--help`` shows ``manage.py duejobs_worker [OPTIONS]`` without the ``--app`` the
    command fills in; Django's standard options are accepted. Seen failing with ``Usage:
    manage.py duejobs_worker worker``, a required ``--app``, and ``-v`` refused."""
    helped = shop.manage("duejobs_worker", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Usage: manage.py duejobs_worker [OPTIONS]"), helped.stdout
    assert "--app" not in helped.stdout and "--concurrency" in helped.stdout
    reconciled = shop.manage(
        "duejobs_reconcile", "-v", "2", "--traceback", "--no-color", "--verbosity=0", "--json"
    )
    assert reconciled.returncode == 0 and reconciled.stdout.startswith("{"), reconciled.stderr
    refused = shop.manage("duejobs_reconcile", "--no-such-flag")
    assert refused.returncode == 2 and refused.stderr.startswith("error: "), refused.stderr


def test_a_dashboard_form_from_before_a_sign_out_is_refused_after_it(shop: Shop) -> None:
    """The dashboard's token is bound to Django's session, which a sign-out ends: a form
    shown before it cannot be posted after the next sign-in. Seen failing on tokens bound
    to the user alone."""
    import re

    from django.contrib.auth.models import User
    from django.test import Client

    s = shop.django_app.schedule("shop.remind", {"order_id": 2}, delay=timedelta(hours=1))
    staff = User.objects.create_user(f"staff-{uuid.uuid4().hex[:12]}", password="x", is_staff=True)
    browser = Client()
    browser.force_login(staff)
    page = browser.get(f"/jobs/schedules/{s.id}").content.decode()
    token = re.search(r'name="csrf" value="([0-9a-f.]+)"', page)
    assert token is not None
    kept = dict(browser.cookies)  # a browser keeps a site's other cookies across a sign-out
    browser.logout()
    browser.force_login(staff)
    for name, morsel in kept.items():
        if name not in browser.cookies:
            browser.cookies[name] = morsel.value
    cancel, form = f"/jobs/schedules/{s.id}/cancel", "application/x-www-form-urlencoded"
    assert browser.post(cancel, f"csrf={token[1]}", content_type=form).status_code == 403
    assert shop.app.get(s.id).status is Status.SCHEDULED  # type: ignore[union-attr]


def test_a_project_not_on_postgresql_gets_a_system_check_error_not_a_traceback(
    shop: Shop,
) -> None:
    """``manage.py check`` on SQLite: one error, ``duejobs.E001``, naming the engine — the
    project's URLs importing a view that imports the App at module level, as docs/django.md
    writes it. Seen failing with a 30-line traceback from every command, and, with the view,
    a traceback from the App's import."""
    done = shop.manage("check", settings="tests.django_project.sqlite_settings")
    assert done.returncode != 0
    assert "duejobs.E001" in done.stderr and "sqlite3" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_wrapped_postgresql_engine_is_accepted(shop: Shop) -> None:
    """Judged by the backend's vendor, as PostGIS is: seen failing with the engine's name
    compared to Django's own."""
    done = shop.manage("check", settings="tests.django_project.wrapped_settings")
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_operators_read_inside_an_atomic_block_leaves_no_time_limit_behind(
    shop: Shop,
) -> None:
    """A list inside a view's ``atomic()`` runs under ``READ_TIMEOUT``, and the view's later
    statements do not: the transaction's own limit is given back. Seen failing when the limit
    was set for the rest of the transaction (the view's next query capped at 10 s)."""
    from django.db import connection, transaction

    with transaction.atomic():
        shop.django_app.list()
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            assert cursor.fetchone() == ("0",)


def test_a_bad_duejobs_value_is_a_system_check_error_naming_its_key(shop: Shop) -> None:
    """``DUEJOBS["PREPARED_STATEMENTS"] = "maybe"``: ``manage.py check`` fails with
    ``duejobs.E001`` naming the key as it is set, and no command shows a traceback. Seen
    failing with every command crashing, the traceback naming the App's option and the
    environment variable."""
    done = shop.manage("check", settings="tests.django_project.bad_value_settings")
    assert done.returncode != 0
    assert "duejobs.E001" in done.stderr and "DUEJOBS['PREPARED_STATEMENTS']" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_task_state_django_logs_is_printed_once_by_a_duejobs_process(
    shop: Shop, capfd: pytest.CaptureFixture[str]
) -> None:
    """Django 6 logs each task's state under ``django.tasks``, whose parent ``django`` has a
    console handler of Django's own (its default logging, with DEBUG on): a worker, whose logs
    duejobs sets up, printed each state twice. Seen failing with two lines."""
    import logging.config

    from django.test import override_settings
    from django.utils.log import DEFAULT_LOGGING

    from duejobs.observability import logs

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    tasks = logging.getLogger("django.tasks")
    try:
        with override_settings(DEBUG=True):
            logging.config.dictConfig(DEFAULT_LOGGING)
            logs.configure("info", "text")
            tasks.info("Task id=%s state=%s", "t-1", "RUNNING")
    finally:
        root.handlers[:], root.level = handlers, level
        tasks.handlers[:], tasks.propagate = [], True
        logging.getLogger("django").handlers[:] = []
    assert capfd.readouterr().err.count("Task id=t-1 state=RUNNING") == 1
