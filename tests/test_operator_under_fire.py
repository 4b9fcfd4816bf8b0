"""The operator's surface under fire: the dashboard's pages, ``duejobs stats`` and ``duejobs
list`` polled while the PostgreSQL primary, its read replica, the default Redis and a second
Redis node (a queue of its own) are each stopped and started again, in an order drawn from a
seed. During each outage: no page answers 500, no command prints a traceback, and every page
or command that needs the stopped service says which one it is; after each recovery every
page answers again and the overview's figures count a schedule made after the recovery
within one refresh.

Takes about a minute: four real stops and starts (two of PostgreSQL servers) with a few
dozen polls each; ``DUEJOBS_FIRE_SEEDS=1,2,3`` for more orders. Seen failing on builds
broken on purpose: the outage pages' guard removed from the list page (a bare 500 with the
primary or the replica down), the CLI's outage handling removed (``stats`` and ``list``
print tracebacks).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from bench.chaos import Servers
from duejobs import App
from duejobs.dashboard import Access, create_dashboard
from duejobs.scheduler.loop import Scheduler
from tests.support import wait_for
from tests.support.dashboard import HERE, LOCAL
from tests.support.replication import Pair
from tests.support.replication import pair as pair

# Stops and starts servers of its own: run on its own (`pytest -m serial`).
pytestmark = pytest.mark.serial

SEEDS = [int(s) for s in os.environ.get("DUEJOBS_FIRE_SEEDS", "5").split(",")]
REFRESH = 1  # the overview's refresh, in seconds
OTHER_QUEUE = "far"  # the queue on the second Redis node

# What each service is called when it is missing, and what reads it.
SAID = {
    "primary": "PostgreSQL",
    "replica": "read replica",
    "redis": "Redis",
    "node": "Redis",
}
PAGES_NEEDING = {
    "/": {"primary", "replica", "redis", "node"},
    "/schedules": {"primary", "replica"},
    "/recurring": {"primary", "replica"},
    "schedule": {"primary", "redis"},  # a pushed schedule of the default queue: its job's node
    "far schedule": {"primary", "node"},  # one of the second node's queue
}
COMMANDS_NEEDING = {
    "stats": {"primary", "replica", "redis", "node"},
    "list": {"primary", "replica"},
}


@dataclass
class Surface:
    """What the operator looks at, and the servers behind it."""

    pair: Pair
    redis: Servers
    app: App
    client: TestClient
    env: dict[str, str]
    pages: dict[str, str]

    def look(self, down: str | None = None) -> dict[str, tuple[int, str]]:
        """Every page and command once: (status or exit code, text). With a service
        ``down``, the overview is read until it says so, at most a few refreshes: figures
        read less than a refresh before the outage are still current, and say so."""
        if down is not None:
            said = SAID[down]
            wait_for(lambda: said in self._page("/")[1], 3 * REFRESH + 10, f"/ to say {said}")
        seen = {name: self._page(path) for name, path in self.pages.items()}
        for command in COMMANDS_NEEDING:
            done = subprocess.run(
                [sys.executable, "-m", "duejobs", command],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            seen[command] = (done.returncode, done.stdout + done.stderr)
        return seen

    def _page(self, path: str) -> tuple[int, str]:
        response = self.client.get(path)
        return response.status_code, response.text

    def stop(self, service: str) -> Callable[[], None]:
        """Stop ``service``; the function that starts it again."""
        if service == "primary":
            self.pair.stop_primary()
            return self.pair.start_primary
        if service == "replica":
            self.pair.stop_standby()
            return self.pair.start_standby
        node = 0 if service == "redis" else 1
        self.redis.stop_redis(node)
        return lambda: self.redis.start_redis(node)

    def scheduled_count(self) -> int:
        status, text = self._page("/")
        found = re.search(r'id="count-scheduled">(\d+)<', text)
        return -1 if status != 200 or found is None else int(found[1])


@pytest.fixture
def surface(pair: Pair, tmp_path: Path) -> Iterator[Surface]:
    pair.ensure_standby()
    redis = Servers(tmp_path, nodes=2, postgres=False)
    nodes = {OTHER_QUEUE: redis.redis_urls[1]}
    app = App(
        pair.primary_url,
        redis.redis_url,
        read_database_url=pair.replica_url,
        redis_nodes=nodes,
    )
    app.migrate()
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": pair.primary_url,
        "DUEJOBS_READ_DATABASE_URL": pair.replica_url,
        "DUEJOBS_REDIS_URL": redis.redis_url,
        "DUEJOBS_REDIS_NODES": f"{OTHER_QUEUE}={redis.redis_urls[1]}",
    }
    near = app.schedule("report", {}, delay=timedelta(minutes=10))
    far = app.schedule("report", {}, delay=timedelta(minutes=10), queue=OTHER_QUEUE)
    assert Scheduler(app).run_once().claimed == 2  # their pages read their jobs on the nodes
    pages = {
        "/": "/",
        "/schedules": "/schedules",
        "/recurring": "/recurring",
        "schedule": f"/schedules/{near.id}",
        "far schedule": f"/schedules/{far.id}",
    }
    board = create_dashboard(app, Access(), refresh=REFRESH)
    try:
        with TestClient(board, client=LOCAL, base_url=HERE, raise_server_exceptions=False) as c:
            yield Surface(pair, redis, app, c, env, pages)
    finally:
        app.close()
        redis.stop()


def _problems(seen: dict[str, tuple[int, str]], down: str) -> list[str]:
    """What an operator would hold against the surface while ``down`` is stopped."""
    found = []
    needing = {**PAGES_NEEDING, **COMMANDS_NEEDING}
    for name, (code, text) in seen.items():
        if "Traceback" in text:
            found.append(f"{name}: a traceback")
        if name in PAGES_NEEDING and code not in (200, 503):
            found.append(f"{name}: answered {code}")
        if name in COMMANDS_NEEDING and code not in (0, 1):
            found.append(f"{name}: exited {code}")
        if down in needing[name] and SAID[down] not in text:
            found.append(f"{name}: does not say {SAID[down]} is unavailable ({code})")
        if down not in needing[name] and code not in (0, 200):
            found.append(f"{name}: failed ({code}) though it needs no {down}")
    return [f"{p} [{down} down]" for p in found]


def _all_well(surface: Surface) -> bool:
    return all(code in (0, 200) for code, _ in surface.look().values())


@pytest.mark.long  # 30 s of faults under the operator's pages: make test-long (test-all)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_operator_surface_says_what_is_down_and_recovers_within_a_refresh(
    surface: Surface, seed: int
) -> None:
    rng = random.Random(seed)
    order = list(SAID)
    rng.shuffle(order)
    problems: list[str] = []
    assert _all_well(surface), surface.look()
    for service in order:
        start = surface.stop(service)
        try:
            for _ in range(rng.randint(2, 3)):
                problems += _problems(surface.look(service), service)
        finally:
            start()
        wait_for(lambda: _all_well(surface), 120, f"every page after {service} came back")
        counted = surface.scheduled_count() + 1
        surface.app.schedule("report", {"after": service}, delay=timedelta(hours=2))
        wait_for(
            lambda: surface.scheduled_count() == counted,  # noqa: B023 (waited for at once)
            REFRESH + 10,
            f"the overview to count a schedule made after {service} came back",
        )
    assert problems == [], "\n".join(dict.fromkeys(problems))
