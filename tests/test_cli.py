"""The duejobs command line, run as a user runs it (a separate process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from duejobs import App
from tests.conftest import Servers


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duejobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def env(app: App, database_url: str, redis_url: str) -> dict[str, str]:
    return {**os.environ, "DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}


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


def test_demo_runs_the_whole_system_and_checks_the_outcome(
    env: dict[str, str], tmp_path: Path
) -> None:
    result = run("--data-dir", str(tmp_path), "demo", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    for check in (
        "each effect applied exactly once",
        "the cancelled follow-up never started",
        "the flaky webhook failed once, then succeeded on attempt 2",
    ):
        assert f"ok   {check}" in result.stdout
    assert "lag run_at -> start: p50" in result.stdout


def test_without_urls_the_cli_uses_embedded_servers_and_says_so(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUEJOBS_")}
    result = run("--data-dir", str(tmp_path / "data"), "migrate", env=clean)
    assert result.returncode == 0, result.stderr
    assert "embedded PostgreSQL" in result.stderr and "Valkey" in result.stderr
    state = json.loads((tmp_path / "data" / "postgres" / "lease.json").read_text())
    assert state == {"endpoint": None, "users": []}, "the CLI left its servers running"


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
