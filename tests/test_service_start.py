"""What a service says and refuses at its start: code newer than its tables ends with exit 2
naming ``duejobs migrate`` (a database never migrated, or migrated to an older revision);
tables newer than the code are said at warning and served; and its first line says what it
serves, on which PostgreSQL and Redis, through its logs (JSON with ``--log-format json``).

Seen failing against the build before: the scheduler logged a raw "relation does not exist"
each pass for good, the worker started silently, and the scheduler's first line was plain
text whatever the log format. (Each starts a service process: 2-4 s each.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from duejobs import App, store
from duejobs.store.migrate import head_revision, upgrade
from tests.support import wait_for
from tests.support.processes import ROOT, Proc, stopped_at_first_line
from tests.support.servers import Servers


@pytest.fixture
def fresh_database(servers: Servers) -> Iterator[str]:
    name = f"duejobs_start_{uuid.uuid4().hex[:8]}"
    yield servers.create_database(name)
    servers.drop_database(name)


def _start(
    command: list[str], env: dict[str, str], database_url: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duejobs", *command],
        env={**env, "DUEJOBS_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_schema_head_this_code_needs_is_alembics_head() -> None:
    assert head_revision() == store.SCHEMA_HEAD


def test_a_service_on_a_database_never_migrated_ends_naming_duejobs_migrate(
    env: dict[str, str], fresh_database: str
) -> None:
    done = _start(["scheduler"], env, fresh_database)
    assert done.returncode == 2, done.stderr
    assert "has no duejobs tables: run `duejobs migrate`" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_service_on_tables_older_than_its_code_ends_naming_duejobs_migrate(
    env: dict[str, str], fresh_database: str
) -> None:
    older = f"{int(store.SCHEMA_HEAD) - 1:04d}"
    app = App(fresh_database)
    try:
        upgrade(app.engine, older)
    finally:
        app.close()
    done = _start(["worker", "--app", "tests.support.apps:app", "--burst"], env, fresh_database)
    assert done.returncode == 2, done.stderr
    said = f"is at schema revision {older}, and this duejobs needs {store.SCHEMA_HEAD}"
    assert said in done.stderr and "run `duejobs migrate`" in done.stderr, done.stderr


def test_a_service_on_tables_newer_than_its_code_says_so_and_serves(
    fresh_database: str, spawn: Callable[..., Proc]
) -> None:
    app = App(fresh_database)
    try:
        upgrade(app.engine)
        with app.engine.begin() as conn:  # as a newer release's migration leaves it
            conn.execute(text("UPDATE duejobs_alembic_version SET version_num = '9999'"))
    finally:
        app.close()
    scheduler = spawn("scheduler", extra_env={"DUEJOBS_DATABASE_URL": fresh_database})
    wait_for(lambda: "duejobs scheduler: queue" in scheduler.output(), 30, "its first line")
    assert "newer than this duejobs knows" in scheduler.output(), scheduler.output()
    assert scheduler.stop() == 0, scheduler.output()


def test_a_service_says_what_it_serves_through_its_json_logs(
    spawn: Callable[..., Proc], database_url: str
) -> None:
    worker = spawn("worker", "--app", "tests.support.apps:app", "--log-format", "json")
    wait_for(lambda: "duejobs worker:" in worker.output(), 30, "its first line")
    lines = [json.loads(line) for line in worker.output().splitlines()]  # every line JSON
    said = [line["message"] for line in lines if line["message"].startswith("duejobs worker:")]
    assert said[0].startswith("duejobs worker: queues 'duejobs', 1 slot;"), lines
    assert "PostgreSQL " in said[0] and "Redis redis://" in said[0]
    assert worker.stop() == 0, worker.output()


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "--app", "tests.support.apps:app"],
        ["scheduler"],
        ["reconcile", "--every", "1s"],
    ],
    ids=["worker", "scheduler", "reconcile"],
)
def test_a_stop_sent_as_a_service_says_its_first_line_ends_it_cleanly(
    spawn: Callable[..., Proc], command: list[str]
) -> None:
    """A deployment stops a service it saw start: SIGTERM handled from the first line on, so
    the stop is the warm one (exit 0), never the signal's default (-15). Seen failing with the
    worker's and the reconciler's handlers installed after their first line."""
    service = spawn(code=stopped_at_first_line(command))
    assert service.ended() == 0, service.output()
