"""The FastAPI example (``examples/fastapi_app.py``) started with uvicorn and driven over HTTP,
its reminders run by a real ``duejobs worker`` process, on real PostgreSQL and Redis.

Seen failing against a build broken on purpose: the endpoint scheduling outside its
transaction (no ``conn=``) → ``test_a_failed_order_leaves_neither_the_order_nor_its_reminder``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from duejobs import App
from duejobs.scheduler.loop import Scheduler
from tests.support import wait_for
from tests.support.network import free_port
from tests.support.processes import ROOT, Proc


class Client:
    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def answers(self) -> bool:
        try:
            return self.call("GET", "/openapi.json")[0] == 200
        except OSError:
            return False


@pytest.fixture
def service(app: App, database_url: str, redis_url: str, tmp_path: Any) -> Iterator[Client]:
    with app.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS example_orders"))
    port = free_port()
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "uvicorn", "examples.fastapi_app:api", "--port", str(port)]
    log = tmp_path / "uvicorn.log"
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    client = Client(f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: client.answers() or server.poll() is not None, 30, "uvicorn to answer")
        assert server.poll() is None, log.read_text()
        yield client
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_order_and_its_reminder_commit_together_and_a_worker_runs_it(
    service: Client, app: App, spawn: Callable[..., Proc]
) -> None:
    status, placed = service.call("POST", "/orders", {"customer": "ana", "remind_in_seconds": 0})
    assert status == 201, placed
    path = f"/orders/{placed['order_id']}/reminder"
    assert service.call("GET", path)[1]["status"] == "scheduled"

    Scheduler(app).run_once()
    worker = spawn("worker", "--app", "examples.jobs:app", "--burst")
    assert worker.popen.wait(timeout=60) == 0, worker.output()
    reminder = service.call("GET", path)[1]
    assert reminder["status"] == "succeeded" and reminder["reminded_at"] is not None


def test_a_failed_order_leaves_neither_the_order_nor_its_reminder(
    service: Client, count: Callable[..., int]
) -> None:
    status, _ = service.call("POST", "/orders", {"customer": "bo", "fail": True})
    assert status == 500
    assert count() == 0 and count("example_orders") == 0


def test_a_reminder_is_cancelled_over_http(service: Client) -> None:
    placed = service.call("POST", "/orders", {"customer": "cy"})[1]
    path = f"/orders/{placed['order_id']}/reminder"
    assert service.call("DELETE", path) == (200, {"cancelled": True})
    assert service.call("GET", path)[1]["status"] == "cancelled"
    assert service.call("DELETE", path) == (200, {"cancelled": False})
