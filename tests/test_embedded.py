"""The embedded PostgreSQL and Redis: real servers, shared, stopped by their last user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from duejobs.dev.embedded import start_embedded

# Starts, pauses, kills or restarts servers of its own on free ports: run on its own
# (`pytest -m serial`), never beside another test process.
pytestmark = pytest.mark.serial

HOLDER = """
import json, sys
from pathlib import Path
from duejobs.dev.embedded import start_embedded

services = start_embedded(Path(sys.argv[1]))
print(json.dumps({"db": services.database_url, "redis": services.redis_url}), flush=True)
sys.stdin.readline()
"""


def _holder(data_dir: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def _server_pids(data_dir: Path) -> list[int]:
    pids = []
    for name in ("postgres", "redis"):
        state = json.loads((data_dir / name / "lease.json").read_text())
        if state["endpoint"]:
            pids.append(state["endpoint"]["pid"])
    return pids


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_embedded_servers_are_real_postgresql_and_redis(tmp_path: Path) -> None:
    services = start_embedded(tmp_path)
    try:
        with psycopg.connect(services.database_url) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()
        assert version is not None and int(version[0]) >= 160000
        client = redis.Redis.from_url(services.redis_url)
        assert client.ping() and client.info("server").get("redis_version")
        client.close()
    finally:
        pids = _server_pids(tmp_path)
        services.stop()
    assert _wait_gone(pids)


def test_a_process_that_stopped_the_servers_starts_them_again(tmp_path: Path) -> None:
    """Start, stop, start again in one process (a test run's fixtures, a bench's steps): the
    second start serves a running PostgreSQL. Seen failing when the handle pgserver keeps
    for a data folder (one per process) was taken as is: it still named the server stopped,
    and the database could not be reached ("No such file" for its socket)."""
    first = start_embedded(tmp_path)
    first.stop()
    second = start_embedded(tmp_path)
    try:
        with psycopg.connect(second.database_url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        second.stop()


def test_a_second_process_reuses_the_running_servers(tmp_path: Path) -> None:
    proc, urls = _holder(tmp_path)
    services = start_embedded(tmp_path)
    assert services.reused
    assert (services.database_url, services.redis_url) == (urls["db"], urls["redis"])
    pids = _server_pids(tmp_path)
    services.stop()
    assert all(_running(p) for p in pids), "stopped while another process used them"
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert _wait_gone(pids), "the last user did not stop the servers"


def test_servers_of_a_sigkilled_run_are_adopted_and_stopped(tmp_path: Path) -> None:
    proc, urls = _holder(tmp_path)
    pids = _server_pids(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert all(_running(p) for p in pids)
    services = start_embedded(tmp_path)
    assert services.reused and services.database_url == urls["db"]
    services.stop()
    assert _wait_gone(pids), "servers left behind by a killed run were not stopped"


def test_a_server_that_died_is_replaced(tmp_path: Path) -> None:
    first = start_embedded(tmp_path)
    redis_pid = _server_pids(tmp_path)[1]
    os.kill(redis_pid, signal.SIGKILL)
    assert _wait_gone([redis_pid])
    second = start_embedded(tmp_path)
    try:
        assert not second.reused
        assert redis.Redis.from_url(second.redis_url).ping()
    finally:
        pids = _server_pids(tmp_path)
        second.stop()
        first.stop()
    assert _wait_gone(pids)


def test_a_server_that_is_slow_to_answer_is_waited_for_not_replaced(tmp_path: Path) -> None:
    """A paused or busy server still serves the processes that started it: a newcomer that
    took a late answer for a dead server stopped it under them."""
    first = start_embedded(tmp_path)
    redis_pid = _server_pids(tmp_path)[1]
    with redis.Redis.from_url(first.redis_url) as client:
        client.execute_command("CLIENT", "PAUSE", 5_000, "ALL")
    second = start_embedded(tmp_path)
    try:
        assert second.reused and second.redis_url == first.redis_url
        assert _running(redis_pid)
    finally:
        pids = _server_pids(tmp_path)
        second.stop()
        first.stop()
    assert _wait_gone(pids)


def test_devs_first_start_says_where_and_your_own_code_finds_it_through_duejobs_env(
    tmp_path: Path,
) -> None:
    """A newcomer's path: ``duejobs dev`` on a fresh folder prints its servers' line and its
    own (no migration's or server's chatter); ``eval "$(duejobs env)"`` in a second shell
    lets a plain ``App()`` reach the same servers. Seen failing with 38 lines at the first
    start, and ``DUEJOBS_DATABASE_URL is not set`` from the second shell's code. (Starts
    PostgreSQL and runs every migration on it: about 10 s.)"""
    from tests.support import wait_for
    from tests.support.processes import ROOT, Proc

    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEJOBS_")}
    env["PYTHONPATH"] = str(ROOT)
    cli = [sys.executable, "-m", "duejobs", "--data-dir", str(data)]
    dev = Proc(
        ["--data-dir", str(data), "dev", "--app", "tests.support.apps:app"], env, tmp_path / "dev"
    )
    try:
        wait_for(lambda: "duejobs dev:" in dev.output(), 120, "dev to start")
        lines = dev.output().splitlines()
        assert len(lines) == 2 and "started embedded PostgreSQL" in lines[0], lines
        second_shell = (
            f'eval "$({" ".join(cli)} env)" && '
            f"{sys.executable} -c 'from duejobs import App; print(App().now().year)'"
        )
        done = subprocess.run(
            ["bash", "-c", second_shell], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr
    finally:
        assert dev.stop() == 0, dev.output()
